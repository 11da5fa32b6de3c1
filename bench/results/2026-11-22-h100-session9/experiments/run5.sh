#!/bin/bash
# A/B at ff0edda's kernel (cur): PDL chain (chain2), cluster sum loading peers 2 at a time (peer2) or one at a time (peer1).
cd "$(dirname "$0")"
for rep in 1 2 3; do
for shape in "128 7168 16384 256 4" "128 4096 7168 256 6" "128 7168 2048 256 4" "128 4096 7168 256 4" "2048 2048 2048 256 1"; do
  for v in cur chain2 peer2 peer1; do echo -n "$v: "; timeout 60 ./$v/ablate-0-k128 $shape | tr '\n' ' '; echo; done
done; done
for v in cur-tl peer2-tl; do for shape in "128 7168 2048 256 4" "128 4096 7168 256 6"; do echo "== $v $shape"; timeout 60 ./$v/ablate-0-k128-tl $shape; done; done
