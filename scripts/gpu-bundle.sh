#!/usr/bin/env bash
# Builds, on a machine without a GPU, one folder that runs on a machine with an NVIDIA driver and
# no Rust toolchain: the GPU and CPU test binaries, the example, the benchmark and a runner.
# cudart is linked statically and libcuda is loaded at run time, so the folder needs nothing else.
#   scripts/gpu-bundle.sh [DIR]      (default: bundle/)     then on the GPU machine: DIR/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bundle}
rm -rf "$out"
mkdir -p "$out/deps" "$out/examples"
cargo build --release --examples
# Test executables; example_cli finds the example at ../examples/ beside its own folder.
cargo test --release --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["target"]["name"], m["executable"])
' | while read -r name exe; do
  case "$name" in
    cutlass_host) ;;  # needs the build tree (cuobjdump, kernel objects): CI runs it
    *) cp "$exe" "$out/deps/$name" ;;
  esac
done
for ex in nvfp4_gemm bench; do cp "target/release/examples/$ex" "$out/examples/"; done
strip "$out"/deps/* "$out"/examples/* 2>/dev/null || true
cp bench/torch_baselines.py "$out/"
cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# What to run: tests (default), sanitize, example [ARGS], bench [ARGS].
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
case "${1:-tests}" in
  tests)
    rc=0
    for t in "$here"/deps/*; do echo "== $(basename "$t")"; "$t" || rc=1; done
    exit $rc ;;
  sanitize)
    # memcheck and racecheck over every SM90 config, split-K path and output type, FP4 outputs
    # included (small shapes).
    rc=0
    for tool in memcheck racecheck; do
      compute-sanitizer --tool $tool --error-exitcode 9 "$here/deps/gpu" sm90_every_config sm90_split_k sm90_extreme fp4_output_exact fp4_output_chains || rc=1
    done
    exit $rc ;;
  example) shift; exec "$here/examples/nvfp4_gemm" "$@" ;;
  bench)
    shift
    base=""
    if python3 -c 'import torch' 2>/dev/null; then
      python3 "$here/torch_baselines.py" "${OUT:-/tmp}/torch-baselines.json" && base="--baselines ${OUT:-/tmp}/torch-baselines.json"
    fi
    exec "$here/examples/bench" $base "$@" ;;
  *) echo "usage: run.sh [tests|sanitize|example ARGS|bench ARGS]" >&2; exit 2 ;;
esac
RUN
chmod +x "$out/run.sh"
du -sh "$out"
