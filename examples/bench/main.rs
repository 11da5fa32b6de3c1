//! Benchmark of `BlockScaledGemm` measured the way engines run it (not a test; bench/README.md
//! has the method and the current table).
//!
//! Per shape and output type, in one run: `sets` copies of the inputs and of the outputs, every
//! launch on the next in turn, so that no launch reads or writes data an earlier launch left in
//! the L2 ([`rotation`] has the rule); 10 warm-up launches; then
//! - `ours_launch_us`: each of `--runs` launches alone between a pair of CUDA events (a memset of
//!   a scratch word between launches); the median;
//! - `ours_b2b_us`: `--runs` launches back to back between one pair of events; the mean;
//! - `ours_graph_us`: a CUDA graph of `graph_calls` launches (a multiple of `sets`, at least
//!   `--graph-calls`) replayed `--replays` times between events; the median replay over the
//!   calls in it; `ours_prepacked_graph_us`: the same with the weights prepacked
//!   (`Nvfp4Tensor::prepack`), the rule's config for them (`prepacked_config`) or the forced one;
//!   null where the config is not an SM90 one;
//! - `host_enqueue_us`: host time of one call while queueing the back-to-back launches (median),
//!   each call made as a user makes it (the rule picks the config unless `--config` forces one);
//!   `host_plan_us`: of that, the validation and config choice alone (median of 1000).
//!   The outputs are poisoned (0xFF bytes) before each timing. After it, the latest set's is judged on sampled
//!   rows against the exact CPU reference by the crate's verdict (`compare::verify_matrices`;
//!   FP4 outputs: codes and scales within one step, as the example judges them), and every other
//!   set the timing wrote must hold the same bytes (the sets' inputs are equal): `verdict`
//!   "exact" (every element bit for bit), "bound" (none beyond the stated FP32 bound) or
//!   "failed"; `exact` says bit for bit.
//!
//! The floor is max(bytes read and written / `floor_gbps`, FP16 MMA time at 800 TFLOP/s), where
//! `floor_gbps` is the device-to-device copy rate measured in this run (`copy_gbps`) or 3.0 TB/s,
//! whichever is larger ([`FLOOR_MIN_GBPS`]). cuBLAS figures come from `--baselines FILE`
//! (bench/baselines.py, run in the same device session by `run.sh bench`), graph-replayed like
//! ours, with their `triton.testing.do_bench` cross-check (`*_do_bench_us`) and their rotation
//! (`baselines_sets`, `baselines_graph_calls`); absent, they are null.
//!
//! Then the GPU quantizer (`op` "quantize"), bf16 (1, M, K) with a given global scale, for each
//! of `--quantize-rows` at K = `--quantize-k`: back to back and from a graph as above, inputs and
//! outputs rotated as above, `gbps` = bytes read + written (scale padding included)
//! per second of the graph time, against `copy_gbps`; `exact`: codes and scales equal the CPU
//! quantizer's bit for bit. The same for the fused SwiGLU quantizer (`"transform":"swiglu"`),
//! bf16 (1, M, 2K) in, for each of `--swiglu-rows` at K = `--swiglu-k`; `exact`: equal to the
//! CPU quantizer of `swiglu::swiglu_rows`.
//!
//! Then the quantizer feeding the GEMM (`op` "quantize_gemm", [`chain`] has the method) at each
//! of `--chain-shapes`: `quantize_into` + `gemm` against `quantize_decoded_into` + `gemm_decoded`.
//!
//! Then the grouped (mixture-of-experts) cases (`op` "grouped", [`grouped`] has the method),
//! against the loop of `gemm` per expert and bf16 grouped GEMM from `--grouped-baselines FILE`
//! (bench/baselines.py --op grouped over the cases `--emit-grouped-cases FILE` writes).
//!
//! `cargo run --release --example bench -- [--shape MxNxK]... [--out f16,nvfp4] [--json FILE]`

mod chain;
mod grouped;
mod rotation;
mod w4a16;

use std::time::Instant;

use blockscaled_gemm::compare::{compare_fp4, verify_matrices, Verdict};
use blockscaled_gemm::fp4_out;
use blockscaled_gemm::layout::from_tiled;
use blockscaled_gemm::reference::{self, Accumulation};
use blockscaled_gemm::{BlockScaledGemm, Config, Nvfp4Matrix, Nvfp4Output, Nvfp4Tensor, OutType, Problem, Quantizer, SplitMix64, WeightLayout};
use clap::Parser;
use cudarc::driver::sys::{CUdevice_attribute, CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, CudaViewMut, DevicePtrMut};
use rotation::{differing, Rotated, Rotation, Turns};
use half::f16;
use std::sync::Arc;

#[derive(Parser)]
struct Cli {
    /// Timed launches per measurement (the median or mean is reported); at least 100.
    #[arg(long, default_value_t = 100)]
    runs: usize,
    /// Launches captured in one CUDA graph (at least 20).
    #[arg(long, default_value_t = 20)]
    graph_calls: usize,
    /// Timed replays of the graph.
    #[arg(long, default_value_t = 20)]
    replays: usize,
    /// JSON from bench/baselines.py (cuBLAS bf16 and FP8, graph-replayed, same device session).
    #[arg(long)]
    baselines: Option<std::path::PathBuf>,
    /// Shapes to run (default: the ten of bench/README.md), e.g. --shape 128x7168x16384.
    #[arg(long, value_parser = parse_shape)]
    shape: Vec<(usize, usize, usize)>,
    /// Force a config by name.
    #[arg(long, value_parser = parse_config)]
    config: Option<Config>,
    /// Force the SM90 split-K count.
    #[arg(long)]
    split_k: Option<u32>,
    /// Output types, comma-separated: f16, bf16, f32, nvfp4, nvfp4-ue8m0.
    #[arg(long, default_value = "f16", value_parser = parse_outs)]
    out: List<OutType>,
    /// Write one JSON object per shape and output type here (JSON lines).
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Rows of the quantizer runs, comma-separated (empty: none).
    #[arg(long, default_value = "1,16,128,4096,16384", value_parser = parse_rows)]
    quantize_rows: List<usize>,
    /// K of the quantizer runs.
    #[arg(long, default_value_t = 7168)]
    quantize_k: usize,
    /// Rows of the fused SwiGLU quantizer runs (bf16 (1, M, 2K) in), comma-separated.
    #[arg(long, default_value = "1,16,128,4096,16384", value_parser = parse_rows)]
    swiglu_rows: List<usize>,
    /// K of the SwiGLU quantizer runs (the output's; DeepSeek-V3's expert width by default).
    #[arg(long, default_value_t = 2048)]
    swiglu_k: usize,
    /// Shapes of the quantizer-then-GEMM runs (`op` "quantize_gemm"), comma-separated MxNxK
    /// (empty: none).
    #[arg(long, default_value = "64x4096x7168,128x4096x7168,128x7168x2048,128x7168x16384,256x4096x7168", value_parser = parse_shapes)]
    chain_shapes: List<(usize, usize, usize)>,
    /// Skip the GEMMs (quantizer runs only).
    #[arg(long)]
    no_gemm: bool,
    /// Grouped cases to run: comma-separated names (the bench's cases, or a model layer at any
    /// token count, e.g. `dsv3-down-t384`), `all` or `none`.
    #[arg(long, default_value = "all")]
    grouped: String,
    /// Force the grouped cases' config by name: the MoE form's, and the list and W4A16 forms'
    /// where it has their kernels (`list_config`, `w4a16_config` in the JSON say what ran).
    #[arg(long, value_parser = parse_config)]
    grouped_config: Option<Config>,
    /// JSON from bench/baselines.py --op grouped (bf16 grouped GEMM, same device session).
    #[arg(long)]
    grouped_baselines: Option<std::path::PathBuf>,
    /// Write the `--grouped` cases (names, N, K, rows per expert) as JSON here and exit.
    #[arg(long)]
    emit_grouped_cases: Option<std::path::PathBuf>,
    /// Skip the W4A16 rows (bf16 activations x NVFP4 weights at every GEMM shape).
    #[arg(long)]
    no_w4a16: bool,
    /// W4A16 activation types, comma-separated: bf16, f16 (D has the activations' type).
    #[arg(long, default_value = "bf16", value_parser = parse_inputs)]
    w4a16_input: List<&'static str>,
    /// JSON from bench/baselines.py --op w4a16 (cuBLAS bf16 and torch._weight_int4pack_mm).
    #[arg(long)]
    w4a16_baselines: Option<std::path::PathBuf>,
    /// Commit recorded in the JSON (default: the one this binary was built from, if known).
    #[arg(long)]
    commit: Option<String>,
    /// NVFP4 operands: gaussian (N(0, 1) quantized, as real tensors arrive) or contest (random
    /// codes, block scales 0..3: a quarter of the blocks zero; the data of results before
    /// bf30fc7). The GPU's clock under load depends on the operands' bits: compare rows of
    /// the same data only (bench/DESIGN.md, "Data and power").
    #[arg(long, value_enum, default_value_t = Data::Gaussian)]
    data: Data,
}

/// A comma-separated option's values, parsed (and so checked) with the others at startup.
#[derive(Clone, Debug)]
struct List<T>(Vec<T>);

fn parse_shape(s: &str) -> Result<(usize, usize, usize), String> {
    match s.split('x').map(str::parse).collect::<Result<Vec<usize>, _>>().as_deref() {
        Ok(&[m, n, k]) => Ok((m, n, k)),
        _ => Err("expected MxNxK, three whole numbers".into()),
    }
}

fn parse_config(s: &str) -> Result<Config, String> {
    Config::from_name(s).ok_or_else(|| format!("not a config of cpp/configs.def ({})", Config::ALL.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(", ")))
}

/// Comma-separated values, each by `one`; empty items are skipped, so "" is none.
fn parse_list<T>(s: &str, one: impl Fn(&str) -> Result<T, String>) -> Result<List<T>, String> {
    s.split(',').map(str::trim).filter(|v| !v.is_empty()).map(one).collect::<Result<_, _>>().map(List)
}

fn parse_shapes(s: &str) -> Result<List<(usize, usize, usize)>, String> {
    parse_list(s, parse_shape)
}

fn parse_outs(s: &str) -> Result<List<OutType>, String> {
    let outs = parse_list(s, |v| OutType::ALL.into_iter().find(|o| o.name() == v).ok_or_else(|| format!("{v}: one of f16, bf16, f32, nvfp4, nvfp4-ue8m0")))?;
    if outs.0.is_empty() {
        return Err("at least one output type (--no-gemm skips the GEMMs)".into());
    }
    Ok(outs)
}

fn parse_rows(s: &str) -> Result<List<usize>, String> {
    parse_list(s, |v| v.parse().map_err(|_| format!("{v} is not a row count")))
}

fn parse_inputs(s: &str) -> Result<List<&'static str>, String> {
    parse_list(s, |v| ["bf16", "f16"].into_iter().find(|i| *i == v).ok_or_else(|| format!("{v}: bf16 or f16")))
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Data {
    Gaussian,
    Contest,
}

impl Data {
    fn name(self) -> &'static str {
        match self {
            Data::Gaussian => "gaussian",
            Data::Contest => "contest",
        }
    }
}

/// An NVFP4 operand (batch, rows, K) of the `--data` kind.
fn operand(cli: &Cli, shape: (usize, usize, usize), seed: u64) -> blockscaled_gemm::Result<Nvfp4Matrix> {
    match cli.data {
        Data::Gaussian => Nvfp4Matrix::random_gaussian(shape, seed),
        Data::Contest => Nvfp4Matrix::random_contest(shape, seed),
    }
}

/// The floors' bandwidth is the copy rate measured in the run or this, whichever is larger: SPEC.md
/// states an H100's floors at 3.0 TB/s, and a run's copy can measure below it (2.92 TB/s on one
/// H100), which would make the floor kinder. An H200's copy measures above it and is used.
const FLOOR_MIN_GBPS: f64 = 3000.0;

const DEFAULT_SHAPES: &[(usize, usize, usize)] = &[
    (1, 4096, 7168),
    (1, 7168, 16384),
    (16, 4096, 7168),
    (64, 4096, 7168),
    (128, 4096, 7168),
    (128, 7168, 2048),
    (128, 7168, 16384),
    (256, 4096, 7168),
    (2048, 2048, 2048),
    (8192, 8192, 8192),
];

type Sets = Vec<(Nvfp4Tensor, Nvfp4Tensor)>;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    if cli.runs < 100 || cli.graph_calls < 20 || cli.replays < 1 {
        eprintln!("bench: --runs must be at least 100, --graph-calls at least 20, --replays at least 1");
        std::process::exit(2);
    }
    let cases = grouped::select(&cli.grouped).unwrap_or_else(|e| {
        eprintln!("bench: {e}");
        std::process::exit(2);
    });
    if let Some(path) = &cli.emit_grouped_cases {
        std::fs::write(path, grouped::cases_json(&cases))?;
        return Ok(());
    }
    if !BlockScaledGemm::driver_present() {
        eprintln!("bench: no NVIDIA driver on this machine");
        std::process::exit(3);
    }
    let outs = &cli.out.0;
    let shapes = if cli.shape.is_empty() { DEFAULT_SHAPES.to_vec() } else { cli.shape.clone() };
    let ctx = CudaContext::new(0)?;
    // Graph capture needs a stream of our own and no cudarc event tracking (BlockScaledGemm docs).
    // SAFETY: this program orders every buffer's uses on the one stream below.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.new_stream()?;
    let gemm = BlockScaledGemm::new(stream.clone())?.with_split_k(cli.split_k);
    let l2 = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize;
    let gpu = ctx.name()?;
    let data = cli.data.name();
    let commit = cli.commit.clone().or_else(|| option_env!("BSG_COMMIT").map(str::to_string)).unwrap_or_else(|| "unknown".into());
    let (baselines, gemm_base_data) = read_baselines(&cli.baselines, cli.data)?;
    let copy_gbps = copy_bandwidth(&stream)?;
    let floor_gbps = copy_gbps.max(FLOOR_MIN_GBPS);
    println!("device: {gpu}, {} SMs, L2 {} MB, copy {copy_gbps:.0} GB/s (floors at {floor_gbps:.0}); commit {commit}", gemm.device().sm_count, l2 >> 20);
    println!("{:>16} {:>6} {:>24} {:>5} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>10} {:>9} {:>7} {:>6}", "MxNxK", "out", "config", "split", "launch_us", "b2b_us", "graph_us", "prepack", "host_us", "floor_us", "bf16_graph", "fp8_graph", "x_floor", "check");
    let mut json = String::new();
    for &(m, n, k) in shapes.iter().filter(|_| !cli.no_gemm) {
        for &out in outs {
            let r = bench_one(&cli, &gemm, &stream, l2, floor_gbps, (m, n, k), out)?;
            let (bf16, fp8) = baselines.as_ref().map_or((None, None), |b| b.get(m, n, k));
            let fmt = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.2}"));
            println!("{:>16} {:>6} {:>24} {:>5} {:>9.2} {:>8.2} {:>8.2} {:>8} {:>8.2} {:>8.2} {:>10} {:>9} {:>7.2} {:>6}", format!("{m}x{n}x{k}"), out.name(), r.config.to_string(), r.split,
                r.launch_us, r.b2b_us, r.graph_us, fmt(r.prepacked.map(|x| x.0)), r.host_us, r.floor_us, fmt(bf16), fmt(fp8), r.graph_us / r.floor_us, r.check.label());
            let num = |x: Option<f64>| x.map_or("null".to_string(), |v| format!("{v:.3}"));
            let (prepacked_us, prepacked_config) = prepacked_json(r.prepacked);
            json += &format!(
                "{{\"op\":\"gemm\",\"gpu\":\"{gpu}\",\"commit\":\"{commit}\",\"data\":\"{data}\",\"baselines_data\":{gemm_base_data},\"m\":{m},\"n\":{n},\"k\":{k},\"l\":1,\"out\":\"{}\",\"config\":\"{}\",\"split_k\":{},\"runs\":{},\"sets\":{},\"graph_calls\":{},\"ours_launch_us\":{:.3},\"ours_b2b_us\":{:.3},\"ours_graph_us\":{:.3},\"ours_prepacked_graph_us\":{},\"prepacked_config\":{},\"host_enqueue_us\":{:.3},\"host_plan_us\":{:.3},\"cublas_bf16_graph_us\":{},\"cublas_fp8_graph_us\":{},{},\"floor_us\":{:.3},\"floor_gbps\":{floor_gbps:.1},\"copy_gbps\":{copy_gbps:.1},\"workspace_bytes\":{},\"exact\":{},\"verdict\":\"{}\"}}\n",
                out.name(), r.config, r.split, cli.runs, r.rot.sets, r.rot.calls, r.launch_us, r.b2b_us, r.graph_us, prepacked_us, prepacked_config, r.host_us, r.plan_us, num(bf16), num(fp8),
                cross_check(&baselines, &format!("{m}x{n}x{k}"), &["cublas_bf16_do_bench_us", "cublas_fp8_do_bench_us"]), r.floor_us, r.workspace, r.check.bit_exact, r.check.verdict());
        }
    }
    let (w4a16_baselines, w4a16_base_data) = read_baselines(&cli.w4a16_baselines, cli.data)?;
    if !cli.no_gemm && !cli.no_w4a16 {
        println!("{:>16} {:>24} {:>5} {:>8} {:>8} {:>8} {:>8} {:>8} {:>10} {:>10} {:>7} {:>6}", "w4a16 MxNxK", "config", "split", "b2b_us", "graph_us", "prepack", "host_us", "floor_us", "bf16_graph", "int4_graph", "x_floor", "check");
    }
    let inputs = &cli.w4a16_input.0;
    for (&(m, n, k), &input) in shapes.iter().filter(|_| !cli.no_gemm && !cli.no_w4a16).flat_map(|s| inputs.iter().map(move |i| (s, i))) {
        let r = match input {
            "f16" => w4a16::bench_shape::<f16>(&cli, &gemm, &stream, l2, floor_gbps, (m, n, k))?,
            _ => w4a16::bench_shape::<half::bf16>(&cli, &gemm, &stream, l2, floor_gbps, (m, n, k))?,
        };
        let name = format!("{m}x{n}x{k}");
        let bf16 = w4a16_baselines.as_ref().and_then(|b| b.number(&name, "cublas_bf16_graph_us"));
        let int4 = w4a16_baselines.as_ref().and_then(|b| b.number(&name, "int4_tinygemm_graph_us"));
        let fmt = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.2}"));
        println!("{:>16} {:>24} {:>5} {:>8.2} {:>8.2} {:>8} {:>8.2} {:>8.2} {:>10} {:>10} {:>7.2} {:>6}", format!("{input} {name}"), r.config.to_string(), r.split, r.b2b_us, r.graph_us, fmt(r.prepacked.map(|x| x.0)), r.host_us, r.floor_us, fmt(bf16), fmt(int4), r.graph_us / r.floor_us, if r.exact { "exact" } else { "FAILED" });
        let num = |x: Option<f64>| x.map_or("null".to_string(), |v| format!("{v:.3}"));
        let (prepacked_us, prepacked_config) = prepacked_json(r.prepacked);
        json += &format!(
            "{{\"op\":\"w4a16\",\"gpu\":\"{gpu}\",\"commit\":\"{commit}\",\"data\":\"{data}\",\"baselines_data\":{w4a16_base_data},\"m\":{m},\"n\":{n},\"k\":{k},\"l\":1,\"input\":\"{input}\",\"out\":\"{input}\",\"config\":\"{}\",\"split_k\":{},\"runs\":{},\"sets\":{},\"graph_calls\":{},\"ours_b2b_us\":{:.3},\"ours_graph_us\":{:.3},\"ours_prepacked_graph_us\":{},\"prepacked_config\":{},\"host_enqueue_us\":{:.3},\"cublas_bf16_graph_us\":{},\"int4_tinygemm_graph_us\":{},{},\"floor_us\":{:.3},\"floor_gbps\":{floor_gbps:.1},\"copy_gbps\":{copy_gbps:.1},\"exact\":{}}}\n",
            r.config, r.split, cli.runs, r.rot.sets, r.rot.calls, r.b2b_us, r.graph_us, prepacked_us, prepacked_config, r.host_us, num(bf16), num(int4),
            cross_check(&w4a16_baselines, &name, &["cublas_bf16_do_bench_us", "int4_tinygemm_do_bench_us"]), r.floor_us, r.exact);
    }
    let quantizer = Quantizer::new(stream.clone());
    let k = cli.quantize_k;
    for &m in &cli.quantize_rows.0 {
        let r = bench_quantize(&cli, &quantizer, &stream, l2, (m, k), false)?;
        let gbps = r.bytes as f64 / (r.graph_us * 1e-6) / 1e9;
        println!("quantize bf16 {m}x{k}: b2b {:.2} us, graph {:.2} us, host {:.2} us, {gbps:.0} GB/s ({:.0}% of copy; a same-size copy {:.2} us), {}", r.b2b_us, r.graph_us, r.host_us, 100.0 * gbps / copy_gbps, r.copy_same_us, if r.exact { "exact" } else { "FAILED" });
        json += &format!(
            "{{\"op\":\"quantize\",\"gpu\":\"{gpu}\",\"commit\":\"{commit}\",\"m\":{m},\"k\":{k},\"l\":1,\"input\":\"bf16\",\"runs\":{},\"sets\":{},\"graph_calls\":{},\"ours_b2b_us\":{:.3},\"ours_graph_us\":{:.3},\"host_enqueue_us\":{:.3},\"bytes\":{},\"gbps\":{gbps:.1},\"copy_gbps\":{copy_gbps:.1},\"copy_same_us\":{:.3},\"exact\":{}}}\n",
            cli.runs, r.sets, r.graph_calls, r.b2b_us, r.graph_us, r.host_us, r.bytes, r.copy_same_us, r.exact);
    }
    let k = cli.swiglu_k;
    for &m in &cli.swiglu_rows.0 {
        let r = bench_quantize(&cli, &quantizer, &stream, l2, (m, k), true)?;
        let gbps = r.bytes as f64 / (r.graph_us * 1e-6) / 1e9;
        println!("quantize swiglu bf16 {m}x{}->{k}: b2b {:.2} us, graph {:.2} us, host {:.2} us, {gbps:.0} GB/s ({:.0}% of copy; a same-size copy {:.2} us), {}", 2 * k, r.b2b_us, r.graph_us, r.host_us, 100.0 * gbps / copy_gbps, r.copy_same_us, if r.exact { "exact" } else { "FAILED" });
        json += &format!(
            "{{\"op\":\"quantize\",\"transform\":\"swiglu\",\"gpu\":\"{gpu}\",\"commit\":\"{commit}\",\"m\":{m},\"k\":{k},\"l\":1,\"input\":\"bf16\",\"runs\":{},\"sets\":{},\"graph_calls\":{},\"ours_b2b_us\":{:.3},\"ours_graph_us\":{:.3},\"host_enqueue_us\":{:.3},\"bytes\":{},\"gbps\":{gbps:.1},\"copy_gbps\":{copy_gbps:.1},\"copy_same_us\":{:.3},\"exact\":{}}}\n",
            cli.runs, r.sets, r.graph_calls, r.b2b_us, r.graph_us, r.host_us, r.bytes, r.copy_same_us, r.exact);
    }
    // The MoE-form quantizer on the DeepSeek-V3 gate-up cases' stacked rows (K = 7168).
    for case in cases.iter().filter(|c| c.name.starts_with("dsv3-gate-up")) {
        let r = grouped::bench_quantize_moe(&cli, &quantizer, &stream, l2, case)?;
        let (t, k) = (case.counts.iter().sum::<usize>(), case.k);
        let gbps = r.bytes as f64 / (r.graph_us * 1e-6) / 1e9;
        println!("quantize moe bf16 {} ({t}x{k}, {} experts): b2b {:.2} us, graph {:.2} us, host {:.2} us, {gbps:.0} GB/s ({:.0}% of copy; a same-size copy {:.2} us), {}", case.name, case.counts.len(), r.b2b_us, r.graph_us, r.host_us, 100.0 * gbps / copy_gbps, r.copy_same_us, if r.exact { "exact" } else { "FAILED" });
        json += &format!(
            "{{\"op\":\"quantize\",\"layout\":\"moe\",\"case\":\"{}\",\"experts\":{},\"gpu\":\"{gpu}\",\"commit\":\"{commit}\",\"m\":{t},\"k\":{k},\"l\":1,\"input\":\"bf16\",\"runs\":{},\"sets\":{},\"graph_calls\":{},\"ours_b2b_us\":{:.3},\"ours_graph_us\":{:.3},\"host_enqueue_us\":{:.3},\"bytes\":{},\"gbps\":{gbps:.1},\"copy_gbps\":{copy_gbps:.1},\"copy_same_us\":{:.3},\"exact\":{}}}\n",
            case.name, case.counts.len(), cli.runs, r.sets, r.graph_calls, r.b2b_us, r.graph_us, r.host_us, r.bytes, r.copy_same_us, r.exact);
    }
    for &(m, n, k) in cli.chain_shapes.0.iter().filter(|_| !cli.no_gemm) {
        let r = chain::bench_chain(&cli, &gemm, &stream, l2, (m, n, k))?;
        let [t0, t1] = r.two_step_graph_us;
        let [d0, d1] = r.decoded_graph_us;
        println!("quantize+gemm bf16 {m}x{n}x{k} ({}): quantize_into + gemm {t0:.2} / {t1:.2} us, quantize_decoded_into + gemm_decoded {d0:.2} / {d1:.2} us a step (two rounds), {}", r.config, if r.exact { "same bits" } else { "DIFFERENT" });
        json += &format!(
            "{{\"op\":\"quantize_gemm\",\"gpu\":\"{gpu}\",\"commit\":\"{commit}\",\"data\":\"{data}\",\"m\":{m},\"n\":{n},\"k\":{k},\"l\":1,\"input\":\"bf16\",\"out\":\"f16\",\"config\":\"{}\",\"sets\":{},\"graph_calls\":{},\"two_step_graph_us\":[{t0:.3},{t1:.3}],\"decoded_graph_us\":[{d0:.3},{d1:.3}],\"exact\":{}}}\n",
            r.config, r.rot.sets, r.rot.calls, r.exact);
    }
    let (grouped_baselines, grouped_base_data) = read_baselines(&cli.grouped_baselines, cli.data)?;
    if !cases.is_empty() {
        println!("{:>26} {:>5} {:>6} {:>5} {:>26} {:>8} {:>9} {:>8} {:>9} {:>10} {:>8} {:>7} {:>6} {:>8} {:>8} {:>8}", "case", "E", "hit", "T", "config", "b2b_us", "graph_us", "host_us", "loop_us", "bf16_group", "floor_us", "x_floor", "check", "list_us", "w4a16_us", "prepack");
    }
    for case in &cases {
        let r = grouped::bench_case(&cli, &gemm, &stream, l2, floor_gbps, case)?;
        let t: usize = case.counts.iter().sum();
        let bf16 = grouped_baselines.as_ref().and_then(|b| b.number(&case.name, "bf16_grouped_graph_us"));
        let kind = grouped_baselines.as_ref().and_then(|b| b.text(&case.name, "bf16_grouped_kind"));
        let fmt = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.2}"));
        println!("{:>26} {:>5} {:>6} {:>5} {:>26} {:>8.2} {:>9.2} {:>8.2} {:>9.2} {:>10} {:>8.2} {:>7.2} {:>6} {:>8.2} {:>8} {:>8}", case.name, case.counts.len(), r.experts_hit, t, r.config.to_string(),
            r.b2b_us, r.graph_us, r.host_us, r.loop_graph_us, fmt(bf16), r.floor_us, r.graph_us / r.floor_us, if r.exact { "exact" } else { "FAILED" }, r.list_graph_us, fmt(r.w4a16_graph_us), fmt(r.prepacked_graph_us));
        let num = |x: Option<f64>| x.map_or("null".to_string(), |v| format!("{v:.3}"));
        json += &format!(
            "{{\"op\":\"grouped\",\"gpu\":\"{gpu}\",\"commit\":\"{commit}\",\"data\":\"{data}\",\"baselines_data\":{grouped_base_data},\"case\":\"{}\",\"groups\":{},\"experts_hit\":{},\"sum_m\":{t},\"n\":{},\"k\":{},\"out\":\"bf16\",\"config\":\"{}\",\"runs\":{},\"sets\":{},\"graph_calls\":{},\"ours_b2b_us\":{:.3},\"ours_graph_us\":{:.3},\"ours_prepacked_graph_us\":{},\"host_enqueue_us\":{:.3},\"loop_graph_us\":{:.3},\"list_config\":\"{}\",\"list_graph_us\":{:.3},\"w4a16_config\":{},\"w4a16_graph_us\":{},\"bf16_grouped_graph_us\":{},\"bf16_grouped_kind\":{},{},\"floor_us\":{:.3},\"floor_gbps\":{floor_gbps:.1},\"bytes\":{},\"gbps\":{:.1},\"copy_gbps\":{copy_gbps:.1},\"exact\":{}}}\n",
            case.name, case.counts.len(), r.experts_hit, case.n, case.k, r.config, cli.runs, r.rot.sets, r.rot.calls, r.b2b_us, r.graph_us, num(r.prepacked_graph_us), r.host_us, r.loop_graph_us, r.list_config, r.list_graph_us,
            r.w4a16_config.map_or("null".to_string(), |c| format!("\"{c}\"")), num(r.w4a16_graph_us), num(bf16),
            kind.map_or("null".to_string(), |k| format!("\"{k}\"")), cross_check(&grouped_baselines, &case.name, &["bf16_grouped_do_bench_us"]), r.floor_us, r.bytes, r.bytes as f64 / (r.graph_us * 1e-6) / 1e9, r.exact);
    }
    if let Some(path) = &cli.json {
        std::fs::write(path, json)?;
    }
    Ok(())
}

struct QuantResult {
    b2b_us: f64,
    graph_us: f64,
    host_us: f64,
    bytes: usize,
    /// The row's `Rotation`.
    sets: usize,
    graph_calls: usize,
    /// A device-to-device copy moving the same bytes (half read, half written), graph-timed the
    /// same way with its buffers rotated: at small M both are launch-bound, which copy_gbps (a
    /// 512 MiB copy) does not show.
    copy_same_us: f64,
    exact: bool,
}

/// The quantizer on bf16 (1, m, k) N(0, 1) data with the global scale 4 / 2688 given (a static
/// activation scale), inputs and outputs rotated (`rotation`). `swiglu`: the fused SwiGLU
/// quantizer, its input (1, m, 2k).
fn bench_quantize(cli: &Cli, q: &Quantizer, stream: &Arc<CudaStream>, l2: usize, (m, k): (usize, usize), swiglu: bool) -> Result<QuantResult, Box<dyn std::error::Error>> {
    let mut rng = SplitMix64::new(7);
    let width = if swiglu { 2 } else { 1 };
    let elems = m * k * width;
    let x: Vec<half::bf16> = (0..elems).map(|_| half::bf16::from_f32(rng.normal() as f32)).collect();
    let g = 4.0 / 2688.0;
    let want = if swiglu {
        Nvfp4Matrix::quantize(&blockscaled_gemm::swiglu::swiglu_rows(&x, (1, m, k))?, (1, m, k), Some(g))?
    } else {
        Nvfp4Matrix::quantize(&x, (1, m, k), Some(g))?
    };
    let lens = (m * k / 2, want.scales().len());
    let bytes = 2 * elems + lens.0 + lens.1;
    let rot = Rotation::new(cli.graph_calls, l2, bytes, false);
    let big = stream.clone_htod(&x.repeat(rot.sets))?;
    let launch = |s: usize, codes: &mut CudaViewMut<u8>, scales: &mut CudaViewMut<u8>| {
        let x = big.slice(s * elems..(s + 1) * elems);
        if swiglu {
            q.quantize_swiglu_into(&x, (1, m, k), g, codes, scales)
        } else {
            q.quantize_into(&x, (1, m, k), g, codes, scales)
        }
    };
    time_quantizer(cli, stream, l2, rot, bytes, lens, launch, |codes, scales| codes == want.data() && scales == want.scales())
}

/// A quantizer's timings: 10 warm-up launches, then back to back and from a CUDA graph, its
/// outputs (codes and scales, `lens` bytes a set) rotated with the inputs, poisoned before each
/// timing and judged after it: the latest set's by `check`, and every other set it wrote must
/// hold the same bytes; `bytes` moved per launch.
#[allow(clippy::too_many_arguments)]
fn time_quantizer<E: Into<Box<dyn std::error::Error>>>(
    cli: &Cli, stream: &Arc<CudaStream>, l2: usize, rot: Rotation, bytes: usize, lens: (usize, usize),
    launch: impl Fn(usize, &mut CudaViewMut<u8>, &mut CudaViewMut<u8>) -> Result<(), E>,
    check: impl Fn(&[u8], &[u8]) -> bool,
) -> Result<QuantResult, Box<dyn std::error::Error>> {
    let turns = Turns::new(rot);
    let mut codes = Rotated::<u8>::new(stream, rot, lens.0)?;
    let mut scales = Rotated::<u8>::new(stream, rot, lens.1)?;
    let next = |codes: &mut Rotated<u8>, scales: &mut Rotated<u8>| {
        let s = turns.next();
        launch(s, &mut codes.set(s), &mut scales.set(s))
    };
    let judge = |codes: &Rotated<u8>, scales: &Rotated<u8>, since: usize| -> Result<bool, Box<dyn std::error::Error>> {
        let (c, sc) = (codes.read(stream)?, scales.read(stream)?);
        let latest = turns.latest();
        Ok(check(c.get(latest), sc.get(latest)) && differing(&[&c, &sc], latest, &turns.written_since(since), |v| *v).is_none())
    };
    for _ in 0..10 {
        next(&mut codes, &mut scales).map_err(Into::into)?;
    }
    codes.poison(stream)?;
    scales.poison(stream)?;
    let since = turns.count();
    let (b2b_us, host_us) = time_back_to_back(cli, stream, || next(&mut codes, &mut scales))?;
    let mut exact = judge(&codes, &scales, since)?;
    codes.poison(stream)?;
    scales.poison(stream)?;
    let since = turns.count();
    let graph_us = time_graph(cli, stream, rot.calls, || next(&mut codes, &mut scales))?;
    exact &= judge(&codes, &scales, since)?;
    let copy_same_us = time_copy(cli, stream, l2, bytes / 2)?;
    Ok(QuantResult { b2b_us, graph_us, host_us, bytes, sets: rot.sets, graph_calls: rot.calls, copy_same_us, exact })
}

/// Graph time of one device-to-device copy of `bytes` bytes, sources and destinations rotated
/// like a row's buffers.
fn time_copy(cli: &Cli, stream: &Arc<CudaStream>, l2: usize, bytes: usize) -> Result<f64, Box<dyn std::error::Error>> {
    let bytes = bytes.max(1);
    let rot = Rotation::new(cli.graph_calls, l2, 2 * bytes, false);
    let turns = Turns::new(rot);
    let src: CudaSlice<u8> = stream.alloc_zeros(rot.sets * bytes)?;
    let mut dst = Rotated::<u8>::new(stream, rot, bytes)?;
    time_graph(cli, stream, rot.calls, || {
        let s = turns.next();
        stream.memcpy_dtod(&src.slice(s * bytes..(s + 1) * bytes), &mut dst.set(s))
    })
}

struct Result1 {
    config: Config,
    split: u32,
    rot: Rotation,
    launch_us: f64,
    b2b_us: f64,
    graph_us: f64,
    /// The graph time with the weights prepacked, and the config that ran it.
    prepacked: Option<(f64, Config)>,
    host_us: f64,
    plan_us: f64,
    floor_us: f64,
    workspace: usize,
    check: Check,
}

/// How the sampled rows of the timed outputs compared with the exact reference.
#[derive(Clone, Copy)]
struct Check {
    bit_exact: bool,
    passed: bool,
}

impl Check {
    fn and(self, o: Check) -> Check {
        Check { bit_exact: self.bit_exact && o.bit_exact, passed: self.passed && o.passed }
    }
    fn verdict(self) -> &'static str {
        match (self.passed, self.bit_exact) {
            (false, _) => "failed",
            (true, true) => "exact",
            (true, false) => "bound",
        }
    }
    fn label(self) -> &'static str {
        if self.passed { self.verdict() } else { "FAILED" }
    }
}

#[allow(clippy::too_many_arguments)]
fn bench_one(cli: &Cli, gemm: &BlockScaledGemm, stream: &Arc<CudaStream>, l2: usize, floor_gbps: f64, (m, n, k): (usize, usize, usize), out: OutType) -> Result<Result1, Box<dyn std::error::Error>> {
    let a = operand(cli, (1, m, k), 1)?;
    let b = operand(cli, (1, n, k), 2)?;
    // Verified rows; for FP4 outputs they also set the norm constant (top scale near 448).
    let rows: Vec<usize> = (0..m.min(64)).map(|i| i * (m - 1) / (m.min(64) - 1).max(1)).collect();
    let a_rows = a.select_rows(&rows)?;
    let acc = out.sfd().map(|_| reference::accumulators(&Problem::new(rows.len(), n, k), a_rows.data(), a_rows.scales(), b.data(), b.scales(), Accumulation::Exact)).transpose()?;
    let st = acc.as_ref().map_or(1.0, |acc| 6.0 * 448.0 / acc.iter().fold(1e-30f32, |x, v| x.max(v.abs())));
    let p = Problem::new(m, n, k).norm_constant(st);
    let config = match cli.config {
        Some(c) => c,
        None => gemm.select_config(&p, out)?,
    };
    let split = cli.split_k.unwrap_or_else(|| blockscaled_gemm::dispatch::split_k(config, &p, out, gemm.device().sm_count, &gemm.device().max_clusters));
    // The host's planning alone (validation and the rule), without the launch: median of 1000.
    let mut plan = Vec::with_capacity(1000);
    for _ in 0..1000 {
        let t = Instant::now();
        std::hint::black_box(gemm.select_config(std::hint::black_box(&p), out)?);
        plan.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let plan_us = median(plan);
    let in_bytes = p.a_bytes() + p.b_bytes() + p.sfa_bytes() + p.sfb_bytes();
    let elem = match out {
        OutType::F32 => 4,
        _ => 2,
    };
    let fp4 = out.sfd().is_some();
    let d_bytes = if fp4 { out.d_bytes(p.cd_elems()) } else { elem * p.cd_elems() };
    let sfd_bytes = if fp4 { p.sfd_bytes() } else { 0 };
    let rot = Rotation::new(cli.graph_calls, l2, in_bytes + d_bytes + sfd_bytes, false);
    let turns = Turns::new(rot);
    let mut sets: Sets = Vec::new();
    for _ in 0..rot.sets {
        sets.push((Nvfp4Tensor::upload(&a, stream)?, Nvfp4Tensor::upload(&b, stream)?));
    }
    let mut d = Rotated::<u8>::new(stream, rot, d_bytes)?;
    let mut sfd = Rotated::<u8>::new(stream, rot, sfd_bytes)?;
    let workspace = gemm.workspace_size(&p, out, Some(config))?;
    gemm.reserve_workspace(workspace)?;
    // Each launch as a user calls: the rule's pick (`cli.config` unless forced), so that the host
    // time includes it; the pick is checked against `config` (or the prepacked pick) below.
    let launch = |sets: &Sets, d: &mut Rotated<u8>, sfd: &mut Rotated<u8>| -> Result<Config, blockscaled_gemm::Error> {
        let s = turns.next();
        let (oa, ob) = (&sets[s].0, &sets[s].1);
        let mut ds = d.set(s);
        // SAFETY: every bit pattern is a value of these types, and the part holds d_bytes bytes.
        match out {
            OutType::Nvfp4 | OutType::Nvfp4Ue8m0 => gemm.gemm_fp4(&p, out, oa, ob, Nvfp4Output::new(&mut ds, &mut sfd.set(s)), cli.config),
            OutType::F16 => gemm.gemm(&p, oa, ob, &mut unsafe { ds.transmute_mut::<f16>(p.cd_elems()) }.expect("2 bytes each"), cli.config),
            OutType::Bf16 => gemm.gemm(&p, oa, ob, &mut unsafe { ds.transmute_mut::<half::bf16>(p.cd_elems()) }.expect("2 bytes each"), cli.config),
            OutType::F32 => gemm.gemm(&p, oa, ob, &mut unsafe { ds.transmute_mut::<f32>(p.cd_elems()) }.expect("4 bytes each"), cli.config),
        }
    };
    // The latest set's output against the reference on the sampled rows; every other set written
    // since `since` must hold the same bytes.
    let check = |d: &Rotated<u8>, sfd: &Rotated<u8>, since: usize| -> Result<Check, Box<dyn std::error::Error>> {
        let (all, all_sfd) = (d.read(stream)?, sfd.read(stream)?);
        let latest = turns.latest();
        let got = all.get(latest);
        let c = match out.sfd() {
            Some(format) => {
                let pr = Problem::new(rows.len(), n, k).norm_constant(st);
                let (want_d, want_sfd) = fp4_out::epilogue(&pr, acc.as_deref().expect("computed for FP4"), None, format)?;
                let got_sfd = from_tiled(all_sfd.get(latest), (1, m, n / 16))?;
                let got_d: Vec<u8> = rows.iter().flat_map(|&r| got[r * n / 2..][..n / 2].iter().copied()).collect();
                let got_sf: Vec<u8> = rows.iter().flat_map(|&r| got_sfd[r * n / 16..][..n / 16].iter().copied()).collect();
                let cmp = compare_fp4(&got_d, &got_sf, &want_d, &from_tiled(&want_sfd, (1, rows.len(), n / 16))?, n, format)?;
                if !cmp.within_one_step() {
                    eprintln!("{m}x{n}x{k} {out}: verification failed: {cmp}");
                }
                Check { bit_exact: cmp.byte_equal(), passed: cmp.within_one_step() }
            }
            None => {
                let row_bytes = n * elem;
                let pick: Vec<u8> = rows.iter().flat_map(|&r| got[r * row_bytes..][..row_bytes].iter().copied()).collect();
                let v = match out {
                    OutType::F16 => verdict_rows::<f16>(&pick, &a_rows, &b),
                    OutType::Bf16 => verdict_rows::<half::bf16>(&pick, &a_rows, &b),
                    _ => verdict_rows::<f32>(&pick, &a_rows, &b),
                }?;
                if !v.passed() {
                    eprintln!("{m}x{n}x{k} {out}: verification failed: {v}");
                }
                Check { bit_exact: v.exact == v.count, passed: v.passed() }
            }
        };
        Ok(match differing(&[&all, &all_sfd], latest, &turns.written_since(since), |v| *v) {
            Some(s) => {
                eprintln!("{m}x{n}x{k} {out}: the output of set {s} differs from the verified set {latest}'s");
                Check { bit_exact: false, passed: false }
            }
            None => c,
        })
    };
    for _ in 0..10 {
        let ran = launch(&sets, &mut d, &mut sfd)?;
        same_config(&format!("{m}x{n}x{k} {out}"), ran, config)?;
    }
    let event = || stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
    // Per launch: the outputs poisoned once ahead (a poison just before a launch would leave its
    // output in the L2), and a memset of a scratch word between launches keeps each alone, as
    // the poison did before 4869900 (no launch overlaps the next through the programmatic launch).
    let mut events = Vec::with_capacity(cli.runs);
    let mut scratch: CudaSlice<u8> = stream.alloc_zeros(4)?;
    d.poison(stream)?;
    sfd.poison(stream)?;
    let since = turns.count();
    for _ in 0..cli.runs {
        poison(stream, &mut scratch)?;
        let start = event()?;
        launch(&sets, &mut d, &mut sfd)?;
        events.push((start, event()?));
    }
    stream.synchronize()?;
    let launch_us = median(events.iter().map(|(s, e)| s.elapsed_ms(e).map(|ms| ms as f64 * 1e3)).collect::<Result<_, _>>()?);
    let mut judged = check(&d, &sfd, since)?;
    // Back to back, and the host's time to queue them.
    d.poison(stream)?;
    sfd.poison(stream)?;
    let since = turns.count();
    let (b2b_us, host_us) = time_back_to_back(cli, stream, || launch(&sets, &mut d, &mut sfd).map(|_| ()))?;
    judged = judged.and(check(&d, &sfd, since)?);
    // A graph of rot.calls launches, replayed.
    d.poison(stream)?;
    sfd.poison(stream)?;
    let since = turns.count();
    let graph_us = time_graph(cli, stream, rot.calls, || launch(&sets, &mut d, &mut sfd).map(|_| ()))?;
    judged = judged.and(check(&d, &sfd, since)?);
    // The same graph with the weights prepacked (Hopper kernels only, and a forced split within
    // the prepacked layout's one range per 256 values of K), checked too.
    let prepacked = if config.info().arch == 90 && cli.split_k.is_none_or(|s| s as usize <= blockscaled_gemm::layout::prepack_chunks(k)) {
        drop(sets);
        let mut packed: Sets = Vec::new();
        for _ in 0..rot.sets {
            packed.push((Nvfp4Tensor::upload(&a, stream)?, Nvfp4Tensor::upload(&b, stream)?.prepack(stream)?));
        }
        // The rule's pick for prepacked weights (or the forced config).
        let pconfig = if cli.config.is_some() { config } else { gemm.select_config_for(&p, out, WeightLayout::Prepacked)? };
        gemm.reserve_workspace(gemm.workspace_size(&p, out, Some(pconfig))?)?;
        let ran = launch(&packed, &mut d, &mut sfd)?;
        same_config(&format!("{m}x{n}x{k} {out} prepacked"), ran, pconfig)?;
        d.poison(stream)?;
        sfd.poison(stream)?;
        let since = turns.count();
        let us = time_graph(cli, stream, rot.calls, || launch(&packed, &mut d, &mut sfd).map(|_| ()))?;
        judged = judged.and(check(&d, &sfd, since)?);
        Some((us, pconfig))
    } else {
        None
    };
    let floor_us = (((in_bytes + d_bytes + sfd_bytes) as f64) / (floor_gbps * 1e9)).max(p.flops() / 800e12) * 1e6;
    Ok(Result1 { config, split, rot, launch_us, b2b_us, graph_us, prepacked, host_us, plan_us, floor_us, workspace, check: judged })
}

/// That a call made as a user makes it ran `rule`, the config the row records for it.
fn same_config(what: &str, ran: Config, rule: Config) -> Result<(), Box<dyn std::error::Error>> {
    if ran != rule {
        return Err(format!("{what}: the call ran {ran}, the rule said {rule}").into());
    }
    Ok(())
}

/// A run's `ours_prepacked_graph_us` and `prepacked_config` as JSON values (null where the
/// prepacked weights were not timed).
fn prepacked_json(prepacked: Option<(f64, Config)>) -> (String, String) {
    prepacked.map_or(("null".into(), "null".into()), |(us, config)| (format!("{us:.3}"), format!("\"{config}\"")))
}

/// `cli.runs` launches back to back between one pair of events: device us per launch, and the
/// median host us to queue one.
fn time_back_to_back<E: Into<Box<dyn std::error::Error>>>(cli: &Cli, stream: &Arc<CudaStream>, mut launch: impl FnMut() -> Result<(), E>) -> Result<(f64, f64), Box<dyn std::error::Error>> {
    let start = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    let mut host = Vec::with_capacity(cli.runs);
    for _ in 0..cli.runs {
        let t = Instant::now();
        launch().map_err(Into::into)?;
        host.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    end.synchronize()?;
    Ok((start.elapsed_ms(&end)? as f64 * 1e3 / cli.runs as f64, median(host)))
}

/// A CUDA graph of `calls` launches (a row's `Rotation::calls`), replayed `cli.replays` times
/// between events after three untimed replays: the median replay's us per launch.
fn time_graph<E: Into<Box<dyn std::error::Error>>>(cli: &Cli, stream: &Arc<CudaStream>, calls: usize, mut launch: impl FnMut() -> Result<(), E>) -> Result<f64, Box<dyn std::error::Error>> {
    stream.synchronize()?;
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let captured = (0..calls).try_for_each(|_| launch());
    let graph = stream.end_capture(CUgraphInstantiate_flags(0))?;
    captured.map_err(Into::into)?;
    let graph = graph.ok_or("capture gave no graph")?;
    graph.upload()?;
    for _ in 0..3 {
        graph.launch()?;
    }
    let event = || stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
    let mut reps = Vec::with_capacity(cli.replays);
    for _ in 0..cli.replays {
        let s = event()?;
        graph.launch()?;
        reps.push((s, event()?));
    }
    stream.synchronize()?;
    Ok(median(reps.iter().map(|(s, e)| s.elapsed_ms(e).map(|ms| ms as f64 * 1e3 / calls as f64)).collect::<Result<_, _>>()?))
}

/// The middle value of the sorted samples (upper middle for an even count).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|x, y| x.total_cmp(y));
    v[v.len() / 2]
}

/// The verdict on the sampled rows (bytes of D's type) against the exact reference.
fn verdict_rows<T: blockscaled_gemm::OutputElement + le::FromLe>(got: &[u8], a_rows: &Nvfp4Matrix, b: &Nvfp4Matrix) -> Result<Verdict, blockscaled_gemm::Error> {
    let got: Vec<T> = got.chunks_exact(std::mem::size_of::<T>()).map(T::from_le).collect();
    verify_matrices(a_rows, b, 1.0, 0.0, None, &got)
}

mod le {
    /// Reads one value from its little-endian bytes.
    pub trait FromLe {
        fn from_le(b: &[u8]) -> Self;
    }
    impl FromLe for half::f16 {
        fn from_le(b: &[u8]) -> Self {
            half::f16::from_le_bytes([b[0], b[1]])
        }
    }
    impl FromLe for half::bf16 {
        fn from_le(b: &[u8]) -> Self {
            half::bf16::from_le_bytes([b[0], b[1]])
        }
    }
    impl FromLe for f32 {
        fn from_le(b: &[u8]) -> Self {
            f32::from_le_bytes([b[0], b[1], b[2], b[3]])
        }
    }
}

fn poison<T>(stream: &Arc<CudaStream>, d: &mut impl DevicePtrMut<T>) -> Result<(), cudarc::driver::DriverError> {
    let bytes = d.len() * std::mem::size_of::<T>();
    let (ptr, _guard) = d.device_ptr_mut(stream);
    // SAFETY: ptr is a live allocation of `bytes` bytes, ordered on this stream by the guard.
    unsafe { cudarc::driver::result::memset_d8_async(ptr, 0xFF, bytes, stream.cu_stream()) }
}

/// Device-to-device copy bandwidth, bytes read plus written per second, in GB/s: 512 MiB copied
/// 10 times, the median.
fn copy_bandwidth(stream: &Arc<CudaStream>) -> Result<f64, Box<dyn std::error::Error>> {
    let bytes = 512 << 20;
    let src: CudaSlice<u8> = stream.alloc_zeros(bytes)?;
    let mut dst: CudaSlice<u8> = stream.alloc_zeros(bytes)?;
    stream.memcpy_dtod(&src, &mut dst)?;
    let mut t = Vec::new();
    for _ in 0..10 {
        let s = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        stream.memcpy_dtod(&src, &mut dst)?;
        let e = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        e.synchronize()?;
        t.push(s.elapsed_ms(&e)? as f64);
    }
    Ok(2.0 * bytes as f64 / (median(t) * 1e-3) / 1e9)
}

/// cuBLAS figures from bench/baselines.py's JSON: {"shapes": {"MxNxK": {"cublas_bf16_graph_us":
/// x, "cublas_fp8_graph_us": y, ...}}}; a minimal reader (no JSON crate for one file).
struct Baselines(String);

impl Baselines {
    fn read(path: &std::path::Path) -> std::io::Result<Baselines> {
        std::fs::read_to_string(path).map(Baselines)
    }
    fn get(&self, m: usize, n: usize, k: usize) -> (Option<f64>, Option<f64>) {
        let name = format!("{m}x{n}x{k}");
        (self.number(&name, "cublas_bf16_graph_us"), self.number(&name, "cublas_fp8_graph_us"))
    }
    /// The raw value of `key` in the entry named `name` (a shape or a grouped case).
    fn field(&self, name: &str, key: &str) -> Option<&str> {
        let i = self.0.find(&format!("\"{name}\""))?;
        let rest = &self.0[i..];
        let entry = &rest[..rest.find('}').unwrap_or(rest.len())];
        let j = entry.find(&format!("\"{key}\""))? + key.len() + 2;
        Some(entry[j..].trim_start_matches([':', ' ']).split([',', '}', '\n']).next()?.trim())
    }
    fn number(&self, name: &str, key: &str) -> Option<f64> {
        self.field(name, key)?.parse().ok()
    }
    fn text(&self, name: &str, key: &str) -> Option<String> {
        Some(self.field(name, key)?.strip_prefix('"')?.strip_suffix('"')?.to_string())
    }
    /// The operand data the baselines ran on (files before bf30fc7 have no "data": randn).
    fn data(&self) -> &str {
        let key = "\"data\": \"";
        self.0.find(key).and_then(|i| self.0[i + key.len()..].split('"').next()).unwrap_or("randn")
    }
}

/// The baselines' cross-check and rotation for the entry `name`, as JSON fields: each of `keys`
/// (their `triton.testing.do_bench` figures), `baselines_sets` and `baselines_graph_calls`; null
/// where the file lacks one (or there is no file).
fn cross_check(b: &Option<Baselines>, name: &str, keys: &[&str]) -> String {
    let value = |key: &str| b.as_ref().and_then(|b| b.field(name, key)).filter(|v| v.parse::<f64>().is_ok_and(f64::is_finite)).unwrap_or("null").to_string();
    let named = |field: &str, key: &str| format!("\"{field}\":{}", value(key));
    keys.iter().map(|k| named(k, k)).chain([named("baselines_sets", "sets"), named("baselines_graph_calls", "graph_calls")]).collect::<Vec<_>>().join(",")
}

/// The baselines in `path`, if given, and the records' `baselines_data` (null without them),
/// warning when the baselines' data are not this run's (then the two sides' times do not
/// compare: bench/README.md, "Data").
fn read_baselines(path: &Option<std::path::PathBuf>, data: Data) -> Result<(Option<Baselines>, String), Box<dyn std::error::Error>> {
    let Some(path) = path else { return Ok((None, "null".into())) };
    let b = Baselines::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if !matches!((data, b.data()), (Data::Gaussian, "nvfp4-gaussian")) {
        eprintln!("warning: the baselines in {} ran on {} data, this crate on {}: their times do not compare", path.display(), b.data(), data.name());
    }
    let field = format!("\"{}\"", b.data());
    Ok((Some(b), field))
}
