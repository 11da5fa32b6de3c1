#!/bin/bash
# Session 10: this session's bundle against the previous commit's (80ec819, .devbin/s10/prev),
# alternating, on the shapes whose kernels did not change in kind (128x256, 256x128: registers
# renamed only), then the bound of the swapped 128x128 loop (no loads, no decode; trace).
for rep in 1 2 3; do
  for b in .devbin/s10/prev bundle; do
    echo "== $b rep $rep"; $b/examples/bench --shape 128x7168x16384 --shape 2048x2048x2048 --shape 8192x8192x8192 | awk 'NR>2{print $1,$2,$3,$4,$5,$12}'
  done
done
cd .devbin/s10
for a in 1 4; do n/ablate-$a-k128 128 7168 16384 s128 2; n/ablate-$a-k128 128 7168 2048 s128 2; done
ntr/ablate-0-k128 128 7168 16384 s128 2; ntr4/ablate-4-k128 128 7168 16384 s128 2
