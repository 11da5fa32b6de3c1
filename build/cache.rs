//! Upkeep of the object cache (`<cache>/objects`), apart from `build.rs` so that
//! `tests/build_logic.rs` can test it. The objects a build links are marked used (their
//! modification time set to now); objects no build has used for [`KEEP`], and temporary files
//! that a killed nvcc left more than [`TMP_KEEP`] ago, are removed. Builds running at the same
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
