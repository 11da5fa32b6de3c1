#!/usr/bin/env bash
# Session 11 run 5: ws = the swapped main loop with the weights' scale used as converted (no
# decode8_scales 2^6 multiply, no permute: HMUL2 reads the low half twice) and the accumulators
# times 64 after the loop, against def, alternating; D hashes must match.
cd "$(dirname "$0")"
D=${DEVBIN:-../../../../.devbin/s11}
for rep in 1 2 3; do
  for v in def ws; do
    B=$D/$v/ablate-0-k128
    $B 128 7168 16384 256 4; $B 128 7168 16384 s128 2; $B 128 4096 7168 s128 3; $B 128 7168 2048 s128 2; $B 2048 2048 2048 128 1 256; $B 8192 8192 8192 128 1 256
  done
done
for v in def ws; do
  B=$D/$v/ablate-0-k128
  $B 200 136 224 s128 1; $B 200 136 224 256 1; $B 200 136 224 128 1 256; $B 130 264 2048 s128 7; $B 1000 3000 4000 128 3 256
done
