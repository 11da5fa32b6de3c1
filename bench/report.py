#!/usr/bin/env python3
"""Turns a bench JSONL (examples/bench --json) into a plot and the README table.

  python3 bench/report.py RESULTS.jsonl [--png OUT.png] [--readme README.md ...]

Each line: one JSON object with op ("gemm"), gpu, commit, m, n, k, l, out, config,
ours_launch_us, ours_b2b_us, ours_graph_us, host_enqueue_us, cublas_bf16_graph_us,
cublas_fp8_graph_us, floor_us, exact, verdict; ours_prepacked_graph_us (the weights prepacked,
every table: its column, and a sentence comparing it with ours_graph_us where the file has it);
data and baselines_data (the operands' kind on each side, named in every table's source line).
Rows with op "gemm" (or none) are used, in file order; extra fields and nulls are fine.
- --png: time / floor_us per shape (log scale), one subplot per output type, one marker series
  per contender (ours graph, back to back, per launch; cuBLAS bf16 and FP8 graph), the floor at 1.
- --readme: in each file, replaces the lines between `<!-- bench-table:begin -->` and
  `<!-- bench-table:end -->` with a markdown table of the rows, one sentence per cuBLAS
  contender comparing ours_graph_us with that contender's graph time (like for like, same run;
  nothing else is claimed) and the source line. A file without exactly one pair of markers:
  exit 2, naming it, before any file is written. Running it twice gives the same file.
- --grouped: the rows with op "grouped" instead (case, groups, experts_hit, sum_m, n, k, config,
  ours_graph_us, host_enqueue_us, list_graph_us, w4a16_graph_us, loop_graph_us, bf16_grouped_graph_us,
  floor_us, exact), their table between `<!-- grouped-table:begin -->` and `<!-- grouped-table:end -->`,
  comparing ours_graph_us with the loop of gemm and with bf16 grouped GEMM, and w4a16_graph_us
  (where the run has it) with bf16 grouped GEMM; no plot.
- --w4a16: the rows with op "w4a16" (m, n, k, input, config, ours_graph_us, host_enqueue_us,
  cublas_bf16_graph_us, int4_tinygemm_graph_us, floor_us, exact), their table between
  `<!-- w4a16-table:begin -->` and `<!-- w4a16-table:end -->`, comparing ours_graph_us with cuBLAS
  bf16 and torch._weight_int4pack_mm, and the NVFP4 GEMM's graph time at the same shape where the
  file has gemm rows; no plot.
- --tag TAG: the markers carry the tag (`<!-- bench-table:TAG:begin -->`, likewise the others'), so
  that a file can hold the tables of several runs.
"""
import argparse
import json
import os
import sys

BEGIN, END = "<!-- bench-table:begin -->", "<!-- bench-table:end -->"
GBEGIN, GEND = "<!-- grouped-table:begin -->", "<!-- grouped-table:end -->"
WBEGIN, WEND = "<!-- w4a16-table:begin -->", "<!-- w4a16-table:end -->"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERIES = [  # (field, legend, marker)
    ("ours_graph_us", "ours, CUDA graph", "o"),
    ("ours_b2b_us", "ours, back to back", "s"),
    ("ours_launch_us", "ours, per launch", "^"),
    ("cublas_bf16_graph_us", "cuBLAS bf16, CUDA graph", "x"),
    ("cublas_fp8_graph_us", "cuBLAS FP8, CUDA graph", "+"),
]
CUBLAS = [("cublas_bf16_graph_us", "cuBLAS bf16"), ("cublas_fp8_graph_us", "cuBLAS FP8")]


def load(path, op="gemm"):
    rows = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{i}: not JSON: {e}")
            if row.get("op", "gemm") == op:
                rows.append(row)
    if not rows:
        sys.exit(f"{path}: no {op} rows")
    return rows


def _maybe_load(path, op):
    """The rows with `op`, or none (load() exits where there are none)."""
    with open(path) as f:
        return [r for r in (json.loads(l) for l in f if l.strip()) if r.get("op", "gemm") == op]


def shape(r):
    s = f"{r.get('m')}x{r.get('n')}x{r.get('k')}"
    return s if r.get("l") in (None, 1) else f"{s}x{r['l']}"


def num(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def fmt(v):
    v = num(v)
    if v is None:
        return "-"
    return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def joined(rows, key):
    return ", ".join(dict.fromkeys(str(r.get(key)) for r in rows if r.get(key) is not None)) or "?"


def plot(rows, png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    outs = list(dict.fromkeys(str(r.get("out")) for r in rows))
    fig, axes = plt.subplots(len(outs), 1, squeeze=False, figsize=(max(7, 0.8 * len(rows) / len(outs) + 3), 3.6 * len(outs)))
    for ax, out in zip(axes[:, 0], outs):
        sub = [r for r in rows if str(r.get("out")) == out]
        xs = range(len(sub))
        for field, label, marker in SERIES:
            pts = [(x, num(r.get(field)) / num(r.get("floor_us"))) for x, r in zip(xs, sub)
                   if num(r.get(field)) and num(r.get("floor_us"))]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker, label=label, ms=7,
                        mfc="none" if marker in "os^" else None)
        ax.axhline(1, color="k", lw=0.8, ls="--", label="floor")
        ax.set_yscale("log")
        ax.set_ylim(bottom=min(0.8, ax.get_ylim()[0]))
        for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
            axis(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xticks(list(xs), [shape(r) for r in sub], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("time / floor")
        ax.set_title(f"output {out}", fontsize=10)
        ax.grid(True, which="both", axis="y", alpha=0.3)
    axes[0, 0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.suptitle(f"{joined(rows, 'gpu')}, commit {joined(rows, 'commit')}")
    fig.tight_layout()
    fig.savefig(png, dpi=120)


NOISE = 0.02  # the least margin a "faster" or "slower" needs; a baseline's own disagreement widens it


def failed(r):
    """A row whose output failed its check: its times are not compared. GEMM rows say so by their
    verdict (their `exact` is bit for bit, false for a passing "bound" row); the others by `exact`."""
    return r.get("verdict") == "failed" if r.get("verdict") else r.get("exact") is False


def comparison(rows, field, name, label_of=shape, units="shapes", ours_field="ours_graph_us", who="Faster"):
    """One sentence: where `ours_field` (ours_graph_us) beats, ties or loses to `field` (same-run
    rows only). A side counts as faster only by more than the margin: NOISE, or the contender's
    own graph vs do_bench disagreement (`field` with _do_bench_us for _graph_us) where larger;
    rows whose output failed its check are not compared. `who` starts it."""
    several_outs = len({str(r.get("out")) for r in rows}) > 1
    unit = "rows" if several_outs or len({label_of(r) for r in rows}) < len(rows) else units
    faster, slower, tied, bad = [], [], [], []
    for r in rows:
        ours, theirs = num(r.get(ours_field)), num(r.get(field))
        if not ours or not theirs:
            continue
        label = label_of(r) + (f" {r.get('out')}" if several_outs else "")
        if failed(r):
            bad.append(label)
            continue
        margin = NOISE
        cross = num(r.get(field.replace("_graph_us", "_do_bench_us"))) if field.endswith("_graph_us") else None
        if cross:
            margin = max(margin, abs(theirs - cross) / min(theirs, cross))
        ratio = f"{theirs / ours:.2f}"
        item = f"{label} ({theirs / ours:.3f}x)" if ratio == "1.00" else f"{label} ({ratio}x)"
        if margin > NOISE:
            item = item[:-1] + f", margin {100 * margin:.0f} %)"
        (faster if ours * (1 + margin) < theirs else slower if ours > theirs * (1 + margin) else tied).append(item)
    n = len(faster) + len(slower) + len(tied)
    if n == 0 and not bad:
        return f"No row has both our graph time and a {name} graph time."
    crossed = any(num(r.get(field.replace("_graph_us", "_do_bench_us"))) for r in rows) if field.endswith("_graph_us") else False
    basis = f"by more than {100 * NOISE:.0f} %" + (f" or {name}'s own graph vs do_bench disagreement" if crossed else "")
    s = f"{who} than {name} (graph vs graph, same run, {basis}) at {len(faster)} of {n} {unit}"
    s += f": {', '.join(faster)}" if faster else ""
    s += f"; slower at {len(slower)}: {', '.join(slower)}" if slower else "; slower at none"
    s += f"; within the margin at {len(tied)}: {', '.join(tied)}" if tied else ""
    if bad:
        s += f"; not compared, their output failed its check: {', '.join(bad)}"
    if n + len(bad) < len(rows):
        s += f"; {len(rows) - n - len(bad)} {unit} without both figures"
    s += f" (in brackets: {name} time / ours)"
    return s + "."


def markdown(head, rows, cells_of):
    """A markdown table: `head`, then cells_of(row) for each row."""
    lines = ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cells_of(r)) + " |" for r in rows]
    return lines


def ratio_and_exact(r):
    g, fl = num(r.get("ours_graph_us")), num(r.get("floor_us"))
    ex, v = r.get("exact"), r.get("verdict")
    judged = {"exact": "yes", "bound": "within bound", "failed": "no"}.get(v) if v else None
    return [f"{g / fl:.2f}" if g and fl else "-", judged or ("yes" if ex is True else "no" if ex is False else "-")]


def ending(lines, rows, source, label_of=shape, units="shapes"):
    """A table's last lines: prepacked weights against the standard layout (where the file has
    them), then the source line."""
    if any(r.get("ours_prepacked_graph_us") is not None for r in rows):
        lines += ["", comparison(rows, "ours_graph_us", "the standard layout", label_of, units, "ours_prepacked_graph_us",
                                 "Prepacked weights (`Nvfp4Tensor::prepack`) faster")]
    data = joined(rows, "data") if any(r.get("data") for r in rows) else "contest"
    if any(r.get("baselines_data") for r in rows):
        data += f", baselines' data {joined(rows, 'baselines_data')}"
    lines += ["", f"Source: {source} ({joined(rows, 'gpu')}, commit {joined(rows, 'commit')}, operand data {data})", ""]
    return "\n".join(lines)


def table(rows, source):
    head = ["M x N x K", "out", "config", "ours graph us", "prepacked graph us", "ours b2b us", "ours per launch us",
            "host enqueue us", "cuBLAS bf16 graph us", "cuBLAS FP8 graph us", "floor us",
            "ours/floor", "exact"]
    fields = ("ours_graph_us", "ours_prepacked_graph_us", "ours_b2b_us", "ours_launch_us", "host_enqueue_us",
              "cublas_bf16_graph_us", "cublas_fp8_graph_us", "floor_us")
    lines = markdown(head, rows, lambda r: [shape(r), str(r.get("out") or "-"), f"`{r['config']}`" if r.get("config") else "-"]
                     + [fmt(r.get(f)) for f in fields] + ratio_and_exact(r))
    for f, name in CUBLAS:
        lines += ["", comparison(rows, f, name)]
    return ending(lines, rows, source)


def grouped_table(rows, source):
    head = ["case", "experts (with rows)", "rows", "N x K", "config", "ours graph us", "prepacked graph us",
            "host enqueue us", "list form graph us", "W4A16 (bf16 in) graph us", "loop of gemm graph us", "bf16 grouped graph us",
            "floor us", "ours/floor", "exact"]
    fields = ("ours_graph_us", "ours_prepacked_graph_us", "host_enqueue_us", "list_graph_us", "w4a16_graph_us", "loop_graph_us", "bf16_grouped_graph_us", "floor_us")
    lines = markdown(head, rows, lambda r: [str(r.get("case")), f"{r.get('groups')} ({r.get('experts_hit')})", str(r.get("sum_m")),
                                            f"{r.get('n')} x {r.get('k')}", f"`{r['config']}`" if r.get("config") else "-"]
                     + [fmt(r.get(f)) for f in fields] + ratio_and_exact(r))
    for field, name in [("loop_graph_us", "the loop of gemm"), ("bf16_grouped_graph_us", "bf16 grouped GEMM")]:
        lines += ["", comparison(rows, field, name, lambda r: str(r.get("case")), "cases")]
    if any(r.get("w4a16_graph_us") is not None for r in rows):
        lines += ["", comparison(rows, "bf16_grouped_graph_us", "bf16 grouped GEMM", lambda r: str(r.get("case")), "cases",
                                 "w4a16_graph_us", "W4A16 grouped (`moe_gemm_w4a16`, bf16 activations) faster")]
    return ending(lines, rows, source, lambda r: str(r.get("case")), "cases")


def w4a16_table(rows, gemm_rows, source):
    # The NVFP4 x NVFP4 GEMM with a 16-bit output (f16: the bench times no bf16-output row), never
    # its FP4-output row of the same shape.
    nvfp4 = {shape(r): num(r.get("ours_graph_us")) for r in gemm_rows if str(r.get("out")) == "f16"}
    for r in rows:
        r["nvfp4_graph_us"] = nvfp4.get(shape(r))
    head = ["M x N x K", "activations", "config", "ours graph us", "prepacked graph us", "host enqueue us", "NVFP4 x NVFP4 graph us",
            "cuBLAS bf16 graph us", "int4 tinygemm graph us", "floor us", "ours/floor", "exact"]
    fields = ("ours_graph_us", "ours_prepacked_graph_us", "host_enqueue_us", "nvfp4_graph_us", "cublas_bf16_graph_us", "int4_tinygemm_graph_us", "floor_us")
    lines = markdown(head, rows, lambda r: [shape(r), str(r.get("input") or "-"), f"`{r['config']}`" if r.get("config") else "-"]
                     + [fmt(r.get(f)) for f in fields] + ratio_and_exact(r))
    for field, name in [("cublas_bf16_graph_us", "cuBLAS bf16"), ("int4_tinygemm_graph_us", "torch._weight_int4pack_mm"), ("nvfp4_graph_us", "the NVFP4 x NVFP4 GEMM")]:
        lines += ["", comparison(rows, field, name)]
    return ending(lines, rows, source)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("jsonl")
    p.add_argument("--png", help="write the plot here")
    p.add_argument("--readme", action="append", default=[], help="file with the bench-table markers (repeatable)")
    p.add_argument("--grouped", action="store_true", help="the grouped rows and their table")
    p.add_argument("--w4a16", action="store_true", help="the W4A16 rows and their table")
    p.add_argument("--tag", help="use the markers with this tag (`<!-- bench-table:TAG:begin -->`), "
                                 "so that one file can hold the tables of several runs (another GPU's, say)")
    args = p.parse_args()
    begin, end = (GBEGIN, GEND) if args.grouped else (WBEGIN, WEND) if args.w4a16 else (BEGIN, END)
    if args.tag:
        if not args.tag.replace("-", "").isalnum():
            p.error(f"--tag {args.tag!r}: letters, digits and '-' only")
        begin, end = (m.replace(":begin", f":{args.tag}:begin").replace(":end", f":{args.tag}:end") for m in (begin, end))
    rows = load(args.jsonl, "grouped" if args.grouped else "w4a16" if args.w4a16 else "gemm")

    texts = {}
    for path in args.readme:
        try:
            lines = open(path).read().split("\n")
        except OSError as e:
            print(f"{path}: {e}", file=sys.stderr)
            sys.exit(2)
        b = [i for i, l in enumerate(lines) if l.strip() == begin]
        e = [i for i, l in enumerate(lines) if l.strip() == end]
        if len(b) != 1 or len(e) != 1 or b[0] > e[0]:
            print(f"{path}: needs exactly one line {begin} followed by one line {end}", file=sys.stderr)
            sys.exit(2)
        texts[path] = (lines, b[0], e[0])

    if args.png and not args.grouped and not args.w4a16:
        plot(rows, args.png)
    src = os.path.abspath(args.jsonl)
    src = os.path.relpath(src, ROOT) if src.startswith(ROOT + os.sep) else args.jsonl
    if args.w4a16:
        body = w4a16_table(rows, _maybe_load(args.jsonl, "gemm"), src)
    else:
        body = grouped_table(rows, src) if args.grouped else table(rows, src)
    for path, (lines, b, e) in texts.items():
        new = "\n".join(lines[:b + 1] + [body] + lines[e:])
        if new != "\n".join(lines):
            with open(path, "w") as f:
                f.write(new)
        print(f"{path}: table of {len(rows)} rows", file=sys.stderr)


if __name__ == "__main__":
    main()
