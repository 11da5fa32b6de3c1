#!/bin/bash
# Session 10 check of the last commit (8e79b12) on the H100; outputs tarred (final.sh lost four files).
# Session 10 check on the H100 (run from the repository root with bundle/ carried): tests,
# sanitizers (memcheck, racecheck, synccheck), the tile rule against 128x256 forced at M <= 128
# (twice, alternating), the SPEC shapes (f16 with cuBLAS, nvfp4), the example.
mkdir -p /tmp/o; REAL_OUT=$OUT; OUT=/tmp/o
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
cd bundle
./run.sh tests > $OUT/tests.txt 2>&1; echo "tests rc=$?" | tee -a $OUT/tests.txt
grep -E "^gpu:|test result|FAILED|panicked" $OUT/tests.txt | tail -6
{ ./run.sh sanitize; echo "memcheck+racecheck rc=$?"; compute-sanitizer --tool synccheck --error-exitcode 9 ./deps/gpu sm90_split_k sm90_every_config; echo "synccheck rc=$?"; } > $OUT/sanitize.txt 2>&1
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=" $OUT/sanitize.txt
S=""; for s in 128x7168x16384 128x4096x7168 128x7168x2048 128x2048x7168 128x1536x7168 128x3072x1536 128x7168x512 128x8192x16384 128x7168x4096 128x7168x8192 128x4096x16384 128x1024x4096 128x2048x4096 128x16384x4096 64x7168x2048; do S="$S --shape $s"; done
for rep in 1 2; do
  ./examples/bench $S > $OUT/rule-$rep.txt 2>&1; echo "rule rc=$?"
  ./examples/bench $S --config Sm90_128x256x64 > $OUT/wide-$rep.txt 2>&1; echo "wide rc=$?"
done
./examples/bench --shape 128x1024x4096 --shape 128x2048x4096 --shape 128x16384x4096 --config Sm90_128x128x64 > $OUT/unswapped.txt 2>&1; echo "unswapped rc=$?"
OUT=$OUT ./run.sh bench > $OUT/bench-f16.txt 2>&1; echo "bench rc=$?"
./examples/bench --out nvfp4 --baselines $OUT/torch-baselines.json > $OUT/bench-nvfp4.txt 2>&1; echo "bench nvfp4 rc=$?"
./run.sh example --m 8192 --n 8192 --k 8192 --iterations 20 > $OUT/example.txt 2>&1; echo "example rc=$?"; tail -4 $OUT/example.txt
tail -8 $OUT/bench-f16.txt; tail -7 $OUT/bench-nvfp4.txt
tar czf $REAL_OUT/final2.tgz -C /tmp o
