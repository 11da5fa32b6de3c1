#!/bin/bash
# A/B in one run: .devbin/bundle-c8a (cluster_sum unrolled for 8 peers always) vs bundle (4 where split <= 4).
S="--shape 128x7168x2048 --shape 128x7168x16384 --shape 128x4096x7168"
for i in 1 2; do
  for b in .devbin/bundle-c8a bundle; do
    for o in f16 nvfp4; do
      echo "== $b $o"; $b/examples/bench $S --out $o 2>&1 | tail -3
    done
  done
done
