#!/usr/bin/env bash
# Session 11 run 6: np = the kept kernel (cur, Tile::kWScaleLow for the swapped 128x128) plus, for
# 128x256 and 256x128, HMUL2 reading the (2^6-scaled) scale's low half instead of a permuted pair
# (variant-no-permute.patch), against cur, alternating; D hashes must match.
cd "$(dirname "$0")"
D=${DEVBIN:-../../../../.devbin/s11}
for rep in 1 2 3; do
  for v in cur np; do
    B=$D/$v/ablate-0-k128
    $B 128 7168 16384 256 4; $B 128 4096 16384 256 6; $B 2048 2048 2048 128 1 256; $B 8192 8192 8192 128 1 256; $B 2304 4608 7168 128 1 256; $B 256 7168 2048 128 2 256
  done
done
