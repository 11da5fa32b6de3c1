#!/bin/bash
# A/B: base, first (stage 0 alone, then the rest), first2 (stages 0-1, then the rest), kld (epilogue row pitch BN+4),
# splitbar (cluster arrive before the stores, wait after), all1 (first+kld+splitbar), all1c (all1 + PDL chain), chain.
cd "$(dirname "$0")"
for rep in 1 2; do
for shape in "128 7168 16384 256 4" "128 4096 7168 256 6" "128 7168 2048 256 4" "128 4096 7168 256 4" "2048 2048 2048 256 1" "8192 8192 8192 256 1"; do
  for v in base first first2 kld splitbar all1 all1c chain; do echo -n "$v: "; timeout 60 ./$v/ablate-0-k128 $shape | tr '\n' ' '; echo; done
done; done
for shape in "128 7168 2048 256 4" "128 4096 7168 256 6" "128 7168 16384 256 4"; do echo "== all1-tl $shape"; timeout 60 ./all1-tl/ablate-0-k128-tl $shape; done
