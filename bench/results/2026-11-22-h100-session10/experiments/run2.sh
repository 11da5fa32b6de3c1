#!/usr/bin/env bash
# Session 10 run 2: where the swapped 128x128's k-tile goes (trace; no decode; no loads).
cd "$(dirname "$0")"
S=sw/ablate
for a in 0 1 4; do $S-$a-k128 128 7168 16384 128 2; done
swtr/ablate-0-k128 128 7168 16384 128 2
basetr/ablate-0-k128 128 7168 16384 256 4
for a in 0 1 4; do $S-$a-k128 128 7168 2048 128 2; done
