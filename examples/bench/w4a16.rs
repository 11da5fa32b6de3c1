//! The W4A16 rows of the bench (`op` "w4a16"): bf16 or f16 activations (`--w4a16-input`;
//! N(0, 1)) times NVFP4 weights (`--data`), output of the activations' type, at every GEMM
//! shape of the run. Buffer sets rotated over more
//! than twice the L2; timed as `gemm` is (`ours_b2b_us` and `host_enqueue_us` back to back,
//! `ours_graph_us` from a CUDA graph). `exact`: sampled rows of every timing pass the verdict
//! against the exact W4A16 reference (`compare::verify_w4a16`) with no element outside the
//! FP32 bound. The floor is max(bytes / the run's copy bandwidth, FP16 MMA time at 800 TFLOP/s).
//! cuBLAS bf16 and `torch._weight_int4pack_mm` come from `--w4a16-baselines FILE`
//! (bench/baselines.py --op w4a16, same device session).

use std::sync::Arc;

use blockscaled_gemm::compare::verify_w4a16;
use blockscaled_gemm::{Activation16, BlockScaledGemm, Config, Nvfp4Tensor, Problem, SplitMix64, WeightLayout};
use cudarc::driver::{CudaSlice, CudaStream};

use crate::{poison, time_back_to_back, time_graph, Cli};

pub struct W4a16Result {
    pub config: Config,
    pub split: u32,
    pub b2b_us: f64,
    pub graph_us: f64,
    /// The same with the weights prepacked, and the config that ran it (`None` for a forced split
    /// past its ranges).
    pub prepacked: Option<(f64, Config)>,
    pub host_us: f64,
    pub floor_us: f64,
    pub exact: bool,
}

pub fn bench_shape<TA: Activation16>(cli: &Cli, gemm: &BlockScaledGemm, stream: &Arc<CudaStream>, l2: usize, copy_gbps: f64, (m, n, k): (usize, usize, usize)) -> Result<W4a16Result, Box<dyn std::error::Error>> {
    let mut rng = SplitMix64::new(3);
    let x: Vec<TA> = (0..m * k).map(|_| TA::from_f64(rng.normal())).collect();
    let w = crate::operand(cli, n, k, 1, 2)?;
    let p = Problem::new(m, n, k);
    let config = match cli.config {
        Some(c) => c,
        None => gemm.select_w4a16_config(&p, TA::OUT)?,
    };
    let split = cli.split_k.unwrap_or_else(|| blockscaled_gemm::config_split_k(config, &p, TA::OUT, gemm.device().sm_count, &gemm.device().max_clusters));
    let set_bytes = 2 * m * k + p.b_bytes() + p.sfb_bytes();
    let n_sets = (2 * l2 / set_bytes + 1).max(2);
    let mut sets = Vec::with_capacity(n_sets);
    for _ in 0..n_sets {
        sets.push((stream.clone_htod(&x)?, Nvfp4Tensor::upload(&w, stream)?));
    }
    let mut d: CudaSlice<TA> = stream.alloc_zeros(m * n)?;
    gemm.reserve_workspace(gemm.w4a16_workspace_size::<TA>(&p, TA::OUT, Some(config))?)?;
    let launch = |(sets, config): (&[(CudaSlice<TA>, Nvfp4Tensor)], Config), i: usize, d: &mut CudaSlice<TA>| gemm.gemm_w4a16(&p, &sets[i % n_sets].0, &sets[i % n_sets].1, d, Some(config)).map(|_| ());
    // Sampled rows, judged against the exact reference of those rows.
    let rows: Vec<usize> = (0..m.min(16)).map(|i| i * (m - 1) / (m.min(16) - 1).max(1)).collect();
    let x_rows: Vec<TA> = rows.iter().flat_map(|&r| x[r * k..(r + 1) * k].iter().copied()).collect();
    let pr = Problem::new(rows.len(), n, k).scalars(w.global_scale().unwrap_or(1.0), 0.0);
    let check = |d: &CudaSlice<TA>| -> Result<bool, Box<dyn std::error::Error>> {
        let got = stream.clone_dtoh(d)?;
        let picked: Vec<TA> = rows.iter().flat_map(|&r| got[r * n..(r + 1) * n].iter().copied()).collect();
        let v = verify_w4a16(&pr, &x_rows, w.data(), w.scales(), None, &picked)?;
        if !v.passed() {
            eprintln!("w4a16 {m}x{n}x{k}: verification failed: {v}");
        }
        Ok(v.passed())
    };
    for i in 0..10 {
        launch((&sets, config), i, &mut d)?;
    }
    let as_bytes = |d: &mut CudaSlice<TA>| -> Result<(), cudarc::driver::DriverError> {
        // SAFETY: 0xFF bytes are a NaN of either type; the view covers the buffer.
        poison(stream, &mut unsafe { d.transmute_mut::<u8>(2 * m * n) }.expect("2 bytes each"))
    };
    as_bytes(&mut d)?;
    let (b2b_us, host_us) = time_back_to_back(cli, stream, |i| launch((&sets, config), i, &mut d))?;
    let mut exact = check(&d)?;
    as_bytes(&mut d)?;
    let graph_us = time_graph(cli, stream, |i| launch((&sets, config), i, &mut d))?;
    exact &= check(&d)?;
    // The same graph with the weights prepacked (a forced split within the prepacked layout's
    // one range per 256 values of K), checked too.
    let mut prepacked = None;
    if cli.split_k.is_none_or(|s| s as usize <= blockscaled_gemm::layout::prepack_chunks(k)) {
        drop(sets);
        let mut packed = Vec::with_capacity(n_sets);
        for _ in 0..n_sets {
            packed.push((stream.clone_htod(&x)?, Nvfp4Tensor::upload(&w, stream)?.prepack(stream)?));
        }
        // The rule's pick for prepacked weights (or the forced config).
        let pconfig = if cli.config.is_some() { config } else { gemm.select_w4a16_config_for(&p, TA::OUT, WeightLayout::Prepacked)? };
        gemm.reserve_workspace(gemm.w4a16_workspace_size::<TA>(&p, TA::OUT, Some(pconfig))?)?;
        as_bytes(&mut d)?;
        prepacked = Some((time_graph(cli, stream, |i| launch((&packed, pconfig), i, &mut d))?, pconfig));
        exact &= check(&d)?;
    }
    let floor_us = (((set_bytes + 2 * m * n) as f64) / (copy_gbps * 1e9)).max(p.flops() / 800e12) * 1e6;
    Ok(W4a16Result { config, split, b2b_us, graph_us, prepacked, host_us, floor_us, exact })
}
