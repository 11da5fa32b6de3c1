#!/bin/bash
# Final check of this session's kernel: tests, sanitizers (memcheck, racecheck, synccheck), bench (f16, nvfp4), example.
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
cd bundle
./run.sh tests > $OUT/tests.txt 2>&1; echo "tests rc=$?" | tee -a $OUT/tests.txt
grep -E "^gpu:|test result|FAILED|panicked" $OUT/tests.txt | tail -6
{ ./run.sh sanitize; echo "memcheck+racecheck rc=$?"; compute-sanitizer --tool synccheck --error-exitcode 9 ./deps/gpu sm90_split_k sm90_every_config; echo "synccheck rc=$?"; } > $OUT/sanitize.txt 2>&1
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=" $OUT/sanitize.txt
OUT=$OUT ./run.sh bench > $OUT/bench-f16.txt 2>&1; echo "bench rc=$?"
./examples/bench --out nvfp4 --baselines $OUT/torch-baselines.json > $OUT/bench-nvfp4.txt 2>&1; echo "bench nvfp4 rc=$?"
./run.sh example --m 8192 --n 8192 --k 8192 --iterations 20 > $OUT/example.txt 2>&1; echo "example rc=$?"; tail -4 $OUT/example.txt
tail -8 $OUT/bench-f16.txt; tail -7 $OUT/bench-nvfp4.txt
