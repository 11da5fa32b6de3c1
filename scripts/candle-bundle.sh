#!/usr/bin/env bash
# Adds the `--features candle` executables (tests/gpu_candle.rs and the candle_linear example) to
# a bundle made by scripts/gpu-bundle.sh, on a machine with no GPU and no CUDA libraries:
#   scripts/candle-bundle.sh DIR       then on the GPU machine: DIR/run.sh candle
# candle links libcuda, cuBLAS, cuRAND and NVRTC when the program loads (cudarc's
# `dynamic-linking`). To link here it takes cuBLAS, cuRAND and NVRTC from their pinned PyPI wheels
# (about 590 MB, cached in <cache>/candle-link) and a libcuda made of empty functions named as
# cudarc's driver bindings name them; nothing of these is carried. On the GPU machine the
# driver's libcuda and the CUDA 13 libraries beside PyTorch (its nvidia/cu13/lib) are loaded.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/candle-bundle.sh DIR (a bundle of scripts/gpu-bundle.sh)}
[ -x "$out/run.sh" ] || { echo "candle-bundle.sh: $out is not a bundle of scripts/gpu-bundle.sh" >&2; exit 2; }
cache=${BSG_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/blockscaled-gemm}/candle-link
mkdir -p "$cache/wheels"
req=$(mktemp)
trap 'rm -f "$req"' EXIT
cat > "$req" <<'PINS'
nvidia-cublas==13.0.2.14 --hash=sha256:0cf238ffdbe46c00cb9aa98e7bca745c223a5ca5a53e686ac8b3e5a08fe80d6c
nvidia-curand==10.4.5.25 --hash=sha256:22bb226a857e5888fe6b54ae465fc4371296bcff13a35f79e19691bcf454f529
nvidia-cuda-nvrtc==13.0.88 --hash=sha256:ad9b6d2ead2435f11cbb6868809d2adeeee302e9bb94bcf0539c7a40d80e8575
PINS
python3 -m pip download --quiet --no-deps --require-hashes --only-binary=:all: \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_12_x86_64 --python-version 3.11 \
  -d "$cache/wheels" -r "$req"
lib="$cache/root/lib"
if [ ! -e "$lib/libcurand.so" ]; then
  rm -rf "$cache/root" "$cache/unpacked"
  for w in "$cache"/wheels/nvidia_cublas-13.0.2.14-*.whl "$cache"/wheels/nvidia_curand-10.4.5.25-*.whl "$cache"/wheels/nvidia_cuda_nvrtc-13.0.88-*.whl; do
    python3 -m zipfile -e "$w" "$cache/unpacked/"
  done
  mkdir -p "$lib.tmp"
  for l in cublas.so.13 cublasLt.so.13 nvrtc.so.13 curand.so.10; do
    ln -s "$cache/unpacked/nvidia/cu13/lib/lib$l" "$lib.tmp/lib${l%%.so*}.so"
  done
  mv "$lib.tmp" "$lib"
fi

# The toolchain build.rs fetched (the newest one) gives candle-kernels its nvcc and cudart.
toolchain=$(ls -td "${BSG_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/blockscaled-gemm}"/toolchain/*/cuda/nvidia/cu13 | head -1)
[ -x "$toolchain/bin/nvcc" ] || { echo "candle-bundle.sh: no toolchain yet: run scripts/gpu-bundle.sh first" >&2; exit 2; }
ln -sf "$toolchain/lib/libcudart.so.13" "$lib/libcudart.so"

# libcuda: one empty function for each driver entry point cudarc binds (the real one is loaded
# on the GPU machine; these only satisfy the linker).
sys=$(cargo metadata --format-version 1 --features candle | python3 -c '
import json, os, sys
m = json.load(sys.stdin)
print(next(os.path.join(os.path.dirname(p["manifest_path"]), "src/driver/sys/mod.rs") for p in m["packages"] if p["name"] == "cudarc"))')
grep -hoE '^\s*fn cu[A-Za-z0-9_]+\(' "$sys" | grep -oE 'cu[A-Za-z0-9_]+' | sort -u | awk '{print "void " $1 "(void) {}"}' > "$cache/libcuda-stub.c"
cc -shared -fPIC -o "$lib/libcuda.so" -Wl,-soname,libcuda.so.1 "$cache/libcuda-stub.c"

export CUDA_HOME=$toolchain CUDA_PATH=$cache/root PATH=$toolchain/bin:$PATH CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
mkdir -p "$out/candle"
msgs=$(mktemp)
trap 'rm -f "$req" "$msgs"' EXIT
cargo test --release --features candle --test gpu_candle --no-run --message-format=json-render-diagnostics > "$msgs"
cargo build --release --features candle --example candle_linear --message-format=json-render-diagnostics >> "$msgs"
python3 - "$msgs" "$out/candle" <<'PY'
import json, shutil, sys
found = set()
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in ("gpu_candle", "candle_linear"):
        shutil.copy(m["executable"], f"{sys.argv[2]}/{m['target']['name']}")
        found.add(m["target"]["name"])
if found != {"gpu_candle", "candle_linear"}:
    sys.exit(f"candle-bundle.sh: cargo built only {sorted(found)}")
PY
strip "$out"/candle/* 2>/dev/null || true
echo "candle-bundle.sh: $out/candle: $(ls "$out/candle" | tr '\n' ' ')"
