#!/bin/bash
# Product bench (each output checked against the exact reference) on the shapes whose SM90 pick
# the session-7 rule changed: auto (new rule: 128x256, cluster-lowered split) vs forced 128x128
# (the old rule's pick).
cd bundle
S="--shape 256x4096x7168 --shape 1024x1024x8192 --shape 512x2048x8192 --shape 384x2816x8192 --shape 128x10240x8192 --shape 128x8192x16384"
./examples/bench $S > $OUT/rule-auto.txt 2>&1; echo "auto rc=$?"
./examples/bench $S --config Sm90_128x128x64 > $OUT/rule-128x128.txt 2>&1; echo "128x128 rc=$?"
tail -8 $OUT/rule-auto.txt; tail -8 $OUT/rule-128x128.txt
