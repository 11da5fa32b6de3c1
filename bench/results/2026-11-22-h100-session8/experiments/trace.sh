#!/bin/bash
# Clock trace of the kept kernel (pre-decoded activations): full, no decode (1), no wgmma (2).
cd "$(dirname "$0")"
for a in 0 1 2; do for shape in "128 7168 16384 256 4" "8192 8192 8192 256 1"; do timeout 30 ./ablate-tr$a $shape; done; done
