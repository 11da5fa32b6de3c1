#!/bin/bash
# Product bench A/B, alternating: prev = bade31f's kernels (tiles M fastest), new = the working tree (groups of tile rows, N fastest inside).
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 50 > $OUT/smi.txt &
SMI=$!
S="--shape 128x7168x16384 --shape 128x4096x7168 --shape 2048x2048x2048 --shape 4096x4096x4096 --shape 2304x4608x7168 --shape 8192x8192x8192"
for rep in 1 2; do
  for v in prev new; do
    b=.devbin/bundle-prev; [ $v = new ] && b=bundle
    echo "$(date +%T) $v f16" >> $OUT/marks.txt
    $b/examples/bench $S > $OUT/$v-f16-$rep.txt 2>&1
    echo "$(date +%T) $v nvfp4" >> $OUT/marks.txt
    $b/examples/bench $S --out nvfp4 > $OUT/$v-nvfp4-$rep.txt 2>&1
  done
done
kill $SMI
for f in $OUT/*-f16-*.txt $OUT/*-nvfp4-*.txt; do echo "== $(basename $f)"; grep Sm90 $f | awk '{print $1, $4, $5, $NF}'; done
