#!/usr/bin/env bash
# Session 11: the shapes whose pick flips if the rule's swapped 128x128 rate drops from 691 to 677
# clocks per k-tile (src/config.rs swapped_estimate_us), both configs forced, two rounds, with
# the bundle of 8af9438 (bench copied to .devbin/s11b); then the swapped 128x128's trace before
# (basetr, 820bbd9) and after (tr, 8af9438) at 128x7168x16384 split 2.
cd "$(dirname "$0")/../../../.devbin/s11b"
S=""; for s in 128x3072x16384 128x7168x8192 128x10240x7168 128x16384x7168 384x1024x16384 384x2048x8192 384x4096x7168 640x1536x8192 640x2048x7168 640x3072x7168 640x16384x4096; do S="$S --shape $s"; done
for rep in 1 2; do
  ./bench $S --config Sm90_128x256x64; ./bench $S --config Sm90_Swapped_128x128x64
done
./ablate-basetr 128 7168 16384 s128 2; ./ablate-tr 128 7168 16384 s128 2
./ablate-basetr 128 4096 7168 s128 3; ./ablate-tr 128 4096 7168 s128 3
