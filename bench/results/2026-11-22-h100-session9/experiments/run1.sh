#!/bin/bash
# A/B alternating: base vs direct-bit decode (ablate, f16, D hash), then traces and a timeline.
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv
for rep in 1 2; do
for shape in "128 7168 16384 256 4" "128 4096 7168 256 6" "128 7168 2048 256 4" "2048 2048 2048 256 1" "8192 8192 8192 256 1"; do
  for v in base bits; do echo -n "$v: "; timeout 60 ./$v/ablate-0-k128 $shape | tr '\n' ' '; echo; done
done; done
for v in base-tr bits-tr; do for shape in "128 7168 16384 256 4" "8192 8192 8192 256 1"; do echo "== $v $shape"; timeout 60 ./$v/ablate-0-k128 $shape; done; done
for shape in "128 7168 16384 256 4" "128 4096 7168 256 6" "128 7168 2048 256 4" "2048 2048 2048 256 1"; do echo "== tl $shape"; timeout 60 ./base-tl/ablate-0-k128-tl $shape; done
