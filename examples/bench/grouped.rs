//! The grouped (mixture-of-experts) cases of the bench (`op` "grouped"): the cases, their
//! routing, and one case's timings.
//!
//! Per case, in one run: stacked NVFP4 activations of the `--data` kind (T = sum of the experts'
//! rows, K), weights (E, N, K) of which eight distinct experts repeat, expert scales 1, bf16
//! output; inputs and D rotated (`rotation`) by the bytes a call touches: the weights of the
//! experts with rows, the activations, the scale rows their 128-row blocks occupy and D (one set
//! where a call alone touches more than twice the L2). Timed as `gemm` is: `ours_b2b_us` and
//! `host_enqueue_us` back to back, `ours_graph_us` from a CUDA graph; `loop_graph_us`: this
//! crate's `gemm` once per expert with rows, every call of the loop in the same graph;
//! `list_graph_us`: the list-form grouped GEMM (`grouped_list_raw`) with the experts that have
//! rows as its groups (their rows of A and D, their scales and weights; the arrays uploaded once
//! per set), from a CUDA graph. `exact`: sampled rows of every timing's latest set equal the exact
//! reference of their expert bit for bit, and every other set it wrote holds the same bits. The
//! floor is max(those bytes / the floor bandwidth, FP16 MMA time of the rows at 800 TFLOP/s), as
//! the GEMM rows'.

use std::sync::Arc;

use blockscaled_gemm::compare::compare;
use blockscaled_gemm::grouped::{expert_offsets, moe_scale_starts, moe_scales, moe_sfa_used_rows};
use blockscaled_gemm::layout::{padded_sf_cols, sf_batch_bytes};
use blockscaled_gemm::{reference_gemm, BlockScaledGemm, Config, ListArrays, ListProblem, MoeActivations, MoeProblem, Nvfp4Matrix, Nvfp4Tensor, OutType, Problem, SplitMix64};
use cudarc::driver::{CudaSlice, CudaStream, CudaViewMut, DevicePtr};
use half::bf16;

use crate::rotation::{differing, Rotated, Rotation, Turns};
use crate::{time_back_to_back, time_graph, Cli};

/// One grouped case: its name, N, K and the rows each expert receives.
pub struct Case {
    pub name: String,
    pub n: usize,
    pub k: usize,
    pub counts: Vec<usize>,
}

/// Rows per expert of `tokens` tokens each routed to `top_k` distinct experts of `experts`,
/// drawn with SplitMix64(seed): the same routing on every run.
fn routing(tokens: usize, experts: usize, top_k: usize, seed: u64) -> Vec<usize> {
    let mut rng = SplitMix64::new(seed);
    let mut counts = vec![0usize; experts];
    for _ in 0..tokens {
        let mut picked: Vec<usize> = Vec::with_capacity(top_k);
        while picked.len() < top_k {
            let e = rng.below(experts as u64) as usize;
            if !picked.contains(&e) {
                picked.push(e);
            }
        }
        for e in picked {
            counts[e] += 1;
        }
    }
    counts
}

/// The bench's grouped cases: four of fixed sizes, and the expert layers of DeepSeek-V3 (E = 256,
/// top-8, hidden 7168, expert width 2048) and Qwen3-30B-A3B (E = 128, top-8, hidden 2048, expert
/// width 768) at 1, 8, 64 and 512 tokens.
pub fn cases() -> Vec<Case> {
    let mut v = fixed_cases();
    for (model, experts, layers) in MODELS {
        for (layer, n, k) in layers {
            for t in [1, 8, 64, 512] {
                v.push(model_case(model, experts, layer, n, k, t));
            }
        }
    }
    v
}

/// A model's expert layers: (model, experts, [(layer, N, K)]), each routed top-8.
type Model = (&'static str, usize, [(&'static str, usize, usize); 2]);
const MODELS: [Model; 2] =
    [("dsv3", 256, [("gate-up", 4096, 7168), ("down", 7168, 2048)]), ("qwen3-30b-a3b", 128, [("gate-up", 1536, 2048), ("down", 2048, 768)])];

fn model_case(model: &str, experts: usize, layer: &str, n: usize, k: usize, t: usize) -> Case {
    Case { name: format!("{model}-{layer}-t{t}"), n, k, counts: routing(t, experts, 8, 0x5eed + t as u64) }
}

/// `--grouped` names: `all`, `none`, or a comma-separated list of the cases' names and of model
/// layers at any token count (`MODEL-LAYER-tT`, e.g. `dsv3-down-t384`: the bench's routing of T
/// tokens, T in 1..=65536 written without sign or leading zeros). Each case runs once, in the
/// order first named; an unknown or empty name is an error.
pub fn select(names: &str) -> Result<Vec<Case>, String> {
    match names.trim() {
        "all" => return Ok(cases()),
        "none" | "" => return Ok(Vec::new()),
        _ => {}
    }
    let mut picked: Vec<Case> = Vec::new();
    for name in names.split(',').map(str::trim) {
        if picked.iter().any(|c| c.name == name) {
            continue;
        }
        // A model layer at a standard token count is the standard case: model_case builds both.
        let case = fixed_cases().into_iter().find(|c| c.name == name).or_else(|| {
            MODELS
                .iter()
                .flat_map(|&(model, experts, layers)| layers.into_iter().map(move |(layer, n, k)| (model, experts, layer, n, k)))
                .find_map(|(model, experts, layer, n, k)| {
                    let digits = name.strip_prefix(&format!("{model}-{layer}-t"))?;
                    let t: usize = digits.parse().ok().filter(|t: &usize| t.to_string() == digits)?;
                    (1..=65536).contains(&t).then(|| model_case(model, experts, layer, n, k, t))
                })
        });
        picked.push(case.ok_or_else(|| format!("--grouped: unknown case {name:?} (the cases' names, MODEL-LAYER-tT with T in 1..=65536, all or none)"))?);
    }
    Ok(picked)
}

/// The fixed-size cases.
fn fixed_cases() -> Vec<Case> {
    vec![
        Case { name: "g8-n4096-k7168".into(), n: 4096, k: 7168, counts: vec![80, 176, 128, 72, 64, 248, 96, 160] },
        Case { name: "g8-n7168-k2048".into(), n: 7168, k: 2048, counts: vec![40, 76, 168, 72, 164, 148, 196, 160] },
        Case { name: "g2-n3072-k4096".into(), n: 3072, k: 4096, counts: vec![192, 320] },
        Case { name: "g2-n4096-k1536".into(), n: 4096, k: 1536, counts: vec![128, 384] },
    ]
}

/// The cases as JSON for bench/baselines.py (`--op grouped --grouped-cases FILE`).
pub fn cases_json(cases: &[Case]) -> String {
    let items: Vec<String> = cases.iter().map(|c| {
        let counts: Vec<String> = c.counts.iter().map(|x| x.to_string()).collect();
        format!("\"{}\": {{\"n\": {}, \"k\": {}, \"counts\": [{}]}}", c.name, c.n, c.k, counts.join(", "))
    }).collect();
    format!("{{{}}}\n", items.join(",\n "))
}

pub struct GroupedResult {
    pub config: Config,
    pub rot: Rotation,
    pub experts_hit: usize,
    pub b2b_us: f64,
    pub graph_us: f64,
    /// The same with the weights prepacked: `None` off Hopper.
    pub prepacked_graph_us: Option<f64>,
    pub host_us: f64,
    pub loop_graph_us: f64,
    pub list_config: Config,
    pub list_graph_us: f64,
    /// W4A16 grouped: `None` where the device has no W4A16 kernel (SM100).
    pub w4a16_config: Option<Config>,
    pub w4a16_graph_us: Option<f64>,
    pub floor_us: f64,
    pub bytes: usize,
    pub exact: bool,
}

/// One timing of a case on its output sets: us per call.
type Timing<'a> = &'a mut dyn FnMut(&mut Rotated<bf16>) -> Result<f64, Box<dyn std::error::Error>>;

/// Device buffers of one set: activations, their MoE-layout scales, weights and weight scales.
struct Set {
    a: CudaSlice<u8>,
    sfa: CudaSlice<u8>,
    b: CudaSlice<u8>,
    sfb: CudaSlice<u8>,
}

pub fn bench_case(cli: &Cli, gemm: &BlockScaledGemm, stream: &Arc<CudaStream>, l2: usize, floor_gbps: f64, case: &Case) -> Result<GroupedResult, Box<dyn std::error::Error>> {
    let (n, k, experts) = (case.n, case.k, case.counts.len());
    let t: usize = case.counts.iter().sum();
    let p = MoeProblem::new(t, n, k, experts);
    let x = crate::operand(cli, (1, t, k), 1)?;
    let unique = experts.min(8);
    let w8 = crate::operand(cli, (unique, n, k), 2)?;
    let offsets = expert_offsets(&case.counts)?;
    let sfa_host = moe_scales(&x, &offsets)?;
    let hit: Vec<usize> = (0..experts).filter(|&e| case.counts[e] > 0).collect();
    let (w_bytes, w_sf) = (n * k / 2, sf_batch_bytes(n, k));
    // The scale rows this routing's blocks occupy (each expert's rows rounded up to 128), not the
    // buffer's capacity for any routing.
    let sp = padded_sf_cols(k / 16);
    let sf_start: Vec<usize> = moe_scale_starts(&offsets)?.iter().map(|r| r * sp).collect();
    let bytes = hit.len() * (w_bytes + w_sf) + p.a_bytes() + sf_start[experts] + 2 * p.d_elems();
    let rot = Rotation::new(cli.graph_calls, l2, bytes, true);
    let turns = Turns::new(rot);
    let mut sets = Vec::with_capacity(rot.sets);
    for _ in 0..rot.sets {
        let mut b: CudaSlice<u8> = stream.alloc_zeros(p.b_bytes())?;
        let mut sfb: CudaSlice<u8> = stream.alloc_zeros(p.sfb_bytes())?;
        for e in 0..experts {
            let u = e % unique;
            stream.memcpy_htod(&w8.data()[u * w_bytes..][..w_bytes], &mut b.slice_mut(e * w_bytes..(e + 1) * w_bytes))?;
            stream.memcpy_htod(&w8.scales()[u * w_sf..][..w_sf], &mut sfb.slice_mut(e * w_sf..(e + 1) * w_sf))?;
        }
        sets.push(Set { a: stream.clone_htod(x.data())?, sfa: stream.clone_htod(&sfa_host)?, b, sfb });
    }
    let offsets_dev = stream.clone_htod(&offsets)?;
    let ones = stream.clone_htod(&vec![1.0f32; experts])?;
    let mut d = Rotated::<bf16>::new(stream, rot, p.d_elems())?;
    let forced = cli.grouped_config;
    let config = match forced {
        Some(c) => c,
        None => gemm.select_grouped_config(&p, blockscaled_gemm::OutType::Bf16)?,
    };
    let w4a16_forced = forced.filter(|c| c.is_built_grouped_w4a16(OutType::Bf16));
    // As a user calls: the rule's pick unless forced (the host time includes it); checked below.
    let launch = |d: &mut Rotated<bf16>| -> Result<Config, blockscaled_gemm::Error> {
        let s = turns.next();
        let set = &sets[s];
        let a = MoeActivations::new(set.a.as_view(), set.sfa.as_view(), (t, k), 1.0)?;
        let b = Nvfp4Tensor::new(set.b.as_view(), set.sfb.as_view(), (experts, n, k), 1.0)?;
        gemm.moe_gemm(&p, &a, &b, &offsets_dev, &ones, &mut d.set(s), forced)
    };
    // The loop of gemm, one call per expert with rows: the expert's rows of A, its scales (the
    // MoE layout is each expert's own tiled layout, at its padded start), its batch of B.
    let mut workspace = gemm.moe_workspace_size(&p, blockscaled_gemm::OutType::Bf16, Some(config))?;
    for &e in &hit {
        workspace = workspace.max(gemm.workspace_size(&Problem::new(case.counts[e], n, k), blockscaled_gemm::OutType::Bf16, None)?);
    }
    // The list form: one group per expert with rows, at most as many rows as the largest.
    let max_m = hit.iter().map(|&e| case.counts[e]).max().unwrap_or(0);
    let list_p = ListProblem::new(hit.len(), max_m, n, k).max_rows(t);
    // `--grouped-config` forces the list and W4A16 forms too where the config has their kernels
    // (the three forms share the rule; forcing one alone would time the others on other tiles).
    let list_config = match forced.filter(|c| c.is_built_grouped_list(OutType::Bf16)) {
        Some(c) => c,
        None => gemm.select_list_config(&list_p, OutType::Bf16)?,
    };
    workspace = workspace.max(gemm.grouped_list_workspace_size(&list_p, OutType::Bf16, Some(list_config))?);
    // W4A16 (`moe_gemm_w4a16`): the same activations in bf16, where each NVFP4 value is exact, so
    // D is the NVFP4 GEMM's (the kernels pair the same products in the same order) and the same
    // check applies; the rule's config, or the forced one where it has W4A16 kernels. Skipped where
    // the device has none (SM100).
    let w4a16_workspace = match gemm.moe_w4a16_workspace_size::<bf16>(&p, OutType::Bf16, w4a16_forced) {
        Ok(bytes) => Some(bytes),
        Err(blockscaled_gemm::Error::UnsupportedDevice { .. } | blockscaled_gemm::Error::OutputUnsupported { .. }) => None,
        Err(e) => return Err(e.into()),
    };
    let x16: Vec<bf16> = if w4a16_workspace.is_some() { x.dequantize()?.iter().map(|&v| bf16::from_f32(v)).collect() } else { Vec::new() };
    let a16_sets = if w4a16_workspace.is_some() { (0..rot.sets).map(|_| stream.clone_htod(&x16)).collect::<Result<Vec<CudaSlice<bf16>>, _>>()? } else { Vec::new() };
    workspace = workspace.max(w4a16_workspace.unwrap_or(0));
    gemm.reserve_workspace(workspace)?;
    let addr = |x: &CudaSlice<u8>| x.device_ptr(stream).0;
    let problems = stream.clone_htod(&hit.iter().flat_map(|&e| [case.counts[e] as i32, n as i32, k as i32]).collect::<Vec<i32>>())?;
    let mut list_sets = Vec::with_capacity(rot.sets);
    for (i, s) in sets.iter().enumerate() {
        let arr = |f: &dyn Fn(usize) -> u64| stream.clone_htod(&hit.iter().map(|&e| f(e)).collect::<Vec<u64>>());
        let d_addr = d.set(i).device_ptr(stream).0;
        list_sets.push([
            arr(&|e| addr(&s.a) + (offsets[e] as usize * k / 2) as u64)?,
            arr(&|e| addr(&s.sfa) + sf_start[e] as u64)?,
            arr(&|e| addr(&s.b) + (e * w_bytes) as u64)?,
            arr(&|e| addr(&s.sfb) + (e * w_sf) as u64)?,
            arr(&|e| d_addr + (offsets[e] as usize * n * 2) as u64)?,
        ]);
    }
    // `_d`: the list form writes the set's part of D through the addresses of its arrays; taking
    // it here keeps it borrowed as the other forms' launches do.
    let list_launch = |_d: &mut Rotated<bf16>| -> Result<(), blockscaled_gemm::Error> {
        let [a, sfa, b, sfb, d_list] = &list_sets[turns.next()];
        let arrays = ListArrays { problems: &problems, a, sfa, b, sfb, d: d_list, c: None, sfd: None, alphas: None };
        // SAFETY: every address is inside this case's live buffers, at the expert's rows.
        unsafe { gemm.grouped_list_raw(&list_p, OutType::Bf16, &arrays, Some(list_config)) }.map(|_| ())
    };
    let w4a16_launch = |d: &mut Rotated<bf16>| -> Result<Config, blockscaled_gemm::Error> {
        let s = turns.next();
        let set = &sets[s];
        let b = Nvfp4Tensor::new(set.b.as_view(), set.sfb.as_view(), (experts, n, k), 1.0)?;
        gemm.moe_gemm_w4a16(&p, &a16_sets[s], &b, &offsets_dev, &ones, &mut d.set(s), w4a16_forced)
    };
    let loop_launch = |d: &mut Rotated<bf16>| -> Result<(), blockscaled_gemm::Error> {
        let s = turns.next();
        let (set, mut ds) = (&sets[s], d.set(s));
        for &e in &hit {
            let (r0, r1) = (offsets[e] as usize, offsets[e + 1] as usize);
            let pe = Problem::new(r1 - r0, n, k);
            let a = Nvfp4Tensor::new(set.a.slice(r0 * k / 2..r1 * k / 2), set.sfa.slice(sf_start[e]..sf_start[e + 1]), (1, r1 - r0, k), 1.0)?;
            let b = Nvfp4Tensor::new(set.b.slice(e * w_bytes..(e + 1) * w_bytes), set.sfb.slice(e * w_sf..(e + 1) * w_sf), (1, n, k), 1.0)?;
            gemm.gemm(&pe, &a, &b, &mut ds.slice_mut(r0 * n..r1 * n), None)?;
        }
        Ok(())
    };
    // Sampled rows of every expert region and the exact reference of their expert (computed
    // once; each timing's latest output is checked against it, and every other set it wrote must
    // hold the same bits).
    let rows: Vec<usize> = (0..t.min(48)).map(|i| i * (t - 1) / (t.min(48) - 1).max(1)).collect();
    let mut wants: Vec<(Vec<usize>, Vec<bf16>)> = Vec::new();
    for &e in &hit {
        let (r0, r1) = (offsets[e] as usize, offsets[e + 1] as usize);
        let mine: Vec<usize> = rows.iter().copied().filter(|&r| r >= r0 && r < r1).collect();
        if !mine.is_empty() {
            let want = reference_gemm(&x.select_rows(&mine)?, &w8.batch_slice(e % unique)?, 1.0, 0.0, None)?;
            wants.push((mine, want));
        }
    }
    let check = |d: &Rotated<bf16>, what: &str, since: usize| -> Result<bool, Box<dyn std::error::Error>> {
        let all = d.read(stream)?;
        let latest = turns.latest();
        let got = all.get(latest);
        let mut ok = true;
        for (mine, want) in &wants {
            let got_rows: Vec<bf16> = mine.iter().flat_map(|&r| got[r * n..(r + 1) * n].iter().copied()).collect();
            ok &= compare(&got_rows, want, 0.0, 0.0)?.passed();
        }
        if !ok {
            eprintln!("{}: verification failed ({what})", case.name);
        }
        if let Some(s) = differing(&[&all], latest, &turns.written_since(since), |v| v.to_bits()) {
            eprintln!("{}: the output of set {s} differs from the verified set {latest}'s ({what})", case.name);
            ok = false;
        }
        Ok(ok)
    };
    for _ in 0..10 {
        let ran = launch(&mut d)?;
        crate::same_config(&case.name, ran, config)?;
    }
    // One timing: `d` poisoned, then `time` runs it; its output judged.
    let mut exact = true;
    let mut timed = |d: &mut Rotated<bf16>, what: &str, time: Timing| -> Result<f64, Box<dyn std::error::Error>> {
        d.poison(stream)?;
        let since = turns.count();
        let us = time(d)?;
        exact &= check(d, what, since)?;
        Ok(us)
    };
    let mut host_us = 0.0;
    let b2b_us = timed(&mut d, "back to back", &mut |d| {
        let (us, host) = time_back_to_back(cli, stream, || launch(d).map(|_| ()))?;
        host_us = host;
        Ok(us)
    })?;
    let graph_us = timed(&mut d, "graph", &mut |d| time_graph(cli, stream, rot.calls, || launch(d).map(|_| ())))?;
    let loop_graph_us = timed(&mut d, "loop of gemm", &mut |d| time_graph(cli, stream, rot.calls, || loop_launch(d)))?;
    let list_graph_us = timed(&mut d, "list form", &mut |d| time_graph(cli, stream, rot.calls, || list_launch(d)))?;
    let (mut w4a16_config, mut w4a16_graph_us) = (None, None);
    if w4a16_workspace.is_some() {
        // The config, from one launch ahead of the timing (whose poison then covers it).
        w4a16_config = Some(w4a16_launch(&mut d)?);
        w4a16_graph_us = Some(timed(&mut d, "W4A16", &mut |d| time_graph(cli, stream, rot.calls, || w4a16_launch(d).map(|_| ())))?);
    }
    // The MoE form with the weights prepacked (Hopper only), the rule's config for them.
    let mut prepacked_graph_us = None;
    if config.info().arch == 90 {
        let mut packed = Vec::with_capacity(rot.sets);
        for s in &sets {
            packed.push(Nvfp4Tensor::new(s.b.as_view(), s.sfb.as_view(), (experts, n, k), 1.0)?.prepack(stream)?.into_parts().0);
        }
        let packed_launch = |d: &mut Rotated<bf16>| -> Result<(), blockscaled_gemm::Error> {
            let s = turns.next();
            let set = &sets[s];
            let a = MoeActivations::new(set.a.as_view(), set.sfa.as_view(), (t, k), 1.0)?;
            let b = Nvfp4Tensor::new_prepacked(packed[s].as_view(), set.sfb.as_view(), (experts, n, k), 1.0)?;
            gemm.moe_gemm(&p, &a, &b, &offsets_dev, &ones, &mut d.set(s), Some(config)).map(|_| ())
        };
        prepacked_graph_us = Some(timed(&mut d, "prepacked weights", &mut |d| time_graph(cli, stream, rot.calls, || packed_launch(d)))?);
    }
    let floor_us = (bytes as f64 / (floor_gbps * 1e9)).max(2.0 * (t * n * k) as f64 / 800e12) * 1e6;
    Ok(GroupedResult { config, rot, experts_hit: hit.len(), b2b_us, graph_us, prepacked_graph_us, host_us, loop_graph_us, list_config, list_graph_us, w4a16_config, w4a16_graph_us, floor_us, bytes, exact })
}

/// The MoE-form quantizer on case `case`'s stacked rows: bf16 (T, K) N(0, 1) data, the case's
/// routing on the device, global scale 4 / 2688 given; inputs and outputs rotated (`rotation`);
/// `exact`: codes, and the scales of the experts' 128-row blocks, equal the CPU quantizer's
/// with `moe_scales`' placement (the buffer's rows past those blocks are not checked). Bytes: the
/// input read, the codes and the scale rows any routing's blocks can reach written (the rest of
/// the buffer is not written).
pub fn bench_quantize_moe(cli: &Cli, q: &blockscaled_gemm::Quantizer, stream: &Arc<CudaStream>, l2: usize, case: &Case) -> Result<crate::QuantResult, Box<dyn std::error::Error>> {
    let (t, k) = (case.counts.iter().sum::<usize>(), case.k);
    let mut rng = SplitMix64::new(7);
    let x: Vec<bf16> = (0..t * k).map(|_| bf16::from_f32(rng.normal() as f32)).collect();
    let g = 4.0 / 2688.0;
    let offsets = expert_offsets(&case.counts)?;
    let want = Nvfp4Matrix::quantize(&x, (1, t, k), Some(g))?;
    let want_scales = moe_scales(&want, &offsets)?;
    let reach = moe_sfa_used_rows(t, case.counts.len()) * padded_sf_cols(k / 16);
    let bytes = 2 * t * k + t * k / 2 + reach;
    let rot = Rotation::new(cli.graph_calls, l2, bytes, false);
    let big = stream.clone_htod(&x.repeat(rot.sets))?;
    let offsets_dev = stream.clone_htod(&offsets)?;
    let launch = |s: usize, codes: &mut CudaViewMut<u8>, scales: &mut CudaViewMut<u8>| {
        q.quantize_moe_into(&big.slice(s * t * k..(s + 1) * t * k), (t, k), &offsets_dev, g, codes, scales)
    };
    let used = moe_scale_starts(&offsets)?[case.counts.len()] * padded_sf_cols(k / 16);
    let check = |codes: &[u8], scales: &[u8]| codes == want.data() && scales[..used] == want_scales[..used];
    crate::time_quantizer(cli, stream, l2, rot, bytes, (t * k / 2, want_scales.len()), launch, check)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &str) -> Result<Vec<String>, String> {
        select(list).map(|v| v.into_iter().map(|c| c.name).collect())
    }

    #[test]
    fn grouped_names_select_cases_once_and_refuse_unknown_ones() {
        assert_eq!(names("all").unwrap().len(), 20);
        assert!(names("none").unwrap().is_empty());
        assert_eq!(names("dsv3-down-t384, g8-n4096-k7168,dsv3-down-t384").unwrap(), ["dsv3-down-t384", "g8-n4096-k7168"]);
        // A model layer at one of the standard token counts is the standard case, routing included.
        let standard = cases().into_iter().find(|c| c.name == "qwen3-30b-a3b-down-t64").unwrap();
        assert_eq!(select("qwen3-30b-a3b-down-t64").unwrap()[0].counts, standard.counts);
        // T tokens, each routed to 8 distinct experts of 256.
        let c = &select("dsv3-down-t384").unwrap()[0];
        assert_eq!((c.n, c.k, c.counts.len(), c.counts.iter().sum::<usize>()), (7168, 2048, 256, 8 * 384));
        assert!(c.counts.iter().all(|&r| r <= 384));
        for bad in ["foo", "dsv3-down-t0", "dsv3-down-t65537", "dsv3-down-t008", "dsv3-down-t+8", "a,,b", "dsv3-mid-t8", "dsv3-down-t8,"] {
            assert!(select(bad).is_err(), "{bad:?} accepted");
        }
    }
}
