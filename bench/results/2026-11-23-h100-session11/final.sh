#!/bin/bash
# Session 11 check of 820bbd9 (the landed code; this session's kernel variants were not kept) on
# the H100, from the repository root with the bundle (scripts/gpu-bundle.sh .devbin/base) carried:
# GPU tests, compute-sanitizer memcheck, racecheck, synccheck, the SPEC shapes (f16 with cuBLAS in
# the same run, nvfp4 output), the example at 8192^3. Outputs tarred (at most 8 files come back).
mkdir -p /tmp/o; REAL_OUT=$OUT; OUT=/tmp/o
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
cd ${BUNDLE:-.devbin/base}
./run.sh tests > $OUT/tests.txt 2>&1; echo "tests rc=$?" | tee -a $OUT/tests.txt
grep -E "^gpu:|passed, .* failed|test result|FAILED|panicked" $OUT/tests.txt | tail -8
{ ./run.sh sanitize; echo "memcheck+racecheck rc=$?"; compute-sanitizer --tool synccheck --error-exitcode 9 ./deps/gpu sm90_split_k sm90_every_config; echo "synccheck rc=$?"; } > $OUT/sanitize.txt 2>&1
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=" $OUT/sanitize.txt
OUT=$OUT ./run.sh bench > $OUT/bench-f16.txt 2>&1; echo "bench rc=$?"
./examples/bench --out nvfp4 --baselines $OUT/torch-baselines.json > $OUT/bench-nvfp4.txt 2>&1; echo "bench nvfp4 rc=$?"
./run.sh example --m 8192 --n 8192 --k 8192 --iterations 20 > $OUT/example.txt 2>&1; echo "example rc=$?"; tail -4 $OUT/example.txt
tail -8 $OUT/bench-f16.txt; tail -7 $OUT/bench-nvfp4.txt
tar czf $REAL_OUT/final.tgz -C /tmp o
