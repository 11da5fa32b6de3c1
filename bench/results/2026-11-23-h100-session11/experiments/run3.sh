#!/usr/bin/env bash
# Session 11 run 3: the swapped 128x128 with 5 raw stages instead of 4 (S5), two k-tiles per turn,
# against the defaults (def), alternating, then per-CTA timelines of both.
cd "$(dirname "$0")"
D=${DEVBIN:-../../../../.devbin/s11}
for rep in 1 2 3; do
  for v in def S5; do
    B=$D/$v/ablate-0-k128
    $B 128 7168 16384 s128 2; $B 128 4096 7168 s128 3; $B 128 7168 2048 s128 2; $B 128 1536 7168 s128 8; $B 128 8192 16384 s128 2
  done
done
for v in def S5; do
  B=$D/$v/ablate-0-k128-tl
  $B 128 7168 16384 s128 2; $B 128 7168 2048 s128 2
done
