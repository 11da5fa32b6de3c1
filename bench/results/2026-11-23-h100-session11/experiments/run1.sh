#!/usr/bin/env bash
# Session 11 run 1: the swapped main loop with the next turn's decode between this turn's wgmma
# issues (il: -DBSG_SM90_INTERLEAVE=1) against the kernel of 820bbd9 (base), alternating, at each
# SPEC shape's rule config and split; then traces (basetr, iltr) of the per-turn clocks.
cd "$(dirname "$0")"
D=${DEVBIN:-../../../../.devbin/s11}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
for rep in 1 2; do
  for v in base il; do
    B=$D/$v/ablate-0-k128
    $B 128 7168 16384 256 4; $B 128 7168 16384 s128 2; $B 128 4096 7168 s128 3; $B 128 7168 2048 s128 2
    $B 2048 2048 2048 128 1 256; $B 8192 8192 8192 128 1 256
  done
done
for v in basetr iltr; do
  B=$D/$v/ablate-0-k128
  $B 128 7168 16384 s128 2; $B 128 7168 16384 256 4; $B 8192 8192 8192 128 1 256
done
