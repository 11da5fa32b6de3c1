#!/bin/bash
# Cluster-limited 128x256 splits against the 128x128 pick (the rule's condition split == split without a cluster limit).
b=.devbin/cur/ablate-0-k128
run() { timeout 20 $b $@ | grep -o "ablate=.*" | awk '{print $3, $4, $5, $6}'; }
for mnk in "128 8192 16384" "256 4096 7168" "1024 1024 8192" "512 2048 8192" "128 10240 8192" "384 2816 8192"; do
  for c in "256 2" "256 3" "128 2" "128 4"; do run $mnk $c; done
done
