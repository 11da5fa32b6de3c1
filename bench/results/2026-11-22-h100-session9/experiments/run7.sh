#!/bin/bash
# 256x128 with split-K through the cluster (tallc) against 128x256 at the same split; D hashes should agree.
cd "$(dirname "$0")"
for rep in 1 2; do
for sh in "256 7168 256 1" "256 7168 2048 2" "256 7168 7168 2" "512 4096 512 2" "512 4096 7168 2" "512 1536 7168 4" "512 512 7168 8" "1024 1024 8192 3" "768 7168 2048 1" "1024 4096 4096 1"; do
  set -- $sh
  echo -n "128x256: "; timeout 60 ./tallc/ablate-0-k128 $1 $2 $3 256 $4 | tr '\n' ' '; echo
  echo -n "256x128: "; timeout 60 ./tallc/ablate-0-k128 $1 $2 $3 128 $4 256 | tr '\n' ' '; echo
done; done
