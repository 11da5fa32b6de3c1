#!/bin/bash
# A/B: base, own slice read locally in the cluster sum (local), first raw stage issued alone (first); timelines with after-loop stamps.
cd "$(dirname "$0")"
for rep in 1 2; do
for shape in "128 7168 16384 256 4" "128 4096 7168 256 6" "128 7168 2048 256 4" "128 4096 7168 256 4" "2048 2048 2048 256 1"; do
  for v in base local first; do echo -n "$v: "; timeout 60 ./$v/ablate-0-k128 $shape | tr '\n' ' '; echo; done
done; done
for v in base-tl local-tl first-tl; do for shape in "128 7168 2048 256 4" "128 4096 7168 256 6" "128 7168 16384 256 4"; do echo "== $v $shape"; timeout 60 ./$v/ablate-0-k128-tl $shape; done; done
