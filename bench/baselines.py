#!/usr/bin/env python3
"""cuBLAS baselines through PyTorch, timed the way inference engines run them: inside a CUDA graph.

For each shape M x N x K (A: (M, K) activations, W: (N, K) weights, result A @ W.T):
- cublas_bf16: `a @ w.T`, bf16 a and w (w stands for weights already dequantized to bf16);
- cublas_fp8 (--op gemm): `torch._scaled_mm(a8, w8.T, s_a, s_b, out_dtype=bf16)`, e4m3 operands
  (a and w cast), per-tensor float32 scales; w8.T of the row-major (N, K) w8 is the column-major
  second operand that _scaled_mm wants;
- int4_tinygemm (--op w4a16): `torch._weight_int4pack_mm(a, w_packed, 128, scales_and_zeros)`,
  bf16 a, int4 weights in groups of 128 packed by `torch._convert_weight_to_int4pack`.
- bf16_grouped (--op grouped, cases from --grouped-cases FILE, which `bench --emit-grouped-cases`
  writes): the mixture-of-experts GEMM on bf16 weights (E, N, K) (weights already dequantized)
  and activations (T, K) stacked by expert: `torch._grouped_mm(a, w.transpose(-2, -1), offs)`
  where this PyTorch has it and takes the case (`bf16_grouped_kind` "grouped_mm"), else a loop of
  `a[rows of e] @ w[e].T` over the experts with rows, all in the one graph (kind "loop").

Data (--data): nvfp4-gaussian (default): the operands the crate's bench multiplies, dequantized:
N(0, 1) values quantized to NVFP4 (block scale e4m3(max|x| / 6), global scale 1) and back, as
bf16; for --op w4a16 the activations are N(0, 1) bf16 as the crate's are. randn: bf16 N(0, 1)
for every operand (the baselines before bf30fc7). Under load the GPU's clock depends on the
operands' bits (power), so a comparison holds only on the same data: at 8192^3 cuBLAS bf16 took
1519-1544 us on randn and 1454 on nvfp4-gaussian in one H100 session (bench/DESIGN.md, "Data and
power").

Method, per contender and shape:
- S input sets (every tensor of a call cloned S times), S = max(2, ceil(2 * L2 / B) + 1) where B
  is the smallest per-call input size among the shape's contenders, so that every contender
  rotates through more than twice the L2 (the same S for all of them); grouped: B is the bytes a
  call touches (the weights of experts with rows, activations, output), and S = 1 where B alone
  exceeds twice the L2;
- each set run once eagerly on a side stream (cuBLAS handles, workspaces and heuristics are
  made there, outside the capture; an unsupported call fails here);
- one CUDA graph captured on that stream of R = S * ceil(20 / S) calls, call i on set i mod S,
  each call writing its own output (allocated from the graph's pool, kept alive);
- `*_graph_us` (primary): 3 replays of warm-up, then `REPS` replays each between a pair of CUDA
  events; the median replay time / R;
- `*_do_bench_us` (cross-check): triton.testing.do_bench(graph.replay, return_mode="median") / R
  (do_bench also clears the L2 before each replay); a warning goes to stderr when the two differ
  by more than 10%.
Once per run: device-to-device copy bandwidth, `copy_gbps` = 2 * bytes / time of a 1 GiB
`dst.copy_(src)` (median of 10, CUDA events).

Output JSON (see --help): {"gpu", "l2_bytes", "copy_gbps", "torch", "triton", "cuda", "op", "data",
"shapes": {"MxNxK": {"<contender>_graph_us", "<contender>_do_bench_us", "graph_calls", "sets",
"<contender>_error" (only on failure), ...}}}. A contender that fails gets nulls and an error
string; the script goes on, rewrites the JSON after every shape, and exits 0 once it is written.

  python3 bench/baselines.py --out FILE.json [--shape MxNxK ...] [--op gemm|w4a16] [--data KIND]
  python3 bench/baselines.py --out FILE.json --op grouped --grouped-cases CASES.json
"""
import argparse
import json
import math
import os
import statistics
import sys

import torch

DEFAULT_SHAPES = ["1x4096x7168", "1x7168x16384", "16x4096x7168", "64x4096x7168", "128x4096x7168",
                  "128x7168x2048", "128x7168x16384", "256x4096x7168", "2048x2048x2048",
                  "8192x8192x8192"]
MIN_CALLS = 20   # calls per graph at least
REPS = 15        # timed replays
MAX_SETS = 1024  # tiny shapes: cap the graph size (then rotation may cover less than 2x L2)
GROUP = 128      # int4 group size


def log(msg):
    print(msg, file=sys.stderr, flush=True)


E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def nvfp4_gaussian(rows, k, gen):
    """(rows, K) bf16: N(0, 1) quantized to NVFP4 and dequantized (ties and the order of the
    crate's roundings aside, the distribution of Nvfp4Matrix::random_gaussian). In row chunks of
    at most 2^26 values, so that expert stacks of several GB fit."""
    out = torch.empty(rows, k, device="cuda", dtype=torch.bfloat16)
    grid = torch.tensor(E2M1_MAGNITUDES, device="cuda")
    mids = (grid[1:] + grid[:-1]) / 2
    step = max(1, (1 << 26) // k)
    for r0 in range(0, rows, step):
        r = min(step, rows - r0)
        x = torch.randn(r, k // 16, 16, device="cuda", generator=gen)
        sf = (x.abs().amax(-1, keepdim=True) / 6).to(torch.float8_e4m3fn).float()
        q = torch.where(sf > 0, x / sf, torch.zeros_like(x))
        out[r0:r0 + r] = (torch.copysign(grid[torch.bucketize(q.abs(), mids)], q) * sf).view(r, k).to(torch.bfloat16)
    return out


def operands(data, gen):
    """(weights(rows, K), activations(rows, K), activations16(rows, K)) makers for --data: NVFP4
    operands (weights and NVFP4 activations) and the 16-bit activations of W4A16."""
    def randn(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    if data == "randn":
        return randn, randn, randn
    return (lambda r, k: nvfp4_gaussian(r, k, gen)), (lambda r, k: nvfp4_gaussian(r, k, gen)), randn


def contenders(op, m, n, k, gen, data):
    """name -> (bytes of one call's inputs, make() -> one input set (tuple), call(*set) -> output)."""
    weights, acts, acts16 = operands(data, gen)
    a_make = acts if op == "gemm" else acts16
    out = {"cublas_bf16": ((m + n) * k * 2, lambda: (a_make(m, k), weights(n, k)), lambda a, w: a @ w.T)}
    if op == "gemm":
        one = torch.ones((), device="cuda", dtype=torch.float32)
        f8 = torch.float8_e4m3fn
        out["cublas_fp8"] = (
            (m + n) * k,
            lambda: (acts(m, k).to(f8), weights(n, k).to(f8)),
            lambda a, w: torch._scaled_mm(a, w.T, one, one, out_dtype=torch.bfloat16))
    else:
        def make_int4():
            # (N, K/2) uint8, two 4-bit codes a byte (even k in the high nibble); scales and zeros
            # (K/128, N, 2) bf16: w = (q - 8) * scale + zero.
            q = torch.randint(0, 256, (n, k // 2), device="cuda", dtype=torch.uint8, generator=gen)
            packed = torch._convert_weight_to_int4pack(q, 8)  # PyTorch >= 2.5: uint8 codes
            sz = torch.stack([torch.full((k // GROUP, n), 0.01), torch.zeros(k // GROUP, n)], -1)
            return acts16(m, k), packed, sz.to("cuda", torch.bfloat16).contiguous()
        out["int4_tinygemm"] = (
            m * k * 2 + n * k // 2 + (k // GROUP) * n * 4,
            make_int4,
            lambda a, w, sz: torch._weight_int4pack_mm(a, w, GROUP, sz))
    return out


def grouped_contender(n, k, counts, gen, data):
    """bf16_grouped for one case: (bytes a call touches, make, call, kind)."""
    weights, acts, _ = operands(data, gen)
    experts, t = len(counts), sum(counts)
    hit = [e for e in range(experts) if counts[e]]
    ends = [sum(counts[:e + 1]) for e in range(experts)]
    nbytes = len(hit) * n * k * 2 + t * k * 2 + t * n * 2

    def make():
        a = acts(t, k)
        w = weights(experts * n, k).view(experts, n, k)
        return a, w, torch.tensor(ends, device="cuda", dtype=torch.int32)

    def grouped(a, w, offs):
        return torch._grouped_mm(a, w.transpose(-2, -1), offs=offs, out_dtype=torch.bfloat16)

    def loop(a, w, offs):
        starts = [0] + ends[:-1]
        return [a[starts[e]:ends[e]] @ w[e].T for e in hit]

    kind, call = "loop", loop
    if hasattr(torch, "_grouped_mm"):
        try:
            probe = make()
            grouped(*probe)
            torch.cuda.synchronize()
            kind, call = "grouped_mm", grouped
        except Exception as e:  # noqa: BLE001 - unsupported here: the loop stands in
            log(f"torch._grouped_mm refused the case ({type(e).__name__}: {str(e)[:200]}); timing the loop")
        finally:
            probe = None
            free()
    return nbytes, make, call, kind


def run_grouped(name, case, l2, data):
    gen = torch.Generator(device="cuda").manual_seed(0)
    nbytes, make, call, kind = grouped_contender(case["n"], case["k"], case["counts"], gen, data)
    nsets = 1 if nbytes > 2 * l2 else math.ceil(2 * l2 / nbytes) + 1
    calls = nsets * math.ceil(MIN_CALLS / nsets)
    rec = {"graph_calls": calls, "sets": nsets, "bf16_grouped_kind": kind,
           "bf16_grouped_graph_us": None, "bf16_grouped_do_bench_us": None}
    sets = None
    try:
        first = make()
        sets = [first] + [tuple(x.clone() for x in first) for _ in range(nsets - 1)]
        g_us, db_us, db_err = time_graph(call, sets, calls)
        rec["bf16_grouped_graph_us"] = round(g_us, 3)
        rec["bf16_grouped_do_bench_us"] = None if db_us is None else round(db_us, 3)
        if db_err:
            rec["bf16_grouped_do_bench_error"] = db_err
        elif abs(g_us - db_us) > 0.1 * min(g_us, db_us):
            log(f"WARNING {name}: graph {g_us:.2f} us vs do_bench {db_us:.2f} us (> 10% apart)")
        log(f"{name}: bf16 grouped ({kind}) {g_us:.2f} us (do_bench {db_us}); {nsets} sets, {calls} calls a graph")
    except Exception as e:  # noqa: BLE001
        rec["bf16_grouped_error"] = f"{type(e).__name__}: {e}".strip()[:500]
        log(f"{name}: failed: {rec['bf16_grouped_error']}")
    finally:
        del sets
        free()
    return rec


def time_graph(call, sets, calls):
    """Captures `calls` calls rotating over `sets` into one graph; returns (graph_us, do_bench_us,
    do_bench_error) per call."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for s in sets:
            call(*s)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph, outs = torch.cuda.CUDAGraph(), []
    try:
        with torch.cuda.graph(graph, stream=stream):
            for i in range(calls):
                outs.append(call(*sets[i % len(sets)]))
        for _ in range(3):
            graph.replay()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(REPS)]
        for start, end in events:
            start.record()
            graph.replay()
            end.record()
        torch.cuda.synchronize()
        graph_us = statistics.median(s.elapsed_time(e) for s, e in events) * 1e3 / calls
        try:
            import triton.testing
            ms = triton.testing.do_bench(graph.replay, warmup=25, rep=100, return_mode="median")
            return graph_us, ms * 1e3 / calls, None
        except Exception as e:  # noqa: BLE001 - the cross-check must not lose the primary figure
            return graph_us, None, f"{type(e).__name__}: {e}"
    finally:
        del outs
        try:
            graph.reset()
        except Exception:  # noqa: BLE001 - keep the capture's own error, if any
            pass


def copy_gbps(nbytes=1 << 30, reps=10):
    src = torch.ones(nbytes, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(reps)]
    for start, end in events:
        start.record()
        dst.copy_(src)
        end.record()
    torch.cuda.synchronize()
    ms = statistics.median(s.elapsed_time(e) for s, e in events)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def free():
    try:
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - best effort after a failure
        pass
    torch.cuda.empty_cache()


def run_shape(op, shape, l2, data):
    m, n, k = (int(x) for x in shape.split("x"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    table = contenders(op, m, n, k, gen, data)
    nsets = max(2, math.ceil(2 * l2 / min(b for b, _, _ in table.values())) + 1)
    if nsets > MAX_SETS:
        log(f"{shape}: {nsets} sets needed to cover 2x L2, capped at {MAX_SETS}")
        nsets = MAX_SETS
    calls = nsets * math.ceil(MIN_CALLS / nsets)
    rec = {"graph_calls": calls, "sets": nsets}
    for name, (nbytes, make, call) in table.items():
        rec[f"{name}_graph_us"] = rec[f"{name}_do_bench_us"] = None
        sets = None
        try:
            first = make()
            sets = [first] + [tuple(t.clone() for t in first) for _ in range(nsets - 1)]
            g_us, db_us, db_err = time_graph(call, sets, calls)
            rec[f"{name}_graph_us"] = round(g_us, 3)
            rec[f"{name}_do_bench_us"] = None if db_us is None else round(db_us, 3)
            if db_err:
                rec[f"{name}_do_bench_error"] = db_err
                log(f"{shape} {name}: do_bench failed: {db_err}")
            elif abs(g_us - db_us) > 0.1 * min(g_us, db_us):
                log(f"WARNING {shape} {name}: graph {g_us:.2f} us vs do_bench {db_us:.2f} us (> 10% apart)")
        except Exception as e:  # noqa: BLE001 - one contender's failure must not stop the run
            rec[f"{name}_error"] = f"{type(e).__name__}: {e}".strip()[:500]
            log(f"{shape} {name}: failed: {rec[name + '_error']}")
        finally:
            del sets
            free()
    def us(v):
        return "-" if v is None else f"{v:.2f}"
    parts = [f"{name} {us(rec[name + '_graph_us'])} us (do_bench {us(rec[name + '_do_bench_us'])})"
             for name in table]
    log(f"{shape}: " + ", ".join(parts) + f"; {nsets} sets, {calls} calls a graph")
    return rec


def write(path, doc):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--shape", action="append", help="MxNxK (repeatable; default: the bench shapes)")
    p.add_argument("--op", choices=["gemm", "w4a16", "grouped"], default="gemm",
                   help="gemm: cuBLAS bf16 and FP8; w4a16: cuBLAS bf16 and int4 tinygemm; "
                        "grouped: bf16 grouped GEMM over --grouped-cases")
    p.add_argument("--grouped-cases", help="JSON of the grouped cases (bench --emit-grouped-cases)")
    p.add_argument("--data", choices=["nvfp4-gaussian", "randn"], default="nvfp4-gaussian",
                   help="operand values (see the module doc); the crate's bench --data gaussian matches the default")
    args = p.parse_args()
    if args.op == "grouped" and not args.grouped_cases:
        p.error("--op grouped needs --grouped-cases FILE")
    shapes = args.shape or DEFAULT_SHAPES
    for s in shapes:
        if len(s.split("x")) != 3 or not all(x.isdigit() for x in s.split("x")):
            p.error(f"bad shape {s!r}: expected MxNxK")

    props = torch.cuda.get_device_properties(0)
    try:
        import triton
        triton_version = triton.__version__
    except Exception:  # noqa: BLE001
        triton_version = None
    doc = {"gpu": props.name, "l2_bytes": props.L2_cache_size, "copy_gbps": None,
           "torch": torch.__version__, "triton": triton_version, "cuda": torch.version.cuda,
           "op": args.op, "data": args.data, "shapes": {}}
    try:
        doc["copy_gbps"] = round(copy_gbps(), 1)
        log(f"{props.name}, L2 {props.L2_cache_size / 2**20:.0f} MiB, copy {doc['copy_gbps']} GB/s")
    except Exception as e:  # noqa: BLE001
        doc["copy_error"] = f"{type(e).__name__}: {e}"
        log(f"copy bandwidth failed: {doc['copy_error']}")
    free()
    if args.op == "grouped":
        with open(args.grouped_cases) as f:
            cases = json.load(f)
        doc["cases"] = {}
        for name, case in cases.items():
            doc["cases"][name] = run_grouped(name, case, props.L2_cache_size, args.data)
            write(args.out, doc)
        shapes = []
    for s in shapes:
        doc["shapes"][s] = run_shape(args.op, s, props.L2_cache_size, args.data)
        write(args.out, doc)
    write(args.out, doc)


if __name__ == "__main__":
    main()
