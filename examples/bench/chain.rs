//! The quantizer feeding the GEMM (`op` "quantize_gemm"), as an engine's NVFP4 path runs a
//! linear layer: bf16 (1, M, K) activations of N(0, 1), quantized with a given global scale, then
//! the GEMM against N(0, 1) NVFP4 weights, f16 out; two launches a step. Activations and weights
//! are rotated (`rotation`; a warm-up step runs both forms on one set, a timed step one form);
//! the quantizer writes one activation buffer and the GEMM one D, as an engine reuses its own
//! (unlike the other rows, whose outputs rotate too). Two forms, graph-timed in the same run, alternating, two rounds each:
//! `quantize_into` then `gemm` (`two_step_graph_us`: where the GEMM's tile reads decoded
//! activations, its pre-pass decodes them again), and `quantize_decoded_into` then
//! `gemm_decoded` (`decoded_graph_us`: the quantizer writes the decode). Times are per step
//! (quantizer and GEMM). `exact`: both forms' D equal bit for bit for every set.

use std::sync::Arc;

use blockscaled_gemm::{BlockScaledGemm, Config, Nvfp4Activations, Nvfp4Tensor, Problem, Quantizer, SplitMix64};
use cudarc::driver::{CudaSlice, CudaStream};
use half::{bf16, f16};

use crate::rotation::{Rotation, Turns};

pub struct ChainResult {
    pub config: Config,
    pub rot: Rotation,
    pub two_step_graph_us: [f64; 2],
    pub decoded_graph_us: [f64; 2],
    pub exact: bool,
}

pub fn bench_chain(cli: &crate::Cli, gemm: &BlockScaledGemm, stream: &Arc<CudaStream>, l2: usize, (m, n, k): (usize, usize, usize)) -> Result<ChainResult, Box<dyn std::error::Error>> {
    let q = Quantizer::new(stream.clone());
    let g = 4.0 / 2688.0;
    let rot = Rotation::new(cli.graph_calls, l2, 2 * m * k + n * k / 2 + n * k / 16, false);
    let (n_sets, turns) = (rot.sets, Turns::new(rot));
    let mut rng = SplitMix64::new(11);
    let x: Vec<bf16> = (0..n_sets * m * k).map(|_| bf16::from_f32(rng.normal() as f32)).collect();
    let x = stream.clone_htod(&x)?;
    let weights: Vec<Nvfp4Tensor> = (0..n_sets).map(|i| Nvfp4Tensor::upload(&crate::operand(cli, (1, n, k), 100 + i as u64)?, stream)).collect::<Result<_, _>>()?;
    let p = Problem::new(m, n, k);
    let (mut codes, mut scales): (CudaSlice<u8>, CudaSlice<u8>) = (stream.alloc_zeros(m * k / 2)?, stream.alloc_zeros(blockscaled_gemm::layout::sf_bytes((1, m, k)))?);
    let mut act = Nvfp4Activations::new(stream, (1, m, k))?;
    let (mut d1, mut d2): (CudaSlice<f16>, CudaSlice<f16>) = (stream.alloc_zeros(m * n)?, stream.alloc_zeros(m * n)?);
    let xs = |s: usize| x.slice(s * m * k..(s + 1) * m * k);
    let mut two_step = |s: usize, d: &mut CudaSlice<f16>| -> blockscaled_gemm::Result<Config> {
        q.quantize_into(&xs(s), (1, m, k), g, &mut codes, &mut scales)?;
        let a = Nvfp4Tensor::new(codes.as_view(), scales.as_view(), (1, m, k), g)?;
        gemm.gemm(&p, &a, &weights[s], d, cli.config)
    };
    let mut decoded = |s: usize, d: &mut CudaSlice<f16>| -> blockscaled_gemm::Result<Config> {
        q.quantize_decoded_into(&xs(s), g, &mut act)?;
        gemm.gemm_decoded(&p, &act, &weights[s], d, cli.config)
    };
    // Warm-up, and the outputs of every set compared (each form's D poisoned first).
    let mut exact = true;
    let mut config = None;
    for _ in 0..n_sets.max(10) {
        crate::poison(stream, &mut d1)?;
        crate::poison(stream, &mut d2)?;
        let s = turns.next();
        let c1 = two_step(s, &mut d1)?;
        let c2 = decoded(s, &mut d2)?;
        exact &= c1 == c2 && stream.clone_dtoh(&d1)?.iter().map(|v| v.to_bits()).eq(stream.clone_dtoh(&d2)?.iter().map(|v| v.to_bits()));
        config = Some(c1);
    }
    let mut two_step_graph_us = [0.0; 2];
    let mut decoded_graph_us = [0.0; 2];
    for round in 0..2 {
        two_step_graph_us[round] = crate::time_graph(cli, stream, rot.calls, || two_step(turns.next(), &mut d1).map(|_| ()))?;
        decoded_graph_us[round] = crate::time_graph(cli, stream, rot.calls, || decoded(turns.next(), &mut d2).map(|_| ()))?;
    }
    Ok(ChainResult { config: config.ok_or("no warm-up step")?, rot, two_step_graph_us, decoded_graph_us, exact })
}
