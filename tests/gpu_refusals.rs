//! Refused calls on a GPU (from an adversarial review, 2026-11-28): each bad call to the dense,
//! W4A16, quantizer, grouped MoE and list-form entry points returns its typed error and leaves the
//! poisoned outputs (0xA5 bytes) byte-identical. Its own harness (`harness = false`, as
//! tests/gpu.rs) so that a case without a suitable device is counted as skipped, with its reason,
//! never as passed. The host-only halves are tests/refusals_dense.rs and tests/refusals_grouped.rs.
#![allow(clippy::too_many_arguments, clippy::type_complexity)]
use blockscaled_gemm::grouped::{expert_offsets, moe_scales, moe_sfa_bytes, reference_moe, MAX_EXPERTS};
use blockscaled_gemm::layout;
use blockscaled_gemm::{BlockScaledGemm, Config, Error, ListArrays, ListGroup, ListProblem, MoeActivations, MoeProblem, Nvfp4Activations, Nvfp4Matrix, Nvfp4Output, Nvfp4Tensor, OutType, Problem, Quantizer};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr};
use half::{bf16, f16};
use std::sync::Arc;

mod harness;
use harness::Outcome;

fn main() {
    let tests: &[(&str, fn() -> Outcome)] = &[
        ("gpu_sm100_batch_stride_overflow_is_refused", gpu_sm100_batch_stride_overflow_is_refused),
        ("gpu_workspace_limit_below_need_writes_nothing", gpu_workspace_limit_below_need_writes_nothing),
        ("gpu_forced_split_k_refusals_write_nothing", gpu_forced_split_k_refusals_write_nothing),
        ("gpu_refused_forms_write_nothing", gpu_refused_forms_write_nothing),
        ("gpu_bad_global_scales_are_refused", gpu_bad_global_scales_are_refused),
        ("gpu_quantize_computed_scale_on_edge_inputs", gpu_quantize_computed_scale_on_edge_inputs),
        ("gpu_activations_reused_across_shapes", gpu_activations_reused_across_shapes),
        ("gpu_w4a16_refusals_write_nothing", gpu_w4a16_refusals_write_nothing),
        ("gpu_prepack_odd_shapes", gpu_prepack_odd_shapes),
        ("gpu_moe_gemm_bad_lengths_and_shapes_write_nothing", gpu_moe_gemm_bad_lengths_and_shapes_write_nothing),
        ("gpu_moe_gemm_bad_scalars_alignment_and_configs_write_nothing", gpu_moe_gemm_bad_scalars_alignment_and_configs_write_nothing),
        ("gpu_moe_gemm_workspace_limit_writes_nothing", gpu_moe_gemm_workspace_limit_writes_nothing),
        ("gpu_moe_gemm_device_offsets_outside_the_contract", gpu_moe_gemm_device_offsets_outside_the_contract),
        ("gpu_moe_gemm_zero_rows", gpu_moe_gemm_zero_rows),
        ("gpu_moe_gemm_w4a16_bad_inputs_write_nothing", gpu_moe_gemm_w4a16_bad_inputs_write_nothing),
        ("gpu_quantize_moe_bad_inputs_write_nothing", gpu_quantize_moe_bad_inputs_write_nothing),
        ("gpu_grouped_list_bad_groups_write_nothing", gpu_grouped_list_bad_groups_write_nothing),
        ("gpu_grouped_list_raw_bad_arrays_are_refused", gpu_grouped_list_raw_bad_arrays_are_refused),
        ("gpu_select_list_config_refuses_what_the_call_refuses", gpu_select_list_config_refuses_what_the_call_refuses),
    ];
    harness::run("gpu_refusals", tests);
}

/// The GEMM on a new stream of device 0, or the reason there is none.
fn gpu() -> Result<BlockScaledGemm, String> {
    harness::gpu_present()?;
    let stream = CudaContext::new(0).expect("context").new_stream().expect("stream");
    Ok(BlockScaledGemm::new(stream).expect("gemm"))
}

/// [`gpu`] on a device of compute capability `cc` only.
fn gpu_cc(cc: (i32, i32)) -> Result<BlockScaledGemm, String> {
    let g = gpu()?;
    if g.device().compute_capability != cc {
        return Err(format!("device is {:?}, this case needs {cc:?}", g.device().compute_capability));
    }
    Ok(g)
}

/// [`gpu`] on a device that runs this build's kernels (SM90 or SM100).
fn gpu_with_kernels() -> Result<BlockScaledGemm, String> {
    let g = gpu()?;
    if g.device().arch().is_none() {
        return Err(format!("device {:?} runs no kernel of this build", g.device().compute_capability));
    }
    Ok(g)
}

fn sm100_configs() -> impl Iterator<Item = Config> {
    Config::ALL.iter().copied().filter(|c| c.info().arch == 100)
}

/// `n` elements of `T` whose bytes are all 0xA5.
fn poison<T: DeviceRepr + Copy + bytemuck_like::Bits>(s: &Arc<CudaStream>, n: usize) -> CudaSlice<T> {
    s.clone_htod(&vec![T::a5(); n]).unwrap()
}

fn bytes_of<T: DeviceRepr + Copy + bytemuck_like::Bits>(s: &Arc<CudaStream>, d: &CudaSlice<T>) -> Vec<u8> {
    s.synchronize().unwrap();
    s.clone_dtoh(d).unwrap().into_iter().flat_map(|x| x.to_le()).collect()
}

fn assert_poisoned<T: DeviceRepr + Copy + bytemuck_like::Bits>(s: &Arc<CudaStream>, d: &CudaSlice<T>, what: &str) {
    let b = bytes_of(s, d);
    assert!(b.iter().all(|&x| x == 0xA5), "{what}: a refused call wrote the buffer");
}

/// The poison and byte views of the element types used here.
mod bytemuck_like {
    pub trait Bits {
        fn a5() -> Self;
        fn to_le(self) -> Vec<u8>;
    }
    impl Bits for u8 {
        fn a5() -> Self { 0xA5 }
        fn to_le(self) -> Vec<u8> { vec![self] }
    }
    impl Bits for f32 {
        fn a5() -> Self { f32::from_bits(0xA5A5_A5A5) }
        fn to_le(self) -> Vec<u8> { self.to_bits().to_le_bytes().to_vec() }
    }
    impl Bits for half::f16 {
        fn a5() -> Self { half::f16::from_bits(0xA5A5) }
        fn to_le(self) -> Vec<u8> { self.to_bits().to_le_bytes().to_vec() }
    }
    impl Bits for half::bf16 {
        fn a5() -> Self { half::bf16::from_bits(0xA5A5) }
        fn to_le(self) -> Vec<u8> { self.to_bits().to_le_bytes().to_vec() }
    }
}

fn operands(s: &Arc<CudaStream>, m: usize, n: usize, k: usize, l: usize) -> (Nvfp4Tensor, Nvfp4Tensor) {
    let a = Nvfp4Matrix::random_contest((l, m, k), 11).unwrap();
    let b = Nvfp4Matrix::random_contest((l, n, k), 12).unwrap();
    (Nvfp4Tensor::upload(&a, s).unwrap(), Nvfp4Tensor::upload(&b, s).unwrap())
}

/// SM100: a batched problem whose A batch stride (M*K) is 2^31 elements. Without the Rust check
/// the CUTLASS kernel addresses batch 1 at a wrapped, negative offset (out-of-bounds reads of
/// A: an illegal address or garbage). Expect SizeLimit ("A batch stride"), D untouched.
/// Memory: A 2 GiB, SFA 256 MiB, D 16 MiB.
fn gpu_sm100_batch_stride_overflow_is_refused() -> Outcome {
    let g = gpu_cc((10, 0))?;
    let s = g.stream().clone();
    let p = Problem::new(1 << 16, 64, 1 << 15).batch(2);
    let a = Nvfp4Tensor::new(s.alloc_zeros::<u8>(p.a_bytes()).unwrap(), s.alloc_zeros::<u8>(p.sfa_bytes()).unwrap(), (2, p.m, p.k), 1.0).unwrap();
    let b = Nvfp4Tensor::new(s.alloc_zeros::<u8>(p.b_bytes()).unwrap(), s.alloc_zeros::<u8>(p.sfb_bytes()).unwrap(), (2, p.n, p.k), 1.0).unwrap();
    let mut d = poison::<f16>(&s, p.cd_elems());
    let e = g.gemm(&p, &a, &b, &mut d, None).unwrap_err();
    assert!(matches!(e, Error::SizeLimit { .. }) && e.to_string().contains("batch stride"), "{e}");
    for c in sm100_configs().filter(|c| c.is_built(OutType::F16)) {
        let e = g.gemm(&p, &a, &b, &mut d, Some(c)).unwrap_err();
        assert!(matches!(e, Error::SizeLimit { .. }), "{c}: {e}");
    }
    assert_poisoned(&s, &d, "D");
    // D's stride (M*N = 2^31, D 8 GiB of f16) is refused by the same rule without allocating it.
    let q = Problem::new(1 << 15, 1 << 16, 64).batch(2);
    assert!(matches!(g.select_config(&q, OutType::F16), Err(Error::SizeLimit { .. })));
    assert!(matches!(g.workspace_size(&q, OutType::F16, None), Err(Error::SizeLimit { .. })));
    Ok(())
}

/// Workspace limit below the need, on the calls not covered by tests/gpu.rs: W4A16 on a swapped
/// tile (the re-ordered activations) and FP4 output split through global memory (Hopper), and
/// gemm_decoded. Expect WorkspaceLimit { need, limit }, D (and SFD) untouched, workspace not grown.
fn gpu_workspace_limit_below_need_writes_nothing() -> Outcome {
    let g = gpu_cc((9, 0))?;
    let s = g.stream().clone();
    // W4A16, 256 x 4096 x 7168: a swapped tile.
    let p = Problem::new(256, 4096, 7168);
    let need = g.w4a16_workspace_size::<bf16>(&p, OutType::Bf16, None).unwrap();
    assert!(need > 0);
    let (_, b) = operands(&s, 1, p.n, p.k, 1);
    let x = s.clone_htod(&vec![bf16::from_f32(0.5); p.m * p.k]).unwrap();
    let mut d = poison::<bf16>(&s, p.cd_elems());
    unsafe { g.release_workspace() }.unwrap();
    g.set_workspace_limit(Some(need - 1));
    let e = g.gemm_w4a16(&p, &x, &b, &mut d, None).unwrap_err();
    assert!(matches!(e, Error::WorkspaceLimit { need: n, limit } if n == need && limit == need - 1), "{e}");
    assert_poisoned(&s, &d, "W4A16 D");
    assert_eq!(g.workspace_bytes(), 0);
    // FP4 output, 64 x 4096 x 7168: split 3 through global memory.
    let p = Problem::new(64, 4096, 7168);
    let need = g.workspace_size(&p, OutType::Nvfp4, None).unwrap();
    if need > 0 {
        let (a, b) = operands(&s, p.m, p.n, p.k, 1);
        let (mut dv, mut ds) = (poison::<u8>(&s, p.cd_elems() / 2), poison::<u8>(&s, p.sfd_bytes()));
        g.set_workspace_limit(Some(need - 1));
        let e = g.gemm_fp4(&p, OutType::Nvfp4, &a, &b, Nvfp4Output::new(&mut dv, &mut ds), None).unwrap_err();
        assert!(matches!(e, Error::WorkspaceLimit { .. }), "{e}");
        assert_poisoned(&s, &dv, "FP4 D");
        assert_poisoned(&s, &ds, "SFD");
    } else {
        println!("64x4096x7168 nvfp4 needs no workspace here");
    }
    // gemm_decoded on a swapped pick needs only split-K counters, if any: a limit of 0 either
    // passes or is WorkspaceLimit; D is written only on success.
    let p = Problem::new(128, 4096, 7168);
    let mut xq = Nvfp4Activations::new(&s, (1, p.m, p.k)).unwrap();
    let xs = s.clone_htod(&vec![bf16::from_f32(0.25); p.m * p.k]).unwrap();
    Quantizer::new(s.clone()).quantize_decoded_into(&xs, 1.0 / 2688.0, &mut xq).unwrap();
    let (_, b) = operands(&s, 1, p.n, p.k, 1);
    let mut d = poison::<f16>(&s, p.cd_elems());
    g.set_workspace_limit(Some(0));
    match g.gemm_decoded(&p, &xq, &b, &mut d, None) {
        Err(Error::WorkspaceLimit { .. }) => assert_poisoned(&s, &d, "decoded D"),
        Ok(c) => println!("gemm_decoded {c} ran with no workspace"),
        Err(e) => panic!("{e}"),
    }
    g.set_workspace_limit(None);
    Ok(())
}

/// Forced split-K the call must refuse: 0, more ranges than k-tiles, and (prepacked B) more than
/// one range per 256 values of K. Expect InvalidData { what: "split_k" }, D untouched.
fn gpu_forced_split_k_refusals_write_nothing() -> Outcome {
    let g0 = gpu_cc((9, 0))?;
    let s = g0.stream().clone();
    let p = Problem::new(128, 1024, 512); // 8 k-tiles, 2 prepacked chunks
    let (a, b) = operands(&s, p.m, p.n, p.k, 1);
    let packed = b.prepack::<u8, u8>(&s).unwrap();
    let mut d = poison::<f16>(&s, p.cd_elems());
    for split in [0, 9, 65535, u32::MAX] {
        let g = BlockScaledGemm::new(s.clone()).unwrap().with_split_k(Some(split));
        let e = g.gemm(&p, &a, &b, &mut d, None).unwrap_err();
        assert!(matches!(e, Error::InvalidData { what: "split_k", .. }), "{split}: {e}");
        assert!(g.workspace_size(&p, OutType::F16, None).is_err(), "{split}");
    }
    for split in [3, 8] {
        let g = BlockScaledGemm::new(s.clone()).unwrap().with_split_k(Some(split));
        let e = g.gemm(&p, &a, &packed, &mut d, Some(Config::Sm90_128x128x64)).unwrap_err();
        assert!(matches!(e, Error::InvalidData { what: "split_k", .. }), "prepacked {split}: {e}");
    }
    assert_poisoned(&s, &d, "D");
    Ok(())
}

/// Calls refused for their form: gemm_fp4 with a 16-bit output type, a prepacked A, a prepacked
/// B on SM100, a C one element short, a D one element long, global scales whose product with
/// alpha overflows. Each typed; D (and SFD) untouched.
fn gpu_refused_forms_write_nothing() -> Outcome {
    let g = gpu_with_kernels()?;
    let s = g.stream().clone();
    let p = Problem::new(128, 256, 512);
    let (a, b) = operands(&s, p.m, p.n, p.k, 1);
    let (mut dv, mut ds) = (poison::<u8>(&s, p.cd_elems() / 2), poison::<u8>(&s, p.sfd_bytes()));
    let e = g.gemm_fp4(&p, OutType::F16, &a, &b, Nvfp4Output::new(&mut dv, &mut ds), None).unwrap_err();
    assert!(matches!(e, Error::InvalidData { what: "out", .. }), "{e}");
    assert_poisoned(&s, &dv, "FP4 D");
    assert_poisoned(&s, &ds, "SFD");

    let mut d = poison::<f32>(&s, p.cd_elems());
    // Prepacked A (a weight layout).
    let (a_sq, _) = operands(&s, p.m, p.m, p.k, 1);
    let a_packed = a_sq.prepack::<u8, u8>(&s).unwrap();
    let e = g.gemm(&p, &a_packed, &b, &mut d, None).unwrap_err();
    assert!(matches!(e, Error::Layout { name: "A", .. }), "{e}");
    // Prepacked B on SM100.
    if g.device().arch() == Some(100) {
        let bp = b.prepack::<u8, u8>(&s).unwrap();
        let e = g.gemm(&p, &a, &bp, &mut d, None).unwrap_err();
        assert!(matches!(e, Error::Layout { name: "B", .. }), "{e}");
    }
    // C short, D long.
    let c = s.alloc_zeros::<f32>(p.cd_elems() - 1).unwrap();
    let e = g.gemm_with_c(&p.scalars(1.0, 1.0), &a, &b, &c, &mut d, None).unwrap_err();
    assert!(matches!(e, Error::BufferLength { name: "C", .. }), "{e}");
    let mut d_long = poison::<f32>(&s, p.cd_elems() + 1);
    let e = g.gemm(&p, &a, &b, &mut d_long, None).unwrap_err();
    assert!(matches!(e, Error::BufferLength { name: "D", .. }), "{e}");
    assert_poisoned(&s, &d_long, "D long");
    // alpha * ga * gb overflows f32.
    let big_a = Nvfp4Tensor::new(a.values().as_view(), a.scales().as_view(), a.shape(), 1e30).unwrap();
    let big_b = Nvfp4Tensor::new(b.values().as_view(), b.scales().as_view(), b.shape(), 1e30).unwrap();
    let e = g.gemm(&p, &big_a, &big_b, &mut d, None).unwrap_err();
    assert!(matches!(e, Error::InvalidData { what: "alpha", .. }), "{e}");
    // beta nonzero without C.
    let e = g.gemm(&p.scalars(1.0, 0.5), &a, &b, &mut d, None).unwrap_err();
    assert!(matches!(e, Error::BetaWithoutC { .. }), "{e}");
    assert_poisoned(&s, &d, "D");
    Ok(())
}

/// Global scales that are not finite and positive: refused by the tensor constructors and by
/// the quantizer before it writes codes or scales.
fn gpu_bad_global_scales_are_refused() -> Outcome {
    let g = gpu()?;
    let s = g.stream().clone();
    let (rows, k) = (16, 64);
    let v = s.alloc_zeros::<u8>(rows * k / 2).unwrap();
    let sf = s.alloc_zeros::<u8>(layout::sf_bytes((1, rows, k))).unwrap();
    let x = s.clone_htod(&vec![f16::from_f32(1.0); rows * k]).unwrap();
    let (mut codes, mut scales) = (poison::<u8>(&s, rows * k / 2), poison::<u8>(&s, layout::sf_bytes((1, rows, k))));
    let q = Quantizer::new(s.clone());
    for gs in [0.0, -0.0, -1.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        assert!(matches!(Nvfp4Tensor::new(v.as_view(), sf.as_view(), (1, rows, k), gs), Err(Error::InvalidData { .. })), "{gs}");
        assert!(matches!(Nvfp4Tensor::new_prepacked(v.as_view(), sf.as_view(), (1, rows, k), gs), Err(Error::InvalidData { .. }) | Err(Error::BufferLength { .. })), "{gs}");
        let e = q.quantize_into(&x, (1, rows, k), gs, &mut codes, &mut scales).unwrap_err();
        assert!(matches!(e, Error::InvalidData { what: "global scale", .. }), "{gs}: {e}");
        let e = q.quantize_swiglu_into(&s.clone_htod(&vec![f16::ZERO; rows * 2 * k]).unwrap(), (1, rows, k), gs, &mut codes, &mut scales).unwrap_err();
        assert!(matches!(e, Error::InvalidData { what: "global scale", .. }), "{gs}: {e}");
        assert!(q.quantize(&x, (1, rows, k), Some(gs)).is_err(), "{gs}");
    }
    assert_poisoned(&s, &codes, "codes");
    assert_poisoned(&s, &scales, "scales");
    Ok(())
}

/// The computed global scale (None) on edge inputs: all zeros (scale 1, codes 0), all NaN
/// (NaN does not raise the amax: scale 1), an infinity (typed error, documented), f16 max.
fn gpu_quantize_computed_scale_on_edge_inputs() -> Outcome {
    let g = gpu_with_kernels()?;
    let s = g.stream().clone();
    let q = Quantizer::new(s.clone());
    let (rows, k) = (3, 32);
    let n = rows * k;
    let t = q.quantize(&s.clone_htod(&vec![f16::ZERO; n]).unwrap(), (1, rows, k), None).unwrap();
    assert_eq!(t.global_scale(), 1.0);
    assert!(s.clone_dtoh(t.values()).unwrap().iter().all(|&b| b == 0), "zeros quantize to code 0");
    let t = q.quantize(&s.clone_htod(&vec![f16::NAN; n]).unwrap(), (1, rows, k), None).unwrap();
    assert_eq!(t.global_scale(), 1.0, "NaN does not raise the amax");
    let mut with_inf = vec![f16::from_f32(1.0); n];
    with_inf[n - 1] = f16::NEG_INFINITY;
    let e = q.quantize(&s.clone_htod(&with_inf).unwrap(), (1, rows, k), None).unwrap_err();
    assert!(matches!(e, Error::InvalidData { what: "x", .. }), "{e}");
    let t = q.quantize(&s.clone_htod(&vec![f16::MAX; n]).unwrap(), (1, rows, k), None).unwrap();
    assert_eq!(t.global_scale(), 65504.0 / 2688.0);
    // Wrong lengths and shapes: typed, no allocation visible.
    assert!(matches!(q.quantize(&s.clone_htod(&vec![f16::ZERO; n + 1]).unwrap(), (1, rows, k), None), Err(Error::BufferLength { .. })));
    assert!(matches!(q.quantize(&s.clone_htod(&vec![f16::ZERO; n]).unwrap(), (1, rows, 24), None), Err(Error::KMultiple { .. }) | Err(Error::BufferLength { .. })));
    assert!(matches!(q.quantize(&s.clone_htod(&vec![f16::ZERO; 16]).unwrap(), (65536, 1, 16), None), Err(Error::Dimension { .. })));
    Ok(())
}

/// Nvfp4Activations made for one shape, used with another: the quantizer refuses x of the other
/// length, the GEMM a problem of the other shape; neither writes the activations or D.
fn gpu_activations_reused_across_shapes() -> Outcome {
    let g = gpu_with_kernels()?;
    let s = g.stream().clone();
    let q = Quantizer::new(s.clone());
    let (m, n, k) = (64, 256, 512);
    let mut xq = Nvfp4Activations::new(&s, (1, m, k)).unwrap();
    q.quantize_decoded_into(&s.clone_htod(&vec![bf16::from_f32(0.75); m * k]).unwrap(), 1.0 / 2688.0, &mut xq).unwrap();
    s.synchronize().unwrap();
    let before = (s.clone_dtoh(xq.tensor().values()).unwrap(), s.clone_dtoh(xq.tensor().scales()).unwrap(), s.clone_dtoh(xq.decoded()).unwrap(), xq.tensor().global_scale());
    let other = s.clone_htod(&vec![bf16::from_f32(0.5); 32 * k]).unwrap();
    let e = q.quantize_decoded_into(&other, 1.0 / 1000.0, &mut xq).unwrap_err();
    assert!(matches!(e, Error::BufferLength { name: "x", .. }), "{e}");
    let e = q.quantize_swiglu_decoded_into(&other, 1.0 / 1000.0, &mut xq).unwrap_err();
    assert!(matches!(e, Error::BufferLength { name: "x", .. }), "{e}");
    let e = q.quantize_decoded_into(&other, f32::NAN, &mut xq).unwrap_err();
    assert!(matches!(e, Error::InvalidData { .. }), "{e}");
    s.synchronize().unwrap();
    let after = (s.clone_dtoh(xq.tensor().values()).unwrap(), s.clone_dtoh(xq.tensor().scales()).unwrap(), s.clone_dtoh(xq.decoded()).unwrap(), xq.tensor().global_scale());
    assert!(before == after, "a refused quantization changed the activations or their global scale");
    let (_, b) = operands(&s, 1, n, k, 1);
    let mut d = poison::<f16>(&s, 32 * n);
    let e = g.gemm_decoded(&Problem::new(32, n, k), &xq, &b, &mut d, None).unwrap_err();
    assert!(matches!(e, Error::OperandShape { name: "A", .. }), "{e}");
    let e = g.gemm_decoded(&Problem::new(64, n, k).batch(2), &xq, &b, &mut d, None).unwrap_err();
    assert!(matches!(e, Error::OperandShape { .. }), "{e}");
    assert_poisoned(&s, &d, "D");
    Ok(())
}

/// W4A16: a misaligned activation view, activations one short, an FP4 output type by the
/// forced-config route, a config without W4A16 kernels. Typed; D untouched. SM100: the
/// W4A16 call is UnsupportedDevice.
fn gpu_w4a16_refusals_write_nothing() -> Outcome {
    let g = gpu()?;
    let s = g.stream().clone();
    let p = Problem::new(16, 256, 512);
    let (_, b) = operands(&s, 1, p.n, p.k, 1);
    let x = s.clone_htod(&vec![f16::from_f32(1.0); p.m * p.k + 8]).unwrap();
    let mut d = poison::<f16>(&s, p.cd_elems());
    if g.device().compute_capability != (9, 0) {
        let e = g.gemm_w4a16(&p, &x.slice(..p.m * p.k), &b, &mut d, None).unwrap_err();
        assert!(matches!(e, Error::UnsupportedDevice { .. }), "{e}");
        assert_poisoned(&s, &d, "D");
        return Ok(());
    }
    let e = g.gemm_w4a16(&p, &x.slice(1..p.m * p.k + 1), &b, &mut d, None).unwrap_err();
    assert!(matches!(e, Error::Misaligned { name: "A", .. }), "{e}");
    let e = g.gemm_w4a16(&p, &x.slice(..p.m * p.k - 1), &b, &mut d, None).unwrap_err();
    assert!(matches!(e, Error::BufferLength { name: "A", .. }), "{e}");
    let e = g.gemm_w4a16(&p, &x.slice(..p.m * p.k), &b, &mut d, Some(Config::Sm90_128x64x64)).unwrap_err();
    assert!(matches!(e, Error::NotBuilt { .. }), "{e}");
    let e = g.gemm_w4a16(&p, &x.slice(..p.m * p.k), &b, &mut d, Some(Config::Sm100_1Sm_128x128x256)).unwrap_err();
    assert!(matches!(e, Error::ArchMismatch { .. }), "{e}");
    assert_poisoned(&s, &d, "D");
    Ok(())
}

/// prepack/unpack of odd shapes: one row, K = 32 (one partial chunk), batch 3; K = 48 made as a
/// prepacked tensor cannot unpack (K % 32); a second prepack is a Layout error.
fn gpu_prepack_odd_shapes() -> Outcome {
    let g = gpu()?;
    let s = g.stream().clone();
    for (rows, k, batch) in [(1, 32, 3), (129, 288, 2), (7, 2080, 1)] {
        let m = Nvfp4Matrix::random_contest((batch, rows, k), 5).unwrap();
        let t = Nvfp4Tensor::upload(&m, &s).unwrap();
        let p = t.prepack::<u8, u8>(&s).unwrap();
        let want = layout::prepack_values(m.data(), (batch, rows, k)).unwrap();
        assert_eq!(s.clone_dtoh(p.values()).unwrap(), want, "{rows} {k} {batch}");
        assert!(matches!(p.prepack::<u8, u8>(&s), Err(Error::Layout { .. })));
        let u = p.unpack::<u8, u8>(&s).unwrap();
        assert_eq!(s.clone_dtoh(u.values()).unwrap(), m.data(), "{rows} {k} {batch}");
    }
    let (rows, k) = (5, 48);
    let v = s.alloc_zeros::<u8>(layout::prepacked_bytes((1, rows, k))).unwrap();
    let sf = s.alloc_zeros::<u8>(layout::sf_bytes((1, rows, k))).unwrap();
    let t = Nvfp4Tensor::new_prepacked(v.as_view(), sf.as_view(), (1, rows, k), 1.0).unwrap();
    assert!(matches!(t.unpack::<u8, u8>(&s), Err(Error::KMultiple { .. })));
    // A standard-length buffer passed as prepacked (and the other way) is a length error.
    let std_v = s.alloc_zeros::<u8>(rows * 64 / 2).unwrap();
    let sf64 = s.alloc_zeros::<u8>(layout::sf_bytes((1, rows, 64))).unwrap();
    assert!(matches!(Nvfp4Tensor::new_prepacked(std_v.as_view(), sf64.as_view(), (1, rows, 64), 1.0), Err(Error::BufferLength { .. })));
    let pk_v = s.alloc_zeros::<u8>(layout::prepacked_bytes((1, rows, 64))).unwrap();
    assert!(matches!(Nvfp4Tensor::new(pk_v.as_view(), sf64.as_view(), (1, rows, 64), 1.0), Err(Error::BufferLength { .. })));
    Ok(())
}

/// T = 100 rows over E = 4 experts, N = 256, K = 512, routed [30, 0, 50, 20].
struct Moe {
    p: MoeProblem,
    x: Nvfp4Matrix,
    w: Nvfp4Matrix,
    offsets: Vec<i32>,
    a: MoeActivations,
    b: Nvfp4Tensor,
    o: CudaSlice<i32>,
    es: CudaSlice<f32>,
}

fn moe(s: &Arc<CudaStream>) -> Moe {
    let (t, n, k, e) = (100, 256, 512, 4);
    let x = Nvfp4Matrix::random_contest((1, t, k), 1).unwrap();
    let w = Nvfp4Matrix::random_contest((e, n, k), 2).unwrap();
    let offsets = expert_offsets(&[30, 0, 50, 20]).unwrap();
    let sfa = moe_scales(&x, &offsets).unwrap();
    let a = MoeActivations::new(s.clone_htod(x.data()).unwrap(), s.clone_htod(&sfa).unwrap(), (t, k), 1.0).unwrap();
    let b = Nvfp4Tensor::upload(&w, s).unwrap();
    let o = s.clone_htod(&offsets).unwrap();
    let es = s.clone_htod(&[1.0f32, 0.5, 2.0, 0.25]).unwrap();
    Moe { p: MoeProblem::new(t, n, k, e), x, w, offsets, a, b, o, es }
}

fn gpu_moe_gemm_bad_lengths_and_shapes_write_nothing() -> Outcome {
    let g = gpu()?;
    let s = g.stream().clone();
    let m = moe(&s);
    let mut d = poison::<f16>(&s, m.p.d_elems());
    // Offsets: E entries (too few) and E + 2 (too many).
    for len in [m.p.experts, m.p.experts + 2] {
        let o = s.clone_htod(&vec![0i32; len]).unwrap();
        let e = g.moe_gemm(&m.p, &m.a, &m.b, &o, &m.es, &mut d, None).unwrap_err();
        assert!(matches!(e, Error::BufferLength { name: "offsets", .. }), "{e:?}");
    }
    // Expert scales: E - 1 and E + 1.
    for len in [m.p.experts - 1, m.p.experts + 1] {
        let es = s.clone_htod(&vec![1.0f32; len]).unwrap();
        let e = g.moe_gemm(&m.p, &m.a, &m.b, &m.o, &es, &mut d, None).unwrap_err();
        assert!(matches!(e, Error::BufferLength { name: "expert_scales", .. }), "{e:?}");
    }
    // D one element short (a view of the poisoned buffer).
    let e = g.moe_gemm(&m.p, &m.a, &m.b, &m.o, &m.es, &mut d.slice_mut(0..m.p.d_elems() - 1), None).unwrap_err();
    assert!(matches!(e, Error::BufferLength { name: "D", .. }), "{e:?}");
    // Activations whose own lengths are wrong are refused when made: values one byte short or
    // long, K off 16 (and 0), scales short of one expert's MoE layout.
    let (t, k) = (m.p.rows, m.p.k);
    let (x, sfa) = (s.clone_htod(m.x.data()).unwrap(), s.clone_htod(&moe_scales(&m.x, &m.offsets).unwrap()).unwrap());
    let long = s.alloc_zeros::<u8>(t * k / 2 + 1).unwrap();
    for values in [x.slice(..t * k / 2 - 1), long.as_view()] {
        let e = MoeActivations::new(values, sfa.as_view(), (t, k), 1.0).unwrap_err();
        assert!(matches!(e, Error::BufferLength { name: "A", .. }), "{e:?}");
    }
    for bad_k in [8, 520] {
        let e = MoeActivations::new(x.as_view(), sfa.as_view(), (t, bad_k), 1.0).unwrap_err();
        assert!(matches!(e, Error::KMultiple { .. }), "{e:?}");
    }
    let e = MoeActivations::new(x.as_view(), sfa.as_view(), (t, 0), 1.0).unwrap_err();
    assert!(matches!(e, Error::Dimension { dim: "K", .. }), "{e:?}");
    let e = MoeActivations::new(x.as_view(), sfa.slice(..moe_sfa_bytes(t, k, 1) - 1), (t, k), 1.0).unwrap_err();
    assert!(matches!(e, Error::InvalidData { what: "SFA", .. }), "{e:?}");
    // A's scales in the dense layout (T rows padded once) instead of the MoE one: enough for one
    // expert, so made, and refused by the call that knows E.
    let dense = MoeActivations::new(s.clone_htod(m.x.data()).unwrap(), s.clone_htod(m.x.scales()).unwrap(), (m.p.rows, m.p.k), 1.0).unwrap();
    let e = g.moe_gemm(&m.p, &dense, &m.b, &m.o, &m.es, &mut d, None).unwrap_err();
    assert!(matches!(e, Error::BufferLength { name: "SFA", .. }), "{e:?}");
    // A of another T; B of another E.
    let p2 = MoeProblem { rows: m.p.rows - 1, ..m.p };
    let e = g.moe_gemm(&p2, &m.a, &m.b, &m.o, &m.es, &mut d.slice_mut(0..p2.d_elems()), None).unwrap_err();
    assert!(matches!(e, Error::OperandShape { name: "A", .. }), "{e:?}");
    let p3 = MoeProblem { experts: 3, ..m.p };
    let e = g.moe_gemm(&p3, &m.a, &m.b, &m.o, &m.es, &mut d, None).unwrap_err();
    assert!(matches!(e, Error::BufferLength { name: "SFA", .. } | Error::OperandShape { name: "B", .. }), "{e:?}");
    // Zero experts, too many experts.
    for experts in [0, MAX_EXPERTS + 1] {
        let e = g.moe_gemm(&MoeProblem { experts, ..m.p }, &m.a, &m.b, &m.o, &m.es, &mut d, None).unwrap_err();
        assert!(matches!(e, Error::Dimension { dim: "experts", .. }), "{e:?}");
    }
    // T past the kernels' 32-bit counts: refused by validate before any length.
    let e = g.moe_gemm(&MoeProblem { rows: 1 << 31, ..m.p }, &m.a, &m.b, &m.o, &m.es, &mut d, None).unwrap_err();
    assert!(matches!(e, Error::Dimension { .. } | Error::SizeLimit { .. }), "{e:?}");
    assert_poisoned(&s, &d, "bad lengths");
    Ok(())
}

fn gpu_moe_gemm_bad_scalars_alignment_and_configs_write_nothing() -> Outcome {
    let g = gpu()?;
    let s = g.stream().clone();
    let m = moe(&s);
    let mut d = poison::<f16>(&s, m.p.d_elems() + 8);
    for alpha in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let e = g.moe_gemm(&m.p.alpha(alpha), &m.a, &m.b, &m.o, &m.es, &mut d.slice_mut(0..m.p.d_elems()), None).unwrap_err();
        assert!(matches!(e, Error::NonFiniteScalar { name: "alpha", .. }), "{e:?}");
    }
    // alpha finite but its fold with the global scales overflows.
    let big = MoeActivations::new(s.clone_htod(m.x.data()).unwrap(), s.clone_htod(&moe_scales(&m.x, &m.offsets).unwrap()).unwrap(), (m.p.rows, m.p.k), 1e30).unwrap();
    let e = g.moe_gemm(&m.p.alpha(1e20), &big, &m.b, &m.o, &m.es, &mut d.slice_mut(0..m.p.d_elems()), None).unwrap_err();
    assert!(matches!(e, Error::InvalidData { what: "alpha", .. }), "{e:?}");
    // D one f16 past a 16-byte boundary.
    let e = g.moe_gemm(&m.p, &m.a, &m.b, &m.o, &m.es, &mut d.slice_mut(1..1 + m.p.d_elems()), None).unwrap_err();
    assert!(matches!(e, Error::Misaligned { name: "D", .. }), "{e:?}");
    // Offsets one i32 in (4-byte aligned: allowed) is fine for alignment; the call runs. Not here.
    // A config without grouped kernels, and one of the other architecture.
    let e = g.moe_gemm(&m.p, &m.a, &m.b, &m.o, &m.es, &mut d.slice_mut(0..m.p.d_elems()), Some(Config::Sm90_128x64x64)).unwrap_err();
    assert!(matches!(e, Error::NotBuilt { .. } | Error::ArchMismatch { .. }), "{e:?}");
    let other = if g.device().compute_capability == (9, 0) { Config::Sm100_1Sm_128x128x256 } else { Config::Sm90_Swapped_128x128x64 };
    let e = g.moe_gemm(&m.p, &m.a, &m.b, &m.o, &m.es, &mut d.slice_mut(0..m.p.d_elems()), Some(other)).unwrap_err();
    assert!(matches!(e, Error::ArchMismatch { .. }), "{e:?}");
    // FP4 entry with a 16-bit output type, and bad normalization constants.
    let mut dv = poison::<u8>(&s, m.p.d_elems() / 2);
    let mut sfd = poison::<u8>(&s, m.p.sfd_bytes());
    let e = g.moe_gemm_fp4(&m.p, OutType::F16, &m.a, &m.b, &m.o, &m.es, Nvfp4Output::new(&mut dv, &mut sfd), None).unwrap_err();
    assert!(matches!(e, Error::InvalidData { what: "out", .. }), "{e:?}");
    for nc in [0.0f32, -1.0, f32::NAN, f32::INFINITY] {
        let e = g.moe_gemm_fp4(&m.p.norm_constant(nc), OutType::Nvfp4, &m.a, &m.b, &m.o, &m.es, Nvfp4Output::new(&mut dv, &mut sfd), None).unwrap_err();
        assert!(matches!(e, Error::NormConstant { .. }), "{nc}: {e:?}");
    }
    // SFD in the dense layout.
    let mut sfd_dense = poison::<u8>(&s, blockscaled_gemm::layout::sf_bytes((1, m.p.rows, m.p.n)));
    let e = g.moe_gemm_fp4(&m.p, OutType::Nvfp4, &m.a, &m.b, &m.o, &m.es, Nvfp4Output::new(&mut dv, &mut sfd_dense), None).unwrap_err();
    assert!(matches!(e, Error::BufferLength { name: "SFD", .. }), "{e:?}");
    assert_poisoned(&s, &d, "bad scalars");
    assert_poisoned(&s, &dv, "FP4 D");
    assert_poisoned(&s, &sfd, "FP4 SFD");
    assert_poisoned(&s, &sfd_dense, "FP4 dense SFD");
    Ok(())
}

fn gpu_moe_gemm_workspace_limit_writes_nothing() -> Outcome {
    let g = gpu_cc((9, 0))?;
    let s = g.stream().clone();
    let m = moe(&s);
    let mut d = poison::<f16>(&s, m.p.d_elems());
    // The swapped tile decodes A into the workspace: a fresh GEMM limited to 0 bytes refuses it.
    g.set_workspace_limit(Some(0));
    let e = g.moe_gemm(&m.p, &m.a, &m.b, &m.o, &m.es, &mut d, Some(Config::Sm90_Swapped_128x128x64)).unwrap_err();
    assert!(matches!(e, Error::WorkspaceLimit { .. }), "{e:?}");
    assert!(g.moe_workspace_size(&m.p, OutType::F16, Some(Config::Sm90_Swapped_128x128x64)).unwrap() > 0);
    g.set_workspace_limit(None);
    assert_poisoned(&s, &d, "workspace limit");
    Ok(())
}

/// Device offsets the host never checked: each expert covers the running maximum of the
/// offsets clamped to [0, T] (moe_gemm's documented reading). Offsets that leave every expert
/// empty must leave D (and on Hopper, FP4 SFD) as it was; offsets that give one expert every row
/// must give that expert's GEMM.
fn gpu_moe_gemm_device_offsets_outside_the_contract() -> Outcome {
    let g = gpu()?;
    let s = g.stream().clone();
    let m = moe(&s);
    let t = m.p.rows as i32;
    for bad in [vec![t + 1000; 5], vec![i32::MIN; 5], vec![i32::MAX; 5], vec![t, 0, 0, 0, 0], vec![0; 5]] {
        let o = s.clone_htod(&bad).unwrap();
        let configs: &[Option<Config>] = if g.device().compute_capability == (9, 0) { &[None, Some(Config::Sm90_Swapped_128x128x64)] } else { &[None] };
        for &config in configs {
            let mut d = poison::<f16>(&s, m.p.d_elems());
            g.moe_gemm(&m.p, &m.a, &m.b, &o, &m.es, &mut d, config).unwrap();
            assert_poisoned(&s, &d, &format!("{config:?} offsets {bad:?} (no expert has rows)"));
        }
        if g.device().compute_capability == (9, 0) {
            let (mut dv, mut sfd) = (poison::<u8>(&s, m.p.d_elems() / 2), poison::<u8>(&s, m.p.sfd_bytes()));
            g.moe_gemm_fp4(&m.p, OutType::Nvfp4, &m.a, &m.b, &o, &m.es, Nvfp4Output::new(&mut dv, &mut sfd), None).unwrap();
            assert_poisoned(&s, &dv, "FP4 D, no expert has rows");
            assert_poisoned(&s, &sfd, "FP4 SFD on Hopper, no expert has rows");
        }
    }
    // [0, MAX, MIN, 0, T] reads as [0, T, T, T, T]: expert 0 holds every row.
    let device = [0, i32::MAX, i32::MIN, 0, t];
    let clamped = [0, t, t, t, t];
    let sfa = moe_scales(&m.x, &clamped).unwrap();
    let a = MoeActivations::new(s.clone_htod(m.x.data()).unwrap(), s.clone_htod(&sfa).unwrap(), (m.p.rows, m.p.k), 1.0).unwrap();
    let mut d = poison::<f16>(&s, m.p.d_elems());
    g.moe_gemm(&m.p, &a, &m.b, &s.clone_htod(&device).unwrap(), &m.es, &mut d, None).unwrap();
    let want: Vec<f16> = reference_moe(&m.x, &m.w, &clamped, &[1.0, 0.5, 2.0, 0.25], 1.0).unwrap();
    let got = s.clone_dtoh(&d).unwrap();
    assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "clamped offsets: expert 0's GEMM");
    Ok(())
}

/// T = 0: checked, nothing launched, Ok.
fn gpu_moe_gemm_zero_rows() -> Outcome {
    let g = gpu()?;
    let s = g.stream().clone();
    let p = MoeProblem::new(0, 256, 512, 4);
    let a = MoeActivations::new(s.alloc_zeros::<u8>(0).unwrap(), poison::<u8>(&s, p.sfa_bytes()), (0, 512), 1.0).unwrap();
    let w = Nvfp4Matrix::random_contest((4, 256, 512), 3).unwrap();
    let b = Nvfp4Tensor::upload(&w, &s).unwrap();
    let mut d = s.alloc_zeros::<f16>(0).unwrap();
    g.moe_gemm(&p, &a, &b, &s.clone_htod(&[0i32; 5]).unwrap(), &s.clone_htod(&[1.0f32; 4]).unwrap(), &mut d, None).unwrap();
    // Zero rows but the wrong offsets count is still refused.
    let e = g.moe_gemm(&p, &a, &b, &s.clone_htod(&[0i32; 4]).unwrap(), &s.clone_htod(&[1.0f32; 4]).unwrap(), &mut d, None).unwrap_err();
    assert!(matches!(e, Error::BufferLength { name: "offsets", .. }), "{e:?}");
    Ok(())
}

fn gpu_moe_gemm_w4a16_bad_inputs_write_nothing() -> Outcome {
    let g = gpu_cc((9, 0))?;
    let s = g.stream().clone();
    let m = moe(&s);
    // One element more than A, so that a view one element in stays inside the buffer.
    let x = s.clone_htod(&vec![bf16::from_f32(0.5); m.p.rows * m.p.k + 1]).unwrap();
    let x_a = x.slice(0..m.p.rows * m.p.k);
    let mut d = poison::<f16>(&s, m.p.d_elems());
    let e = g.moe_gemm_w4a16(&m.p, &x.slice(0..m.p.rows * m.p.k - 1), &m.b, &m.o, &m.es, &mut d, None).unwrap_err();
    assert!(matches!(e, Error::BufferLength { name: "A", .. }), "{e:?}");
    let e = g.moe_gemm_w4a16(&m.p, &x_a, &m.b, &s.clone_htod(&[0i32; 4]).unwrap(), &m.es, &mut d, None).unwrap_err();
    assert!(matches!(e, Error::BufferLength { name: "offsets", .. }), "{e:?}");
    let e = g.moe_gemm_w4a16(&m.p.alpha(f32::NAN), &x_a, &m.b, &m.o, &m.es, &mut d, None).unwrap_err();
    assert!(matches!(e, Error::NonFiniteScalar { .. }), "{e:?}");
    // A grouped config without W4A16 kernels for this output... and a W4A16 config without grouped ones.
    let e = g.moe_gemm_w4a16(&m.p, &x_a, &m.b, &m.o, &m.es, &mut d, Some(Config::Sm90_Stream_8x32x64)).unwrap_err();
    assert!(matches!(e, Error::NotBuilt { .. }), "{e:?}");
    let e = g.moe_gemm_w4a16(&m.p, &x.slice(1..1 + m.p.rows * m.p.k), &m.b, &m.o, &m.es, &mut d, None).unwrap_err();
    assert!(matches!(e, Error::Misaligned { name: "A", .. }), "{e:?}");
    assert_poisoned(&s, &d, "w4a16");
    Ok(())
}

fn gpu_quantize_moe_bad_inputs_write_nothing() -> Outcome {
    let g = gpu()?;
    let s = g.stream().clone();
    let q = Quantizer::new(s.clone());
    let (t, k, e) = (100usize, 512usize, 4usize);
    let x = s.clone_htod(&vec![bf16::from_f32(0.25); t * k]).unwrap();
    let o = s.clone_htod(&expert_offsets(&[30, 0, 50, 20]).unwrap()).unwrap();
    let sfb = blockscaled_gemm::grouped::moe_sfa_bytes(t, k, e);
    let (mut codes, mut scales) = (poison::<u8>(&s, t * k / 2), poison::<u8>(&s, sfb));
    for gs in [0.0f32, -1.0, f32::NAN, f32::INFINITY] {
        let err = q.quantize_moe_into(&x, (t, k), &o, gs, &mut codes, &mut scales).unwrap_err();
        assert!(matches!(err, Error::InvalidData { what: "global scale", .. }), "{err:?}");
    }
    for len in [0usize, 1, MAX_EXPERTS + 2] {
        let err = q.quantize_moe_into(&x, (t, k), &s.clone_htod(&vec![0i32; len.max(1)]).unwrap().slice(0..len), 1.0, &mut codes, &mut scales).unwrap_err();
        assert!(matches!(err, Error::Dimension { .. }), "{len}: {err:?}");
    }
    let err = q.quantize_moe_into(&x, (t, k), &o, 1.0, &mut codes, &mut scales.slice_mut(0..sfb - 1)).unwrap_err();
    assert!(matches!(err, Error::BufferLength { name: "scales", .. }), "{err:?}");
    let err = q.quantize_moe_into(&x, (t, k), &o, 1.0, &mut codes.slice_mut(0..t * k / 2 - 1), &mut scales).unwrap_err();
    assert!(matches!(err, Error::BufferLength { name: "codes", .. }), "{err:?}");
    let err = q.quantize_moe_into(&x, (t + 1, k), &o, 1.0, &mut codes, &mut scales).unwrap_err();
    assert!(matches!(err, Error::BufferLength { .. }), "{err:?}");
    let err = q.quantize_moe_swiglu_into(&x, (t, k), &o, 1.0, &mut codes, &mut scales).unwrap_err();
    assert!(matches!(err, Error::BufferLength { name: "x", .. }), "{err:?}");
    let err = q.quantize_moe_into(&x.slice(8..8 + t * k - 8), (t, k), &o, 1.0, &mut codes, &mut scales).unwrap_err();
    assert!(matches!(err, Error::BufferLength { name: "x", .. }), "{err:?}");
    assert_poisoned(&s, &codes, "quantize_moe codes");
    assert_poisoned(&s, &scales, "quantize_moe scales");
    Ok(())
}

fn gpu_grouped_list_bad_groups_write_nothing() -> Outcome {
    let g = gpu()?;
    let s = g.stream().clone();
    let up = |m: &Nvfp4Matrix| Nvfp4Tensor::upload(m, &s).unwrap();
    let a0 = up(&Nvfp4Matrix::random_contest((1, 16, 256), 4).unwrap());
    let b0 = up(&Nvfp4Matrix::random_contest((1, 128, 256), 5).unwrap());
    let b_other_k = up(&Nvfp4Matrix::random_contest((1, 128, 512), 6).unwrap());
    let b_batched = up(&Nvfp4Matrix::random_contest((2, 128, 256), 7).unwrap());
    let mut d0 = poison::<f16>(&s, 16 * 128);
    let mut d1 = poison::<f16>(&s, 16 * 128);
    // Empty list.
    let mut empty: [ListGroup<'_, CudaSlice<u8>, CudaSlice<u8>, CudaSlice<u8>, CudaSlice<u8>, &mut CudaSlice<f16>>; 0] = [];
    let e = g.grouped_list::<_, _, _, _, _, u8, u8, f16>(&mut empty, None).unwrap_err();
    assert!(matches!(e, Error::Dimension { dim: "groups", .. }), "{e:?}");
    // The second group's K differs from its A's, or its B is batched: the first group is good.
    for bad_b in [&b_other_k, &b_batched] {
        let mut groups = [ListGroup { a: &a0, b: &b0, d: &mut d0, alpha: 1.0 }, ListGroup { a: &a0, b: bad_b, d: &mut d1, alpha: 1.0 }];
        let e = g.grouped_list(&mut groups, None).unwrap_err();
        assert!(matches!(e, Error::InvalidData { what: "groups", .. }), "{e:?}");
    }
    // The second group's D short, or its alpha NaN.
    {
        let mut short = d1.slice_mut(0..16 * 128 - 8);
        let mut groups = [ListGroup { a: &a0, b: &b0, d: &mut d0.slice_mut(0..16 * 128), alpha: 1.0 }, ListGroup { a: &a0, b: &b0, d: &mut short, alpha: 1.0 }];
        let e = g.grouped_list(&mut groups, None).unwrap_err();
        assert!(matches!(e, Error::BufferLength { name: "D", .. }), "{e:?}");
    }
    {
        let mut groups = [ListGroup { a: &a0, b: &b0, d: &mut d0, alpha: 1.0 }, ListGroup { a: &a0, b: &b0, d: &mut d1, alpha: f32::NAN }];
        let e = g.grouped_list(&mut groups, None).unwrap_err();
        assert!(matches!(e, Error::InvalidData { what: "alpha", .. }), "{e:?}");
    }
    // More groups than a launch takes (each good).
    {
        let mut ds: Vec<CudaSlice<f16>> = (0..MAX_EXPERTS + 1).map(|_| poison::<f16>(&s, 16 * 128)).collect();
        let mut groups: Vec<_> = ds.iter_mut().map(|d| ListGroup { a: &a0, b: &b0, d, alpha: 1.0 }).collect();
        let e = g.grouped_list(&mut groups, None).unwrap_err();
        assert!(matches!(e, Error::Dimension { dim: "groups", .. }), "{e:?}");
        for d in &ds {
            assert_poisoned(&s, d, "too many groups");
        }
    }
    // A forced config without list kernels.
    {
        let mut groups = [ListGroup { a: &a0, b: &b0, d: &mut d0, alpha: 1.0 }];
        let e = g.grouped_list(&mut groups, Some(Config::Sm90_128x64x64)).unwrap_err();
        assert!(matches!(e, Error::NotBuilt { .. } | Error::ArchMismatch { .. }), "{e:?}");
    }
    // FP4 entry with a 16-bit output.
    {
        let (mut dv, mut sfd) = (poison::<u8>(&s, 16 * 64), poison::<u8>(&s, blockscaled_gemm::Problem::new(16, 128, 256).sfd_bytes()));
        let mut groups = [ListGroup { a: &a0, b: &b0, d: Nvfp4Output::new(&mut dv, &mut sfd), alpha: 1.0 }];
        let e = g.grouped_list_fp4(OutType::Bf16, 1.0, &mut groups, None).unwrap_err();
        assert!(matches!(e, Error::InvalidData { what: "out", .. }), "{e:?}");
        let e = g.grouped_list_fp4(OutType::Nvfp4, f32::NAN, &mut groups, None).unwrap_err();
        assert!(matches!(e, Error::NormConstant { .. }), "{e:?}");
        assert_poisoned(&s, &dv, "list FP4 D");
        assert_poisoned(&s, &sfd, "list FP4 SFD");
    }
    assert_poisoned(&s, &d0, "list group 0");
    assert_poisoned(&s, &d1, "list group 1");
    Ok(())
}

fn gpu_grouped_list_raw_bad_arrays_are_refused() -> Outcome {
    let g = gpu()?;
    let s = g.stream().clone();
    let p = ListProblem::new(2, 16, 128, 256);
    let z = |n: usize| s.alloc_zeros::<u64>(n).unwrap();
    let (a, sfa, b, sfb, d, sfd) = (z(2), z(2), z(2), z(2), z(2), z(2));
    let problems = s.alloc_zeros::<i32>(6).unwrap();
    let arrays = ListArrays { problems: &problems, a: &a, sfa: &sfa, b: &b, sfb: &sfb, d: &d, c: None, sfd: None, alphas: None };
    // SFD addresses for a 16-bit output; FP4 output without them.
    let e = unsafe { g.grouped_list_raw(&p, OutType::F16, &ListArrays { sfd: Some(&sfd), ..arrays }, None) }.unwrap_err();
    assert!(matches!(e, Error::InvalidData { what: "sfd", .. }), "{e:?}");
    let e = unsafe { g.grouped_list_raw(&p, OutType::Nvfp4, &arrays, None) }.unwrap_err();
    assert!(matches!(e, Error::InvalidData { what: "sfd", .. }), "{e:?}");
    // problems for 1 group; an address array of 3; alphas of 1.
    let short = s.alloc_zeros::<i32>(3).unwrap();
    let e = unsafe { g.grouped_list_raw(&p, OutType::F16, &ListArrays { problems: &short, ..arrays }, None) }.unwrap_err();
    assert!(matches!(e, Error::BufferLength { name: "problems", .. }), "{e:?}");
    let three = z(3);
    let e = unsafe { g.grouped_list_raw(&p, OutType::F16, &ListArrays { b: &three, ..arrays }, None) }.unwrap_err();
    assert!(matches!(e, Error::BufferLength { name: "b", .. }), "{e:?}");
    let one = s.alloc_zeros::<f32>(1).unwrap();
    let e = unsafe { g.grouped_list_raw(&p, OutType::F16, &ListArrays { alphas: Some(&one), ..arrays }, None) }.unwrap_err();
    assert!(matches!(e, Error::BufferLength { name: "alphas", .. }), "{e:?}");
    // beta without C; groups 0.
    let e = unsafe { g.grouped_list_raw(&p.scalars(1.0, 0.5), OutType::F16, &arrays, None) }.unwrap_err();
    assert!(matches!(e, Error::BetaWithoutC { .. }), "{e:?}");
    let e = unsafe { g.grouped_list_raw(&ListProblem { groups: 0, ..p }, OutType::F16, &arrays, None) }.unwrap_err();
    assert!(matches!(e, Error::Dimension { dim: "groups", .. }), "{e:?}");
    Ok(())
}

/// select_list_config says it "errors as the call would": on bounds the call refuses it must
/// refuse too (before the fix it returned a config for zero groups).
fn gpu_select_list_config_refuses_what_the_call_refuses() -> Outcome {
    let g = gpu()?;
    for (p, what) in [
        (ListProblem::new(0, 16, 128, 256), "zero groups"),
        (ListProblem::new(MAX_EXPERTS + 1, 16, 128, 256), "too many groups"),
        (ListProblem::new(2, 16, 128, 250), "K not a multiple of 32"),
        (ListProblem::new(2, 16, 128, 256).scalars(f32::NAN, 0.0), "alpha NaN"),
    ] {
        assert!(g.select_list_config(&p, OutType::F16).is_err(), "{what}");
        assert!(g.grouped_list_workspace_size(&p, OutType::F16, None).is_err(), "{what}");
    }
    // And the MoE form's select, for the same rules.
    assert!(g.select_grouped_config(&MoeProblem::new(8, 128, 256, 0), OutType::F16).is_err());
    Ok(())
}
