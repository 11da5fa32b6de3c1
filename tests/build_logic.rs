//! The pure helpers of build.rs (`build/toolkit.rs`): the user's toolkit from `NVCC` /
//! `CUDA_HOME`, the pinned toolchain recognised under another name, the `BSG_CONFIGS` list; and
//! the object cache's upkeep (`build/cache.rs`).
#[path = "../build/cache.rs"]
mod cache;
#[path = "../build/toolkit.rs"]
mod toolkit;

use std::ffi::OsString;
use std::path::PathBuf;

/// A fake toolkit `<tmp>/<name>/{bin/nvcc,include}`, returned with a `PATH` holding its bin.
fn fake_toolkit(name: &str) -> (PathBuf, OsString) {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("build_logic").join(name);
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::create_dir_all(root.join("include")).unwrap();
    std::fs::write(root.join("bin/nvcc"), "").unwrap();
    let path = std::env::join_paths([PathBuf::from("/nonexistent-dir"), root.join("bin")]).unwrap();
    (std::fs::canonicalize(root).unwrap(), path)
}

#[test]
fn neither_set_builds_the_wheels() {
    assert_eq!(toolkit::user_cuda(None, None, None), Ok(None));
}

#[test]
fn cuda_home_alone() {
    let got = toolkit::user_cuda(None, Some("/opt/cuda"), None).unwrap().unwrap();
    assert_eq!(got, (PathBuf::from("/opt/cuda/bin/nvcc"), PathBuf::from("/opt/cuda")));
}

/// `NVCC=nvcc` (a bare name) with `CUDA_HOME` set: used to panic "set CUDA_HOME".
#[test]
fn bare_nvcc_with_cuda_home() {
    let (root, path) = fake_toolkit("bare_with_home");
    let got = toolkit::user_cuda(Some("nvcc"), Some("/opt/cuda"), Some(&path)).unwrap().unwrap();
    assert_eq!(got, (root.join("bin/nvcc"), PathBuf::from("/opt/cuda")));
}

/// `NVCC=nvcc` alone: found on PATH, the root is the folder above its bin/.
#[test]
fn bare_nvcc_on_path() {
    let (root, path) = fake_toolkit("bare_on_path");
    let got = toolkit::user_cuda(Some("nvcc"), None, Some(&path)).unwrap().unwrap();
    assert_eq!(got, (root.join("bin/nvcc"), root));
}

#[test]
fn bare_nvcc_missing_names_the_variable() {
    let e = toolkit::user_cuda(Some("nvcc-none"), None, Some(OsString::from("/nonexistent-dir").as_os_str())).unwrap_err();
    assert!(e.contains("NVCC=nvcc-none") && e.contains("PATH"), "{e}");
}

/// A symlink to nvcc outside a bin/ folder (e.g. `/usr/local/bin/nvcc`) finds the real toolkit.
#[test]
fn symlinked_nvcc_gives_the_real_root() {
    let (root, _) = fake_toolkit("symlinked");
    let link = root.parent().unwrap().join("symlinked-link-nvcc");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(root.join("bin/nvcc"), &link).unwrap();
    let got = toolkit::user_cuda(Some(link.to_str().unwrap()), None, None).unwrap().unwrap();
    assert_eq!(got, (link, root));
}

#[test]
fn nvcc_outside_bin_asks_for_cuda_home() {
    let (root, _) = fake_toolkit("outside_bin");
    let odd = root.join("nvcc-here");
    std::fs::write(&odd, "").unwrap();
    let e = toolkit::user_cuda(Some(odd.to_str().unwrap()), None, None).unwrap_err();
    assert!(e.contains("CUDA_HOME"), "{e}");
}

/// CUDA_HOME spelled differently (trailing `/.`, a symlink) is still the same toolkit.
#[test]
fn same_place_sees_through_spellings() {
    let (root, _) = fake_toolkit("same_place");
    let link = root.parent().unwrap().join("same_place-link");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&root, &link).unwrap();
    assert!(toolkit::same_place(&root.join("bin/nvcc"), &link.join("bin/./nvcc")));
    assert!(toolkit::same_place(&root.join("include/."), &root.join("include")));
    let (other, _) = fake_toolkit("same_place_other");
    assert!(!toolkit::same_place(&root.join("bin/nvcc"), &other.join("bin/nvcc")));
    assert!(!toolkit::same_place(&root.join("missing"), &root.join("missing")));
}

#[test]
fn config_list_refuses_unknown_names() {
    let known = ["Sm90_128x128x64", "Sm100_1sm_128x64x256"];
    assert_eq!(toolkit::config_list(" sm90_128X128x64, ,Sm100_1sm_128x64x256", &known).unwrap(), ["sm90_128x128x64", "sm100_1sm_128x64x256"]);
    let e = toolkit::config_list("Sm90_128x128x64,Sm90_128x128", &known).unwrap_err();
    assert!(e.contains("\"sm90_128x128\"") && e.contains("Sm90_128x128x64"), "{e}");
}

#[test]
fn cache_keeps_objects_a_month_and_temporaries_a_day() {
    let day = std::time::Duration::from_secs(24 * 3600);
    assert!(!cache::stale("bsg_sm90_x-0123abcd.o", 29 * day));
    assert!(cache::stale("bsg_sm90_x-0123abcd.o", 31 * day));
    assert!(!cache::stale("bsg_sm90_x-0123abcd.tmp4242", day / 2));
    assert!(cache::stale("bsg_sm90_x-0123abcd.tmp4242", 2 * day));
    // Nothing else, however old: not a temporary without its pid, nor a stray file.
    for keep in ["bsg_sm90_x-0123abcd.tmp", "bsg_sm90_x-0123abcd.tmpx1", ".tmp12", "notes.txt", "x.o.bak"] {
        assert!(!cache::stale(keep, 400 * day), "{keep}");
    }
}

#[test]
fn cache_upkeep_marks_the_used_and_removes_the_stale() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("build_logic").join("cache");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("sub.o")).unwrap();
    let day = std::time::Duration::from_secs(24 * 3600);
    let now = std::time::SystemTime::now();
    let file = |name: &str, age: std::time::Duration| {
        let p = dir.join(name);
        std::fs::write(&p, b"x").unwrap();
        std::fs::File::options().write(true).open(&p).unwrap().set_modified(now - age).unwrap();
        p
    };
    let used_old = file("used-1.o", 60 * day);
    let unused_old = file("unused-2.o", 60 * day);
    let unused_new = file("unused-3.o", 2 * day);
    let tmp_old = file("killed-4.tmp99", 3 * day);
    let tmp_new = file("running-5.tmp98", std::time::Duration::from_secs(60));
    let other = file("README", 900 * day);
    assert_eq!(cache::upkeep(&dir, &[used_old.as_path()], now), 2);
    assert!(used_old.exists() && unused_new.exists() && tmp_new.exists() && other.exists() && dir.join("sub.o").is_dir());
    assert!(!unused_old.exists() && !tmp_old.exists());
    // The used object was marked used then, so 29 days on it stays while the two younger files
    // unused since then go.
    assert_eq!(cache::upkeep(&dir, &[], now + 29 * day), 2);
    assert!(used_old.exists() && !unused_new.exists() && !tmp_new.exists());
    // A folder that is not there: nothing to do, no error.
    assert_eq!(cache::upkeep(&dir.join("absent"), &[], now), 0);
}

#[test]
fn cache_folders_keep_toolchains_a_month_and_temporaries_a_day() {
    let day = std::time::Duration::from_secs(24 * 3600);
    assert!(!cache::stale_folder("7e8ab433800c0af9", 29 * day));
    assert!(cache::stale_folder("7e8ab433800c0af9", 31 * day));
    assert!(cache::stale_folder("tmpab_12x", 2 * day));
    assert!(!cache::stale_folder("tmpab_12x", day / 2));
    for keep in ["7E8AB433800C0AF9", "7e8ab433800c0af", "7e8ab433800c0af9a", "nvidia", "objects"] {
        assert!(!cache::stale_folder(keep, 400 * day), "{keep}");
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("build_logic").join("toolchains");
    let _ = std::fs::remove_dir_all(&dir);
    let now = std::time::SystemTime::now();
    let folder = |name: &str, age: std::time::Duration| {
        let p = dir.join(name);
        std::fs::create_dir_all(p.join("bin")).unwrap();
        std::fs::write(p.join("bin/nvcc"), b"x").unwrap();
        std::fs::File::open(&p).unwrap().set_modified(now - age).unwrap();
        p
    };
    let mine = folder("0123456789abcdef", 90 * day);
    let old = folder("fedcba9876543210", 90 * day);
    let young = folder("00000000aaaaaaaa", 3 * day);
    let killed = folder("tmpq1w2e3", 3 * day);
    assert_eq!(cache::upkeep_folders(&dir, Some(mine.as_path()), now), 2);
    assert!(mine.join("bin/nvcc").exists() && young.exists() && !old.exists() && !killed.exists());
    assert_eq!(cache::upkeep_folders(&dir, None, now + 29 * day), 1, "mine was marked used, the young one was not");
    assert!(mine.exists() && !young.exists());
}
