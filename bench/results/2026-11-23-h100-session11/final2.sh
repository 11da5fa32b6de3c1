#!/bin/bash
# Session 11 check of the swapped 128x128's scale change (Tile::kWScaleLow) on the H100, from the
# repository root with the bundle (scripts/gpu-bundle.sh .devbin/new, plus the previous bundle's
# bench as .devbin/new/prev/bench) carried: GPU tests, memcheck, racecheck, synccheck, the
# product bench of the previous and this bundle alternating at the shapes the rule gives the
# swapped 128x128, the SPEC shapes (f16 with cuBLAS in the same run, nvfp4), the example.
mkdir -p /tmp/o; REAL_OUT=$OUT; OUT=/tmp/o
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
cd ${BUNDLE:-.devbin/new}
./run.sh tests > $OUT/tests.txt 2>&1; echo "tests rc=$?" | tee -a $OUT/tests.txt
grep -E "^gpu:|test result|FAILED|panicked" $OUT/tests.txt | tail -8
{ ./run.sh sanitize; echo "memcheck+racecheck rc=$?"; compute-sanitizer --tool synccheck --error-exitcode 9 ./deps/gpu sm90_split_k sm90_every_config; echo "synccheck rc=$?"; } > $OUT/sanitize.txt 2>&1
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=" $OUT/sanitize.txt
S=""; for s in 128x4096x7168 128x7168x2048 128x8192x16384 128x2048x7168 128x1536x7168 128x3072x1536 128x16384x4096; do S="$S --shape $s"; done
for rep in 1 2 3; do
  ./prev/bench $S >> $OUT/ab.txt 2>&1; echo "prev rc=$?"
  ./examples/bench $S >> $OUT/ab.txt 2>&1; echo "new rc=$?"
done
OUT=$OUT ./run.sh bench > $OUT/bench-f16.txt 2>&1; echo "bench rc=$?"
./examples/bench --out nvfp4 --baselines $OUT/torch-baselines.json > $OUT/bench-nvfp4.txt 2>&1; echo "bench nvfp4 rc=$?"
./run.sh example --m 8192 --n 8192 --k 8192 --iterations 20 > $OUT/example.txt 2>&1; echo "example rc=$?"; tail -4 $OUT/example.txt
grep -E "Swapped|MxNxK" $OUT/ab.txt
tail -8 $OUT/bench-f16.txt; tail -7 $OUT/bench-nvfp4.txt
tar czf $REAL_OUT/final2.tgz -C /tmp o
