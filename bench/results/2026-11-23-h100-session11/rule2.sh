#!/usr/bin/env bash
# Session 11: more of the 27 (of 1653) grid shapes whose pick flips at 677 clocks per k-tile,
# both configs forced, two rounds, bundle of 8af9438 (bench copied to .devbin/s11b).
cd "$(dirname "$0")/../../../.devbin/s11b"
S=""; for s in 384x14336x1024 384x16384x1024 640x7168x1024 640x8192x1024 384x24576x4096 640x14336x4096 64x7168x8192 128x4096x14336 384x5120x7168; do S="$S --shape $s"; done
for rep in 1 2; do
  ./bench $S --config Sm90_128x256x64; ./bench $S --config Sm90_Swapped_128x128x64
done
