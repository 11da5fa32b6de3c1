#!/bin/bash
# A/B alternating: base, cluster sum with 2 / 4 units in flight, PDL chain (pre-pass after the previous GEMM's main loop), both.
cd "$(dirname "$0")"
for rep in 1 2; do
for shape in "128 7168 16384 256 4" "128 4096 7168 256 6" "128 7168 2048 256 4" "128 4096 7168 256 4" "2048 2048 2048 256 1"; do
  for v in base red2 red4 chain both; do echo -n "$v: "; timeout 60 ./$v/ablate-0-k128 $shape | tr '\n' ' '; echo; done
done; done
for a in 4 8; do for shape in "128 7168 2048 256 4" "128 4096 7168 256 6"; do echo "== tl ablate $a $shape"; timeout 60 ./base-tl/ablate-$a-k128-tl $shape; done; done
for shape in "128 7168 2048 256 4" "128 4096 7168 256 6"; do echo "== red4-tl $shape"; timeout 60 ./red4-tl/ablate-0-k128-tl $shape; done
