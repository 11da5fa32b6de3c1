#!/usr/bin/env bash
# Adds the `--features candle` executables (tests/gpu_candle.rs and the candle_linear example) to
# a bundle made by scripts/gpu-bundle.sh, on a machine with no GPU and no CUDA libraries:
#   scripts/candle-bundle.sh DIR       then on the GPU machine: DIR/run.sh candle
# candle links libcuda, cuBLAS, cuRAND and NVRTC when the program loads (cudarc's
# `dynamic-linking`). To link here it takes cuBLAS, cuRAND and NVRTC from their pinned PyPI wheels
# (about 590 MB, cached in <cache>/candle-link; DIR may be relative to the caller) and a libcuda made of empty functions named as
# cudarc's driver bindings name them; nothing of these is carried. On the GPU machine the
# driver's libcuda and the CUDA 13 libraries beside PyTorch (its nvidia/cu13/lib) are loaded.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: scripts/candle-bundle.sh DIR (a bundle of scripts/gpu-bundle.sh)" >&2; exit 2; }
out=$(realpath -- "$1")
cd "$(dirname "$0")/.."
[ -x "$out/run.sh" ] || { echo "candle-bundle.sh: $out is not a bundle of scripts/gpu-bundle.sh" >&2; exit 2; }
base=${BSG_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/blockscaled-gemm}
cache=$base/candle-link
mkdir -p "$cache/wheels"
pins='nvidia-cublas==13.0.2.14 --hash=sha256:0cf238ffdbe46c00cb9aa98e7bca745c223a5ca5a53e686ac8b3e5a08fe80d6c
nvidia-curand==10.4.5.25 --hash=sha256:22bb226a857e5888fe6b54ae465fc4371296bcff13a35f79e19691bcf454f529
nvidia-cuda-nvrtc==13.0.88 --hash=sha256:ad9b6d2ead2435f11cbb6868809d2adeeee302e9bb94bcf0539c7a40d80e8575'
# The wheels, from the cache when every pinned one is there with its hash, else through pip.
have=$(PINS=$pins python3 - "$cache/wheels" <<'PY'
import glob, hashlib, os, sys
ok = True
for line in os.environ["PINS"].splitlines():
    spec, sha = line.split(" --hash=sha256:")
    name, version = spec.split("==")
    found = glob.glob(os.path.join(sys.argv[1], name.replace("-", "_") + "-" + version + "-*.whl"))
    ok &= any(hashlib.sha256(open(f, "rb").read()).hexdigest() == sha for f in found)
print("yes" if ok else "no")
PY
)
if [ "$have" != yes ]; then
  req=$(mktemp)
  printf '%s\n' "$pins" > "$req"
  python3 -m pip download --quiet --no-deps --require-hashes --only-binary=:all: \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_12_x86_64 --python-version 3.11 \
    -d "$cache/wheels" -r "$req"
  rm -f "$req"
fi
# Unpacked into a folder named by the pins, which appears whole (renamed into place) or not at all.
key=$(printf '%s' "$pins" | sha256sum | cut -c1-16)
root=$cache/root-$key
lib=$root/lib
if [ ! -d "$root" ]; then
  rm -rf "$root.tmp"
  for w in "$cache"/wheels/nvidia_cublas-13.0.2.14-*.whl "$cache"/wheels/nvidia_curand-10.4.5.25-*.whl "$cache"/wheels/nvidia_cuda_nvrtc-13.0.88-*.whl; do
    python3 -m zipfile -e "$w" "$root.tmp/unpacked/"
  done
  mkdir -p "$root.tmp/lib"
  for l in cublas.so.13 cublasLt.so.13 nvrtc.so.13 curand.so.10; do
    [ -e "$root.tmp/unpacked/nvidia/cu13/lib/lib$l" ] || { echo "candle-bundle.sh: lib$l is not in the pinned wheels" >&2; exit 1; }
    ln -s "$root/unpacked/nvidia/cu13/lib/lib$l" "$root.tmp/lib/lib${l%%.so*}.so"
  done
  mv "$root.tmp" "$root"
fi

# The pinned toolchain build.rs fetched gives candle-kernels its nvcc and cudart; CUDA_HOME set
# to it keeps build.rs on the pinned objects.
toolchain=$(scripts/pinned-cuda.sh) || { echo "candle-bundle.sh: run scripts/gpu-bundle.sh first" >&2; exit 2; }
ln -sf "$toolchain/lib/libcudart.so.13" "$lib/libcudart.so"

# libcuda: one empty function for each driver entry point cudarc binds (the real one is loaded
# on the GPU machine; these only satisfy the linker).
sys=$(cargo metadata --format-version 1 --features candle | python3 -c '
import json, os, sys
m = json.load(sys.stdin)
print(next(os.path.join(os.path.dirname(p["manifest_path"]), "src/driver/sys/mod.rs") for p in m["packages"] if p["name"] == "cudarc"))')
grep -hoE '^\s*fn cu[A-Za-z0-9_]+\(' "$sys" | grep -oE 'cu[A-Za-z0-9_]+' | sort -u | awk '{print "void " $1 "(void) {}"}' > "$cache/libcuda-stub.c"
cc -shared -fPIC -o "$lib/libcuda.so" -Wl,-soname,libcuda.so.1 "$cache/libcuda-stub.c"

export CUDA_HOME=$toolchain CUDA_PATH=$root PATH=$toolchain/bin:$PATH CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
mkdir -p "$out/candle"
msgs=$(mktemp)
trap 'rm -f "$msgs"' EXIT
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
