//! Upkeep of the cache (`<cache>/objects`, `toolchain`, `wheels`), apart from `build.rs` so that
//! `tests/build_logic.rs` can test it. The objects a build links, and the toolchain it takes, are
//! marked used (their modification time set to now); objects and toolchains no build has used
//! for [`KEEP`], and temporary files and folders that a killed nvcc or fetch.py left more than
//! [`TMP_KEEP`] ago, are removed. Downloaded wheels stay. Builds running at the same
//! time are safe: an object goes only after weeks unused, and nvcc writes under a temporary name
//! that is renamed whole.

use std::path::Path;
use std::time::{Duration, SystemTime};

/// How long an object no build has used stays in the cache.
pub const KEEP: Duration = Duration::from_secs(30 * 24 * 3600);
/// How long a temporary object stays (no nvcc run takes that long).
pub const TMP_KEEP: Duration = Duration::from_secs(24 * 3600);

/// Whether a file of the object cache named `name`, last modified `age` ago, goes: an object
/// (`*.o`) after [`KEEP`], nvcc's temporary output (`*.tmp<pid>`) after [`TMP_KEEP`], nothing
/// else ever.
pub fn stale(name: &str, age: Duration) -> bool {
    let tmp = name.rsplit_once(".tmp").is_some_and(|(stem, pid)| !stem.is_empty() && !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()));
    if name.ends_with(".o") {
        age > KEEP
    } else if tmp {
        age > TMP_KEEP
    } else {
        false
    }
}

/// Marks the objects `used` as used at `now` and removes the stale files of `dir` (not its
/// folders); returns how many went. Errors are passed over: upkeep never fails a build.
pub fn upkeep(dir: &Path, used: &[&Path], now: SystemTime) -> usize {
    for o in used {
        if let Ok(f) = std::fs::File::options().write(true).open(o) {
            let _ = f.set_modified(now);
        }
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let mut gone = 0;
    for e in entries.flatten() {
        let Ok(meta) = e.metadata() else { continue };
        let age = meta.modified().ok().and_then(|m| now.duration_since(m).ok()).unwrap_or_default();
        let name = e.file_name();
        if meta.is_file() && name.to_str().is_some_and(|n| stale(n, age)) && std::fs::remove_file(e.path()).is_ok() {
            gone += 1;
        }
    }
    gone
}

/// Whether a folder of `<cache>/toolchain` or `<cache>/wheels` named `name`, last modified `age`
/// ago, goes: an unpacked toolchain (16 hex digits, the hash of its pins and fetch script) after
/// [`KEEP`] unused, fetch.py's and pip's temporary folders (`tmp*`, left by a killed fetch) after
/// [`TMP_KEEP`], nothing else ever.
pub fn stale_folder(name: &str, age: Duration) -> bool {
    if name.len() == 16 && name.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        age > KEEP
    } else if name.starts_with("tmp") {
        age > TMP_KEEP
    } else {
        false
    }
}

/// Marks the folder `used` (a toolchain this build takes) as used at `now`, then removes the
/// stale folders of `parent` (`stale_folder`); returns how many went. A build marks its own
/// toolchain before it removes others', so only a toolchain no build has taken for [`KEEP`] can
/// go. Errors are passed over.
pub fn upkeep_folders(parent: &Path, used: Option<&Path>, now: SystemTime) -> usize {
    if let Some(Ok(f)) = used.map(std::fs::File::open) {
        let _ = f.set_modified(now);
    }
    let Ok(entries) = std::fs::read_dir(parent) else { return 0 };
    let mut gone = 0;
    for e in entries.flatten() {
        let Ok(meta) = e.metadata() else { continue };
        let age = meta.modified().ok().and_then(|m| now.duration_since(m).ok()).unwrap_or_default();
        let name = e.file_name();
        let mine = used.is_some_and(|u| u.file_name() == Some(name.as_os_str()));
        if meta.is_dir() && !mine && name.to_str().is_some_and(|n| stale_folder(n, age)) && std::fs::remove_dir_all(e.path()).is_ok() {
            gone += 1;
        }
    }
    gone
}
