#!/bin/bash
# Product bench: the rule's pick (auto) against 128x256 forced, every output checked; b2b_us: the same launches back to back.
cd "$(dirname "$0")"
S="--shape 256x7168x7168 --shape 512x4096x7168 --shape 512x1536x7168 --shape 1024x1024x8192 --shape 256x7168x2048 --shape 2304x4608x7168 --shape 2048x2048x2048 --shape 8192x8192x8192"
for rep in 1 2; do
  ./examples/bench $S > $OUT/tall-auto-$rep.txt 2>&1; echo "auto rc=$?"
  ./examples/bench $S --config Sm90_128x256x64 > $OUT/tall-wide-$rep.txt 2>&1; echo "128x256 rc=$?"
done
grep -h "Sm90" $OUT/tall-*.txt
