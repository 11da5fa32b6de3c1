//! Pure helpers of `build.rs` (std only), kept apart so `tests/build_logic.rs` can test them:
//! where the user's CUDA toolkit is, whether a user path is the pinned toolchain itself, and
//! the `BSG_CONFIGS` list.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// The user's nvcc and CUDA root from `NVCC` / `CUDA_HOME` (`None`: neither set, the pinned
/// wheels build). `NVCC` may be a bare name, looked up in `path` (`PATH`) like a shell does; the
/// root is `CUDA_HOME` where set, else the folder above nvcc's `bin/` (symlinks followed, so
/// `/usr/local/bin/nvcc -> /usr/local/cuda/bin/nvcc` gives `/usr/local/cuda`).
pub fn user_cuda(nvcc: Option<&str>, cuda_home: Option<&str>, path: Option<&OsStr>) -> Result<Option<(PathBuf, PathBuf)>, String> {
    let Some(n) = nvcc else {
        return Ok(cuda_home.map(|h| (Path::new(h).join("bin/nvcc"), PathBuf::from(h))));
    };
    let exe = if n.contains('/') {
        PathBuf::from(n)
    } else {
        path.and_then(|p| std::env::split_paths(p).map(|d| d.join(n)).find(|c| c.is_file()))
            .ok_or_else(|| format!("NVCC={n}: no such program on PATH; give its full path or set CUDA_HOME instead"))?
    };
    if let Some(h) = cuda_home {
        return Ok(Some((exe, PathBuf::from(h))));
    }
    let real = std::fs::canonicalize(&exe).map_err(|e| format!("NVCC={n}: {}: {e}", exe.display()))?;
    let root = real.parent().filter(|b| b.file_name() == Some(OsStr::new("bin"))).and_then(Path::parent)
        .ok_or_else(|| format!("NVCC={n}: {} is not in a toolkit's bin/ folder, so the CUDA root (include/, lib64/) is unknown; set CUDA_HOME too", real.display()))?;
    Ok(Some((exe, root.to_path_buf())))
}

/// Whether `a` and `b` name the same existing file or folder (symlinks and `..` resolved): a
/// `CUDA_HOME` or `CUTLASS_DIR` that is the pinned toolchain's own folder builds the same
/// objects as the pinned wheels, so it takes their cache key.
pub fn same_place(a: &Path, b: &Path) -> bool {
    matches!((std::fs::canonicalize(a), std::fs::canonicalize(b)), (Ok(x), Ok(y)) if x == y)
}

/// `BSG_CONFIGS`: comma list of config names (any case) -> lower-case names, each one of
/// `known`; a name that is none of them is refused (it would build nothing, silently).
pub fn config_list(value: &str, known: &[&str]) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for item in value.split(',').map(|s| s.trim().to_lowercase()).filter(|s| !s.is_empty()) {
        if !known.iter().any(|k| k.to_lowercase() == item) {
            return Err(format!("BSG_CONFIGS: {item:?} is not a config of cpp/configs.def (one of {known:?})"));
        }
        out.push(item);
    }
    Ok(out)
}
