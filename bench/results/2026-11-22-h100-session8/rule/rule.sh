#!/bin/bash
# Product bench (each output checked against the exact reference) on the shapes whose SM90 pick
# session 8's rule changed (128x256 from a third of the SMs, cluster-lowered splits included):
# auto (128x256) vs forced 128x128 (the old pick). Run from the repo root: bash bundle/rule.sh
cd bundle
S="--shape 128x4096x7168 --shape 128x3072x1536 --shape 128x7168x512 --shape 128x10240x8192"
./examples/bench $S > $OUT/rule-auto.txt 2>&1; echo "auto rc=$?"
./examples/bench $S --config Sm90_128x128x64 > $OUT/rule-128x128.txt 2>&1; echo "128x128 rc=$?"
tail -8 $OUT/rule-auto.txt; tail -8 $OUT/rule-128x128.txt
