#!/bin/bash
# Back to back: cur (6f2c96e), ch2 (pre-pass launched programmatically after the GEMM main loop, grid-stride, one 256-thread CTA per SM), ch3 (ch2 with 1024-thread CTAs).
cd "$(dirname "$0")"
for rep in 1 2 3; do
for sh in "128 7168 16384 256 4" "128 4096 7168 256 6" "128 7168 2048 256 4" "128 4096 7168 256 4" "2048 2048 2048 128 1 256" "256 7168 7168 128 2 256" "8192 8192 8192 128 1 256"; do
  for v in cur ch2 ch3; do echo -n "$v: "; timeout 60 ./$v/ablate-0-k128 $sh | tr '\n' ' '; echo; done
done; done
