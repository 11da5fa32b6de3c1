#!/bin/bash
# Session 11 check of the last code (72af55c: kernels as 8af9438, the tile rule at 677 clocks)
# on the H100 with the bundle (scripts/gpu-bundle.sh .devbin/fin) carried: GPU tests, the SPEC
# shapes (f16, cuBLAS in the same run), moved shapes through the rule's own pick.
mkdir -p /tmp/o; REAL_OUT=$OUT; OUT=/tmp/o
cd ${BUNDLE:-.devbin/fin}
./run.sh tests > $OUT/tests.txt 2>&1; echo "tests rc=$?" | tee -a $OUT/tests.txt
grep -E "^gpu:|test result|FAILED|panicked" $OUT/tests.txt | tail -8
OUT=$OUT ./run.sh bench > $OUT/bench-f16.txt 2>&1; echo "bench rc=$?"
./examples/bench --shape 384x24576x4096 --shape 128x16384x7168 --shape 640x7168x1024 --shape 128x7168x8192 > $OUT/moved.txt 2>&1; echo "moved rc=$?"
tail -7 $OUT/bench-f16.txt; tail -5 $OUT/moved.txt
tar czf $REAL_OUT/final3.tgz -C /tmp o
