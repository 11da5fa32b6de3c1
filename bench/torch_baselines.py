#!/usr/bin/env python3
"""cuBLAS baselines for the shapes of SPEC.md §6, measured like examples/bench.rs: CUDA events
around each run, 10 warm-ups, median of 100 runs, inputs rotated through more than twice the L2.

- bf16: a (M, K) @ w (N, K).T with w already dequantized to bf16 in memory (what users do today);
- fp8: torch._scaled_mm with per-tensor scales, e4m3 operands, bf16 output.

Writes {"MxNxK": {"bf16_us": .., "fp8_us": ..}, ...} to the path given (default stdout).
"""
import json
import sys

import torch

SHAPES = [(128, 7168, 16384), (128, 4096, 7168), (128, 7168, 2048), (2048, 2048, 2048), (8192, 8192, 8192)]


def median_us(fn, sets, runs=100, warmup=10):
    for i in range(warmup):
        fn(*sets[i % len(sets)])
    pairs = []
    for i in range(runs):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(*sets[i % len(sets)])
        e.record()
        pairs.append((s, e))
    torch.cuda.synchronize()
    t = sorted(s.elapsed_time(e) * 1e3 for s, e in pairs)
    return t[len(t) // 2]


def main():
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    out = {}
    for m, n, k in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g)
        nsets = max(2, 2 * l2 // ((m + n) * k * 2) + 1)
        bf = [(a.clone(), w.clone()) for _ in range(nsets)]
        bf16 = median_us(lambda x, y: x @ y.T, bf)
        del bf
        a8, w8 = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        nsets = max(2, 2 * l2 // ((m + n) * k) + 1)
        f8 = [(a8.clone(), w8.clone()) for _ in range(nsets)]
        fp8 = median_us(lambda x, y: torch._scaled_mm(x, y.T, one, one, out_dtype=torch.bfloat16), f8)
        del f8
        out[f"{m}x{n}x{k}"] = {"bf16_us": round(bf16, 2), "fp8_us": round(fp8, 2)}
        print(f"{m}x{n}x{k}: cuBLAS bf16 {bf16:.1f} us, fp8 {fp8:.1f} us", file=sys.stderr)
    text = json.dumps(out, indent=1)
    if len(sys.argv) > 1:
        open(sys.argv[1], "w").write(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
