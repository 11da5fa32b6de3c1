//! Benchmark of `BlockScaledGemm` on the shapes of SPEC.md §6 (not a test).
//!
//! Each shape: contest-style data copied into enough device buffer sets to rotate through more
//! than twice the L2 size; D poisoned (0xFF bytes, NaN) before every run; 10 warm-up runs; each
//! of `--runs` runs (at least 100) timed alone with a pair of CUDA events; the median reported,
//! with TFLOP/s, GB/s (the NVFP4 bytes a GEMM must move) and the ratio to the floor (the larger of
//! the NVFP4 bytes at 3.0 TB/s and the FP16 tensor-core work at 800 TFLOP/s, SPEC.md §6). The
//! output of the last timed run is verified against the exact reference on sampled rows. Then the
//! same `--runs` launches go back to back between one pair of events, without the poisoning in
//! between (`b2b_us`: the mean; what a sequence of GEMMs sees, where each launch may overlap the
//! end of the one before).
//! cuBLAS figures come from `--baselines FILE` (JSON written by bench/torch_baselines.py in the
//! same device session) or, when absent, from SPEC.md §6, labelled as such.
//!
//! `--out nvfp4` (or `nvfp4-ue8m0`) times the FP4-output epilogue instead (D and its scale
//! factors poisoned before each run, checked byte for byte on sampled rows).
//!
//! `cargo run --release --example bench -- [--runs 100] [--baselines FILE] [--shape MxNxK]... [--out nvfp4]`

use blockscaled_gemm::compare::{compare, compare_fp4};
use blockscaled_gemm::layout::from_tiled;
use blockscaled_gemm::fp4_out;
use blockscaled_gemm::reference::{self, Accumulation};
use blockscaled_gemm::{reference_gemm, BlockScaledGemm, Config, Nvfp4Matrix, Nvfp4Operand, Nvfp4Output, OutType, Problem};
use clap::Parser;
use cudarc::driver::{sys::CUdevice_attribute, CudaContext, CudaSlice, DevicePtrMut};
use half::f16;

#[derive(Parser)]
struct Cli {
    /// Timed runs per shape (the median is reported); at least 100.
    #[arg(long, default_value_t = 100)]
    runs: usize,
    /// JSON from bench/torch_baselines.py: {"MxNxK": {"bf16_us": .., "fp8_us": ..}, ...}.
    #[arg(long)]
    baselines: Option<std::path::PathBuf>,
    /// Shapes to run (default: SPEC.md §6), e.g. --shape 128x7168x16384.
    #[arg(long)]
    shape: Vec<String>,
    /// Force a config by name.
    #[arg(long)]
    config: Option<String>,
    /// Force the SM90 split-K count.
    #[arg(long)]
    split_k: Option<u32>,
    /// Output type: f16, nvfp4 or nvfp4-ue8m0.
    #[arg(long, default_value = "f16")]
    out: String,
    /// Also write the table as JSON lines here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

/// SPEC.md §6, H100 SXM 80 GB, 2026-11-21: (shape, cuBLAS bf16 us, cuBLAS FP8 us).
const SPEC_BASELINES: &[((usize, usize, usize), f64, f64)] = &[
    ((128, 7168, 16384), 103.8, 56.3),
    ((128, 4096, 7168), 34.1, 20.6),
    ((128, 7168, 2048), 19.7, 13.9),
    ((2048, 2048, 2048), 28.4, 19.3),
    ((8192, 8192, 8192), 1566.0, 877.0),
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    assert!(cli.runs >= 100, "--runs must be at least 100");
    if !BlockScaledGemm::driver_present() {
        eprintln!("bench: no NVIDIA driver on this machine");
        std::process::exit(3);
    }
    let out = OutType::ALL.into_iter().find(|o| o.name() == cli.out && (o.sfd().is_some() || *o == OutType::F16)).ok_or("--out: f16, nvfp4 or nvfp4-ue8m0")?;
    let ctx = CudaContext::new(0)?;
    let stream = ctx.default_stream();
    let gemm = BlockScaledGemm::new(stream.clone())?.with_split_k(cli.split_k);
    let l2 = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as usize;
    let name = ctx.name()?;
    let baselines = cli.baselines.as_ref().map(|p| std::fs::read_to_string(p).map(|s| parse_baselines(&s))).transpose()?;
    let shapes: Vec<(usize, usize, usize)> = if cli.shape.is_empty() {
        SPEC_BASELINES.iter().map(|s| s.0).collect()
    } else {
        cli.shape.iter().map(|s| {
            let v: Vec<usize> = s.split('x').map(|x| x.parse().expect("shape MxNxK")).collect();
            (v[0], v[1], v[2])
        }).collect()
    };
    println!("device: {name}, {} SMs, L2 {} MB; median of {} runs after 10 warm-ups; output {out}", gemm.device().sm_count, l2 >> 20, cli.runs);
    println!("{:>16} {:>24} {:>5} {:>10} {:>8} {:>8} {:>8} {:>9} {:>7} {:>11} {:>10} {:>8}", "MxNxK", "config", "split", "median_us", "b2b_us", "TFLOP/s", "GB/s", "floor_us", "x_floor", "cublas_bf16", "cublas_fp8", "check");
    let mut json = String::new();
    for (m, n, k) in shapes {
        let a = Nvfp4Matrix::random_contest(m, k, 1, 1)?;
        let b = Nvfp4Matrix::random_contest(n, k, 1, 2)?;
        // Verified rows; for FP4 outputs they also set the norm constant (top scale near 448).
        let rows: Vec<usize> = (0..m.min(64)).map(|i| i * (m - 1) / (m.min(64) - 1).max(1)).collect();
        let a_rows = a.select_rows(&rows);
        // FP4: the exact accumulators of those rows, for the norm constant and the check.
        let acc = out.sfd().map(|_| reference::accumulators(&Problem::new(rows.len(), n, k), a_rows.data(), a_rows.scales(), b.data(), b.scales(), Accumulation::Exact)).transpose()?;
        let st = acc.as_ref().map_or(1.0, |acc| 6.0 * 448.0 / acc.iter().fold(1e-30f32, |x, v| x.max(v.abs())));
        let p = Problem::new(m, n, k).norm_constant(st);
        let config = match &cli.config {
            Some(c) => Config::from_name(c).ok_or("unknown --config")?,
            None => gemm.select_config(&p, out)?,
        };
        let split = cli.split_k.unwrap_or_else(|| blockscaled_gemm::config_split_k(config, &p, gemm.device().sm_count, &gemm.device().max_clusters));
        let set_bytes = p.a_bytes() + p.b_bytes() + p.sfa_bytes() + p.sfb_bytes();
        let sets = (2 * l2 / set_bytes + 1).max(2);
        let mut bufs = Vec::new();
        for _ in 0..sets {
            bufs.push((stream.clone_htod(a.data())?, stream.clone_htod(a.scales())?, stream.clone_htod(b.data())?, stream.clone_htod(b.scales())?));
        }
        // D as bytes: f16 elements, or packed e2m1 plus the scale factors.
        let d_bytes = if out.sfd().is_some() { out.d_bytes(p.cd_elems()) } else { 2 * p.cd_elems() };
        let mut d: CudaSlice<u8> = stream.alloc_zeros(d_bytes)?;
        let mut sfd: CudaSlice<u8> = stream.alloc_zeros(p.sfd_bytes())?;
        let launch = |i: usize, d: &mut CudaSlice<u8>, sfd: &mut CudaSlice<u8>| -> Result<(), blockscaled_gemm::Error> {
            let (av, asf, bv, bsf) = &bufs[i % sets];
            let (oa, ob) = (Nvfp4Operand::new(av, asf), Nvfp4Operand::new(bv, bsf));
            if out.sfd().is_some() {
                gemm.gemm_fp4(&p, out, oa, ob, Nvfp4Output::new(d, sfd), Some(config)).map(|_| ())
            } else {
                // SAFETY: every 2-byte pattern is an f16, and the buffer holds 2 * L*M*N bytes.
                let mut dh = unsafe { d.transmute_mut::<f16>(p.cd_elems()) }.expect("2 bytes per f16");
                gemm.gemm(&p, oa, ob, &mut dh, Some(config)).map(|_| ())
            }
        };
        for i in 0..10 {
            launch(i, &mut d, &mut sfd)?;
        }
        let event = || stream.record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT));
        let mut events = Vec::with_capacity(cli.runs);
        for i in 0..cli.runs {
            poison(&stream, &mut d)?;
            poison(&stream, &mut sfd)?;
            let start = event()?;
            launch(i, &mut d, &mut sfd)?;
            let end = event()?;
            events.push((start, end));
        }
        stream.synchronize()?;
        let mut us: Vec<f64> = events.iter().map(|(s, e)| s.elapsed_ms(e).map(|ms| ms as f64 * 1e3)).collect::<Result<_, _>>()?;
        us.sort_by(|x, y| x.partial_cmp(y).unwrap());
        let median = us[us.len() / 2];
        // The last run's output, checked on the sampled rows against the exact reference.
        let got = stream.clone_dtoh(&d)?;
        // Back to back (after the output above was fetched: these launches are not poisoned).
        let start = event()?;
        for i in 0..cli.runs {
            launch(i, &mut d, &mut sfd)?;
        }
        let end = event()?;
        end.synchronize()?;
        let b2b = start.elapsed_ms(&end)? as f64 * 1e3 / cli.runs as f64;
        let passed = match out.sfd() {
            Some(format) => {
                let pr = Problem::new(rows.len(), n, k).norm_constant(st);
                let (want_d, want_sfd) = fp4_out::epilogue(&pr, acc.as_deref().expect("computed for FP4"), None, format);
                let got_sfd = from_tiled(&stream.clone_dtoh(&sfd)?, m, n / 16, 1);
                let got_d: Vec<u8> = rows.iter().flat_map(|&r| got[r * n / 2..][..n / 2].iter().copied()).collect();
                let got_sf: Vec<u8> = rows.iter().flat_map(|&r| got_sfd[r * n / 16..][..n / 16].iter().copied()).collect();
                let cmp = compare_fp4(&got_d, &got_sf, &want_d, &from_tiled(&want_sfd, rows.len(), n / 16, 1), n);
                if !cmp.byte_equal() {
                    eprintln!("{m}x{n}x{k}: verification failed: {cmp}");
                }
                cmp.byte_equal()
            }
            None => {
                let want: Vec<f16> = reference_gemm(&a_rows, &b, 1.0, 0.0, None)?;
                let got_rows: Vec<f16> = rows.iter().flat_map(|&r| got[r * n * 2..][..n * 2].chunks_exact(2).map(|x| f16::from_le_bytes([x[0], x[1]]))).collect();
                let cmp = compare(&got_rows, &want, 0.0, 0.0);
                if !cmp.passed() {
                    eprintln!("{m}x{n}x{k}: verification failed: {cmp}");
                }
                cmp.passed()
            }
        };
        let bytes = (set_bytes + d_bytes + if out.sfd().is_some() { p.sfd_bytes() } else { 0 }) as f64;
        let floor = (bytes / 3.0e12).max(p.flops() / 800e12) * 1e6;
        let (bf16, fp8, src) = match baselines.as_ref().and_then(|b| b.iter().find(|x| x.0 == (m, n, k)).map(|x| (x.1, x.2))) {
            Some((x, y)) => (x, y, "measured"),
            None => SPEC_BASELINES.iter().find(|x| x.0 == (m, n, k)).map_or((f64::NAN, f64::NAN, "none"), |x| (x.1, x.2, "SPEC.md")),
        };
        let shape = format!("{m}x{n}x{k}");
        let check = if passed { "exact" } else { "FAILED" };
        println!("{shape:>16} {:>24} {split:>5} {median:>10.2} {b2b:>8.2} {:>8.1} {:>8.0} {floor:>9.2} {:>7.2} {bf16:>11.1} {fp8:>10.1} {check:>8}{}", config.to_string(), p.flops() / median / 1e6, bytes / median / 1e3, median / floor, if src == "measured" { "" } else { " (cuBLAS: SPEC.md)" });
        json += &format!("{{\"shape\":\"{shape}\",\"device\":\"{name}\",\"config\":\"{config}\",\"split_k\":{split},\"out\":\"{out}\",\"runs\":{},\"median_us\":{median:.3},\"b2b_us\":{b2b:.3},\"min_us\":{:.3},\"tflops\":{:.2},\"gbps\":{:.1},\"floor_us\":{floor:.3},\"x_floor\":{:.3},\"cublas_bf16_us\":{bf16},\"cublas_fp8_us\":{fp8},\"cublas_source\":\"{src}\",\"check\":\"{check}\"}}\n",
            cli.runs, us[0], p.flops() / median / 1e6, bytes / median / 1e3, median / floor);
    }
    if let Some(path) = &cli.json {
        std::fs::write(path, json)?;
    }
    Ok(())
}

fn poison(stream: &std::sync::Arc<cudarc::driver::CudaStream>, d: &mut CudaSlice<u8>) -> Result<(), cudarc::driver::DriverError> {
    let bytes = d.len();
    let (ptr, _guard) = d.device_ptr_mut(stream);
    // SAFETY: ptr is a live allocation of `bytes` bytes, ordered on this stream by the guard.
    unsafe { cudarc::driver::result::memset_d8_async(ptr, 0xFF, bytes, stream.cu_stream()) }
}

/// Minimal reader for the baselines file: lines of `"MxNxK": {"bf16_us": x, "fp8_us": y}`.
fn parse_baselines(s: &str) -> Vec<((usize, usize, usize), f64, f64)> {
    let num = |t: &str, key: &str| -> Option<f64> {
        let i = t.find(key)? + key.len();
        let rest = t[i..].trim_start_matches(|c: char| c == '"' || c == ':' || c.is_whitespace());
        rest.split([',', '}']).next()?.trim().parse().ok()
    };
    s.split("\"").collect::<Vec<_>>().windows(2).filter_map(|w| {
        let dims: Vec<usize> = w[0].split('x').filter_map(|x| x.parse().ok()).collect();
        if dims.len() != 3 || !w[1].trim_start().starts_with(':') {
            return None;
        }
        let tail = &s[s.find(&format!("\"{}\"", w[0]))?..];
        let entry = &tail[..tail.find('}')? + 1];
        Some(((dims[0], dims[1], dims[2]), num(entry, "bf16_us")?, num(entry, "fp8_us")?))
    }).collect()
}
