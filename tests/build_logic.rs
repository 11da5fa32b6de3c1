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
fn cache_temporaries_are_named_as_build_rs_and_fetch_py_name_them() {
    assert!(cache::is_nvcc_temporary("bsg_sm90_stream_8x64x64-0123456789abcdef01234567.tmp4242"));
    for not in [
        "bsg_sm90_stream_8x64x64-0123456789abcdef01234567.o",
        "bsg_sm90_stream_8x64x64-0123456789abcdef01234567.tmp",
        "bsg_sm90_stream_8x64x64-0123456789abcdef0123456.tmp12",
        "bsg_sm90_stream_8x64x64-0123456789ABCDEF01234567.tmp12",
        "-0123456789abcdef01234567.tmp12",
        "notes.tmp12",
        "x-0123456789abcdef01234567.tmp1x",
    ] {
        assert!(!cache::is_nvcc_temporary(not), "{not}");
    }
    assert!(cache::is_fetch_temporary("bsg-fetch-k2j4_x"));
    for not in ["bsg-fetch-", "tmpk2j4_x", "7e8ab433800c0af9", "nvidia"] {
        assert!(!cache::is_fetch_temporary(not), "{not}");
    }
}

#[test]
fn cache_upkeep_removes_old_temporaries_only() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("build_logic-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let day = std::time::Duration::from_secs(24 * 3600);
    let now = std::time::SystemTime::now();
    let age = |p: &std::path::Path, by: std::time::Duration| std::fs::File::open(p).unwrap().set_modified(now - by).unwrap();
    let file = |name: &str, by: std::time::Duration| {
        let p = dir.join(name);
        std::fs::write(&p, b"x").unwrap();
        age(&p, by);
        p
    };
    let killed = file("bsg_x-0123456789abcdef01234567.tmp99", 2 * day);
    let running = file("bsg_x-0123456789abcdef01234567.tmp98", std::time::Duration::from_secs(60));
    let object = file("bsg_x-0123456789abcdef01234567.o", 900 * day);
    let other = file("notes.tmp12", 900 * day);
    let fetch_old = dir.join("bsg-fetch-abc");
    std::fs::create_dir_all(fetch_old.join("wheels")).unwrap();
    age(&fetch_old, 2 * day);
    let fetch_new = dir.join("bsg-fetch-def");
    std::fs::create_dir_all(&fetch_new).unwrap();
    assert_eq!(cache::remove_temporaries(&dir, cache::is_nvcc_temporary, now), 1);
    assert!(!killed.exists() && running.exists() && object.exists() && other.exists() && fetch_old.exists());
    assert_eq!(cache::remove_temporaries(&dir, cache::is_fetch_temporary, now), 1);
    assert!(!fetch_old.exists() && fetch_new.exists() && object.exists());
    // A folder that is not there: nothing to do, no error.
    assert_eq!(cache::remove_temporaries(&dir.join("absent"), cache::is_nvcc_temporary, now), 0);
    std::fs::remove_dir_all(&dir).unwrap();
}
