#!/bin/bash
# Cluster split up to 8 (BSG_SM90_MAX_CLUSTER=8) against the kept kernel (clusters up to 4).
cd "$(dirname "$0")"
timeout 20 ./ablate-c8 clusters
run() { timeout 20 ./$1 ${@:2} | grep -o "hash.*" ; }
for shape in "128 4096 7168" "128 2048 7168" "128 1536 7168" "128 3072 1536" "128 4096 16384"; do
  run ablate-0-k128 $shape 256 4
  run ablate-c8 $shape 256 4
  for s in 6 8; do run ablate-c8 $shape 256 $s; done
done
