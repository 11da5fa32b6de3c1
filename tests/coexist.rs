//! Issue 22: an engine built on candle must be able to depend on this crate. candle-core 0.11
//! turns on cudarc's `dynamic-linking` and `cuda-version-from-build-system`; this crate's
//! `fallback-dynamic-loading` gives way to the first, and with `default-features = false` it
//! leaves the CUDA version to the second. `tests/coexist/` is such a crate; it must `cargo
//! check`, with the CUDA version read from nvcc (the pinned 13.0 on PATH, as an engine's machine
//! has its toolkit) and with a CUDA 12.8 host (`CUDARC_CUDA_VERSION=12080`).

use std::path::{Path, PathBuf};
use std::process::Command;

fn check(cuda_version: Option<&str>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // target/<profile>/deps/coexist-<hash> -> target: share the build dependencies already built.
    let target: PathBuf = std::env::current_exe().unwrap().ancestors().nth(3).unwrap().to_path_buf();
    let nvcc = Path::new(env!("BSG_NVCC"));
    let mut path = nvcc.parent().map(Path::to_path_buf).into_iter().collect::<Vec<_>>();
    path.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()));
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["check", "--quiet", "--locked", "--manifest-path"]).arg(root.join("tests/coexist/Cargo.toml")).arg("--target-dir").arg(&target)
        .env("PATH", std::env::join_paths(path).unwrap()).env_remove("CUDARC_CUDA_VERSION");
    if let Some(v) = cuda_version {
        cmd.env("CUDARC_CUDA_VERSION", v);
    }
    let out = cmd.output().expect("run cargo");
    assert!(out.status.success(), "cargo check of tests/coexist (CUDA {cuda_version:?}) failed:\n{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn builds_in_one_tree_with_candles_cudarc_features() {
    check(None);
    check(Some("12080"));
}
