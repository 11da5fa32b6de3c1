#!/usr/bin/env bash
# Session 11 run 2: more k-tiles per ping-pong turn. base: 820bbd9; def: the generalized loop at
# the defaults (must equal base); A: swapped 128x128 four k-tiles per turn and 256x128 two;
# B: as A's 128x128 with 5 raw stages; C: swapped 128x128 three k-tiles per turn.
cd "$(dirname "$0")"
D=${DEVBIN:-../../../../.devbin/s11}
for rep in 1 2; do
  for v in base def A B C; do
    B=$D/$v/ablate-0-k128
    $B 128 7168 16384 s128 2; $B 128 4096 7168 s128 3; $B 128 7168 2048 s128 2; $B 128 1536 7168 s128 8
  done
  for v in base def A; do
    B=$D/$v/ablate-0-k128
    $B 2048 2048 2048 128 1 256; $B 8192 8192 8192 128 1 256; $B 2304 4608 7168 128 1 256; $B 256 7168 2048 128 2 256
  done
done
