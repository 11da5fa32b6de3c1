#!/usr/bin/env bash
# Session 10 run 4: where the swapped 128x128 (t2, two k-tiles a turn) beats 128x256, each at the
# split its rule gives on an H100 (cluster counts 66/39/30/22/17/15/15 for 2..8).
cd "$(dirname "$0")"
B=base2/ablate-0-k128; T=t2/ablate-0-k128
while read m n k sb st; do
  for rep in 1 2; do $B $m $n $k 256 $sb; $T $m $n $k 128 $st; done
done <<'LIST'
128 7168 4096 4 2
128 7168 8192 4 2
128 4096 16384 6 3
128 2048 7168 8 6
128 1536 7168 8 8
128 3072 1536 6 4
128 10240 8192 2 1
128 8192 16384 3 2
128 7168 512 2 2
64 7168 2048 4 2
LIST
