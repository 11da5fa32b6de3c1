#!/usr/bin/env bash
# Session 10 run 3: swapped 128x128 with two k-tiles per ping-pong turn (t2) against one (sw) and 128x256 (base2).
cd "$(dirname "$0")"
B=base2/ablate-0-k128; S=sw/ablate-0-k128; T=t2/ablate-0-k128
for rep in 1 2; do
$B 128 7168 2048 256 4; $S 128 7168 2048 128 2; $T 128 7168 2048 128 2
$B 128 4096 7168 256 6; $S 128 4096 7168 128 3; $T 128 4096 7168 128 3
$B 128 7168 16384 256 4; $S 128 7168 16384 128 2; $T 128 7168 16384 128 2
done
t2tr/ablate-0-k128 128 7168 16384 128 2
$T-tl 128 7168 2048 128 2; $T-tl 128 4096 7168 128 3; $T-tl 128 7168 16384 128 2
$T 128 7168 2048 128 4; $T 128 4096 7168 128 4; $T 2048 2048 2048 128 1; $S 2048 2048 2048 128 1
