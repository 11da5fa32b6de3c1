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
# A tree with uncommitted changes is labelled as such, so that no result names a commit it did not run.
export BSG_COMMIT=$(git rev-parse --short HEAD)$([ -z "$(git status --porcelain -- build.rs build Cargo.toml Cargo.lock cpp include src examples tests bench scripts)" ] || echo -dirty)
# The executables where cargo says it put them (CARGO_TARGET_DIR or a config's target-dir move
# them from target/), from its JSON messages; its errors still reach the terminal.
msgs=$(mktemp)
trap 'rm -f "$msgs"' EXIT
executables() {  # test|example: "name path" of each executable of that kind in $msgs
  python3 - "$1" "$msgs" <<'PY'
import json, sys
want, path = sys.argv[1], sys.argv[2]
for line in open(path):
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    if m["profile"]["test"] if want == "test" else (not m["profile"]["test"] and want in m["target"]["kind"]):
        print(m["target"]["name"], m["executable"])
PY
}
cargo build --release --examples --message-format=json-render-diagnostics > "$msgs"
executables example > "$msgs.examples"
for ex in nvfp4_gemm bench; do
  exe=$(awk -v n="$ex" '$1 == n { print $2 }' "$msgs.examples")
  [ -n "$exe" ] || { echo "gpu-bundle.sh: cargo built no example $ex" >&2; exit 1; }
  cp "$exe" "$out/examples/"
done
rm -f "$msgs.examples"
# Test executables; example_cli finds the example at ../examples/ beside its own folder.
cargo test --release --no-run --message-format=json-render-diagnostics > "$msgs"
executables test | while read -r name exe; do
  case "$name" in
    cutlass_host|coexist|build_logic) ;;  # need the build tree (cuobjdump, kernel objects, cargo, its tmp dir): CI runs them
    *) cp "$exe" "$out/deps/$name" ;;
  esac
done
# The sanitizer canary (run.sh sanitize runs it first), with the nvcc build.rs fetched.
nvcc=$(scripts/pinned-cuda.sh)/bin/nvcc
"$nvcc" -O1 -arch=sm_90 -cudart static -L "$(dirname "$nvcc")/../lib" -o "$out/sanitizer-canary" scripts/sanitizer-canary.cu
strip "$out"/deps/* "$out"/examples/* 2>/dev/null || true
cp bench/baselines.py bench/report.py "$out/"
cat > "$out/run.sh" <<'RUN'
#!/usr/bin/env bash
# What to run: tests (default), sanitize [TOOL] [TEST...], example [ARGS], bench [ARGS], candle [TEST...].
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
case "${1:-tests}" in
  tests)
    rc=0
    for t in "$here"/deps/*; do echo "== $(basename "$t")"; "$t" || rc=1; done
    exit $rc ;;
  sanitize)
    # sanitize [memcheck|racecheck|synccheck|all] [TEST...]: by default all three tools over every
    # SM90 config (small-M ones too), split-K path and output type, FP4 outputs included (small
    # shapes), the captured graph replayed with new data, the grouped kernels and prepacked weights;
    # a tool or GPU tests (names or parts of names, as deps/gpu takes them) narrow it, since the
    # three together take longer than many GPU sessions allow.
    shift
    tools="memcheck racecheck synccheck"
    case "${1:-all}" in
      all) [ $# -gt 0 ] && shift ;;
      memcheck|racecheck|synccheck) tools=$1; shift ;;
      *) echo "run.sh sanitize: unknown tool ${1:-} (memcheck, racecheck, synccheck or all)" >&2; exit 2 ;;
    esac
    [ $# -gt 0 ] || set -- sm90_every_config sm90_split_k sm90_small_m sm90_extreme fp4_output_exact fp4_output_chains quantized_tensors swiglu_quantizer decoded_activations graph_capture grouped_moe grouped_list w4a16 prepacked_weights_transforms
    rc=0
    for tool in $tools; do
      # A tool that misses a planted defect would report the crate's kernels clean too.
      case $tool in memcheck) plant=oob ;; racecheck) plant=race ;; synccheck) plant=sync ;; esac
      compute-sanitizer --tool $tool --error-exitcode 9 "$here/sanitizer-canary" $plant > /dev/null 2>&1
      if [ $? != 9 ]; then
        echo "run.sh sanitize: compute-sanitizer --tool $tool did not report the planted defect ($plant): its results here would mean nothing" >&2
        exit 3
      fi
      echo "== compute-sanitizer --tool $tool $* (it reported the planted $plant defect)"
      compute-sanitizer --tool $tool --error-exitcode 9 "$here/deps/gpu" "$@" || rc=1
    done
    exit $rc ;;
  example) shift; exec "$here/examples/nvfp4_gemm" "$@" ;;
  candle)
    # candle [TEST...]: the candle layer's GPU tests, then its example, where
    # scripts/candle-bundle.sh added them; CUDA 13's cuBLAS and cuRAND are PyTorch's.
    shift
    [ -d "$here/candle" ] || { echo "run.sh candle: no candle executables here (scripts/candle-bundle.sh adds them)" >&2; exit 2; }
    # Every folder beside python3's packages (site and user) that holds them, in its search order.
    libs=$(python3 - <<'PY' 2>/dev/null
import glob, os, site
dirs = []
for p in list(site.getsitepackages()) + [site.getusersitepackages()]:
    for lib in ("libcublas.so.13", "libcurand.so.10"):
        for f in sorted(glob.glob(os.path.join(p, "nvidia", "**", lib), recursive=True)):
            if os.path.dirname(f) not in dirs:
                dirs.append(os.path.dirname(f))
print(":".join(dirs))
PY
)
    [ -n "$libs" ] || { echo "run.sh candle: no CUDA 13 cuBLAS / cuRAND beside python3's packages" >&2; exit 2; }
    export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    rc=0
    log=$(mktemp)
    "$here/candle/gpu_candle" "$@" | tee "$log"
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
    # A filter that matched nothing, or every case skipped, has checked nothing.
    grep -q '^gpu_candle: [1-9][0-9]* passed' "$log" || { echo "run.sh candle: no case passed" >&2; rc=1; }
    rm -f "$log"
    if [ $# = 0 ]; then
      for mode in w4a16 nvfp4; do "$here/candle/candle_linear" --mode $mode --m 16 --experts 8 --iterations 50 || rc=1; done
    fi
    exit $rc ;;
  bench)
    # bench [ARGS]: cuBLAS baselines (graph-replayed, when PyTorch is present) and this crate, in
    # one run; results as <date>-<gpu>-<commit>.jsonl with its plot, in $OUT (or /tmp).
    shift
    dir=${OUT:-/tmp}
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE 'h100|h200|b200|gb200' | head -1 | tr A-Z a-z)
    name="$(date +%F)-${gpu:-gpu}-$(cat "$here/COMMIT")"
    # The baselines time what the bench will: its --shape list (else the default shapes), the
    # GEMM and W4A16 rows unless --no-gemm / --no-w4a16 skip them, and its --grouped cases.
    shapes=() gemm=1 w4a16=1 prev=""
    for a in "$@"; do
      case "$prev:$a" in
        --shape:*) shapes+=(--shape "$a") ;;
        *:--shape=*) shapes+=(--shape "${a#--shape=}") ;;
        *:--no-gemm) gemm=0 ;;
        *:--no-w4a16) w4a16=0 ;;
      esac
      prev=$a
    done
    # The bench checks its arguments first, so a bad one stops here (its exit status) and not after
    # minutes of baselines; the grouped cases come from it too, with this run's arguments (one
    # routing for both sides, the --grouped selection).
    cases="$dir/$name-grouped-cases.json"
    "$here/examples/bench" "$@" --emit-grouped-cases "$cases" || exit
    base=""
    if python3 -c 'import torch' 2>/dev/null; then
      if [ $gemm = 1 ]; then
        python3 "$here/baselines.py" ${shapes[@]+"${shapes[@]}"} --out "$dir/$name-baselines.json" && base="--baselines $dir/$name-baselines.json"
        if [ $w4a16 = 1 ]; then
          python3 "$here/baselines.py" --op w4a16 ${shapes[@]+"${shapes[@]}"} --out "$dir/$name-w4a16-baselines.json" && base="$base --w4a16-baselines $dir/$name-w4a16-baselines.json"
        fi
      fi
      if [ "$(tr -d ' \n' < "$cases")" != "{}" ]; then
        python3 "$here/baselines.py" --op grouped --grouped-cases "$cases" --out "$dir/$name-grouped-baselines.json" &&
          base="$base --grouped-baselines $dir/$name-grouped-baselines.json"
      fi
    fi
    "$here/examples/bench" $base --json "$dir/$name.jsonl" "$@" || exit 1
    python3 "$here/report.py" "$dir/$name.jsonl" --png "$dir/$name.png" || true ;;
  *) echo "usage: run.sh [tests|sanitize [TOOL] [TEST...]|example ARGS|bench ARGS|candle [TEST...]]" >&2; exit 2 ;;
esac
RUN
chmod +x "$out/run.sh"
echo "$BSG_COMMIT" > "$out/COMMIT"
du -sh "$out"
