#!/bin/bash
# The 256x128 swapped tile (BM=256: activations x weights) against 128x256, same binary; D hashes should agree.
cd "$(dirname "$0")"
for rep in 1 2; do
for shape in "8192 8192 8192" "2048 2048 2048" "4096 4096 4096" "1024 1024 8192" "2048 7168 2048"; do
  echo -n "128x256: "; timeout 60 ./t256/ablate-0-k128 $shape 256 1 | tr '\n' ' '; echo
  echo -n "256x128: "; timeout 60 ./t256/ablate-0-k128 $shape 128 1 256 | tr '\n' ' '; echo
done; done
for shape in "512 4096 7168 256 2" "512 4096 7168 128 1 256" "512 4096 7168 128 2 256" "256 7168 7168 256 2" "256 7168 7168 128 1 256" "256 7168 7168 128 2 256" "200 1000 4064 128 2 256" "200 1000 4064 256 2"; do
  echo -n "$shape: "; timeout 60 ./t256/ablate-0-k128 $shape | tr '\n' ' '; echo
done
for shape in "8192 8192 8192 128 1 256" "8192 8192 8192 256 1" ; do echo "== trace $shape"; timeout 60 ./t256-tr/ablate-0-k128 $shape; done
for shape in "2048 2048 2048 128 1 256" "8192 8192 8192 128 1 256"; do echo "== tl $shape"; timeout 60 ./t256-tl/ablate-0-k128-tl $shape; done
