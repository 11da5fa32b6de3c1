#!/usr/bin/env bash
# Prints the pinned CUDA toolkit build.rs fetched: <cache>/toolchain/<first 16 hex digits of the
# sha256 of third_party/pins.txt and fetch.py>/cuda/nvidia/cu13, the folder build.rs names
# (toolchain_dir). Exits 2 where no build has fetched it yet.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${BSG_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/blockscaled-gemm}
cuda=$base/toolchain/$(cat third_party/pins.txt third_party/fetch.py | sha256sum | cut -c1-16)/cuda/nvidia/cu13
[ -x "$cuda/bin/nvcc" ] || { echo "no pinned toolchain at $cuda: a cargo build of the crate fetches it" >&2; exit 2; }
echo "$cuda"
