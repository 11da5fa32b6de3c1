#!/bin/bash
# Split/tile sweep of the current kernel: ablate-0 (full kernel) per shape, BN and split.
b=.devbin/cur/ablate-0-k128
for mnk in "128 4096 7168" "128 2048 7168" "128 1536 7168" "128 3072 1536" "256 4096 7168" "256 7168 2048" "512 1536 7168" "1024 1024 8192" "128 7168 2048" "128 7168 16384"; do
  for cfg in "128 2" "128 3" "128 4" "128 6" "128 8" "256 2" "256 3" "256 4" "256 8"; do
    timeout 20 $b $mnk $cfg | grep -o "ablate=.*"
  done
done
