#!/usr/bin/env bash
# Session 11 run 4: upper bound of converting weight scales once per stage: cs = the swapped
# main loop with a constant scale (no load, cvt, multiply, permute; results wrong on purpose)
# against def, alternating, at the swapped tiles' SPEC-shape configs.
cd "$(dirname "$0")"
D=${DEVBIN:-../../../../.devbin/s11}
for rep in 1 2 3; do
  for v in def cs; do
    B=$D/$v/ablate-0-k128
    $B 128 7168 16384 256 4; $B 128 7168 16384 s128 2; $B 128 4096 7168 s128 3; $B 128 7168 2048 s128 2; $B 8192 8192 8192 128 1 256
  done
done
