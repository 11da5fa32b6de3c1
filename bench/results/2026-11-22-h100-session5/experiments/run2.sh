#!/bin/bash
# usage: [SHAPES="M N K BN SPLIT;..."] run2.sh "BINARIES"  (default: the shapes of exp2-exp4;
# exp5 ran SHAPES="128 7168 16384 256 4;128 7168 2048 256 4;8192 8192 8192 256 1;2048 2048 2048 256 1")
cd "$(dirname "$0")"
IFS=';' read -ra shapes <<< "${SHAPES:-128 7168 16384 256 4;128 7168 2048 256 4;8192 8192 8192 256 1;128 4096 7168 128 4}"
for shape in "${shapes[@]}"; do
  for b in $1; do
    echo "== $b $shape"; timeout 30 ./$b $shape | grep -v "^ *$"
  done
done
