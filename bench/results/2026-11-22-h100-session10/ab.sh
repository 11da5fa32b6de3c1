#!/bin/bash
# The tile rule against 128x256 forced (and the unswapped 128x128 where it was the pick), at
# M <= 128, alternating (run from the repository root with bundle/ carried). final.sh ran this
# too, but its 128x256 outputs did not come back (too many files): this run tars them.
cd bundle
S=""; for s in 128x7168x16384 128x4096x7168 128x7168x2048 128x2048x7168 128x1536x7168 128x3072x1536 128x7168x512 128x8192x16384 128x7168x4096 128x7168x8192 128x4096x16384 128x1024x4096 128x2048x4096 128x16384x4096 64x7168x2048; do S="$S --shape $s"; done
mkdir -p /tmp/ab
for rep in 3 4; do
  ./examples/bench $S --config Sm90_128x256x64 > /tmp/ab/wide-$rep.txt 2>&1; echo "wide rc=$?"
  ./examples/bench $S > /tmp/ab/rule-$rep.txt 2>&1; echo "rule rc=$?"
done
./examples/bench --shape 128x1024x4096 --shape 128x2048x4096 --shape 128x16384x4096 --config Sm90_128x128x64 > /tmp/ab/unswapped.txt 2>&1; echo "unswapped rc=$?"
for f in /tmp/ab/*.txt; do echo "== $f"; awk 'NR>2{print $1,$2,$3,$4,$5,$12}' $f; done
tar czf $OUT/ab.tgz -C /tmp ab
