#!/usr/bin/env bash
# Session 10 run 10: the cluster sum with 1, 2 or 4 float4 units of loads in flight per thread
# (BSG_SM90_RED_UNITS), timeline builds, at the swapped 128x128's splits 2, 3, 6 and 128x256's 4.
cd "$(dirname "$0")"
for rep in 1 2; do
  for u in u1 u2 u4; do
    echo "== $u"
    $u/ablate-0-k128-tl 128 7168 2048 s128 2; $u/ablate-0-k128-tl 128 4096 7168 s128 3
    $u/ablate-0-k128-tl 128 2048 7168 s128 6; $u/ablate-0-k128-tl 128 7168 2048 256 4
  done
done
