#!/bin/bash
cd "$(dirname "$0")"
for shape in "128 7168 16384 256 4" "128 7168 2048 256 4" "8192 8192 8192 256 1" "2048 2048 2048 256 1"; do
  for b in $1; do
    echo "== $b $shape"; timeout 30 ./$b $shape | grep -v "^ *$"
  done
done
