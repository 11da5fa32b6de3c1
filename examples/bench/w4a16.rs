//! The W4A16 rows of the bench (`op` "w4a16"): bf16 or f16 activations (`--w4a16-input`;
//! N(0, 1)) times NVFP4 weights (`--data`), output of the activations' type, at every GEMM
//! shape of the run. Inputs and outputs rotated (`rotation`); timed as `gemm` is (`ours_b2b_us`
//! and `host_enqueue_us` back to back, `ours_graph_us` from a CUDA graph). `exact`: sampled rows
//! of every timing pass the verdict against the exact W4A16 reference (`compare::verify_w4a16`)
//! with no element outside the FP32 bound, and every set written holds the same bits. The floor
//! is max(bytes / the floor bandwidth, FP16 MMA time at 800 TFLOP/s), as the GEMM rows'.
//! cuBLAS bf16 and `torch._weight_int4pack_mm` come from `--w4a16-baselines FILE`
//! (bench/baselines.py --op w4a16, same device session).

use std::sync::Arc;

use blockscaled_gemm::compare::verify_w4a16;
use blockscaled_gemm::{Activation16, BlockScaledGemm, Config, Nvfp4Tensor, Problem, SplitMix64, WeightLayout};
use cudarc::driver::{CudaSlice, CudaStream};

use crate::rotation::{differing, Rotated, Rotation, Turns};
use crate::{time_back_to_back, time_graph, Cli};

pub struct W4a16Result {
    pub config: Config,
    pub split: u32,
    pub rot: Rotation,
    pub b2b_us: f64,
    pub graph_us: f64,
    /// The same with the weights prepacked, and the config that ran it (`None` for a forced split
    /// past its ranges).
    pub prepacked: Option<(f64, Config)>,
    pub host_us: f64,
    pub floor_us: f64,
    pub exact: bool,
}

pub fn bench_shape<TA: Activation16>(cli: &Cli, gemm: &BlockScaledGemm, stream: &Arc<CudaStream>, l2: usize, floor_gbps: f64, (m, n, k): (usize, usize, usize)) -> Result<W4a16Result, Box<dyn std::error::Error>> {
    let mut rng = SplitMix64::new(3);
    let x: Vec<TA> = (0..m * k).map(|_| TA::from_f64(rng.normal())).collect();
    let w = crate::operand(cli, (1, n, k), 2)?;
    let p = Problem::new(m, n, k);
    let config = match cli.config {
        Some(c) => c,
        None => gemm.select_w4a16_config(&p, TA::OUT)?,
    };
    let split = cli.split_k.unwrap_or_else(|| blockscaled_gemm::dispatch::split_k(config, &p, TA::OUT, gemm.device().sm_count, &gemm.device().max_clusters));
    let bytes = 2 * m * k + p.b_bytes() + p.sfb_bytes() + 2 * m * n;
    let rot = Rotation::new(cli.graph_calls, l2, bytes, false);
    let turns = Turns::new(rot);
    let mut sets = Vec::with_capacity(rot.sets);
    for _ in 0..rot.sets {
        sets.push((stream.clone_htod(&x)?, Nvfp4Tensor::upload(&w, stream)?));
    }
    let mut d = Rotated::<TA>::new(stream, rot, m * n)?;
    gemm.reserve_workspace(gemm.w4a16_workspace_size::<TA>(&p, TA::OUT, Some(config))?)?;
    // As a user calls: the rule's pick unless forced (the host time includes it).
    let launch = |sets: &[(CudaSlice<TA>, Nvfp4Tensor)], d: &mut Rotated<TA>| {
        let s = turns.next();
        gemm.gemm_w4a16(&p, &sets[s].0, &sets[s].1, &mut d.set(s), cli.config)
    };
    // Sampled rows of the latest set, judged against the exact reference of those rows; every
    // other set written since `since` must hold the same bits.
    let rows: Vec<usize> = (0..m.min(16)).map(|i| i * (m - 1) / (m.min(16) - 1).max(1)).collect();
    let x_rows: Vec<TA> = rows.iter().flat_map(|&r| x[r * k..(r + 1) * k].iter().copied()).collect();
    let pr = Problem::new(rows.len(), n, k).scalars(w.global_scale().unwrap_or(1.0), 0.0);
    let check = |d: &Rotated<TA>, since: usize| -> Result<bool, Box<dyn std::error::Error>> {
        let all = d.read(stream)?;
        let latest = turns.latest();
        let got = all.get(latest);
        let picked: Vec<TA> = rows.iter().flat_map(|&r| got[r * n..(r + 1) * n].iter().copied()).collect();
        let v = verify_w4a16(&pr, &x_rows, w.data(), w.scales(), None, &picked)?;
        if !v.passed() {
            eprintln!("w4a16 {m}x{n}x{k}: verification failed: {v}");
        }
        let other = differing(&[&all], latest, &turns.written_since(since), |v| v.to_f64().to_bits());
        if let Some(s) = other {
            eprintln!("w4a16 {m}x{n}x{k}: the output of set {s} differs from the verified set {latest}'s");
        }
        Ok(v.passed() && other.is_none())
    };
    for _ in 0..10 {
        let ran = launch(&sets, &mut d)?;
        crate::same_config(&format!("w4a16 {m}x{n}x{k}"), ran, config)?;
    }
    d.poison(stream)?;
    let since = turns.count();
    let (b2b_us, host_us) = time_back_to_back(cli, stream, || launch(&sets, &mut d).map(|_| ()))?;
    let mut exact = check(&d, since)?;
    d.poison(stream)?;
    let since = turns.count();
    let graph_us = time_graph(cli, stream, rot.calls, || launch(&sets, &mut d).map(|_| ()))?;
    exact &= check(&d, since)?;
    // The same graph with the weights prepacked (a forced split within the prepacked layout's
    // one range per 256 values of K), checked too.
    let mut prepacked = None;
    if cli.split_k.is_none_or(|s| s as usize <= blockscaled_gemm::layout::prepack_chunks(k)) {
        drop(sets);
        let mut packed = Vec::with_capacity(rot.sets);
        for _ in 0..rot.sets {
            packed.push((stream.clone_htod(&x)?, Nvfp4Tensor::upload(&w, stream)?.prepack(stream)?));
        }
        // The rule's pick for prepacked weights (or the forced config).
        let pconfig = if cli.config.is_some() { config } else { gemm.select_w4a16_config_for(&p, TA::OUT, WeightLayout::Prepacked)? };
        gemm.reserve_workspace(gemm.w4a16_workspace_size::<TA>(&p, TA::OUT, Some(pconfig))?)?;
        let ran = launch(&packed, &mut d)?;
        crate::same_config(&format!("w4a16 {m}x{n}x{k} prepacked"), ran, pconfig)?;
        d.poison(stream)?;
        let since = turns.count();
        prepacked = Some((time_graph(cli, stream, rot.calls, || launch(&packed, &mut d).map(|_| ()))?, pconfig));
        exact &= check(&d, since)?;
    }
    let floor_us = (bytes as f64 / (floor_gbps * 1e9)).max(p.flops() / 800e12) * 1e6;
    Ok(W4a16Result { config, split, rot, b2b_us, graph_us, prepacked, host_us, floor_us, exact })
}
