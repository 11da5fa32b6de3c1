#!/bin/bash
# Product bench (each output checked against the exact reference) on the shapes whose SM90 pick or
# split session 8's cluster splits of 5 to 8 changed: auto (128x256, its new split) vs forced
# 128x128 (its own split). Run from the repo root: bash bundle/rule2.sh
cd bundle
S="--shape 128x4096x7168 --shape 128x4096x16384 --shape 128x2048x7168 --shape 128x2048x4096 --shape 128x1536x7168 --shape 128x3072x1536 --shape 128x1024x4096"
./examples/bench $S > $OUT/rule2-auto.txt 2>&1; echo "auto rc=$?"
./examples/bench $S --config Sm90_128x128x64 > $OUT/rule2-128x128.txt 2>&1; echo "128x128 rc=$?"
tail -9 $OUT/rule2-auto.txt; tail -9 $OUT/rule2-128x128.txt
