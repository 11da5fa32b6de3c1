#!/usr/bin/env bash
# Session 10 run 1: swapped 128x128 (BSG_SM90_SWAP128) against the kept 128x256 at M = 128.
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
B=base/ablate-0-k128; S=sw/ablate-0-k128
for rep in 1 2; do
$B 128 7168 2048 256 4; $S 128 7168 2048 128 2; $S 128 7168 2048 128 4
$B 128 4096 7168 256 6; $S 128 4096 7168 128 3; $S 128 4096 7168 128 4
$B 128 7168 16384 256 4; $S 128 7168 16384 128 2
done
$B-tl 128 7168 2048 256 4; $S-tl 128 7168 2048 128 2
$B-tl 128 4096 7168 256 6; $S-tl 128 4096 7168 128 3
$S-tl 128 7168 16384 128 2
