//! NVFP4 x NVFP4 GEMM in the spirit of CUTLASS example 72b: runs `D = alpha * A·Bᵀ + beta * C`
//! on the GPU through `BlockScaledGemm`, verifies it against the exact CPU reference, and prints
//! the time, TFLOP/s and GB/s. `--device cpu` computes with the reference alone.
//!
//! `--out nvfp4` (or `nvfp4-ue8m0`, 72b's own) writes D as e2m1 with generated scale factors per
//! 16 outputs, scaled by `--norm-constant` (default: 6 * 448 / max|alpha * A·Bᵀ + beta * C| over
//! the rows verification takes at the default `--check-budget`, every row up to 2^33
//! multiply-adds: a function of the data alone, so the largest scale factor lands at the top of
//! ue4m3); C is then f32. The report, `--json` and `--save` (an F32 scalar `norm_constant`
//! beside `d` and `sfd`) give the constant used: D ≈ d * sfd / norm_constant. Verification compares
//! scale factors and codes group by group: byte for byte where the FP32 sums are exact (contest
//! data), else within one e2m1 step with the scale factor equal or its neighbour.
//!
//! Verification of f16, bf16 and f32 output (`--tolerance`): `bound` (the default) passes an
//! element that equals the exact result rounded once, or lies within the rigorous bound of FP32
//! summation in any order plus the output type's rounding (`blockscaled_gemm::compare` derives
//! it), and reports the worst element with its bound; `contest` is the contest's
//! |got - want| <= 1e-3 + 1e-3 |want|, which also fails correct results (sums that cancel to near
//! 0, values near a bf16 rounding boundary). Beyond `--check-budget` multiply-adds of reference
//! work, evenly spread rows are verified (first and last included).
//!
//! Sizes and scalars are validated by the library's rules before any data is made, on both
//! devices, so `--device cpu` refuses what the GPU path refuses.
//!
//! `--prepack` runs B prepacked (`Nvfp4Tensor::prepack`: the Hopper kernels' streaming layout,
//! the same result; on SM100 the GEMM refuses it).
//!
//! Exit codes: 0 passed, 1 verification failed or the GPU run failed, 2 bad input (a `--config`
//! of another architecture included), 3 no GPU this build can run on.
//!
//! Input files (`--input`, safetensors): `a` and `b` hold packed e2m1 values, dtype U8 with shape
//! [M, K/2] or [L, M, K/2] (batch outermost, the contest's memory order), or dtype F4 (PyTorch
//! `float4_e2m1fn_x2`) with shape [M, K] or [L, M, K]; `sfa` and `sfb` hold ue4m3 scale bytes
//! (F8_E4M3 or U8) in the tiled storage order of `blockscaled_gemm::layout`, flat, or labelled with the
//! contest's permuted shape (32, 4, rest, 4, rest_k, L) or its storage shape
//! (L, rest, rest_k, 32, 4, 4): in every case the bytes are read in storage order; `c`, when
//! present, has D's shape ([M, N] or [L, M, N]) and dtype; `global_scale_a` and
//! `global_scale_b`, when present (F32, shape [] or [1], finite and positive, as `--save` writes
//! them for checkpoint runs), are A's and B's global scales, folded into alpha as the GEMM folds
//! them: D = alpha * ga * gb * A·Bᵀ + beta * C. Other tensors (`x`, `d`) are ignored. The file's
//! shapes are checked against the host's available memory before D is allocated.
//!
//! Checkpoints (`--checkpoint FILE --layer NAME`): the linear layer NAME of an NVFP4 checkpoint
//! (ModelOpt or compressed-tensors names, `blockscaled_gemm::checkpoint`) is B, N and K come
//! from it; A is `--m` rows of N(0, 1) activations rounded to bf16, by default used as they are
//! (W4A16, below); with `--mode nvfp4` quantized on the host with the layer's input scale
//! (computed from their amax where the file has none): NVFP4 x NVFP4, both global scales folded
//! into alpha. `--save` writes the activations as `x` (bf16 [M, K])
//! beside `a`, `sfa`, `b`, `sfb`, `global_scale_a`, `global_scale_b` (F32 scalars) and `d`; read
//! back with `--input`, they give the same d. A bad file (also one whose tensors do not cover its
//! data exactly, as the safetensors format requires) exits 2 naming the tensor and the rule.
//!
//! `--save` writes a temporary file beside the target and renames it over the target only once
//! it is complete: a failed write leaves no file, and an existing one as it was. A run whose
//! verification fails (exit 1) still saves its d, so that it can be examined; a run that fails
//! before it has a d (exit 2 or 3, or a failed GPU call) saves nothing.
//!
//! Sizes whose host buffers would exceed the available memory (MemAvailable of /proc/meminfo,
//! or the bytes in `NVFP4_GEMM_HOST_MEMORY` where set, e.g. a container's limit) exit 2 before
//! any data is made.
//!
//! `--mode w4a16` (the default with `--checkpoint`): A is the bf16 activations as they are
//! (`--m` rows of N(0, 1), L = `--l`), B the NVFP4 weights (the layer's, or generated), D =
//! alpha * gB * A dec(B)ᵀ by `gemm_w4a16` on the GPU or `reference::gemm_w4a16` on the CPU,
//! verified against the exact W4A16 reference; `--save` writes `x`, `b`, `sfb`,
//! `global_scale_b` and `d`. `--mode nvfp4` (the default otherwise): A quantized to NVFP4 as
//! above.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use blockscaled_gemm::compare::{compare, compare_fp4, sample_row_count, sample_rows, verify_matrices, verify_w4a16, SAMPLE_BUDGET};
use blockscaled_gemm::layout::{from_tiled, padded_rows, padded_sf_cols, sf_bytes, sf_cols};
use blockscaled_gemm::fp4_out;
use blockscaled_gemm::reference::{self, Accumulation};
use blockscaled_gemm::{reference_gemm, BlockScaledGemm, Config, Error, Nvfp4Matrix, Nvfp4Output, Nvfp4Tensor, OutType, OutputElement, Problem, SfdFormat, SplitMix64};
use clap::{Parser, ValueEnum};
use cudarc::driver::{CudaContext, DeviceRepr};
use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};

#[derive(Parser, Debug)]
#[command(name = "nvfp4_gemm", about = "NVFP4 block-scaled GEMM (CUTLASS 72b style), verified against the exact CPU reference")]
struct Cli {
    /// Rows of A and D.
    #[arg(long, default_value_t = 1024, allow_negative_numbers = true)]
    m: usize,
    /// Rows of B, columns of D.
    #[arg(long, default_value_t = 1024, allow_negative_numbers = true)]
    n: usize,
    /// Reduction extent (a multiple of 32, on either device).
    #[arg(long, default_value_t = 1024, allow_negative_numbers = true)]
    k: usize,
    /// Batch count.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    l: usize,
    /// D = alpha * A·Bᵀ + beta * C.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    alpha: f32,
    /// Scale of C (a generated C when the input has none).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    beta: f32,
    /// Timed iterations (GPU), at least 1.
    #[arg(long, default_value_t = 10, allow_negative_numbers = true, value_parser = at_least_one)]
    iterations: usize,
    /// Untimed warm-up iterations (GPU).
    #[arg(long, default_value_t = 3, allow_negative_numbers = true)]
    warmup: usize,
    /// Seed of the generated data.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    seed: u64,
    /// Kernel config: auto, or a name from the config table.
    #[arg(long, default_value = "auto")]
    config: String,
    /// Output type of D.
    #[arg(long, value_enum, default_value_t = OutArg::F16)]
    out: OutArg,
    /// FP4 outputs: the normalization constant (SFD = max|D| * it / 6, so D ≈ d * SFD / it).
    /// Default: 6 * 448 / max|alpha * A·Bᵀ + beta * C| over the rows verification takes at the
    /// default --check-budget (every row up to 2^33 multiply-adds, else evenly spread ones), so
    /// the same data gives the same constant on either device and at any --check-budget. The
    /// report, --json and --save (`norm_constant`) give the one used.
    #[arg(long, allow_negative_numbers = true)]
    norm_constant: Option<f32>,
    /// Where to compute.
    #[arg(long, value_enum, default_value_t = DeviceArg::Gpu)]
    device: DeviceArg,
    /// Generated data: contest (random bytes, scales 0..3) or realistic (quantized Gaussian).
    #[arg(long, value_enum, default_value_t = DataArg::Contest)]
    data: DataArg,
    /// Read a, b, sfa, sfb (and c) from this safetensors file; M, N, K, L come from the shapes.
    #[arg(long)]
    input: Option<PathBuf>,
    /// Run the linear layer `--layer` of this NVFP4 checkpoint on `--m` rows: a .safetensors
    /// file, a model.safetensors.index.json and its shards, or the directory holding either.
    #[arg(long, conflicts_with = "input")]
    checkpoint: Option<PathBuf>,
    /// The layer's name prefix in `--checkpoint`, e.g. model.layers.0.mlp.down_proj.
    #[arg(long, requires = "checkpoint")]
    layer: Option<String>,
    /// nvfp4: A quantized to NVFP4 (NVFP4 x NVFP4); w4a16: A as bf16 activations x NVFP4 weights.
    /// Default: w4a16 with --checkpoint, else nvfp4.
    #[arg(long, value_enum)]
    mode: Option<ModeArg>,
    /// Write d (and the generated inputs) to this safetensors file.
    #[arg(long)]
    save: Option<PathBuf>,
    /// Prepack B's values on the GPU before the timed runs (`Nvfp4Tensor::prepack`, the Hopper
    /// kernels' streaming layout; GPU only).
    #[arg(long)]
    prepack: bool,
    /// Print one JSON line with the result instead of the report.
    #[arg(long)]
    json: bool,
    /// Verification criterion of f16, bf16 and f32 output: exact or within the FP32 bound
    /// (bound), or the contest's atol = rtol = 1e-3 (contest).
    #[arg(long, value_enum, default_value_t = ToleranceArg::Bound)]
    tolerance: ToleranceArg,
    /// Multiply-adds of reference work verification may spend; beyond it, rows are sampled.
    #[arg(long, default_value_t = SAMPLE_BUDGET as u64, allow_negative_numbers = true)]
    check_budget: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, ValueEnum)]
enum ToleranceArg {
    Bound,
    Contest,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum OutArg {
    F16,
    Bf16,
    F32,
    Nvfp4,
    #[value(name = "nvfp4-ue8m0")]
    Nvfp4Ue8m0,
}

#[derive(Clone, Copy, Debug, PartialEq, ValueEnum)]
enum ModeArg {
    Nvfp4,
    W4a16,
}

#[derive(Clone, Copy, Debug, PartialEq, ValueEnum)]
enum DeviceArg {
    Gpu,
    Cpu,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum DataArg {
    Contest,
    Realistic,
}

/// A count of at least 1 (`--iterations`).
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        Ok(_) => Err("must be at least 1".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// An exit with its code and one line for stderr.
struct Exit(u8, String);

impl From<Error> for Exit {
    fn from(e: Error) -> Self {
        let code = match e {
            // A --config for another architecture is a bad value; no kernel for this GPU at all
            // is missing hardware.
            Error::UnsupportedDevice { .. } => 3,
            Error::Cutlass { .. } | Error::CudaRuntime { .. } | Error::Driver(_) | Error::CannotImplement { .. } => 1,
            _ => 2,
        };
        Exit(code, e.to_string())
    }
}

fn bad(msg: impl Into<String>) -> Exit {
    Exit(2, msg.into())
}

/// B on the device, prepacked with `--prepack`.
fn weights(cli: &Cli, b: &Nvfp4Matrix, stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<Nvfp4Tensor, Error> {
    let t = Nvfp4Tensor::upload(b, stream)?;
    if cli.prepack { t.prepack(stream) } else { Ok(t) }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) if !e.use_stderr() => {
            print!("{e}"); // --help, --version
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // Whole: the first line alone can omit what is wrong (the missing argument, the
            // possible values).
            eprint!("{e}");
            return ExitCode::from(2);
        }
    };
    let result = match cli.out {
        // A flag the run would not use is refused rather than ignored.
        OutArg::F16 | OutArg::Bf16 | OutArg::F32 if cli.norm_constant.is_some() => Err(bad(format!(
            "--norm-constant {}: scales FP4 output only (--out nvfp4 or nvfp4-ue8m0), not --out {}",
            cli.norm_constant.unwrap_or_default(),
            cli.out_type()
        ))),
        OutArg::F16 => run::<f16>(&cli),
        OutArg::Bf16 => run::<bf16>(&cli),
        OutArg::F32 => run::<f32>(&cli),
        OutArg::Nvfp4 | OutArg::Nvfp4Ue8m0 => run_fp4(&cli),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(Exit(code, msg)) => {
            eprintln!("error: {msg}");
            ExitCode::from(code)
        }
    }
}

/// Inputs of one run.
struct Inputs<T> {
    a: Nvfp4Matrix,
    b: Nvfp4Matrix,
    c: Option<Vec<T>>,
    generated: bool,
    /// The bf16 activations A was quantized from (checkpoint runs).
    x: Option<Vec<bf16>>,
}

fn parse_config(cli: &Cli) -> Result<Option<Config>, Exit> {
    match cli.config.as_str() {
        "auto" => Ok(None),
        name => Ok(Some(Config::from_name(name).ok_or_else(|| {
            let names: Vec<&str> = Config::ALL.iter().map(|c| c.info().name).collect();
            bad(format!("--config {name}: not auto or one of {}", names.join(", ")))
        })?)),
    }
}

/// Inputs and the problem, validated by the kernels' rules on every path (the CPU keeps them so
/// both devices accept the same problems). Generated data is validated before it is made, so a
/// bad size exits 2 at once instead of exhausting memory first.
fn prepare<T: OutputElement + safetensors_dtype::HasDtype>(cli: &Cli) -> Result<(Inputs<T>, Problem), Exit> {
    let out = cli.out_type();
    // FP4 output: the default norm constant comes from the data later (and is checked there).
    let problem = |m: usize, n: usize, k: usize, l: usize| Problem::new(m, n, k).batch(l).scalars(cli.alpha, cli.beta).norm_constant(cli.norm_constant.unwrap_or(1.0));
    if cli.input.is_some() && cli.checkpoint.is_some() {
        return Err(bad("--input and --checkpoint: give one"));
    }
    if cli.prepack && cli.device == DeviceArg::Cpu {
        return Err(bad("--prepack: the GPU's weight layout; --device cpu runs the reference on the standard one"));
    }
    if cli.input.is_none() && cli.checkpoint.is_none() {
        let p = problem(cli.m, cli.n, cli.k, cli.l);
        p.validate(out, cli.beta != 0.0)?;
        check_host_memory(cli, &p, 0.0)?;
    }
    let inputs = match (&cli.input, &cli.checkpoint) {
        (Some(path), _) => load::<T>(path, cli.beta)?,
        (None, Some(path)) => from_checkpoint::<T>(cli, path)?,
        (None, None) => generate::<T>(cli)?,
    };
    let (a, b) = (&inputs.a, &inputs.b);
    let p = problem(a.rows(), b.rows(), a.k(), a.batch());
    p.validate(out, inputs.c.is_some())?;
    if cli.input.is_some() {
        // A small file can describe a huge D (M and N from the shapes, K = 32).
        check_host_memory(cli, &p, 0.0)?;
    }
    Ok((inputs, p))
}

/// Refuses a run whose host buffers alone (A, B and their scales, C, D, for realistic data the
/// f32 values they are quantized from, and on the CPU the reference's working buffers) exceed the
/// memory the system reports available, instead of letting the allocator abort or the OOM killer
/// end the process.
fn check_host_memory(cli: &Cli, p: &Problem, extra_bytes: f64) -> Result<(), Exit> {
    let Some(available) = mem_available()? else { return Ok(()) };
    let out = cli.out_type();
    let cd = p.cd_elems() as f64;
    let elem = if out.sfd().is_some() { 4.0 } else { (out.bits() / 8) as f64 };
    let mut need = [p.a_bytes(), p.b_bytes(), p.sfa_bytes(), p.sfb_bytes()].iter().map(|&x| x as f64).sum::<f64>() + cd * elem + extra_bytes;
    if cli.beta != 0.0 {
        need += cd * elem;
    }
    if matches!(cli.data, DataArg::Realistic) && cli.input.is_none() && cli.checkpoint.is_none() {
        // One operand's f32 values and codes at a time.
        need += 5.0 * p.l as f64 * p.m.max(p.n) as f64 * p.k as f64;
    }
    if cli.mode() == ModeArg::W4a16 {
        // The bf16 activations.
        need += 2.0 * p.l as f64 * p.m as f64 * p.k as f64;
    }
    // D once more, encoded for --save or the report.
    need += cd * elem;
    if cli.save.is_some() {
        // --save copies A, B, their scales and C into its tensors, then the file's bytes hold
        // them all once more (and D).
        let operands = [p.a_bytes(), p.b_bytes(), p.sfa_bytes(), p.sfb_bytes()].iter().map(|&x| x as f64).sum::<f64>();
        need += 2.0 * operands + cd * elem + if cli.beta != 0.0 { 2.0 * cd * elem } else { 0.0 };
    }
    if cli.device == DeviceArg::Cpu {
        // The reference decodes one batch of B (an i8 value and, per 16, an i64 and an f64
        // scale: 2 bytes a value); W4A16's keeps two f64 sums an output until it rounds them.
        need += 2.0 * p.n as f64 * p.k as f64;
        if cli.mode() == ModeArg::W4a16 {
            need += 16.0 * cd;
        }
    } else {
        // The poisoned D uploaded, D downloaded, and per checked output the exact sums and the
        // verdict's expectations (40 bytes); the check covers the rows its budget allows.
        let rows = sample_row_count(p, cli.check_budget as u128) as f64;
        need += 2.0 * cd * elem + 40.0 * rows * (p.n as f64) * (p.l as f64);
    }
    if out.sfd().is_some() {
        // FP4 output: D's codes and scale factors, the accumulators of the reference and of the
        // norm constant's sample, and with beta a copy of C's checked rows.
        need += 0.6 * cd + 8.0 * cd + if cli.beta != 0.0 { 4.0 * cd } else { 0.0 };
    }
    if need > available as f64 {
        let gib = |x: f64| x / (1u64 << 30) as f64;
        return Err(bad(format!("M = {}, N = {}, K = {}, L = {}: the host buffers need about {:.1} GiB, {:.1} GiB is available", p.m, p.n, p.k, p.l, gib(need), gib(available as f64))));
    }
    Ok(())
}

/// The bytes in NVFP4_GEMM_HOST_MEMORY where set, else MemAvailable of /proc/meminfo, where the
/// system reports it.
fn mem_available() -> Result<Option<u64>, Exit> {
    if let Some(v) = std::env::var_os("NVFP4_GEMM_HOST_MEMORY") {
        return v.to_str().and_then(|v| v.parse().ok()).map(Some).ok_or_else(|| bad(format!("NVFP4_GEMM_HOST_MEMORY = {v:?}: must be a number of bytes")));
    }
    Ok(mem_available_proc())
}

fn mem_available_proc() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// The stream of device 0, or exit 3 with what is missing.
fn gpu_stream() -> Result<std::sync::Arc<cudarc::driver::CudaStream>, Exit> {
    if !BlockScaledGemm::driver_present() {
        return Err(Exit(3, format!("no NVIDIA driver found: the GPU path needs a GPU of {} with its driver; --device cpu runs the CPU reference", blockscaled_gemm::gemm::SUPPORTED)));
    }
    // With the driver but no visible device (CUDA_VISIBLE_DEVICES="", a container without the
    // GPU), cuInit itself fails: that is missing hardware too.
    match CudaContext::device_count() {
        Ok(n) if n >= 1 => {}
        r => {
            let why = r.err().map_or(String::new(), |e| format!(" ({e})"));
            return Err(Exit(3, format!("no CUDA device found{why}: the GPU path needs a GPU of {}; --device cpu runs the CPU reference", blockscaled_gemm::gemm::SUPPORTED)));
        }
    }
    Ok(CudaContext::new(0).map_err(Error::from)?.default_stream())
}

/// Average milliseconds of `launch` over `--iterations` after `--warmup`, by CUDA events.
fn time_launches(cli: &Cli, stream: &std::sync::Arc<cudarc::driver::CudaStream>, mut launch: impl FnMut() -> Result<Config, Error>) -> Result<f64, Exit> {
    for _ in 0..cli.warmup {
        launch()?;
    }
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = stream.record_event(flags).map_err(Error::from)?;
    for _ in 0..cli.iterations {
        launch()?;
    }
    let end = stream.record_event(flags).map_err(Error::from)?;
    end.synchronize().map_err(Error::from)?;
    Ok(start.elapsed_ms(&end).map_err(Error::from)? as f64 / cli.iterations as f64)
}

fn run<T: OutputElement + DeviceRepr + safetensors_dtype::HasDtype>(cli: &Cli) -> Result<bool, Exit> {
    if cli.mode() == ModeArg::W4a16 {
        return run_w4a16::<T>(cli);
    }
    let config = parse_config(cli)?;
    let (inputs, p) = prepare::<T>(cli)?;
    let (a, b) = (&inputs.a, &inputs.b);
    let out = cli.out_type();
    if cli.device == DeviceArg::Cpu {
        let t = Instant::now();
        let d: Vec<T> = reference_gemm(a, b, p.alpha, p.beta, inputs.c.as_deref())?;
        let secs = t.elapsed().as_secs_f64();
        save(cli, &inputs, &p, None, vec![("d".into(), T::DTYPE, d_shape(&p, p.n), T::encode(&d))])?;
        report(cli, &p, "cpu", "reference", None, secs * 1e3, p.flops() / secs / 1e12, traffic(&p, out) / secs / 1e9);
        return Ok(true);
    }
    let stream = gpu_stream()?;
    let gemm = BlockScaledGemm::new(stream.clone())?;
    let (ta, tb) = (Nvfp4Tensor::upload(a, &stream)?, weights(cli, b, &stream)?);
    let c_dev = inputs.c.as_ref().map(|c| stream.clone_htod(c)).transpose().map_err(Error::from)?;
    // Poisoned D: an element the kernel does not write fails verification.
    let mut d = stream.clone_htod(&vec![T::from_f64(f64::NAN); p.cd_elems()]).map_err(Error::from)?;
    let mut launch = || -> Result<Config, Error> {
        let (oa, ob) = (&ta, &tb);
        match &c_dev {
            Some(c) => gemm.gemm_with_c(&p, oa, ob, c, &mut d, config),
            None => gemm.gemm(&p, oa, ob, &mut d, config),
        }
    };
    let ran = launch()?;
    let ms = time_launches(cli, &stream, &mut launch)?;
    let got = stream.clone_dtoh(&d).map_err(Error::from)?;
    let rows = sample_rows(&p, cli.check_budget as u128)?;
    let check = verify(cli, &inputs, &p, &rows, &got)?;
    save(cli, &inputs, &p, None, vec![("d".into(), T::DTYPE, d_shape(&p, p.n), T::encode(&got))])?;
    report(cli, &p, "gpu", &ran.to_string(), Some(&check), ms, p.flops() / ms / 1e9, traffic(&p, out) / ms / 1e6);
    Ok(check.passed)
}

/// W4A16: bf16 activations (the checkpoint run's, else N(0, 1)) times B's NVFP4 weights.
fn run_w4a16<T: OutputElement + DeviceRepr + safetensors_dtype::HasDtype>(cli: &Cli) -> Result<bool, Exit> {
    if cli.input.is_some() {
        return Err(bad("--mode w4a16 runs generated data or --checkpoint (an --input file holds an NVFP4 A)"));
    }
    let config = parse_config(cli)?;
    let (inputs, p) = prepare::<T>(cli)?;
    let b = &inputs.b;
    let x: Vec<bf16> = inputs.x.clone().unwrap_or_else(|| {
        let mut rng = SplitMix64::new(cli.seed.wrapping_add(3));
        (0..p.a_elems()).map(|_| bf16::from_f64(rng.normal())).collect()
    });
    // The reference's alpha: the GEMM folds B's global scale in (f32, alpha * 1 * gB), and
    // refuses a fold that overflows or vanishes; so does the CPU path.
    let folded = p.fold_global_scales(None, b.global_scale())?;
    let (x_bytes, w_bytes) = (2.0 * p.a_elems() as f64, (p.b_bytes() + p.sfb_bytes() + (T::OUT.bits() / 8) * p.cd_elems()) as f64);
    let traffic = x_bytes + w_bytes;
    if cli.device == DeviceArg::Cpu {
        let t = Instant::now();
        let d: Vec<T> = reference::gemm_w4a16(&folded, &x, b.data(), b.scales(), inputs.c.as_deref())?;
        let secs = t.elapsed().as_secs_f64();
        save(cli, &inputs, &p, Some(&x), vec![("d".into(), T::DTYPE, d_shape(&p, p.n), T::encode(&d))])?;
        report(cli, &p, "cpu", "reference", None, secs * 1e3, p.flops() / secs / 1e12, traffic / secs / 1e9);
        return Ok(true);
    }
    let stream = gpu_stream()?;
    let gemm = BlockScaledGemm::new(stream.clone())?;
    let (xd, tb) = (stream.clone_htod(&x).map_err(Error::from)?, weights(cli, b, &stream)?);
    let c_dev = inputs.c.as_ref().map(|c| stream.clone_htod(c)).transpose().map_err(Error::from)?;
    let mut d = stream.clone_htod(&vec![T::from_f64(f64::NAN); p.cd_elems()]).map_err(Error::from)?;
    let mut launch = || -> Result<Config, Error> {
        match &c_dev {
            Some(c) => gemm.gemm_w4a16_with_c(&p, &xd, &tb, c, &mut d, config),
            None => gemm.gemm_w4a16(&p, &xd, &tb, &mut d, config),
        }
    };
    let ran = launch()?;
    let ms = time_launches(cli, &stream, &mut launch)?;
    let got = stream.clone_dtoh(&d).map_err(Error::from)?;
    // Sampled rows of every batch, judged against the exact W4A16 reference.
    let rows = sample_rows(&p, cli.check_budget as u128)?;
    let (m, n, k) = (p.m, p.n, p.k);
    let x_rows = pick_rows(&x, &rows, m, k, p.l);
    let c_rows = inputs.c.as_ref().map(|c| pick_rows(c, &rows, m, n, p.l));
    let got_rows = pick_rows(&got, &rows, m, n, p.l);
    let pr = Problem { m: rows.len(), ..folded };
    let sampled = if rows.len() == m { String::new() } else { format!(" ({} of {m} rows)", rows.len()) };
    let check = match cli.tolerance {
        ToleranceArg::Bound => {
            let v = verify_w4a16(&pr, &x_rows, b.data(), b.scales(), c_rows.as_deref(), &got_rows)?;
            let detail = format!("{} elements{sampled} against the exact W4A16 reference, exact or within the FP32 bound: {v}", got_rows.len());
            Check { passed: v.passed(), bad: v.failed, max_abs: None, worst_ratio: v.worst.map(|w| w.ratio), checked: got_rows.len(), detail }
        }
        ToleranceArg::Contest => {
            let want: Vec<T> = reference::gemm_w4a16(&pr, &x_rows, b.data(), b.scales(), c_rows.as_deref())?;
            let cmp = compare(&got_rows, &want, 1e-3, 1e-3)?;
            let detail = format!("{} elements{sampled} against the exact W4A16 reference, contest tolerance: {cmp}", got_rows.len());
            Check { passed: cmp.passed(), bad: cmp.bad, max_abs: Some(cmp.max_abs), worst_ratio: None, checked: got_rows.len(), detail }
        }
    };
    save(cli, &inputs, &p, Some(&x), vec![("d".into(), T::DTYPE, d_shape(&p, p.n), T::encode(&got))])?;
    report(cli, &p, "gpu", &ran.to_string(), Some(&check), ms, p.flops() / ms / 1e9, traffic / ms / 1e6);
    Ok(check.passed)
}

/// FP4 output: D and its generated scale factors, verified group by group.
fn run_fp4(cli: &Cli) -> Result<bool, Exit> {
    let config = parse_config(cli)?;
    let (inputs, p) = prepare::<f32>(cli)?;
    let out = cli.out_type();
    let Some(format) = out.sfd() else { return Err(bad(format!("--out {out}: not an FP4 output"))) };
    if cli.mode() == ModeArg::W4a16 {
        return Err(bad(format!("--out {out} with --mode w4a16: W4A16 writes f16, bf16 or f32 (pass --mode nvfp4)")));
    }
    // The reference's alpha has both global scales folded in (checkpoint runs, input files that
    // carry them), as the GEMM folds them; `p` itself goes to the GPU, which folds them there.
    let alpha = p.fold_global_scales(inputs.a.global_scale(), inputs.b.global_scale())?.alpha;
    // The exact accumulators of `rows` of every batch.
    let acc_of = |rows: &[usize]| -> Result<Vec<f32>, Exit> {
        let picked;
        let a = if rows.len() == p.m { &inputs.a } else { picked = inputs.a.select_rows(rows)?; &picked };
        let pr = Problem { m: rows.len(), ..p };
        Ok(reference::accumulators(&pr, a.data(), a.scales(), inputs.b.data(), inputs.b.scales(), Accumulation::Exact)?)
    };
    let t = Instant::now();
    // The default norm constant's rows are those of the default budget whatever --check-budget
    // says, so the constant depends on the data alone (and is the same on either device).
    let mut norm_acc = None;
    let st = match cli.norm_constant {
        Some(st) => st,
        None => {
            let rows = sample_rows(&p, SAMPLE_BUDGET)?;
            let acc = acc_of(&rows)?;
            let c = inputs.c.as_ref().map(|c| pick_rows(c, &rows, p.m, p.n, p.l));
            let st = default_norm_constant(&acc, c.as_deref(), p.alpha, alpha, p.beta)?;
            norm_acc = Some((rows, acc));
            st
        }
    };
    let p = p.norm_constant(st);
    p.validate(out, inputs.c.is_some())?;
    let pf = p.scalars(alpha, p.beta);
    let fp4_tensors = |d: Vec<u8>, sfd: Vec<u8>| -> Vec<(String, Dtype, Vec<usize>, Vec<u8>)> {
        let sf_dtype = if format == SfdFormat::Ue4m3 { Dtype::F8_E4M3 } else { Dtype::U8 };
        let sfd_len = sfd.len();
        // The norm constant decodes the output: D ≈ d * sfd / norm_constant.
        vec![("d".into(), Dtype::U8, d_shape(&p, p.n / 2), d), ("sfd".into(), sf_dtype, vec![sfd_len], sfd), ("norm_constant".into(), Dtype::F32, vec![], st.to_le_bytes().to_vec())]
    };
    if cli.device == DeviceArg::Cpu {
        let (d, sfd) = match norm_acc {
            // Every row's accumulators are at hand (the default norm constant's): the epilogue alone.
            Some((rows, acc)) if rows.len() == p.m => fp4_out::epilogue(&pf, &acc, inputs.c.as_deref(), format)?,
            _ => reference::gemm_fp4(&pf, inputs.a.data(), inputs.a.scales(), inputs.b.data(), inputs.b.scales(), inputs.c.as_deref(), format, Accumulation::Exact)?,
        };
        let secs = t.elapsed().as_secs_f64();
        save(cli, &inputs, &p, None, fp4_tensors(d, sfd))?;
        report(cli, &p, "cpu", "reference", None, secs * 1e3, p.flops() / secs / 1e12, traffic(&p, out) / secs / 1e9);
        return Ok(true);
    }
    let stream = gpu_stream()?;
    let gemm = BlockScaledGemm::new(stream.clone())?;
    let up = |v: &[u8]| stream.clone_htod(v).map_err(Error::from);
    let (ta, tb) = (Nvfp4Tensor::upload(&inputs.a, &stream)?, weights(cli, &inputs.b, &stream)?);
    let c_dev = inputs.c.as_ref().map(|c| stream.clone_htod(c)).transpose().map_err(Error::from)?;
    // Poisoned outputs: a code or scale factor the kernel does not write fails verification.
    let mut d = up(&vec![0xEE; p.cd_elems() / 2])?;
    let mut sfd = up(&vec![0x7F; p.sfd_bytes()])?;
    let mut launch = || -> Result<Config, Error> {
        let (oa, ob) = (&ta, &tb);
        let od = Nvfp4Output::new(&mut d, &mut sfd);
        match &c_dev {
            Some(c) => gemm.gemm_fp4_with_c(&p, out, oa, ob, c, od, config),
            None => gemm.gemm_fp4(&p, out, oa, ob, od, config),
        }
    };
    let ran = launch()?;
    let ms = time_launches(cli, &stream, &mut launch)?;
    let (got_d, got_sfd) = (stream.clone_dtoh(&d).map_err(Error::from)?, stream.clone_dtoh(&sfd).map_err(Error::from)?);
    let rows = sample_rows(&p, cli.check_budget as u128)?;
    let acc = match norm_acc {
        Some((r, acc)) if r == rows => acc,
        _ => acc_of(&rows)?,
    };
    let pr = Problem { m: rows.len(), ..pf };
    let c_rows = inputs.c.as_ref().map(|c| pick_rows(c, &rows, p.m, p.n, p.l));
    let (want_d, want_sfd) = fp4_out::epilogue(&pr, &acc, c_rows.as_deref(), format)?;
    let groups = p.n / 16;
    let got_sf_rows = pick_rows(&from_tiled(&got_sfd, (p.l, p.m, groups))?, &rows, p.m, groups, p.l);
    let got_d_rows = pick_rows(&got_d, &rows, p.m, p.n / 2, p.l);
    let cmp = compare_fp4(&got_d_rows, &got_sf_rows, &want_d, &from_tiled(&want_sfd, (p.l, rows.len(), groups))?, p.n, format)?;
    let exactly = if cmp.byte_equal() { "byte for byte" } else { "within one e2m1 step" };
    let check = Check { passed: cmp.within_one_step(), bad: cmp.sfd_far + cmp.codes_far + cmp.neighbour_codes_far, max_abs: None, worst_ratio: None, checked: cmp.codes + cmp.neighbour_codes, detail: format!("{} rows against the exact reference ({exactly}; norm constant {st}): {cmp}", rows.len()) };
    save(cli, &inputs, &p, None, fp4_tensors(got_d, got_sfd))?;
    report(cli, &p, "gpu", &ran.to_string(), Some(&check), ms, p.flops() / ms / 1e9, traffic(&p, out) / ms / 1e6);
    Ok(check.passed)
}

/// The default norm constant of an FP4 output, `6 * 448 / max|v|` over the epilogue's values
/// `v = alpha * acc + beta * C` (f32, as [`fp4_out::epilogue`] forms them; `folded` is alpha with
/// the global scales) of the given rows' exact accumulators, so the largest scale factor lands at
/// the top of ue4m3 (1 where every v is 0); or exit 2 saying to pass one where it is not a
/// finite, positive f32 (a tiny or huge alpha, beta or C).
fn default_norm_constant(acc: &[f32], c: Option<&[f32]>, alpha: f32, folded: f32, beta: f32) -> Result<f32, Exit> {
    let c = c.filter(|_| beta != 0.0);
    let amax = acc.iter().enumerate().fold(0f64, |m, (i, &x)| {
        let v = folded * x + c.map_or(0.0, |c| beta * c[i]);
        m.max(v.abs() as f64)
    });
    if amax == 0.0 {
        return Ok(1.0);
    }
    let st = 6.0 * 448.0 / amax;
    match st as f32 {
        x if x.is_finite() && x > 0.0 => Ok(x),
        _ => Err(bad(format!("alpha = {alpha:e}, beta = {beta:e}: the default norm constant 6 * 448 / max|alpha * A·Bᵀ + beta * C| = {st:e} is not a finite, positive f32; pass --norm-constant"))),
    }
}

/// A verification's outcome, for the report.
struct Check {
    passed: bool,
    bad: usize,
    /// The contest criterion's largest |got - want|.
    max_abs: Option<f64>,
    /// The FP32-bound criterion's worst |got - exact| / bound.
    worst_ratio: Option<f64>,
    checked: usize,
    detail: String,
}

/// Verifies the GPU result on `rows` (every column) by `--tolerance`.
fn verify<T: OutputElement>(cli: &Cli, inputs: &Inputs<T>, p: &Problem, rows: &[usize], got: &[T]) -> Result<Check, Exit> {
    let (m, n) = (p.m, p.n);
    let a = if rows.len() == m { inputs.a.clone() } else { inputs.a.select_rows(rows)? };
    let c_rows = inputs.c.as_ref().map(|c| pick_rows(c, rows, m, n, p.l));
    let got_rows = pick_rows(got, rows, m, n, p.l);
    let checked = got_rows.len();
    let sampled = if rows.len() == m { String::new() } else { format!(" ({} of {m} rows)", rows.len()) };
    Ok(match cli.tolerance {
        ToleranceArg::Bound => {
            let v = verify_matrices(&a, &inputs.b, p.alpha, p.beta, c_rows.as_deref(), &got_rows)?;
            // The worst element's place in D: its index counts the verified rows only.
            let at = v.worst.map_or(String::new(), |w| {
                let (b, r, j) = (w.index / (rows.len() * n), (w.index / n) % rows.len(), w.index % n);
                format!(" [index {} is D[l={b}, m={}, n={j}]]", w.index, rows[r])
            });
            let detail = format!("{checked} elements{sampled} against the exact reference, exact or within the FP32 bound: {v}{at}");
            Check { passed: v.passed(), bad: v.failed, max_abs: None, worst_ratio: v.worst.map(|w| w.ratio), checked, detail }
        }
        ToleranceArg::Contest => {
            let want: Vec<T> = reference_gemm(&a, &inputs.b, p.alpha, p.beta, c_rows.as_deref())?;
            let cmp = compare(&got_rows, &want, 1e-3, 1e-3)?;
            let detail = format!("{checked} elements{sampled} against the exact reference, contest tolerance: {cmp}");
            Check { passed: cmp.passed(), bad: cmp.bad, max_abs: Some(cmp.max_abs), worst_ratio: None, checked, detail }
        }
    })
}

fn pick_rows<T: Copy>(x: &[T], rows: &[usize], m: usize, n: usize, l: usize) -> Vec<T> {
    (0..l).flat_map(|b| rows.iter().flat_map(move |&r| x[(b * m + r) * n..][..n].iter().copied())).collect()
}

/// Bytes a GEMM must move at least: A, B, scales, C when read, D (and SFD).
fn traffic(p: &Problem, out: OutType) -> f64 {
    let c_bytes = if out.sfd().is_some() { 4 * p.cd_elems() } else { out.d_bytes(p.cd_elems()) };
    let d_bytes = out.d_bytes(p.cd_elems()) + if out.sfd().is_some() { p.sfd_bytes() } else { 0 };
    (p.a_bytes() + p.b_bytes() + p.sfa_bytes() + p.sfb_bytes() + d_bytes + if p.beta != 0.0 { c_bytes } else { 0 }) as f64
}

#[allow(clippy::too_many_arguments)]
fn report(cli: &Cli, p: &Problem, device: &str, config: &str, check: Option<&Check>, ms: f64, tflops: f64, gbps: f64) {
    let out = cli.out_type();
    if cli.json {
        let (passed, bad, max_abs, worst_ratio, checked) = match check {
            Some(c) => (c.passed.to_string(), c.bad.to_string(), num(c.max_abs), num(c.worst_ratio), c.checked.to_string()),
            None => ("null".into(), "null".into(), "null".into(), "null".into(), "0".into()),
        };
        let criterion = match cli.tolerance {
            _ if out.sfd().is_some() => "fp4-groups",
            ToleranceArg::Bound => "fp32-bound",
            ToleranceArg::Contest => "contest",
        };
        let (alpha, beta, ms, tflops, gbps) = (num(Some(p.alpha)), num(Some(p.beta)), num(Some(ms)), num(Some(tflops)), num(Some(gbps)));
        // FP4 outputs: the norm constant that decodes D (null for the others).
        let norm = num(out.sfd().map(|_| p.norm_constant));
        println!("{{\"m\":{},\"n\":{},\"k\":{},\"l\":{},\"alpha\":{alpha},\"beta\":{beta},\"out\":\"{out}\",\"norm_constant\":{norm},\"device\":\"{device}\",\"config\":\"{config}\",\"criterion\":\"{criterion}\",\"passed\":{passed},\"bad\":{bad},\"max_abs\":{max_abs},\"worst_ratio\":{worst_ratio},\"checked\":{checked},\"avg_ms\":{ms},\"tflops\":{tflops},\"gbps\":{gbps}}}",
            p.m, p.n, p.k, p.l);
        return;
    }
    let norm = out.sfd().map_or(String::new(), |_| format!(" norm_constant={}", p.norm_constant));
    println!("  Problem: {}x{}x{} L={} alpha={} beta={} out={out}{norm}", p.m, p.n, p.k, p.l, p.alpha, p.beta);
    println!("  Device: {device}, config: {config}");
    match check {
        Some(c) => println!("  Disposition: {} ({})", if c.passed { "Passed" } else { "Failed" }, c.detail),
        None => println!("  Disposition: computed by the CPU reference (nothing to verify)"),
    }
    println!("  Avg runtime: {ms:.4} ms");
    println!("  TFLOP/s: {tflops:.3}");
    println!("  GB/s: {gbps:.2}");
}

/// A JSON number: `null` where the value is absent or not finite (JSON has no NaN or infinity).
fn num<X: Into<f64> + std::fmt::Display + Copy>(x: Option<X>) -> String {
    match x {
        Some(v) if v.into().is_finite() => format!("{v}"),
        _ => "null".into(),
    }
}

impl Cli {
    fn mode(&self) -> ModeArg {
        self.mode.unwrap_or(if self.checkpoint.is_some() { ModeArg::W4a16 } else { ModeArg::Nvfp4 })
    }

    fn out_type(&self) -> OutType {
        match self.out {
            OutArg::F16 => OutType::F16,
            OutArg::Bf16 => OutType::Bf16,
            OutArg::F32 => OutType::F32,
            OutArg::Nvfp4 => OutType::Nvfp4,
            OutArg::Nvfp4Ue8m0 => OutType::Nvfp4Ue8m0,
        }
    }
}

fn generate<T: OutputElement>(cli: &Cli) -> Result<Inputs<T>, Exit> {
    let (m, n, k, l) = (cli.m, cli.n, cli.k, cli.l);
    let (a, b) = match cli.data {
        DataArg::Contest => (Nvfp4Matrix::random_contest((l, m, k), cli.seed)?, Nvfp4Matrix::random_contest((l, n, k), cli.seed.wrapping_add(1))?),
        // Global scale 1 (the block scales of N(0, 1) data stay well inside ue4m3): generated
        // operands carry no global scales, so --save writes none for them.
        DataArg::Realistic => (Nvfp4Matrix::random_gaussian((l, m, k), cli.seed)?, Nvfp4Matrix::random_gaussian((l, n, k), cli.seed.wrapping_add(1))?),
    };
    let c = (cli.beta != 0.0).then(|| {
        let mut rng = SplitMix64::new(cli.seed.wrapping_add(2));
        (0..l * m * n).map(|_| T::from_f64(rng.below(17) as f64 - 8.0)).collect()
    });
    Ok(Inputs { a, b, c, generated: true, x: None })
}

/// B from a checkpoint's layer, A from `--m` rows of N(0, 1) bf16 activations quantized with the
/// layer's input scale (computed where it has none).
fn from_checkpoint<T: OutputElement>(cli: &Cli, path: &PathBuf) -> Result<Inputs<T>, Exit> {
    let name = cli.layer.as_deref().ok_or_else(|| bad("--checkpoint needs --layer NAME (the layer's prefix, e.g. model.layers.0.mlp.down_proj)"))?;
    if cli.l != 1 {
        return Err(bad(format!("--l {}: a checkpoint layer runs with L = 1", cli.l)));
    }
    let checkpoint = blockscaled_gemm::checkpoint::Checkpoint::open(path)?;
    // Sized from the header, before the layer is read.
    let (m, (n, k)) = (cli.m, checkpoint.layer_dims(name)?);
    let p = Problem::new(m, n, k).scalars(cli.alpha, cli.beta);
    p.validate(cli.out_type(), cli.beta != 0.0)?;
    // The bf16 activations and their f32 copy in the quantizer, and the layer's row-major
    // scales while they are tiled, besides the operands.
    check_host_memory(cli, &p, 6.0 * m as f64 * k as f64 + p.sfb_bytes() as f64)?;
    let layer = checkpoint.layer(name)?;
    let mut rng = SplitMix64::new(cli.seed);
    let x: Vec<bf16> = (0..m * k).map(|_| bf16::from_f64(rng.normal())).collect();
    let a = Nvfp4Matrix::quantize(&x, (1, m, k), layer.input_scale)?;
    let c = (cli.beta != 0.0).then(|| {
        let mut rng = SplitMix64::new(cli.seed.wrapping_add(2));
        (0..m * n).map(|_| T::from_f64(rng.below(17) as f64 - 8.0)).collect()
    });
    Ok(Inputs { a, b: layer.weight, c, generated: true, x: Some(x) })
}

fn load<T: OutputElement + safetensors_dtype::HasDtype>(path: &PathBuf, beta: f32) -> Result<Inputs<T>, Exit> {
    // Not a FIFO or a device: reading one would block or never end. The length read is the one
    // checked here: a procfs file reports 0 and may never end.
    let len = match std::fs::metadata(path) {
        Ok(m) => {
            if !m.is_file() {
                return Err(bad(format!("{}: not a regular file", path.display())));
            }
            // The file and the operands copied out of it are in memory at once before any other
            // check.
            if let Some(available) = mem_available()? {
                if m.len().saturating_mul(2) > available {
                    return Err(bad(format!("{}: {} bytes, read and copied, need about twice that; {available} bytes of host memory are available", path.display(), m.len())));
                }
            }
            m.len()
        }
        Err(_) => 0, // the open below names the error
    };
    let bytes = {
        use std::io::Read;
        let mut bytes = Vec::new();
        std::fs::File::open(path).and_then(|f| f.take(len).read_to_end(&mut bytes)).map_err(|e| bad(format!("{}: cannot read: {e}", path.display())))?;
        bytes
    };
    let st = SafeTensors::deserialize(&bytes).map_err(|e| bad(format!("{}: not a safetensors file: {e}", path.display())))?;
    let get = |name: &str| st.tensor(name).map_err(|_| bad(format!("{}: no tensor `{name}`", path.display())));
    let (a, b) = (get("a")?, get("b")?);
    let (la, ma, ka) = fp4_shape("a", &a)?;
    let (lb, nb, kb) = fp4_shape("b", &b)?;
    if (la, ka) != (lb, kb) {
        return Err(bad(format!("a is [L={la}, M={ma}, K={ka}] and b is [L={lb}, N={nb}, K={kb}]: L and K must agree")));
    }
    if ka % 16 != 0 {
        return Err(bad(format!("K = {ka}: must be a multiple of 16 (one scale per 16 values)")));
    }
    let sfa = scales("sfa", &get("sfa")?, ma, ka, la)?;
    let sfb = scales("sfb", &get("sfb")?, nb, ka, la)?;
    let (ga, gb) = (global_scale(&st, "global_scale_a")?, global_scale(&st, "global_scale_b")?);
    let am = matrix("sfa", Nvfp4Matrix::from_parts((la, ma, ka), a.data().to_vec(), sfa, ga))?;
    let bm = matrix("sfb", Nvfp4Matrix::from_parts((la, nb, ka), b.data().to_vec(), sfb, gb))?;
    let c = match st.tensor("c") {
        Ok(c) => {
            let want: Vec<usize> = if la == 1 && c.shape().len() == 2 { vec![ma, nb] } else { vec![la, ma, nb] };
            if c.dtype() != T::DTYPE || c.shape() != want.as_slice() {
                return Err(bad(format!("c: {:?} {:?}, expected {:?} {:?} (D's dtype and shape)", c.dtype(), c.shape(), T::DTYPE, want)));
            }
            Some(T::decode(c.data()))
        }
        Err(_) if beta != 0.0 => return Err(bad(format!("beta = {beta} but {} has no tensor `c`", path.display()))),
        Err(_) => None,
    };
    Ok(Inputs { a: am, b: bm, c, generated: false, x: None })
}

/// An operand of an input file, or its error naming the file's scale tensor where the library's
/// says `scales` (the sizes are checked against the shapes before).
fn matrix(scales: &str, m: Result<Nvfp4Matrix, Error>) -> Result<Nvfp4Matrix, Exit> {
    m.map_err(|e| match e {
        Error::InvalidData { what: "scales", detail } => bad(format!("{scales}: {detail}")),
        e => e.into(),
    })
}

/// A global scale of an input file (`global_scale_a`, `global_scale_b`: F32, shape [] or [1], as
/// `--save` writes them), where present; the GEMM folds it into alpha.
fn global_scale(st: &SafeTensors<'_>, name: &str) -> Result<Option<f32>, Exit> {
    let Ok(t) = st.tensor(name) else { return Ok(None) };
    if t.dtype() != Dtype::F32 || !matches!(t.shape(), [] | [1]) {
        return Err(bad(format!("{name}: {:?} {:?}, expected F32 [] or [1] (a per-tensor scale)", t.dtype(), t.shape())));
    }
    let g = f32::from_le_bytes(t.data().try_into().map_err(|_| bad(format!("{name}: {} bytes, expected 4", t.data().len())))?);
    if !(g.is_finite() && g > 0.0) {
        return Err(bad(format!("{name}: {g}: a global scale must be finite and positive")));
    }
    Ok(Some(g))
}

/// (L, rows, K) of a packed operand.
fn fp4_shape(name: &str, t: &safetensors::tensor::TensorView<'_>) -> Result<(usize, usize, usize), Exit> {
    let per_byte = match t.dtype() {
        Dtype::U8 => 2,
        Dtype::F4 => 1,
        other => return Err(bad(format!("{name}: dtype {other:?}, expected U8 (packed e2m1 pairs) or F4"))),
    };
    let s = t.shape();
    let (l, rows, last) = match s {
        [r, c] => (1, *r, *c),
        [l, r, c] => (*l, *r, *c),
        _ => return Err(bad(format!("{name}: shape {s:?}, expected [rows, K/2] or [L, rows, K/2] (U8), [rows, K] or [L, rows, K] (F4)"))),
    };
    if l == 0 || rows == 0 || last == 0 {
        return Err(bad(format!("{name}: shape {s:?} has an empty dimension")));
    }
    Ok((l, rows, last * per_byte))
}

/// Tiled scale bytes of an operand with `rows` x `k`, batch `l`, from a flat or 6-D tensor.
fn scales(name: &str, t: &safetensors::tensor::TensorView<'_>, rows: usize, k: usize, l: usize) -> Result<Vec<u8>, Exit> {
    if !matches!(t.dtype(), Dtype::U8 | Dtype::F8_E4M3) {
        return Err(bad(format!("{name}: dtype {:?}, expected F8_E4M3 or U8", t.dtype())));
    }
    let (rest, rest_k) = (padded_rows(rows) / 128, padded_sf_cols(sf_cols(k)) / 4);
    let want = sf_bytes((l, rows, k));
    let s = t.shape();
    let ok = match s {
        [x] => *x == want,
        [32, 4, r, 4, rk, ll] | [ll, r, rk, 32, 4, 4] => (*r, *rk, *ll) == (rest, rest_k, l),
        _ => false,
    };
    if !ok {
        return Err(bad(format!("{name}: shape {s:?}, expected [{want}] or (32, 4, {rest}, 4, {rest_k}, {l}) or ({l}, {rest}, {rest_k}, 32, 4, 4) for {rows} rows, K = {k}, L = {l}")));
    }
    Ok(t.data().to_vec())
}

/// Shape of an output with `cols` stored columns: [M, cols] or [L, M, cols].
fn d_shape(p: &Problem, cols: usize) -> Vec<usize> {
    if p.l == 1 { vec![p.m, cols] } else { vec![p.l, p.m, cols] }
}

/// Writes `outputs` (and the generated inputs) to `--save`; W4A16 runs (`w4a16`: the bf16
/// activations) write `x`, `b`, `sfb` and B's global scale instead of the NVFP4 operands.
fn save<T: OutputElement + safetensors_dtype::HasDtype>(cli: &Cli, inputs: &Inputs<T>, p: &Problem, w4a16: Option<&[bf16]>, outputs: Vec<(String, Dtype, Vec<usize>, Vec<u8>)>) -> Result<(), Exit> {
    let Some(path) = &cli.save else { return Ok(()) };
    let mut tensors = outputs;
    if let Some(x) = w4a16 {
        let b = &inputs.b;
        tensors.push(("x".into(), Dtype::BF16, d_shape(p, p.k), x.iter().flat_map(|v| v.to_le_bytes()).collect()));
        tensors.push(("b".into(), Dtype::U8, d_shape(&Problem { m: p.n, ..*p }, p.k / 2), b.data().to_vec()));
        tensors.push(("sfb".into(), Dtype::F8_E4M3, vec![b.scales().len()], b.scales().to_vec()));
        tensors.push(("global_scale_b".into(), Dtype::F32, vec![], b.global_scale().unwrap_or(1.0).to_le_bytes().to_vec()));
        if let Some(c) = &inputs.c {
            tensors.push(("c".into(), T::DTYPE, d_shape(p, p.n), T::encode(c)));
        }
    } else if inputs.generated {
        let (a, b) = (&inputs.a, &inputs.b);
        tensors.push(("a".into(), Dtype::U8, d_shape(p, p.k / 2), a.data().to_vec()));
        tensors.push(("b".into(), Dtype::U8, d_shape(&Problem { m: p.n, ..*p }, p.k / 2), b.data().to_vec()));
        tensors.push(("sfa".into(), Dtype::F8_E4M3, vec![a.scales().len()], a.scales().to_vec()));
        tensors.push(("sfb".into(), Dtype::F8_E4M3, vec![b.scales().len()], b.scales().to_vec()));
        if let Some(c) = &inputs.c {
            tensors.push(("c".into(), T::DTYPE, d_shape(p, p.n), T::encode(c)));
        }
        if let Some(x) = &inputs.x {
            // Checkpoint runs: the activations, and both global scales (D = alpha * ga * gb * A Bᵀ).
            tensors.push(("x".into(), Dtype::BF16, vec![p.m, p.k], x.iter().flat_map(|v| v.to_le_bytes()).collect()));
            for (name, g) in [("global_scale_a", a.global_scale()), ("global_scale_b", b.global_scale())] {
                tensors.push((name.into(), Dtype::F32, vec![], g.unwrap_or(1.0).to_le_bytes().to_vec()));
            }
        }
    }
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors.iter()
        .map(|(n, dt, s, bytes)| (n.clone(), safetensors::tensor::TensorView::new(*dt, s.clone(), bytes).expect("consistent tensor")))
        .collect();
    let bytes = safetensors::serialize(views, None).map_err(|e| bad(format!("{}: cannot serialize: {e}", path.display())))?;
    write_atomically(path, &bytes).map_err(|e| bad(format!("{}: cannot write: {e}", path.display())))
}

/// Writes `bytes` to a new temporary file beside `path`, renamed over `path` only once complete:
/// a failed write (a full disk, `ulimit -f`) leaves no partial file and an existing one as it was.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let name = path.file_name().ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name"))?;
    // Only a regular file is replaced (the rename would put a file in place of a device, a FIFO
    // or a symlink itself), and it keeps its permissions.
    let old = match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_file() => {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "exists and is not a regular file (a device, FIFO, symlink or directory is not replaced)"));
        }
        Ok(m) => Some(m.permissions()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    let tmp = path.with_file_name(format!(".{}.partial-{}", name.to_string_lossy(), std::process::id()));
    ignore_sigxfsz();
    // create_new: never truncate a file this run did not make (and so never remove one).
    let mut f = std::fs::File::create_new(&tmp)?;
    let written = f
        .write_all(bytes)
        .and_then(|_| f.sync_all())
        .and_then(|_| old.map_or(Ok(()), |perm| std::fs::set_permissions(&tmp, perm)))
        .and_then(|_| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// A write past the file size limit (`ulimit -f`) raises SIGXFSZ, whose default action ends the
/// process before the partial file can be removed; ignored, the write fails with EFBIG instead.
#[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
fn ignore_sigxfsz() {
    extern "C" {
        fn signal(signum: i32, handler: usize) -> usize;
    }
    const SIGXFSZ: i32 = 25;
    const SIG_IGN: usize = 1;
    // SAFETY: signal(2) with SIG_IGN installs no handler; nothing else here uses SIGXFSZ.
    unsafe {
        signal(SIGXFSZ, SIG_IGN);
    }
}

#[cfg(not(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64"))))]
fn ignore_sigxfsz() {}

/// safetensors dtypes and little-endian bytes of the output types.
mod safetensors_dtype {
    use super::*;

    pub trait HasDtype: Sized {
        const DTYPE: Dtype;
        fn encode(v: &[Self]) -> Vec<u8>;
        fn decode(b: &[u8]) -> Vec<Self>;
    }

    macro_rules! has_dtype {
        ($t:ty, $d:expr, $n:expr, $to:expr, $from:expr) => {
            impl HasDtype for $t {
                const DTYPE: Dtype = $d;
                fn encode(v: &[Self]) -> Vec<u8> {
                    v.iter().flat_map(|x| $to(*x)).collect()
                }
                fn decode(b: &[u8]) -> Vec<Self> {
                    b.chunks_exact($n).map(|c| $from(c.try_into().unwrap())).collect()
                }
            }
        };
    }
    has_dtype!(f16, Dtype::F16, 2, |x: f16| x.to_le_bytes(), f16::from_le_bytes);
    has_dtype!(bf16, Dtype::BF16, 2, |x: bf16| x.to_le_bytes(), bf16::from_le_bytes);
    has_dtype!(f32, Dtype::F32, 4, |x: f32| x.to_le_bytes(), f32::from_le_bytes);
}
