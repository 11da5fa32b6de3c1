#!/usr/bin/env bash
# Session 10 run 9: a swapped 128x192 tile with three compute warpgroups taking turns (w3)
# against 128x256 (base2, 80ec819) and the swapped 128x128 (n: 400687d).
cd "$(dirname "$0")"
for rep in 1 2; do
  base2/ablate-0-k128 128 7168 16384 256 4; w3/ablate-0-k128 128 7168 16384 192 3
  base2/ablate-0-k128 128 4096 7168 256 6; w3/ablate-0-k128 128 4096 7168 192 5; r1/ablate-0-k128 128 4096 7168 s128 3
  base2/ablate-0-k128 128 7168 2048 256 4; w3/ablate-0-k128 128 7168 2048 192 3; r1/ablate-0-k128 128 7168 2048 s128 2
done
w3/ablate-0-k128 128 7168 16384 192 4; w3/ablate-0-k128 128 7168 16384 192 1
w3tr/ablate-0-k128 128 7168 16384 192 3
