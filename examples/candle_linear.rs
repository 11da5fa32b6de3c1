//! An NVFP4 linear layer inside a candle program (feature `candle`): random bf16 and f16
//! activations as candle tensors on the GPU, multiplied with an NVFP4 weight by `Nvfp4Linear`
//! (`--mode w4a16`: as they are, the default; `--mode nvfp4`: quantized on the GPU first), the
//! result used by a candle op, then judged against the exact CPU reference (of W4A16 on the same
//! activations, or of NVFP4 on the same activations quantized on the host with the same input
//! scale). Then timings: what a forward costs the host, and, in the same run, the layer against
//! candle's own bf16 `matmul` on the dequantized weight (cuBLAS), both eager, weights rotated past
//! the L2. With `--experts E`, the same for an experts layer (`Nvfp4Experts`, the grouped GEMM of
//! a mixture-of-experts layer) on the M rows spread over E experts, against one candle bf16
//! `matmul` an expert.
//!
//! ```text
//! cargo run --release --example candle_linear --features candle -- [--mode w4a16|nvfp4] [--m 16] [--n 4096] [--k 7168] [--experts 8]
//! ```
//! Exits 0 when every element passes, 1 when one does not or a call fails (W4A16, the default, on
//! a GPU without W4A16 kernels such as a B200: use `--mode nvfp4` there), 2 where the driver has
//! no GPU. candle links libcuda at load time (cudarc's `dynamic-linking`), so without a driver at
//! all the program does not start.

use std::error::Error;
use std::time::Instant;

use blockscaled_gemm::candle::{LinearMode, Nvfp4Experts, Nvfp4Linear};
use blockscaled_gemm::layout::sf_batch_bytes;
use blockscaled_gemm::{Activation16, BlockScaledGemm, Nvfp4Matrix, Nvfp4Tensor, Problem, Quantizer};
use candle_core::{DType, Device, Tensor, WithDType};
use clap::{Parser, ValueEnum};

/// How the layer takes its activations.
#[derive(Clone, Copy, ValueEnum)]
enum Mode {
    /// As they are, bf16 or f16 (Hopper).
    W4a16,
    /// Quantized to NVFP4 on the GPU.
    Nvfp4,
}

#[derive(Parser)]
#[command(about = "An NVFP4 linear layer on candle tensors, checked against the exact CPU reference")]
struct Cli {
    /// Token rows, as two batches of M / 2 (M even) to show a 3-D input.
    #[arg(long, default_value_t = 16)]
    m: usize,
    /// Output features (the weight's rows).
    #[arg(long, default_value_t = 4096)]
    n: usize,
    /// Input features.
    #[arg(long, default_value_t = 7168)]
    k: usize,
    /// How the layer takes its activations.
    #[arg(long, value_enum, default_value_t = Mode::W4a16)]
    mode: Mode,
    /// Also an experts layer (`Nvfp4Experts`) of this many experts of the same shape, the M rows
    /// spread evenly over them: checked against the reference and timed (0: none).
    #[arg(long, default_value_t = 0)]
    experts: usize,
    /// Timed forward passes.
    #[arg(long, default_value_t = 200)]
    iterations: usize,
}

fn main() {
    let cli = Cli::parse();
    if !BlockScaledGemm::driver_present() {
        eprintln!("candle_linear: no NVIDIA driver on this machine");
        std::process::exit(2);
    }
    match run(&cli) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("candle_linear: {e}");
            std::process::exit(1);
        }
    }
}

fn run(cli: &Cli) -> Result<bool, Box<dyn Error>> {
    if cli.m == 0 || !cli.m.is_multiple_of(2) {
        return Err(format!("--m {}: an even number of rows (two batches)", cli.m).into());
    }
    let device = Device::new_cuda(0)?;
    let weight = Nvfp4Matrix::random_realistic((1, cli.n, cli.k), 7)?;
    let mode = match cli.mode {
        Mode::W4a16 => LinearMode::W4a16,
        // Activations from randn lie within about 6 sigma: this input scale keeps their block
        // scales inside ue4m3 (ModelOpt's amax / (6 * 448)).
        Mode::Nvfp4 => LinearMode::Nvfp4 { input_scale: 6.0 / (6.0 * 448.0) },
    };
    let layer = make_layer(&device, &weight, mode)?;
    println!("Nvfp4Linear {} -> {}, {mode:?}, on {:?}; input [2, {}, {}]", cli.k, cli.n, device.location(), cli.m / 2, cli.k);
    let mut ok = true;
    ok &= check::<half::bf16>(cli, &device, &layer, &weight, DType::BF16)?;
    ok &= check::<half::f16>(cli, &device, &layer, &weight, DType::F16)?;
    // One layer shared by two threads (candle's device is on the per-thread default stream; the
    // layer keeps a GEMM per thread).
    println!("  two threads sharing the layer:");
    let results: Vec<bool> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2).map(|_| scope.spawn(|| check::<half::bf16>(cli, &device, &layer, &weight, DType::BF16).map_err(|e| e.to_string()))).collect();
        handles.into_iter().map(|h| h.join().expect("thread").unwrap_or_else(|e| { eprintln!("candle_linear: {e}"); false })).collect()
    });
    ok &= results.iter().all(|&r| r);
    host_cost(cli, &device, &layer)?;
    against_bf16(cli, &device, &weight, mode)?;
    if cli.experts > 0 {
        ok &= experts(cli, &device, mode)?;
    }
    println!("{}", if ok { "PASSED" } else { "FAILED" });
    Ok(ok)
}

/// A layer over `weight` uploaded to `device`, taking its input as `mode` says.
fn make_layer(device: &Device, weight: &Nvfp4Matrix, mode: LinearMode) -> Result<Nvfp4Linear, Box<dyn Error>> {
    let cuda = device.as_cuda_device()?;
    Ok(Nvfp4Linear::with_mode(Nvfp4Tensor::upload(weight, &cuda.cuda_stream())?, mode, cuda)?)
}

/// One dtype: forward, a candle op on the result, the verdict against the CPU reference of the
/// layer's mode, timing.
fn check<T: Activation16 + WithDType + blockscaled_gemm::HostFloat>(
    cli: &Cli, device: &Device, layer: &Nvfp4Linear, weight: &Nvfp4Matrix, dtype: DType,
) -> Result<bool, Box<dyn Error>> {
    let x = Tensor::randn(0f32, 1.0, (2, cli.m / 2, cli.k), device)?.to_dtype(dtype)?;
    let y = layer.forward(&x)?;
    assert_eq!(y.dims(), &[2, cli.m / 2, cli.n]);
    // An ordinary candle op on the output: it is a tensor like any other.
    let mean = y.to_dtype(DType::F32)?.abs()?.mean_all()?.to_scalar::<f32>()?;

    let x_host: Vec<T> = x.flatten_all()?.to_vec1()?;
    let got: Vec<T> = y.flatten_all()?.to_vec1()?;
    let verdict = layer.mode().verify(&x_host, weight, 1.0, &got)?;

    let (_, us) = time_calls(device, 0, cli.iterations, &mut |_| {
        layer.forward(&x)?;
        Ok(())
    })?;
    println!("  {dtype:?}: mean |y| {mean:.4}; {verdict}; {us:.1} us per forward (launches and the output's allocation, back to back)");
    Ok(verdict.passed())
}

/// What a forward costs the host, against the path an engine that keeps its buffers takes
/// (`Quantizer::quantize_into` and `BlockScaledGemm::gemm`, or `BlockScaledGemm::gemm_w4a16`, on
/// buffers made once, on the same stream): the median host time of one call (the GPU busy behind
/// it) and the time a call back to back, bf16.
fn host_cost(cli: &Cli, device: &Device, layer: &Nvfp4Linear) -> Result<(), Box<dyn Error>> {
    let (m, k) = (cli.m, cli.k);
    let n = layer.weight().shape().1;
    let x = Tensor::randn(0f32, 1.0, (m, k), device)?.to_dtype(DType::BF16)?;
    let (fh, fb) = time_calls(device, 1, cli.iterations, &mut |_| {
        layer.forward(&x)?;
        Ok(())
    })?;
    let stream = device.as_cuda_device()?.cuda_stream();
    let (q, g) = (Quantizer::new(stream.clone()), BlockScaledGemm::new(stream.clone())?);
    let xs = stream.clone_htod(&x.flatten_all()?.to_vec1::<half::bf16>()?)?;
    let (mut codes, mut scales) = (stream.alloc_zeros::<u8>(m * k / 2)?, stream.alloc_zeros::<u8>(sf_batch_bytes(m, k))?);
    let mut y = stream.alloc_zeros::<half::bf16>(m * n)?;
    let p = Problem::new(m, n, k);
    let (eh, eb) = time_calls(device, 1, cli.iterations, &mut |_| {
        match layer.mode() {
            LinearMode::Nvfp4 { input_scale } => {
                q.quantize_into(&xs, (1, m, k), input_scale, &mut codes, &mut scales)?;
                let a = Nvfp4Tensor::new::<u8, u8>(codes.slice(..), scales.slice(..), (1, m, k), input_scale)?;
                g.gemm(&p, &a, layer.weight(), &mut y, None)?;
            }
            LinearMode::W4a16 => {
                g.gemm_w4a16(&p, &xs, layer.weight(), &mut y, None)?;
            }
        }
        Ok(())
    })?;
    let engine = match layer.mode() {
        LinearMode::Nvfp4 { .. } => "quantize_into + gemm",
        LinearMode::W4a16 => "gemm_w4a16",
    };
    println!("  host cost, bf16 [{m}, {k}] (weights L2-resident): forward {fh:.1} us a call on the host, {fb:.1} us a call back to back; \
              {engine} on buffers made once {eh:.1} / {eb:.1} us");
    Ok(())
}

/// The layer against what a candle model runs without it: `x.matmul(wᵀ)` with the weight
/// dequantized to bf16 (cuBLAS), both eager, back to back, each cycling through copies of its
/// weight that together exceed twice the L2, so neither reads its weight from L2. Same run.
fn against_bf16(cli: &Cli, device: &Device, weight: &Nvfp4Matrix, mode: LinearMode) -> Result<(), Box<dyn Error>> {
    use cudarc::driver::sys::CUdevice_attribute;
    let (m, n, k) = (cli.m, cli.n, cli.k);
    let cuda = device.as_cuda_device()?;
    let l2 = cuda.cuda_stream().context().attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize;
    let sets = |bytes: usize| (2 * l2).div_ceil(bytes.max(1)) + 1;
    let layers = (0..sets(n * k / 2 + n * k / 16)).map(|_| make_layer(device, weight, mode)).collect::<Result<Vec<_>, _>>()?;
    let w16 = Tensor::from_vec(weight.dequantize()?, (n, k), device)?.to_dtype(DType::BF16)?;
    let dense = (0..sets(n * k * 2)).map(|_| w16.copy()).collect::<candle_core::Result<Vec<_>>>()?;
    drop(w16);
    let x = Tensor::randn(0f32, 1.0, (m, k), device)?.to_dtype(DType::BF16)?;
    let (_, ours) = time_calls(device, 4, cli.iterations, &mut |i| {
        layers[i % layers.len()].forward(&x)?;
        Ok(())
    })?;
    let (_, bf16) = time_calls(device, 4, cli.iterations, &mut |i| {
        x.matmul(&dense[i % dense.len()].t()?)?;
        Ok(())
    })?;
    println!("  against candle bf16, [{m}, {k}] x [{n}, {k}]ᵀ, weights rotated over {} / {} copies (> 2x the {} MB L2), back to back: \
              Nvfp4Linear {ours:.1} us a call, bf16 matmul {bf16:.1} us ({:.2}x)", layers.len(), dense.len(), l2 >> 20, bf16 / ours);
    Ok(())
}

/// An experts layer of `cli.experts` experts (N, K) on M rows spread evenly over them (bf16): its
/// verdict expert by expert, then, back to back with the experts' weights rotated past the L2,
/// its forward against what candle runs without it, one bf16 `matmul` an expert on its rows
/// (the weights dequantized), same run.
fn experts(cli: &Cli, device: &Device, mode: LinearMode) -> Result<bool, Box<dyn Error>> {
    use cudarc::driver::sys::CUdevice_attribute;
    let (m, n, k, e) = (cli.m, cli.n, cli.k, cli.experts);
    let counts: Vec<usize> = (0..e).map(|i| m / e + usize::from(i < m % e)).collect();
    let offsets = blockscaled_gemm::grouped::expert_offsets(&counts)?;
    let weight = Nvfp4Matrix::random_realistic((e, n, k), 11)?;
    let scales: Vec<f32> = (0..e).map(|i| [1.0, 0.5, 2.0, 0.25][i % 4]).collect();
    let cuda = device.as_cuda_device()?;
    let make = || -> Result<Nvfp4Experts, Box<dyn Error>> { Ok(Nvfp4Experts::from_matrix(&weight, &scales, mode, cuda)?) };
    let layer = make()?;
    let x = Tensor::randn(0f32, 1.0, (m, k), device)?.to_dtype(DType::BF16)?;
    let o = Tensor::new(offsets.as_slice(), device)?;
    let y = layer.forward(&x, &o)?;
    let (xs, got): (Vec<half::bf16>, Vec<half::bf16>) = (x.flatten_all()?.to_vec1()?, y.flatten_all()?.to_vec1()?);
    let mut ok = true;
    for ex in 0..e {
        let (r0, r1) = (offsets[ex] as usize, offsets[ex + 1] as usize);
        if r0 == r1 {
            continue;
        }
        let v = mode.verify(&xs[r0 * k..r1 * k], &weight.batch_slice(ex)?, scales[ex], &got[r0 * n..r1 * n])?;
        ok &= v.passed();
        if !v.passed() {
            println!("  experts: expert {ex} (rows {r0}..{r1}): {v}");
        }
    }
    let l2 = cuda.cuda_stream().context().attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize;
    let sets = |bytes: usize| (2 * l2).div_ceil(bytes.max(1)) + 1;
    let layers = (0..sets(e * (n * k / 2 + n * k / 16))).map(|_| make()).collect::<Result<Vec<_>, _>>()?;
    let dense: Vec<Vec<Tensor>> = (0..sets(e * n * k * 2))
        .map(|_| (0..e).map(|ex| Tensor::from_vec(weight.batch_slice(ex)?.dequantize()?, (n, k), device)?.to_dtype(DType::BF16).map_err(Into::into)).collect::<Result<Vec<_>, Box<dyn Error>>>())
        .collect::<Result<_, _>>()?;
    let (_, ours) = time_calls(device, 4, cli.iterations, &mut |i| {
        layers[i % layers.len()].forward(&x, &o)?;
        Ok(())
    })?;
    // The grouped GEMM the layer runs, on buffers made once and the same rotated weights: what
    // the layer's output allocation and checks cost.
    let stream = cuda.cuda_stream();
    let (g, q) = (BlockScaledGemm::new(stream.clone())?, Quantizer::new(stream.clone()));
    let (xd, od, sd) = (stream.clone_htod(&xs)?, stream.clone_htod(&offsets)?, stream.clone_htod(&scales)?);
    let mut yd = stream.alloc_zeros::<half::bf16>(m * n)?;
    let (mut codes, mut sfa) = (stream.alloc_zeros::<u8>(m * k / 2)?, stream.alloc_zeros::<u8>(blockscaled_gemm::grouped::moe_sfa_bytes(m, k, e))?);
    let p = blockscaled_gemm::MoeProblem::new(m, n, k, e);
    let (_, raw) = time_calls(device, 4, cli.iterations, &mut |i| {
        let w = layers[i % layers.len()].weight();
        match mode {
            LinearMode::W4a16 => {
                g.moe_gemm_w4a16(&p, &xd, w, &od, &sd, &mut yd, None)?;
            }
            LinearMode::Nvfp4 { input_scale } => {
                q.quantize_moe_into(&xd, (m, k), &od, input_scale, &mut codes, &mut sfa)?;
                let a = blockscaled_gemm::MoeActivations::new(codes.slice(..), sfa.slice(..), (m, k), input_scale)?;
                g.moe_gemm(&p, &a, w, &od, &sd, &mut yd, None)?;
            }
        }
        Ok(())
    })?;
    let (_, loop_bf16) = time_calls(device, 4, cli.iterations, &mut |i| {
        let ws = &dense[i % dense.len()];
        let ys = (0..e).filter(|&ex| counts[ex] > 0).map(|ex| x.narrow(0, offsets[ex] as usize, counts[ex])?.matmul(&ws[ex].t()?)).collect::<candle_core::Result<Vec<_>>>()?;
        Tensor::cat(&ys, 0)?;
        Ok(())
    })?;
    println!("  experts: {e} x [{n}, {k}], {m} rows ({counts:?}), bf16: {}; weights rotated over {} / {} copies, back to back: \
              Nvfp4Experts {ours:.1} us a call (its grouped calls alone on buffers made once {raw:.1}), candle bf16 matmul an expert + cat {loop_bf16:.1} us ({:.2}x)",
             if ok { "every expert exact or within the FP32 bound" } else { "FAILED" }, layers.len(), dense.len(), loop_bf16 / ours);
    Ok(ok)
}

/// `iterations` calls `f(i)` back to back, after `warmup` calls and a synchronization: the median
/// host time of one call and the time a call back to back (to the final synchronization), us.
fn time_calls(device: &Device, warmup: usize, iterations: usize, f: &mut dyn FnMut(usize) -> Result<(), Box<dyn Error>>) -> Result<(f64, f64), Box<dyn Error>> {
    for i in 0..warmup {
        f(i)?;
    }
    device.synchronize()?;
    let mut host = Vec::with_capacity(iterations);
    let start = Instant::now();
    for i in 0..iterations {
        let t = Instant::now();
        f(i)?;
        host.push(t.elapsed().as_secs_f64() * 1e6);
    }
    device.synchronize()?;
    host.sort_by(f64::total_cmp);
    Ok((host.get(host.len() / 2).copied().unwrap_or(0.0), start.elapsed().as_secs_f64() * 1e6 / iterations.max(1) as f64))
}
