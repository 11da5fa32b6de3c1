#!/usr/bin/env bash
# Builds bench/ablate.cu once per ablation (0 full, 1 no decode, 2 no wgmma, 3 neither, 4 no loads,
# 8 no split-K reduction, 16 no decode of A; ABLATIONS="0 8" picks some; TIMELINE=1 adds a per-CTA timeline)
# (RAW_K=K sets the raw-stage K; EXTRA_FLAGS passes more nvcc flags, e.g. -D macros of an experiment) into DIR (default .devbin/ablate) with the pinned nvcc; run them on
# a Hopper GPU:
#   for a in DIR/ablate-*; do $a 2048 2048 2048 128 1; done
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.devbin/ablate}
mkdir -p "$out"
tp=third_party
nvcc=${NVCC:-$tp/cuda/nvidia/cu13/bin/nvcc}
raw_k=${RAW_K:-128}
timeline=${TIMELINE:-0}  # 1: per-CTA %globaltimer stamps, summarized by each binary
for a in ${ABLATIONS:-0 1 2 3 4}; do
  "$nvcc" -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
    -DBSG_SM90_ABLATE=$a -DBSG_SM90_RAW_K=$raw_k -DBSG_SM90_TIMELINE=$timeline ${EXTRA_FLAGS:-} -Icpp -Iinclude -I$tp/cutlass/include -I$tp/cutlass/tools/util/include \
    -L$tp/cuda/nvidia/cu13/lib -cudart static bench/ablate.cu -o "$out/ablate-$a-k$raw_k$([ "$timeline" = 1 ] && echo -tl)" &
done
wait
ls -la "$out"
