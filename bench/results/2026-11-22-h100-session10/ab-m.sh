#!/bin/bash
# Session 10: the swapped 128x128 forced against the rule's 128x256 at M > 128 (run from the
# repository root with bundle/ carried; bundle of 2b01545's code), alternating, twice.
cd bundle
S=""; for s in 384x1536x4096 384x2048x7168 640x7168x2048 384x4096x7168 384x7168x2304 640x4096x4096 1152x2048x4096; do S="$S --shape $s"; done
for rep in 1 2; do
  echo "== rule $rep"; ./examples/bench $S | awk 'NR>2{print $1,$2,$3,$4,$5,$12}'
  echo "== swapped 128x128 $rep"; ./examples/bench $S --config Sm90_Swapped_128x128x64 | awk 'NR>2{print $1,$2,$3,$4,$5,$12}'
done
