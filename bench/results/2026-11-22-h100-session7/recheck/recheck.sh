#!/bin/bash
# GPU tests and the changed picks at the final commit (config rule only changed since final/).
cd bundle
./run.sh tests > $OUT/tests.txt 2>&1; echo "tests rc=$?"; grep -E "^gpu:|FAILED|panicked" $OUT/tests.txt
./examples/bench --shape 256x4096x7168 --shape 1024x1024x8192 --shape 128x10240x8192 --shape 128x8192x16384 > $OUT/picks.txt 2>&1; echo "bench rc=$?"; tail -5 $OUT/picks.txt
