//! GPU integration tests, with their own harness (`harness = false`) so that a test without a
//! suitable device is counted as skipped, with its reason, never as passed.
#![allow(clippy::too_many_arguments, clippy::type_complexity)]
use blockscaled_gemm::compare::compare;
use blockscaled_gemm::{reference_gemm, BlockScaledGemm, Config, Error, Nvfp4Matrix, Nvfp4Operand, OutType, OutputElement, Problem};
use cudarc::driver::CudaContext;
use half::{bf16, f16};
use std::sync::Arc;

/// A test's outcome when it does not panic: ran, or skipped for a reason.
type Outcome = Result<(), String>;

/// The device's GEMM, or the reason there is none.
fn device() -> Result<BlockScaledGemm, String> {
    if !BlockScaledGemm::driver_present() {
        return Err("no NVIDIA driver (libcuda not found)".into());
    }
    match CudaContext::device_count() {
        Ok(n) if n > 0 => {}
        other => return Err(format!("no CUDA device ({other:?})")),
    }
    let stream = CudaContext::new(0).expect("context on device 0").default_stream();
    Ok(BlockScaledGemm::new(stream).expect("BlockScaledGemm on device 0"))
}

fn main() {
    let tests: &[(&str, fn() -> Outcome)] = &[
        ("sm100_every_config_against_the_reference", sm100_every_config_against_the_reference),
        ("wrong_architecture_is_refused_and_nothing_is_written", wrong_architecture_is_refused_and_nothing_is_written),
        ("device_buffer_errors_are_typed", device_buffer_errors_are_typed),
        ("sm90_every_config_and_output", sm90_every_config_and_output),
        ("sm90_split_k_values_and_determinism", sm90_split_k_values_and_determinism),
        ("sm90_extreme_scales", sm90_extreme_scales),
        ("sm90_contest_and_benchmark_shapes", sm90_contest_and_benchmark_shapes),
        ("sm90_workspace_reuse_across_shapes", sm90_workspace_reuse_across_shapes),
    ];
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    for (name, f) in tests {
        if !filter.is_empty() && !filter.iter().any(|x| name.contains(x.as_str())) {
            continue;
        }
        match std::panic::catch_unwind(f) {
            Ok(Ok(())) => { passed += 1; println!("test {name} ... ok"); }
            Ok(Err(why)) => { skipped += 1; println!("test {name} ... SKIPPED: {why}"); }
            Err(_) => { failed += 1; println!("test {name} ... FAILED"); }
        }
    }
    println!("gpu: {passed} passed, {failed} failed, {skipped} skipped");
    if failed > 0 {
        std::process::exit(1);
    }
}

fn upload(g: &BlockScaledGemm, m: &Nvfp4Matrix) -> (cudarc::driver::CudaSlice<u8>, cudarc::driver::CudaSlice<u8>) {
    let s = g.stream();
    (s.clone_htod(m.data()).unwrap(), s.clone_htod(m.scales()).unwrap())
}

/// Runs one problem on the device with a NaN-poisoned D and checks every element against the
/// reference. Contest data sums exactly in FP32, so tolerances are the contest's 1e-3.
fn check<T: OutputElement + cudarc::driver::DeviceRepr>(g: &BlockScaledGemm, m: usize, n: usize, k: usize, l: usize, alpha: f32, beta: f32, config: Option<Config>, seed: u64) {
    let a = Nvfp4Matrix::random_contest(m, k, l, seed).unwrap();
    let b = Nvfp4Matrix::random_contest(n, k, l, seed + 1).unwrap();
    let c: Vec<T> = (0..l * m * n).map(|i| T::from_f64(((i * 7919) % 17) as f64 - 8.0)).collect();
    let s = g.stream();
    let (av, asf) = upload(g, &a);
    let (bv, bsf) = upload(g, &b);
    let mut d = s.clone_htod(&vec![T::from_f64(f64::NAN); l * m * n]).unwrap();
    let p = Problem::new(m, n, k).batch(l).scalars(alpha, beta);
    let ran = if beta != 0.0 {
        let cd = s.clone_htod(&c).unwrap();
        g.gemm_with_c(&p, Nvfp4Operand::new(&av, &asf), Nvfp4Operand::new(&bv, &bsf), &cd, &mut d, config).unwrap()
    } else {
        g.gemm(&p, Nvfp4Operand::new(&av, &asf), Nvfp4Operand::new(&bv, &bsf), &mut d, config).unwrap()
    };
    let got = s.clone_dtoh(&d).unwrap();
    let want: Vec<T> = reference_gemm(&a, &b, alpha, beta, (beta != 0.0).then_some(&c[..])).unwrap();
    let cmp = compare(&got, &want, 1e-3, 1e-3);
    assert!(cmp.passed(), "{ran} {m}x{n}x{k}x{l}: {cmp}");
}

/// Seed of this run's data: fresh each run (printed), or BSG_TEST_SEED to repeat one.
fn seed() -> u64 {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SEED.get_or_init(|| {
        let s = std::env::var("BSG_TEST_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
        });
        println!("data seed: {s} (set BSG_TEST_SEED={s} to repeat)");
        s
    })
}

fn hopper() -> Result<BlockScaledGemm, String> {
    let g = device()?;
    if g.device().compute_capability != (9, 0) {
        return Err(format!("device is {:?}, the SM90 kernels need compute capability 9.0", g.device().compute_capability));
    }
    Ok(g)
}

/// The same matrix with every value's sign cleared: its products sum to sum |a * b|.
fn abs_values(m: &Nvfp4Matrix) -> Nvfp4Matrix {
    let data = m.data().iter().map(|b| b & 0x77).collect();
    Nvfp4Matrix::from_parts(m.rows(), m.k(), m.batch(), data, m.scales().to_vec(), None).unwrap()
}

/// Checks `got` against the exact `want` within what FP32 accumulation and the epilogue may
/// round: 2 K u |alpha| S + 2 u (|alpha| S + |beta c|) + one ulp of the output type, with
/// S = sum |a b| (exact) and u = 2^-24. A wrong index or a lost term errs by O(S).
#[allow(clippy::too_many_arguments)]
fn check_accumulation_bound<T: OutputElement>(got: &[T], want: &[T], a: &Nvfp4Matrix, b: &Nvfp4Matrix, alpha: f32, beta: f32, c: &[T], what: &str) {
    let s: Vec<f32> = reference_gemm(&abs_values(a), &abs_values(b), 1.0, 0.0, None).unwrap();
    let u = 2f64.powi(-24);
    let ulp = match T::OUT { OutType::F16 => 2f64.powi(-10), OutType::Bf16 => 2f64.powi(-7), OutType::F32 => 2f64.powi(-23) };
    let k = a.k() as f64;
    let mut bad = 0;
    let mut worst = (0.0f64, 0usize);
    for i in 0..got.len() {
        let (g, w) = (got[i].to_f64(), want[i].to_f64());
        if g == w {
            continue;
        }
        let sa = alpha.abs() as f64 * s[i] as f64;
        let bound = 2.0 * k * u * sa + 2.0 * u * (sa + (beta as f64 * c[i].to_f64()).abs()) + ulp * w.abs().max(g.abs());
        let over_max = T::OUT != OutType::F32 && g.is_infinite() && w.abs() >= 65504.0 && g.signum() == w.signum();
        let err = (g - w).abs();
        // Negated on purpose: a NaN error must count as a failure.
        #[allow(clippy::neg_cmp_op_on_partial_ord)]
        let within = err <= bound || over_max;
        if !within {
            bad += 1;
            let ratio = err / bound;
            if ratio.is_nan() || ratio > worst.0 {
                worst = (ratio, i);
            }
        }
    }
    let i = worst.1;
    assert!(bad == 0, "{what}: {bad} of {} beyond the FP32 accumulation bound; worst at {i}: got {:?}, want {:?}, sum|ab| {}", got.len(), got[i], want[i], s[i]);
}

/// One problem through a given config and split, output poisoned with NaN first, every element
/// compared with the exact reference: bit for bit when `exact` (contest data, power-of-two
/// alpha and beta, integer C: every FP32 partial sum is exact), else within the FP32
/// accumulation bound of `check_accumulation_bound`.
#[allow(clippy::too_many_arguments)]
fn run_sm90<T: OutputElement + cudarc::driver::DeviceRepr>(g: &BlockScaledGemm, a: &Nvfp4Matrix, b: &Nvfp4Matrix, alpha: f32, beta: f32, config: Config, exact: bool) -> Vec<T> {
    let (m, n, k, l) = (a.rows(), b.rows(), a.k(), a.batch());
    let s = g.stream();
    let mut rng = blockscaled_gemm::SplitMix64::new(seed() ^ 0xC);
    let c: Vec<T> = (0..l * m * n).map(|_| T::from_f64(rng.below(17) as f64 - 8.0)).collect();
    let (av, asf) = upload(g, a);
    let (bv, bsf) = upload(g, b);
    let mut d = s.clone_htod(&vec![T::from_f64(f64::NAN); l * m * n]).unwrap();
    let p = Problem::new(m, n, k).batch(l).scalars(alpha, beta);
    let ran = if beta != 0.0 {
        let cd = s.clone_htod(&c).unwrap();
        g.gemm_with_c(&p, Nvfp4Operand::new(&av, &asf), Nvfp4Operand::new(&bv, &bsf), &cd, &mut d, Some(config)).unwrap()
    } else {
        g.gemm(&p, Nvfp4Operand::new(&av, &asf), Nvfp4Operand::new(&bv, &bsf), &mut d, Some(config)).unwrap()
    };
    let got = s.clone_dtoh(&d).unwrap();
    let want: Vec<T> = reference_gemm(a, b, alpha, beta, (beta != 0.0).then_some(&c[..])).unwrap();
    let what = format!("{ran} {m}x{n}x{k}x{l} alpha={alpha} beta={beta} {:?}", T::OUT);
    if exact {
        let cmp = compare(&got, &want, 0.0, 0.0);
        assert!(cmp.passed(), "{what}: {cmp}");
    } else {
        assert!(got.iter().all(|x| !x.to_f64().is_nan()) || want.iter().any(|x| x.to_f64().is_nan()), "{what}: NaN in the output");
        check_accumulation_bound(&got, &want, a, b, alpha, beta, &c, &what);
    }
    got
}

fn contest(m: usize, n: usize, k: usize, l: usize, salt: u64) -> (Nvfp4Matrix, Nvfp4Matrix) {
    (Nvfp4Matrix::random_contest(m, k, l, seed() ^ salt).unwrap(), Nvfp4Matrix::random_contest(n, k, l, seed() ^ salt ^ 0xB).unwrap())
}

fn sm90_every_config_and_output() -> Outcome {
    let g = hopper()?;
    for (i, c) in Config::ALL.iter().copied().filter(|c| c.info().arch == 90).enumerate() {
        // M and N not multiples of the tile, L = 2, K not a multiple of the 64 K tile.
        let (a, b) = contest(200, 136, 224, 2, 10 + i as u64);
        run_sm90::<f16>(&g, &a, &b, 1.0, 0.0, c, true);
        run_sm90::<bf16>(&g, &a, &b, 0.5, 2.0, c, true);
        run_sm90::<f32>(&g, &a, &b, 0.75, -1.5, c, false);
        let (a, b) = (Nvfp4Matrix::random_realistic(130, 512, 1, seed() ^ 20).unwrap(), Nvfp4Matrix::random_realistic(264, 512, 1, seed() ^ 21).unwrap());
        run_sm90::<f32>(&g, &a, &b, 1.0, 0.0, c, false);
    }
    Ok(())
}

fn sm90_split_k_values_and_determinism() -> Outcome {
    let base = hopper()?;
    let (a, b) = contest(128, 512, 2048, 1, 30);
    let (ar, br) = (Nvfp4Matrix::random_realistic(128, 2048, 1, seed() ^ 31).unwrap(), Nvfp4Matrix::random_realistic(512, 2048, 1, seed() ^ 32).unwrap());
    for split in [1u32, 2, 3, 7, 32] {
        let g = BlockScaledGemm::new(base.stream().clone()).unwrap().with_split_k(Some(split));
        for c in [Config::Sm90_128x128x64, Config::Sm90_128x64x64, Config::Sm90_128x256x64] {
            run_sm90::<f16>(&g, &a, &b, 1.0, 0.0, c, true);
            let first = run_sm90::<f32>(&g, &ar, &br, 1.0, 0.0, c, false);
            let again = run_sm90::<f32>(&g, &ar, &br, 1.0, 0.0, c, false);
            assert!(first.iter().zip(&again).all(|(x, y)| x.to_bits() == y.to_bits()), "{c} split {split}: two runs differ");
        }
    }
    let g = BlockScaledGemm::new(base.stream().clone()).unwrap().with_split_k(Some(33));
    let (av, asf) = upload(&g, &a);
    let mut d = g.stream().alloc_zeros::<f16>(128 * 512).unwrap();
    let e = g.gemm(&Problem::new(128, 512, 2048), Nvfp4Operand::new(&av, &asf), Nvfp4Operand::new(&av, &asf), &mut d, Some(Config::Sm90_128x128x64));
    assert!(e.is_err(), "split_k 33 > 32 k-tiles must be refused");
    Ok(())
}

fn sm90_extreme_scales() -> Outcome {
    let g = hopper()?;
    // Values and scales at the format's ends: codes +-6 and random, scales 0, 448 and 2^-9.
    let (m, n, k) = (136, 72, 512);
    let mk = |rows: usize, salt: u64| {
        let mut rng = blockscaled_gemm::SplitMix64::new(seed() ^ salt);
        let data: Vec<u8> = (0..rows * k / 2).map(|_| if rng.below(4) == 0 { 0x77 } else { rng.next_u64() as u8 }).collect();
        let sf: Vec<u8> = (0..rows * k / 16).map(|_| [0x00, 0x7E, 0x01, 0x38][rng.below(4) as usize]).collect();
        Nvfp4Matrix::from_parts(rows, k, 1, data, blockscaled_gemm::layout::to_tiled(&sf, rows, k / 16, 1), None).unwrap()
    };
    let (a, b) = (mk(m, 40), mk(n, 41));
    for c in Config::ALL.iter().copied().filter(|c| c.info().arch == 90) {
        run_sm90::<f32>(&g, &a, &b, 1.0, 0.0, c, false);
        run_sm90::<f16>(&g, &a, &b, 1.0, 0.0, c, false); // overflows to inf in both
    }
    Ok(())
}

fn sm90_contest_and_benchmark_shapes() -> Outcome {
    let g = hopper()?;
    let shapes = [(128, 256, 256), (128, 1536, 7168), (128, 3072, 1536), (256, 7168, 256), (256, 7168, 2048), (2304, 4608, 7168), (384, 7168, 2304), (512, 512, 7168), (512, 4096, 512), (512, 1536, 7168), (128, 7168, 16384), (128, 4096, 7168), (128, 7168, 2048)];
    for (i, &(m, n, k)) in shapes.iter().enumerate() {
        let (a, b) = contest(m, n, k, 1, 100 + i as u64);
        let p = Problem::new(m, n, k);
        let c = g.select_config(&p, OutType::F16).unwrap();
        println!("  {m}x{n}x{k}: {c}, split_k {}", blockscaled_gemm::config_split_k(c, &p, g.device().sm_count));
        run_sm90::<f16>(&g, &a, &b, 1.0, 0.0, c, true);
    }
    Ok(())
}

/// One GEMM object (one workspace), shapes in an order where a later split-K problem has more
/// output tiles than an earlier one yet needs less workspace, so its per-tile counters lie where
/// the earlier partials were: 128x1152x16384 (9 tiles x 16 splits, 9.4 MB), then 128x8320x512
/// (65 tiles x 2 splits, 8.5 MB; counters over bytes 0..512).
fn sm90_workspace_reuse_across_shapes() -> Outcome {
    let g = hopper()?;
    let c = Config::Sm90_128x128x64;
    for (i, (m, n, k, split)) in [(128, 1152, 16384, 16), (128, 8320, 512, 2), (128, 1152, 16384, 16), (128, 8320, 512, 2)].into_iter().enumerate() {
        let p = Problem::new(m, n, k);
        assert_eq!(blockscaled_gemm::config_split_k(c, &p, g.device().sm_count), split, "{m}x{n}x{k}: the heuristic changed; pick shapes again");
        let (a, b) = contest(m, n, k, 1, 60 + i as u64);
        run_sm90::<f16>(&g, &a, &b, 1.0, 0.0, c, true);
    }
    Ok(())
}

fn sm100_every_config_against_the_reference() -> Outcome {
    let g = device()?;
    if g.device().compute_capability != (10, 0) {
        return Err(format!("device is {:?}, the SM100 kernels need compute capability 10.0", g.device().compute_capability));
    }
    for c in Config::ALL.iter().copied().filter(|c| c.info().arch == 100) {
        check::<f16>(&g, 256, 512, 512, 1, 1.0, 0.0, Some(c), 1);
        check::<bf16>(&g, 130, 264, 256, 2, 0.5, 1.5, Some(c), 2);
    }
    for (i, &(m, n, k)) in [(128, 256, 256), (128, 1536, 7168), (128, 3072, 1536), (256, 7168, 256), (256, 7168, 2048), (2304, 4608, 7168), (384, 7168, 2304), (512, 512, 7168), (512, 4096, 512), (512, 1536, 7168)].iter().enumerate() {
        check::<f16>(&g, m, n, k, 1, 1.0, 0.0, None, 10 + i as u64);
    }
    Ok(())
}

fn wrong_architecture_is_refused_and_nothing_is_written() -> Outcome {
    let g = device()?;
    let cc = g.device().compute_capability;
    let (m, n, k) = (128, 128, 256);
    let a = Nvfp4Matrix::random_contest(m, k, 1, 3).unwrap();
    let (av, asf) = upload(&g, &a);
    let s = g.stream().clone();
    let poison = vec![f16::from_f32(-7.0); m * n];
    let mut d = s.clone_htod(&poison).unwrap();
    let p = Problem::new(m, n, k);
    for c in Config::ALL.iter().copied().filter(|c| c.compute_capability() != cc) {
        let e = g.gemm(&p, Nvfp4Operand::new(&av, &asf), Nvfp4Operand::new(&av, &asf), &mut d, Some(c)).unwrap_err();
        assert!(matches!(e, Error::ArchMismatch { .. }), "{c}: {e}");
        println!("{c} on {cc:?}: {e}");
    }
    if g.device().arch().is_none() {
        let e = g.gemm(&p, Nvfp4Operand::new(&av, &asf), Nvfp4Operand::new(&av, &asf), &mut d, None).unwrap_err();
        assert!(matches!(e, Error::UnsupportedDevice { .. }), "{e}");
        println!("automatic choice on {cc:?}: {e}");
    }
    s.synchronize().unwrap();
    assert_eq!(s.clone_dtoh(&d).unwrap(), poison, "a refused launch must not write D");
    Ok(())
}

fn device_buffer_errors_are_typed() -> Outcome {
    let g = device()?;
    let s: Arc<_> = g.stream().clone();
    let p = Problem::new(128, 128, 256);
    let a = s.alloc_zeros::<u8>(p.a_bytes()).unwrap();
    let sf = s.alloc_zeros::<u8>(p.sfa_bytes()).unwrap();
    let short = s.alloc_zeros::<u8>(p.sfa_bytes() - 1).unwrap();
    let mut d = s.alloc_zeros::<f32>(p.cd_elems()).unwrap();
    let e = g.gemm(&p, Nvfp4Operand::new(&a, &short), Nvfp4Operand::new(&a, &sf), &mut d, None).unwrap_err();
    assert!(e.to_string().starts_with("SFA: holds"), "{e}");
    // A view one byte in: misaligned, and refused before any launch (when the arch runs at all).
    let big = s.alloc_zeros::<u8>(p.a_bytes() + 1).unwrap();
    let view = big.slice(1..);
    match g.gemm(&p, Nvfp4Operand::new(&view, &sf), Nvfp4Operand::new(&a, &sf), &mut d, None) {
        Err(Error::Misaligned { name: "A", .. }) | Err(Error::UnsupportedDevice { .. }) => {}
        other => panic!("expected a misalignment refusal, got {other:?}"),
    }
    assert_eq!(g.select_config(&p, OutType::F32).is_ok(), g.device().arch().is_some() && Config::ALL.iter().any(|c| c.is_built(OutType::F32) && c.compute_capability() == g.device().compute_capability));
    Ok(())
}
