#!/bin/bash
b=.devbin/cur/ablate-0-k128
run() { timeout 20 $b $@ | grep -o "ablate=.*" | awk '{print $3, $4, $5, $6}'; }
for s in 8 11 12 16; do run 128 1536 7168 128 $s; done
for s in 7 8 16; do run 128 2048 7168 128 $s; done
for s in 3 4 5; do run 128 3072 1536 128 $s; done
for s in 4 5 7; do run 128 4096 7168 128 $s; done
for c in "128 4" "128 8" "256 4" "256 8"; do run 128 4096 16384 $c; done
for c in "128 1" "128 2" "256 1" "256 2"; do run 384 4096 7168 $c; done
for c in "128 1" "128 2" "256 1" "256 2"; do run 640 3072 4096 $c; done
for c in "128 1" "256 1" "256 2"; do run 1152 2048 4096 $c; done
for c in "128 1" "128 2" "256 1" "256 2"; do run 1024 3072 4096 $c; done
