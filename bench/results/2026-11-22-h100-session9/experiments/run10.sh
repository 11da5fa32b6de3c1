#!/bin/bash
# Raster order: cur (M fastest) against groups of 4 or 8 tile rows with N fastest inside (g4, g8); D hashes should agree.
cd "$(dirname "$0")"
for rep in 1 2 3; do
for sh in "8192 8192 8192 128 1 256" "4096 4096 4096 128 1 256" "2304 4608 7168 128 1 256" "8192 8192 8192 256 1" "2048 2048 2048 128 1 256"; do
  for v in cur g4 g8; do echo -n "$v: "; timeout 60 ./$v/ablate-0-k128 $sh | tr '\n' ' '; echo; done
done; done
