#!/bin/bash
# usage: run.sh "bins" ; shapes fixed
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for shape in "128 7168 16384 256 4" "128 7168 2048 256 4" "2048 2048 2048 256 1" "8192 8192 8192 256 1" "128 4096 7168 128 4"; do
  for b in $1; do
    echo "== $b $shape"; timeout 30 ./$b $shape
  done
done
