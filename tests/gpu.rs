//! GPU integration tests, with their own harness (`harness = false`) so that a test without a
//! suitable device is counted as skipped, with its reason, never as passed.
#![allow(clippy::too_many_arguments, clippy::type_complexity)]
use blockscaled_gemm::compare::{compare, compare_fp4, verify_matrices};
use blockscaled_gemm::fp4_out::sfd_from_f32;
use blockscaled_gemm::reference::{self, Accumulation};
use blockscaled_gemm::{reference_gemm, BlockScaledGemm, Config, Error, Nvfp4Matrix, Nvfp4Operand, Nvfp4Output, OutType, OutputElement, Problem, Schedule};
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
        ("sm90_small_m_every_output", sm90_small_m_every_output),
        ("sm90_contest_and_benchmark_shapes", sm90_contest_and_benchmark_shapes),
        ("sm90_workspace_reuse_across_shapes", sm90_workspace_reuse_across_shapes),
        ("sm90_split_k_clusters_fit_in_one_wave", sm90_split_k_clusters_fit_in_one_wave),
        ("fp4_output_exact_data_byte_for_byte", fp4_output_exact_data_byte_for_byte),
        ("fp4_output_realistic_data_within_one_step", fp4_output_realistic_data_within_one_step),
        ("fp4_output_chains_into_the_next_gemm", fp4_output_chains_into_the_next_gemm),
        ("buffers_on_another_device_are_refused", buffers_on_another_device_are_refused),
        ("general_data_passes_the_verdict", general_data_passes_the_verdict),
        // Last: it turns cudarc's event tracking off for the buffers made after it.
        ("graph_capture_replays_with_new_data", graph_capture_replays_with_new_data),
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

/// One GEMM on the device, D poisoned with NaN first and C = `c` where beta != 0: the config that
/// ran and D.
#[allow(clippy::too_many_arguments)]
fn run_poisoned<T: OutputElement + cudarc::driver::DeviceRepr>(g: &BlockScaledGemm, a: &Nvfp4Matrix, b: &Nvfp4Matrix, alpha: f32, beta: f32, c: &[T], config: Option<Config>) -> (Config, Vec<T>) {
    let (m, n, k, l) = (a.rows(), b.rows(), a.k(), a.batch());
    let s = g.stream();
    let (av, asf) = upload(g, a);
    let (bv, bsf) = upload(g, b);
    let mut d = s.clone_htod(&vec![T::from_f64(f64::NAN); l * m * n]).unwrap();
    let p = Problem::new(m, n, k).batch(l).scalars(alpha, beta);
    let ran = if beta != 0.0 {
        let cd = s.clone_htod(c).unwrap();
        g.gemm_with_c(&p, Nvfp4Operand::new(&av, &asf), Nvfp4Operand::new(&bv, &bsf), &cd, &mut d, config).unwrap()
    } else {
        g.gemm(&p, Nvfp4Operand::new(&av, &asf), Nvfp4Operand::new(&bv, &bsf), &mut d, config).unwrap()
    };
    (ran, s.clone_dtoh(&d).unwrap())
}

/// Runs one problem on the device with a NaN-poisoned D and judges every element against the
/// exact reference by the verdict (contest data sums exactly in FP32: every element is exact).
fn check<T: OutputElement + cudarc::driver::DeviceRepr>(g: &BlockScaledGemm, m: usize, n: usize, k: usize, l: usize, alpha: f32, beta: f32, config: Option<Config>, seed: u64) {
    let a = Nvfp4Matrix::random_contest(m, k, l, seed).unwrap();
    let b = Nvfp4Matrix::random_contest(n, k, l, seed + 1).unwrap();
    let c: Vec<T> = (0..l * m * n).map(|i| T::from_f64(((i * 7919) % 17) as f64 - 8.0)).collect();
    let (ran, got) = run_poisoned(g, &a, &b, alpha, beta, &c, config);
    let v = verify_matrices(&a, &b, alpha, beta, (beta != 0.0).then_some(&c[..]), &got).unwrap();
    assert!(v.passed(), "{ran} {m}x{n}x{k}x{l}: {v}");
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

/// Judges `got` by the verification verdict (`blockscaled_gemm::compare`): each element equal to
/// the exact result rounded once, or within the rigorous FP32 summation bound and the output's
/// rounding. A wrong index or a lost term errs by far more.
#[allow(clippy::too_many_arguments)]
fn check_accumulation_bound<T: OutputElement>(got: &[T], a: &Nvfp4Matrix, b: &Nvfp4Matrix, alpha: f32, beta: f32, c: &[T], what: &str) {
    let v = verify_matrices(a, b, alpha, beta, (beta != 0.0).then_some(c), got).unwrap();
    assert!(v.passed(), "{what}: {v}");
}

/// One problem through a given config and split, output poisoned with NaN first, every element
/// compared with the exact reference: bit for bit when `exact` (contest data, power-of-two
/// alpha and beta, integer C: every FP32 partial sum is exact), else by the verdict of
/// `check_accumulation_bound`.
#[allow(clippy::too_many_arguments)]
fn run_sm90<T: OutputElement + cudarc::driver::DeviceRepr>(g: &BlockScaledGemm, a: &Nvfp4Matrix, b: &Nvfp4Matrix, alpha: f32, beta: f32, config: Config, exact: bool) -> Vec<T> {
    let (m, n, k, l) = (a.rows(), b.rows(), a.k(), a.batch());
    let mut rng = blockscaled_gemm::SplitMix64::new(seed() ^ 0xC);
    let c: Vec<T> = (0..l * m * n).map(|_| T::from_f64(rng.below(17) as f64 - 8.0)).collect();
    let (ran, got) = run_poisoned(g, a, b, alpha, beta, &c, Some(config));
    let want: Vec<T> = reference_gemm(a, b, alpha, beta, (beta != 0.0).then_some(&c[..])).unwrap();
    let what = format!("{ran} {m}x{n}x{k}x{l} alpha={alpha} beta={beta} {:?}", T::OUT);
    if exact {
        let cmp = compare(&got, &want, 0.0, 0.0);
        assert!(cmp.passed(), "{what}: {cmp}");
    } else {
        assert!(got.iter().all(|x| !x.to_f64().is_nan()) || want.iter().any(|x| x.to_f64().is_nan()), "{what}: NaN in the output");
        check_accumulation_bound(&got, a, b, alpha, beta, &c, &what);
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
        // 1 to 7 k-tiles of 64: fewer than the k-tiles decoded ahead, a raw stage (128 K) cut
        // short, ranges that end inside a raw stage.
        for k in [32, 64, 128, 192, 320, 448] {
            let (a, b) = contest(130, 264, k, 1, 50 + k as u64);
            run_sm90::<f16>(&g, &a, &b, 1.0, 0.0, c, true);
        }
    }
    Ok(())
}

fn sm90_split_k_values_and_determinism() -> Outcome {
    let base = hopper()?;
    let (a, b) = contest(128, 512, 2048, 1, 30);
    // Partial tiles in M and N, two batches, alpha and beta with C (splits 2, 3, 4 and 7 of the
    // swapped configs go through the cluster's shared memory, 32 and the other tiles' through
    // the workspace).
    let (ae, be) = contest(130, 264, 2048, 2, 33);
    let (ar, br) = (Nvfp4Matrix::random_realistic(128, 2048, 1, seed() ^ 31).unwrap(), Nvfp4Matrix::random_realistic(512, 2048, 1, seed() ^ 32).unwrap());
    for split in [1u32, 2, 3, 4, 7, 32] {
        let g = BlockScaledGemm::new(base.stream().clone()).unwrap().with_split_k(Some(split));
        for c in Config::ALL.iter().copied().filter(|c| c.info().arch == 90) {
            run_sm90::<f16>(&g, &a, &b, 1.0, 0.0, c, true);
            run_sm90::<bf16>(&g, &ae, &be, 0.5, 1.5, c, true);
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

/// The small-M family (issue 23): every token count named there, L = 2, every output type, through
/// the rule's choice and through each stream config forced (more rows than its tile: several M
/// tiles). N is not a multiple of the 128-row weight tile and K's 17 k-tiles end inside a raw
/// stage. Contest data: 16- and 32-bit outputs bit for bit, also with alpha, beta and C; FP4
/// outputs byte for byte.
fn sm90_small_m_every_output() -> Outcome {
    let g = hopper()?;
    let (n, k, l) = (352, 1088, 2);
    let streams: Vec<Config> = Config::ALL.iter().copied().filter(|c| c.info().schedule == Schedule::StreamWeights && c.is_built(OutType::F16)).collect();
    assert!(!streams.is_empty(), "no stream config in this build");
    let mut rng = blockscaled_gemm::SplitMix64::new(seed() ^ 0x5A);
    let mut runs = 0;
    for (i, m) in [1usize, 3, 16, 33, 64, 128, 200].into_iter().enumerate() {
        let (a, b) = contest(m, n, k, l, 90 + i as u64);
        let p = Problem::new(m, n, k).batch(l);
        let chosen = g.select_config(&p, OutType::F16).unwrap();
        let configs: Vec<Config> = std::iter::once(chosen).chain(streams.iter().copied().filter(|&c| c != chosen)).collect();
        let c32: Vec<f32> = (0..l * m * n).map(|_| rng.below(33) as f32 - 16.0).collect();
        // FP4 output with C, alpha, beta and a norm constant: D and SFD byte for byte.
        let fp4 = |g: &BlockScaledGemm, out: OutType, config: Config, split: &str| {
            let p = p.scalars(0.5, 0.25).norm_constant(96.0);
            let (ran, d, sfd) = run_fp4(g, &p, out, &a, &b, Some(&c32), Some(config));
            let (want_d, want_sfd) = reference::gemm_fp4(&p, a.data(), a.scales(), b.data(), b.scales(), Some(&c32), out.sfd().unwrap(), Accumulation::Exact).unwrap();
            assert!(d == want_d && sfd == want_sfd, "{ran} {out} split {split} {m}x{n}x{k}x{l}: FP4 output differs from the reference");
        };
        for config in configs {
            run_sm90::<f16>(&g, &a, &b, 1.0, 0.0, config, true);
            run_sm90::<bf16>(&g, &a, &b, 0.5, 2.0, config, true);
            run_sm90::<f32>(&g, &a, &b, -0.75, 0.5, config, true);
            for out in [OutType::Nvfp4, OutType::Nvfp4Ue8m0] {
                fp4(&g, out, config, "by rule");
            }
            runs += 5;
        }
        // Splits past a cluster's reach go through global memory: 12 K ranges.
        if m == 3 || m == 33 {
            let g12 = BlockScaledGemm::new(g.stream().clone()).unwrap().with_split_k(Some(12));
            for &config in &streams {
                run_sm90::<f16>(&g12, &a, &b, 1.0, 0.0, config, true);
                fp4(&g12, OutType::Nvfp4, config, "12");
                runs += 2;
            }
        }
    }
    // Decode shapes whose split clusters may not all fit at once (an H100 runs 30 clusters of 4;
    // 1x4096x7168 asks 32): the launch then sums in global memory at the same split.
    let d = g.device();
    for (i, (m, n, k)) in [(1usize, 4096usize, 7168usize), (16, 4096, 7168)].into_iter().enumerate() {
        let (a, b) = contest(m, n, k, 1, 120 + i as u64);
        let p = Problem::new(m, n, k);
        let c = g.select_config(&p, OutType::F16).unwrap();
        let s = blockscaled_gemm::config_split_k(c, &p, d.sm_count, &d.max_clusters);
        run_sm90::<f16>(&g, &a, &b, 1.0, 0.0, c, true);
        let path = if blockscaled_gemm::cluster_split(c, &p, s, &d.max_clusters) { "cluster" } else { "global" };
        println!("  {m}x{n}x{k}: {c} split {s}, {path} sum, exact");
        runs += 1;
    }
    println!("  {runs} small-M runs equal to the reference");
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
        println!("  {m}x{n}x{k}: {c}, split_k {}", blockscaled_gemm::config_split_k(c, &p, g.device().sm_count, &g.device().max_clusters));
        run_sm90::<f16>(&g, &a, &b, 1.0, 0.0, c, true);
    }
    Ok(())
}

/// The driver's count of clusters the device runs at once is plausible, and the heuristic keeps
/// every split-K cluster within it: the swapped tiles by a smaller split, the small-M tiles by the
/// global sum where clusters of their split would not fit (a second wave doubled the time).
fn sm90_split_k_clusters_fit_in_one_wave() -> Outcome {
    let g = hopper()?;
    let d = g.device();
    println!("  {} SMs; clusters of 2 to {} at once: {:?}", d.sm_count, blockscaled_gemm::SM90_MAX_CLUSTER_SPLIT, d.max_clusters);
    assert_ne!(d.max_clusters, blockscaled_gemm::ANY_CLUSTERS, "the driver did not answer");
    for (i, &n) in d.max_clusters.iter().enumerate() {
        assert!(n >= 1 && n * (i + 2) <= d.sm_count, "{n} clusters of {}", i + 2);
    }
    for (m, n, k) in [(1, 4096, 7168), (1, 7168, 16384), (64, 4096, 7168), (128, 7168, 16384), (128, 8192, 16384), (1024, 1024, 8192), (256, 7168, 7168), (128, 16384, 4096), (128, 4096, 7168), (128, 4096, 16384), (128, 2048, 7168), (512, 1536, 7168)] {
        let p = Problem::new(m, n, k);
        for c in Config::ALL.iter().copied().filter(|c| c.info().cluster_reduces()) {
            let s = blockscaled_gemm::config_split_k(c, &p, d.sm_count, &d.max_clusters);
            let tiles = c.tiles(&p);
            // The swapped rule lowers the split until its clusters fit; the small-M rule keeps it
            // and sums in global memory instead.
            let fits = blockscaled_gemm::cluster_reduced(c, s) && tiles <= d.max_clusters[s as usize - 2];
            assert!(!blockscaled_gemm::cluster_reduced(c, s) || !c.info().swapped() || fits, "{m}x{n}x{k} {c}: {tiles} clusters of {s}");
            print!("  {m}x{n}x{k}: {c} split {s};");
        }
        println!(" chosen {}", g.select_config(&p, OutType::F16).unwrap());
    }
    Ok(())
}

/// One GEMM object (one workspace), shapes in an order where a later split-K problem has more
/// output tiles than an earlier one yet needs less workspace, so its per-tile counters lie where
/// the earlier partials were: 128x1408x16384 (11 tiles x 12 splits, 8.65 MB), then 128x8320x512
/// (65 tiles x 2 splits, 8.52 MB; counters over bytes 0..512). Between them the 128x256 tile
/// writes its pre-decoded activations into the same workspace (128 KB, no reallocation), which
/// must leave the counters zero.
fn sm90_workspace_reuse_across_shapes() -> Outcome {
    let g = hopper()?;
    let c = Config::Sm90_128x128x64;
    for (i, (m, n, k, split)) in [(128, 1408, 16384, 12), (128, 8320, 512, 2), (128, 1408, 16384, 12), (128, 8320, 512, 2)].into_iter().enumerate() {
        let p = Problem::new(m, n, k);
        assert_eq!(blockscaled_gemm::config_split_k(c, &p, g.device().sm_count, &g.device().max_clusters), split, "{m}x{n}x{k}: the heuristic changed; pick shapes again");
        let (a, b) = contest(m, n, k, 1, 60 + i as u64);
        run_sm90::<f16>(&g, &a, &b, 1.0, 0.0, c, true);
        let (a, b) = contest(128, 1024, 512, 1, 70 + i as u64);
        run_sm90::<f16>(&g, &a, &b, 1.0, 0.0, Config::Sm90_128x256x64, true);
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

/// The GEMM for FP4-output tests: any device whose architecture has FP4-output kernels built.
fn fp4_device() -> Result<BlockScaledGemm, String> {
    let g = device()?;
    let cc = g.device().compute_capability;
    if !Config::ALL.iter().any(|c| c.compute_capability() == cc && c.is_built(OutType::Nvfp4)) {
        return Err(format!("no FP4-output kernel in this build runs on compute capability {cc:?}"));
    }
    Ok(g)
}

/// One FP4-output GEMM on the device, D poisoned with 0xEE and SFD with NaN (0x7F) bytes first.
/// Returns the config that ran, D and SFD.
fn run_fp4(g: &BlockScaledGemm, p: &Problem, out: OutType, a: &Nvfp4Matrix, b: &Nvfp4Matrix, c: Option<&[f32]>, config: Option<Config>) -> (Config, Vec<u8>, Vec<u8>) {
    let s = g.stream();
    let (av, asf) = upload(g, a);
    let (bv, bsf) = upload(g, b);
    let mut d = s.clone_htod(&vec![0xEEu8; p.cd_elems() / 2]).unwrap();
    let mut sfd = s.clone_htod(&vec![0x7Fu8; p.sfd_bytes()]).unwrap();
    let (aa, bb) = (Nvfp4Operand::new(&av, &asf), Nvfp4Operand::new(&bv, &bsf));
    let ran = match c {
        Some(c) => {
            let cd = s.clone_htod(c).unwrap();
            g.gemm_fp4_with_c(p, out, aa, bb, &cd, Nvfp4Output::new(&mut d, &mut sfd), config).unwrap()
        }
        None => g.gemm_fp4(p, out, aa, bb, Nvfp4Output::new(&mut d, &mut sfd), config).unwrap(),
    };
    (ran, s.clone_dtoh(&d).unwrap(), s.clone_dtoh(&sfd).unwrap())
}

/// Issue 6: contest data (every FP32 partial sum exact in any order), every FP4-output config
/// and both scale-factor formats, split-K too: D and SFD equal the reference byte for byte.
fn fp4_output_exact_data_byte_for_byte() -> Outcome {
    let base = fp4_device()?;
    let cc = base.device().compute_capability;
    let configs: Vec<Config> = Config::ALL.iter().copied().filter(|c| c.compute_capability() == cc && c.is_built(OutType::Nvfp4)).collect();
    let mut rng = blockscaled_gemm::SplitMix64::new(seed() ^ 0xF4);
    let mut checked = 0;
    for (i, &config) in configs.iter().enumerate() {
        for (j, out) in [OutType::Nvfp4, OutType::Nvfp4Ue8m0].into_iter().enumerate() {
            // M and N not multiples of any tile, L = 2, K not a multiple of the K tile.
            let (m, n, k, l) = (200, 160, 224, 2);
            let (a, b) = contest(m, n, k, l, 70 + (i * 2 + j) as u64);
            let c: Vec<f32> = (0..l * m * n).map(|_| rng.below(33) as f32 - 16.0).collect();
            let splits: &[Option<u32>] = if config.info().arch == 90 { &[None, Some(3)] } else { &[None] };
            for &split in splits {
                let g = BlockScaledGemm::new(base.stream().clone()).unwrap().with_split_k(split);
                for (alpha, beta, st) in [(1.0f32, 0.0f32, 1.0f32), (0.5, 2.0, 2688.0), (-0.25, 0.5, 6.0)] {
                    let p = Problem::new(m, n, k).batch(l).scalars(alpha, beta).norm_constant(st);
                    let c = (beta != 0.0).then_some(&c[..]);
                    let (ran, d, sfd) = run_fp4(&g, &p, out, &a, &b, c, Some(config));
                    let (want_d, want_sfd) = reference::gemm_fp4(&p, a.data(), a.scales(), b.data(), b.scales(), c, out.sfd().unwrap(), Accumulation::Exact).unwrap();
                    let bad_sfd = sfd.iter().zip(&want_sfd).filter(|(x, y)| x != y).count();
                    let bad_d = d.iter().zip(&want_d).filter(|(x, y)| x != y).count();
                    assert!(bad_sfd == 0 && bad_d == 0, "{ran} {out} split {split:?} {p:?}: {bad_sfd} of {} SFD bytes and {bad_d} of {} D bytes differ", sfd.len(), d.len());
                    checked += 1;
                }
            }
        }
    }
    println!("  {checked} FP4-output runs byte-equal to the reference");
    Ok(())
}

/// Realistic data (sums round in FP32, in another order than the reference's): per 16-output
/// group the SFD byte equals the exact reference's and every D code is within one e2m1 step,
/// except groups whose unrounded scale lies within 1e-5 (relative) of an SFD rounding point,
/// where accumulation order may pick the neighbouring scale; those are counted.
fn fp4_output_realistic_data_within_one_step() -> Outcome {
    let g = fp4_device()?;
    let cc = g.device().compute_capability;
    let (m, n, k) = (256, 512, 2048);
    let a = Nvfp4Matrix::random_realistic(m, k, 1, seed() ^ 80).unwrap();
    let b = Nvfp4Matrix::random_realistic(n, k, 1, seed() ^ 81).unwrap();
    let acc = reference::accumulators(&Problem::new(m, n, k), a.data(), a.scales(), b.data(), b.scales(), Accumulation::Exact).unwrap();
    let row_major = |t: &[u8]| blockscaled_gemm::layout::from_tiled(t, m, n / 16, 1);
    for config in Config::ALL.iter().copied().filter(|c| c.compute_capability() == cc && c.is_built(OutType::Nvfp4)) {
        for out in [OutType::Nvfp4, OutType::Nvfp4Ue8m0] {
            let format = out.sfd().unwrap();
            let st = 1.5f32;
            let p = Problem::new(m, n, k).norm_constant(st);
            let (ran, d, sfd) = run_fp4(&g, &p, out, &a, &b, None, Some(config));
            let (want_d, want_sfd) = reference::gemm_fp4(&p, a.data(), a.scales(), b.data(), b.scales(), None, format, Accumulation::Exact).unwrap();
            let (got_sf, want_sf) = (row_major(&sfd), row_major(&want_sfd));
            let cmp = compare_fp4(&d, &got_sf, &want_d, &want_sf, n);
            assert!(cmp.within_one_step(), "{ran} {out}: {cmp}");
            // A neighbouring scale factor only where the unrounded scale sits at a rounding point.
            for (gi, (x, y)) in got_sf.iter().zip(&want_sf).enumerate().filter(|(_, (x, y))| x != y) {
                let amax = acc[gi * 16..][..16].iter().fold(0f32, |mx, v| mx.max(v.abs()));
                let pv = amax * (st * (1.0f32 / 6.0));
                let near = sfd_from_f32(format, pv * (1.0 - 1e-5)) != sfd_from_f32(format, pv * (1.0 + 1e-5));
                assert!(near, "{ran} {out}: group {gi}: SFD {x:#04x}, reference {y:#04x}, unrounded {pv} is not at a rounding point");
            }
            // The padding of the tiles is zero (the API clears it).
            let mut valid = vec![false; sfd.len()];
            for r in 0..m {
                for grp in 0..n / 16 {
                    valid[blockscaled_gemm::layout::sf_offset(r, grp, (n / 16).div_ceil(4) * 4)] = true;
                }
            }
            assert!(sfd.iter().zip(&valid).all(|(&b, &v)| v || b == 0), "{ran} {out}: nonzero SFD padding");
            println!("  {ran} {out}: {cmp}");
        }
    }
    Ok(())
}

/// Issue 6: an NVFP4 output feeds the next GEMM as it stands. GEMM 1 (contest data) writes
/// D1 + SFD1; GEMM 2 takes them as its A operand with alpha = 1 / st; both compared with the
/// reference chained the same way (GEMM 1 byte for byte, GEMM 2 within the FP32 bound). On SM90
/// also with the swapped tiles forced for both calls: GEMM 2's pre-pass then reads D1 under a
/// programmatic launch.
fn fp4_output_chains_into_the_next_gemm() -> Outcome {
    let g = fp4_device()?;
    let s = g.stream().clone();
    let (m, n, k, n2) = (192, 256, 512, 320);
    let (a, b) = contest(m, n, k, 1, 90);
    // st so that the largest scale factor lands near the top of ue4m3 (NVFP4's usual choice).
    let acc = reference::accumulators(&Problem::new(m, n, k), a.data(), a.scales(), b.data(), b.scales(), Accumulation::Exact).unwrap();
    let amax = acc.iter().fold(0f32, |x, v| x.max(v.abs()));
    let st = 6.0 * 448.0 / amax;
    let p1 = Problem::new(m, n, k).norm_constant(st);
    let (av, asf) = upload(&g, &a);
    let (bv, bsf) = upload(&g, &b);
    let b2 = Nvfp4Matrix::random_realistic(n2, n, 1, seed() ^ 91).unwrap();
    let (b2v, b2s) = upload(&g, &b2);
    let p2 = Problem::new(m, n2, n).scalars(1.0 / st, 0.0);
    let (want_d1, want_sfd1) = reference::gemm_fp4(&p1, a.data(), a.scales(), b.data(), b.scales(), None, blockscaled_gemm::SfdFormat::Ue4m3, Accumulation::Exact).unwrap();
    let m1 = Nvfp4Matrix::from_parts(m, n, 1, want_d1.clone(), want_sfd1.clone(), None).unwrap();
    // The configs the rule picks, then (SM90) the swapped tiles forced for both calls: there GEMM
    // 1 lets the next launch be scheduled after its main loop, and GEMM 2's pre-pass, launched
    // programmatically, must still read all of D1 (the pre-pass waits for GEMM 1's completion).
    let mut pairs = vec![(None, None)];
    if g.device().arch() == Some(90) {
        let (wide, tall, narrow) = (Some(Config::Sm90_128x256x64), Some(Config::Sm90_256x128x64), Some(Config::Sm90_Swapped_128x128x64));
        pairs.extend([(wide, wide), (wide, tall), (tall, tall), (tall, wide), (narrow, narrow), (narrow, wide)]);
    }
    let mut got2 = Vec::new();
    for (c1, c2) in pairs {
        let mut d1 = s.alloc_zeros::<u8>(m * n / 2).unwrap();
        let mut sfd1 = s.clone_htod(&vec![0x7Fu8; p1.sfd_bytes()]).unwrap();
        let mut d2 = s.clone_htod(&vec![f32::NAN; m * n2]).unwrap();
        let ran1 = g.gemm_fp4(&p1, OutType::Nvfp4, Nvfp4Operand::new(&av, &asf), Nvfp4Operand::new(&bv, &bsf), Nvfp4Output::new(&mut d1, &mut sfd1), c1).unwrap();
        // GEMM 2 straight from the device buffers of GEMM 1, queued right behind it.
        let ran2 = g.gemm(&p2, Nvfp4Operand::new(&d1, &sfd1), Nvfp4Operand::new(&b2v, &b2s), &mut d2, c2).unwrap();
        // The reference, chained the same way.
        assert_eq!(s.clone_dtoh(&d1).unwrap(), want_d1, "{ran1}: D1");
        assert_eq!(s.clone_dtoh(&sfd1).unwrap(), want_sfd1, "{ran1}: SFD1");
        got2 = s.clone_dtoh(&d2).unwrap();
        check_accumulation_bound(&got2, &m1, &b2, 1.0 / st, 0.0, &vec![0f32; m * n2], &format!("{ran1} -> {ran2}"));
        println!("  {ran1} -> {ran2}: chained result equals the chained reference");
    }
    // And the chain approximates the f32 product: D1 carries FP4 rounding only.
    let exact: Vec<f32> = {
        let b2f = b2.dequantize();
        (0..m).flat_map(|i| { let acc = &acc; let b2f = &b2f; (0..n2).map(move |j| (0..n).map(|t| acc[i * n + t] as f64 * b2f[j * n + t] as f64).sum::<f64>() as f32) }).collect()
    };
    let rel = got2.iter().zip(&exact).map(|(x, y)| (x - y).powi(2) as f64).sum::<f64>().sqrt() / exact.iter().map(|y| (*y as f64).powi(2)).sum::<f64>().sqrt();
    println!("  relative Frobenius distance of the chain to the unquantized product {rel:.4}");
    assert!(rel < 0.2, "the FP4 round trip lost too much: {rel}");
    Ok(())
}

/// With two GPUs: a buffer on device 1 passed to the GEMM of device 0 is refused with
/// `WrongDevice` naming the buffer and both devices, for every buffer role, and nothing is written.
fn buffers_on_another_device_are_refused() -> Outcome {
    let g = device()?;
    if g.device().arch().is_none() {
        return Err(format!("device 0 is {:?}, which no kernel of this build runs on", g.device().compute_capability));
    }
    let count = CudaContext::device_count().map_err(|e| e.to_string())?;
    if count < 2 {
        return Err(format!("needs two CUDA devices, found {count}"));
    }
    let s0 = g.stream().clone();
    let s1 = CudaContext::new(1).expect("context on device 1").default_stream();
    let p = Problem::new(128, 128, 256);
    let (a, b) = contest(128, 128, 256, 1, 95);
    let (av0, as0) = upload(&g, &a);
    let (bv0, bs0) = upload(&g, &b);
    let (av1, as1) = (s1.clone_htod(a.data()).unwrap(), s1.clone_htod(a.scales()).unwrap());
    let poison = vec![f16::from_f32(-7.0); 128 * 128];
    let mut d0 = s0.clone_htod(&poison).unwrap();
    let mut d1 = s1.clone_htod(&poison).unwrap();
    let expect = |r: Result<Config, Error>, name: &str| match r {
        Err(Error::WrongDevice { name: n, buffer_device: 1, gemm_device: 0 }) if n == name => println!("  {name} on device 1: refused"),
        other => panic!("{name} on device 1: expected WrongDevice, got {other:?}"),
    };
    expect(g.gemm(&p, Nvfp4Operand::new(&av1, &as0), Nvfp4Operand::new(&bv0, &bs0), &mut d0, None), "A");
    expect(g.gemm(&p, Nvfp4Operand::new(&av0, &as1), Nvfp4Operand::new(&bv0, &bs0), &mut d0, None), "SFA");
    expect(g.gemm(&p, Nvfp4Operand::new(&av0, &as0), Nvfp4Operand::new(&av1, &bs0), &mut d0, None), "B");
    expect(g.gemm(&p, Nvfp4Operand::new(&av0, &as0), Nvfp4Operand::new(&bv0, &as1), &mut d0, None), "SFB");
    expect(g.gemm(&p, Nvfp4Operand::new(&av0, &as0), Nvfp4Operand::new(&bv0, &bs0), &mut d1, None), "D");
    let c1 = s1.clone_htod(&poison).unwrap();
    expect(g.gemm_with_c(&p.scalars(1.0, 1.0), Nvfp4Operand::new(&av0, &as0), Nvfp4Operand::new(&bv0, &bs0), &c1, &mut d0, None), "C");
    if Config::ALL.iter().any(|c| c.compute_capability() == g.device().compute_capability && c.is_built(OutType::Nvfp4)) {
        let mut q0 = s0.alloc_zeros::<u8>(128 * 64).unwrap();
        let mut sf1 = s1.alloc_zeros::<u8>(p.sfd_bytes()).unwrap();
        expect(g.gemm_fp4(&p, OutType::Nvfp4, Nvfp4Operand::new(&av0, &as0), Nvfp4Operand::new(&bv0, &bs0), Nvfp4Output::new(&mut q0, &mut sf1), None), "SFD");
    }
    s0.synchronize().unwrap();
    s1.synchronize().unwrap();
    assert_eq!(s0.clone_dtoh(&d0).unwrap(), poison, "a refused launch must not write D");
    assert_eq!(s1.clone_dtoh(&d1).unwrap(), poison, "a refused launch must not write D");
    Ok(())
}

/// Issue 25: general data (every e2m1 code, scales 0x10..=0x58, M odd, N not a multiple of the
/// tile, L = 2, alpha 0.75) through the automatic choice in bf16, f16 and f32, with and without
/// C, and on Hopper through every SM90 config: correct results pass the verdict (the contest
/// tolerance failed them: FP32 cancellation near 0, bf16 rounding near a boundary).
fn general_data_passes_the_verdict() -> Outcome {
    let g = device()?;
    if g.device().arch().is_none() {
        return Err(format!("device is {:?}: no kernel of this crate runs there", g.device().compute_capability));
    }
    let general = |rows: usize, k: usize, l: usize, salt: u64| {
        let mut rng = blockscaled_gemm::SplitMix64::new(seed() ^ salt);
        let data = rng.bytes(l * rows * k / 2);
        let sf: Vec<u8> = (0..l * rows * k / 16).map(|_| 0x10 + rng.below(0x49) as u8).collect();
        Nvfp4Matrix::from_parts(rows, k, l, data, blockscaled_gemm::layout::to_tiled(&sf, rows, k / 16, l), None).unwrap()
    };
    fn auto<T: OutputElement + cudarc::driver::DeviceRepr>(g: &BlockScaledGemm, a: &Nvfp4Matrix, b: &Nvfp4Matrix, alpha: f32, beta: f32) {
        let (m, n, k, l) = (a.rows(), b.rows(), a.k(), a.batch());
        let mut rng = blockscaled_gemm::SplitMix64::new(seed() ^ 0xD);
        let c: Vec<T> = (0..l * m * n).map(|_| T::from_f64(rng.normal() * 256.0)).collect();
        let (ran, got) = run_poisoned(g, a, b, alpha, beta, &c, None);
        let v = verify_matrices(a, b, alpha, beta, (beta != 0.0).then_some(&c[..]), &got).unwrap();
        assert!(v.passed(), "{ran} {m}x{n}x{k}x{l} alpha={alpha} beta={beta} {:?}: {v}", T::OUT);
        println!("  {ran} {m}x{n}x{k}x{l} {:?} beta={beta}: {v}", T::OUT);
    }
    for (i, &(m, n, k)) in [(37, 200, 1024), (129, 136, 7168), (1, 4096, 7168)].iter().enumerate() {
        let (a, b) = (general(m, k, 2, 60 + i as u64), general(n, k, 2, 70 + i as u64));
        auto::<bf16>(&g, &a, &b, 0.75, 0.0);
        auto::<f16>(&g, &a, &b, 0.75, 0.0);
        auto::<f32>(&g, &a, &b, 0.75, 0.0);
        auto::<bf16>(&g, &a, &b, 0.75, -1.5);
    }
    if g.device().arch() == Some(90) {
        let (a, b) = (general(131, 2048, 2, 80), general(200, 2048, 2, 81));
        for c in Config::ALL.iter().copied().filter(|c| c.info().arch == 90) {
            run_sm90::<bf16>(&g, &a, &b, 0.75, 0.0, c, false);
            run_sm90::<f32>(&g, &a, &b, 0.75, -1.5, c, false);
        }
    }
    Ok(())
}

/// Issue 21: one CUDA graph of six GEMMs (shapes, configs and outputs differ; FP4 with two norm
/// constants), replayed three times with new inputs copied into the same buffers and a larger
/// eager call in between; every output against the exact reference. Also: a call during capture
/// with event tracking on is a typed error, and so is one needing more workspace than reserved.
fn graph_capture_replays_with_new_data() -> Outcome {
    use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
    let g0 = fp4_device()?;
    let ctx = g0.stream().context().clone();
    let stream = ctx.new_stream().unwrap();
    let g = BlockScaledGemm::new(stream.clone()).unwrap();
    // Tracking on (cudarc's default, several streams): refused before anything is queued.
    {
        let p = Problem::new(128, 256, 512);
        let (a, b) = contest(128, 256, 512, 1, 1);
        let (av, asf, bv, bsf) = (stream.clone_htod(a.data()).unwrap(), stream.clone_htod(a.scales()).unwrap(), stream.clone_htod(b.data()).unwrap(), stream.clone_htod(b.scales()).unwrap());
        let mut d = stream.alloc_zeros::<f16>(p.cd_elems()).unwrap();
        stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
        let e = g.gemm(&p, Nvfp4Operand::new(&av, &asf), Nvfp4Operand::new(&bv, &bsf), &mut d, None).unwrap_err();
        let _ = stream.end_capture(CUgraphInstantiate_flags(0));
        assert!(matches!(e, Error::CaptureEventTracking), "{e}");
        stream.synchronize().unwrap();
    }
    // SAFETY: every buffer below is used on `stream` alone.
    unsafe { ctx.disable_event_tracking() };
    struct Case { m: usize, n: usize, k: usize, out: OutType, st: f32, config: Option<Config> }
    let cases = [
        Case { m: 1, n: 4096, k: 7168, out: OutType::F16, st: 1.0, config: None },
        Case { m: 128, n: 7168, k: 2048, out: OutType::Bf16, st: 1.0, config: None },
        Case { m: 300, n: 512, k: 1024, out: OutType::F32, st: 1.0, config: Some(Config::Sm90_128x128x64) },
        Case { m: 64, n: 1024, k: 4096, out: OutType::F16, st: 1.0, config: Some(Config::Sm90_128x64x64) },
        Case { m: 128, n: 2048, k: 1024, out: OutType::Nvfp4, st: 2.0, config: None },
        Case { m: 200, n: 1024, k: 2048, out: OutType::Nvfp4, st: 0.5, config: None },
    ];
    let mut bufs = Vec::new();
    for c in &cases {
        let p = Problem::new(c.m, c.n, c.k).norm_constant(c.st);
        let (a, b) = contest(c.m, c.n, c.k, 1, 7);
        let up = |x: &[u8]| stream.clone_htod(x).unwrap();
        let d_bytes = if c.out.sfd().is_some() { c.m * c.n / 2 } else { c.m * c.n * if c.out == OutType::F32 { 4 } else { 2 } };
        bufs.push((p, up(a.data()), up(a.scales()), up(b.data()), up(b.scales()), stream.alloc_zeros::<u8>(d_bytes).unwrap(), stream.alloc_zeros::<u8>(p.sfd_bytes()).unwrap()));
    }
    let launch = |i: usize, bufs: &mut Vec<(Problem, cudarc::driver::CudaSlice<u8>, cudarc::driver::CudaSlice<u8>, cudarc::driver::CudaSlice<u8>, cudarc::driver::CudaSlice<u8>, cudarc::driver::CudaSlice<u8>, cudarc::driver::CudaSlice<u8>)>| -> Result<Config, Error> {
        let c = &cases[i];
        let (p, av, asf, bv, bsf, d, sfd) = &mut bufs[i];
        let (oa, ob) = (Nvfp4Operand::new(&*av, &*asf), Nvfp4Operand::new(&*bv, &*bsf));
        match c.out {
            OutType::F16 => g.gemm(p, oa, ob, &mut unsafe { d.transmute_mut::<f16>(p.cd_elems()) }.unwrap(), c.config),
            OutType::Bf16 => g.gemm(p, oa, ob, &mut unsafe { d.transmute_mut::<bf16>(p.cd_elems()) }.unwrap(), c.config),
            OutType::F32 => g.gemm(p, oa, ob, &mut unsafe { d.transmute_mut::<f32>(p.cd_elems()) }.unwrap(), c.config),
            _ => g.gemm_fp4(p, c.out, oa, ob, Nvfp4Output::new(d, sfd), c.config),
        }
    };
    // More workspace than reserved during capture: a typed error, and the capture stays valid.
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    let e = launch(1, &mut bufs).unwrap_err();
    assert!(matches!(e, Error::WorkspaceDuringCapture { .. }), "{e}");
    assert!(stream.end_capture(CUgraphInstantiate_flags(0)).is_ok());
    let need = (0..cases.len()).map(|i| g.workspace_size(&bufs[i].0, cases[i].out, cases[i].config).unwrap()).max().unwrap();
    g.reserve_workspace(need).unwrap();
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    for i in 0..cases.len() {
        launch(i, &mut bufs).unwrap();
    }
    let graph = stream.end_capture(CUgraphInstantiate_flags(0)).unwrap().expect("a graph");
    // A larger eager call on the same object: the workspace grows, the graph's stays alive.
    let (ba, bb) = contest(2048, 2048, 4096, 1, 11);
    let big = Problem::new(2048, 2048, 4096);
    for replay in 0..3u64 {
        let mut wants = Vec::new();
        for (i, c) in cases.iter().enumerate() {
            let (a, b) = contest(c.m, c.n, c.k, 1, 100 + 10 * replay + i as u64);
            let (_, av, asf, bv, bsf, d, sfd) = &mut bufs[i];
            stream.memcpy_htod(a.data(), av).unwrap();
            stream.memcpy_htod(a.scales(), asf).unwrap();
            stream.memcpy_htod(b.data(), bv).unwrap();
            stream.memcpy_htod(b.scales(), bsf).unwrap();
            stream.memcpy_htod(&vec![0xFFu8; d.len()], d).unwrap();
            stream.memcpy_htod(&vec![0x7Fu8; sfd.len()], sfd).unwrap();
            wants.push((a, b));
        }
        graph.launch().unwrap();
        if replay == 1 {
            let (av, asf, bv, bsf) = (stream.clone_htod(ba.data()).unwrap(), stream.clone_htod(ba.scales()).unwrap(), stream.clone_htod(bb.data()).unwrap(), stream.clone_htod(bb.scales()).unwrap());
            let mut d = stream.alloc_zeros::<f16>(big.cd_elems()).unwrap();
            g.gemm(&big, Nvfp4Operand::new(&av, &asf), Nvfp4Operand::new(&bv, &bsf), &mut d, None).unwrap();
            let want: Vec<f16> = reference_gemm(&ba, &bb, 1.0, 0.0, None).unwrap();
            assert!(compare(&stream.clone_dtoh(&d).unwrap(), &want, 0.0, 0.0).passed(), "eager call between replays");
        }
        for (i, c) in cases.iter().enumerate() {
            let (a, b) = &wants[i];
            let (p, _, _, _, _, d, sfd) = &bufs[i];
            let got = stream.clone_dtoh(d).unwrap();
            let le2 = |x: &[u8]| [x[0], x[1]];
            let ok = match c.out {
                OutType::F16 => compare(&got.chunks_exact(2).map(|x| f16::from_le_bytes(le2(x))).collect::<Vec<_>>(), &reference_gemm::<f16>(a, b, 1.0, 0.0, None).unwrap(), 0.0, 0.0).passed(),
                OutType::Bf16 => compare(&got.chunks_exact(2).map(|x| bf16::from_le_bytes(le2(x))).collect::<Vec<_>>(), &reference_gemm::<bf16>(a, b, 1.0, 0.0, None).unwrap(), 0.0, 0.0).passed(),
                OutType::F32 => compare(&got.chunks_exact(4).map(|x| f32::from_le_bytes([x[0], x[1], x[2], x[3]])).collect::<Vec<_>>(), &reference_gemm::<f32>(a, b, 1.0, 0.0, None).unwrap(), 0.0, 0.0).passed(),
                _ => {
                    let acc = reference::accumulators(p, a.data(), a.scales(), b.data(), b.scales(), Accumulation::Exact).unwrap();
                    let (wd, wsf) = blockscaled_gemm::fp4_out::epilogue(p, &acc, None, c.out.sfd().unwrap());
                    let tiled = |x: &[u8]| blockscaled_gemm::layout::from_tiled(x, c.m, c.n / 16, 1);
                    got == wd && tiled(&stream.clone_dtoh(sfd).unwrap()) == tiled(&wsf)
                }
            };
            assert!(ok, "replay {replay}: case {i} ({}x{}x{} {}) differs from the reference", c.m, c.n, c.k, c.out);
        }
    }
    Ok(())
}
