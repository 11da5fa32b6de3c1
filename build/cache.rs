//! Upkeep of the cache, apart from `build.rs` so that `tests/build_logic.rs` can test it: the
//! temporary output a killed build left behind is removed once it is older than [`TMP_KEEP`]
//! (no run of nvcc or fetch.py takes that long): nvcc's `<stem>-<24 hex>.tmp<pid>` in
//! `<cache>/objects`, and fetch.py's `bsg-fetch-*` folders in `<cache>/toolchain` and
//! `<cache>/wheels`. Nothing else is ever removed: objects and toolchains stay until the user
//! deletes the cache folder (the next build fills it again), since no build can know that
//! another, of another checkout, will not link an old object or take an old toolchain.

use std::path::Path;
use std::time::{Duration, SystemTime};

/// How long a temporary file or folder stays.
pub const TMP_KEEP: Duration = Duration::from_secs(24 * 3600);

/// Whether `name` is nvcc's temporary output as `build.rs` names it: `<stem>-<24 hex>.tmp<pid>`.
pub fn is_nvcc_temporary(name: &str) -> bool {
    let Some((object, pid)) = name.rsplit_once(".tmp") else { return false };
    let Some((stem, key)) = object.rsplit_once('-') else { return false };
    !stem.is_empty()
        && key.len() == 24
        && key.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        && !pid.is_empty()
        && pid.bytes().all(|b| b.is_ascii_digit())
}

/// Whether `name` is a temporary folder of fetch.py's (`bsg-fetch-*`).
pub fn is_fetch_temporary(name: &str) -> bool {
    name.len() > "bsg-fetch-".len() && name.starts_with("bsg-fetch-")
}

/// Removes from `dir` the entries whose name `temporary` accepts and which are older than
/// [`TMP_KEEP`] at `now` (files or folders, never following a link); returns how many went.
/// Errors are passed over: upkeep never fails a build.
pub fn remove_temporaries(dir: &Path, temporary: impl Fn(&str) -> bool, now: SystemTime) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let mut gone = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        if !name.to_str().is_some_and(&temporary) {
            continue;
        }
        // The entry itself, not a link's target.
        let Ok(meta) = std::fs::symlink_metadata(e.path()) else { continue };
        let age = meta.modified().ok().and_then(|m| now.duration_since(m).ok()).unwrap_or_default();
        if age <= TMP_KEEP {
            continue;
        }
        let removed = if meta.is_dir() { std::fs::remove_dir_all(e.path()) } else if meta.is_file() { std::fs::remove_file(e.path()) } else { continue };
        gone += usize::from(removed.is_ok());
    }
    gone
}
