#!/bin/bash
# Product bench: the 256x128 tile (auto pick) against 128x256 on shapes the rule gives it, every output checked.
cd "$(dirname "$0")"
S="--shape 2048x2048x2048 --shape 4096x4096x4096 --shape 2048x7168x2048 --shape 2304x4608x7168 --shape 1024x16384x2048 --shape 8192x8192x8192"
for rep in 1 2; do
  ./examples/bench $S > $OUT/tall-auto-$rep.txt 2>&1; echo "auto rc=$?"
  ./examples/bench $S --config Sm90_128x256x64 > $OUT/tall-128x256-$rep.txt 2>&1; echo "128x256 rc=$?"
done
grep -h "Sm90" $OUT/tall-*.txt
