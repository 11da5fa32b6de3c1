#!/bin/bash
# A/B/C: p0 current kernel, p1 pre-decoded activations, p2 = p1 + PDL with B's first stages issued before griddepcontrol.wait.
cd "$(dirname "$0")"
for shape in "200 2304 2080 256 3" "128 7168 2048 256 4" "128 7168 16384 256 4" "128 4096 7168 256 4" "128 4096 7168 128 4" "2048 2048 2048 128 1"; do
  for v in p0 p1 p2 p0 p1 p2; do
    echo -n "$v: "; timeout 60 ./$v/ablate-0-k128 $shape | tr -d '\n'; echo
  done
done
