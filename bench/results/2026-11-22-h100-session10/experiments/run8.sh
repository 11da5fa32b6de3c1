#!/usr/bin/env bash
# Session 10 run 8: one "empty" arrival per warpgroup (r1) against every compute thread (t2 /
# base2: the kernel before), alternating; trace of the new one.
cd "$(dirname "$0")"
for rep in 1 2; do
  t2/ablate-0-k128 128 7168 16384 128 2; r1/ablate-0-k128 128 7168 16384 s128 2
  t2/ablate-0-k128 128 7168 2048 128 2; r1/ablate-0-k128 128 7168 2048 s128 2
  t2/ablate-0-k128 128 4096 7168 128 3; r1/ablate-0-k128 128 4096 7168 s128 3
  base2/ablate-0-k128 128 7168 16384 256 4; r1/ablate-0-k128 128 7168 16384 256 4
  base2/ablate-0-k128 2048 2048 2048 128 1 256; r1/ablate-0-k128 2048 2048 2048 128 1 256
  base2/ablate-0-k128 8192 8192 8192 128 1 256; r1/ablate-0-k128 8192 8192 8192 128 1 256
done
r1tr/ablate-0-k128 128 7168 16384 s128 2; r1tr/ablate-0-k128 128 7168 16384 256 4; r1tr/ablate-0-k128 8192 8192 8192 128 1 256
