#!/bin/bash
# A/B: p0 = current kernel, p1 = pre-decoded activations (BSG_SM90_PRE_A=1). Same shapes, alternating.
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
for shape in "200 2304 2080 256 3" "128 7168 16384 256 4" "128 7168 2048 256 4" "128 4096 7168 256 4" "2048 2048 2048 256 1" "8192 8192 8192 256 1"; do
  for v in p0 p1 p0 p1; do
    echo -n "$v: "; timeout 60 ./$v/ablate-0-k128 $shape | tr -d '\n'; echo
  done
done
