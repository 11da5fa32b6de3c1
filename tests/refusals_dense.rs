//! The dense GEMM, W4A16 and quantizer entry points under bad and extreme inputs (from an
//! adversarial review, 2026-11-28). CPU tests run everywhere; the GPU cases print "skipped: no GPU" (or the device they need) and
//! return where there is none. Each GPU case poisons its outputs, makes the bad call, matches
//! the typed error and checks the outputs are byte-identical to the poison afterwards.
#![allow(clippy::type_complexity)]
use blockscaled_gemm::gemm::{plan, BufferLens, DeviceFacts};
use blockscaled_gemm::layout::{self, prepack_values, unpack_values, to_tiled, from_tiled};
use blockscaled_gemm::w4a16::{plan_w4a16, W4a16Lens};
use blockscaled_gemm::{check_split_k, BlockScaledGemm, Config, Error, OutType, Problem, ANY_CLUSTERS};

const H100: DeviceFacts = DeviceFacts { ordinal: 0, compute_capability: (9, 0), sm_count: 132, max_clusters: ANY_CLUSTERS };
const B200: DeviceFacts = DeviceFacts { ordinal: 0, compute_capability: (10, 0), sm_count: 148, max_clusters: ANY_CLUSTERS };

fn sm100_configs() -> impl Iterator<Item = Config> {
    Config::ALL.iter().copied().filter(|c| c.info().arch == 100)
}

// ---------------------------------------------------------------------------------------------
// CPU: the SM100 batch strides.

/// CUTLASS's `make_cute_packed_stride` (cutlass/util/packed_stride.hpp, CUTLASS 4.2) computes a
/// batch's stride as `static_cast<int64_t>(int * int)`: M*K (A), N*K (B) and M*N (C, D) elements
/// overflow `int` from 2^31 when L > 1, and the SM100 kernels then address batch 1 onwards at a
/// wrapped (here negative) offset. Such problems must be refused on SM100 before any launch.
#[test]
fn sm100_batch_strides_beyond_i32_are_refused() {
    // Each product exactly 2^31 elements with L = 2; every other SM100 limit holds.
    let cases = [
        (Problem::new(1 << 16, 64, 1 << 15).batch(2), "A"),   // M*K = 2^31: A is 2 GiB, D 16 MiB
        (Problem::new(64, 1 << 16, 1 << 15).batch(2), "B"),   // N*K = 2^31
        (Problem::new(1 << 15, 1 << 16, 64).batch(2), "D"),   // M*N = 2^31
    ];
    for (p, which) in cases {
        p.validate(OutType::F16, false).unwrap();
        let e = p.check_sm100(OutType::F16).expect_err(which);
        assert!(matches!(e, Error::SizeLimit { max: 2147483647, .. }), "{which}: {e}");
        assert!(e.to_string().contains("batch stride"), "{which}: {e}");
        let lens = BufferLens::for_problem(&p, OutType::F16, false);
        let e = plan(&p, OutType::F16, &lens, &B200, None, |_, _| true).expect_err(which);
        assert!(matches!(e, Error::SizeLimit { .. }), "{which}: {e}");
        for c in sm100_configs() {
            assert!(plan(&p, OutType::F16, &lens, &B200, Some(c), |_, _| true).is_err(), "{c} {which}");
        }
        // One batch has no batch stride (CUTLASS sets 0), and SM90's own kernels index in 64 bits.
        p.batch(1).check_sm100(OutType::F16).unwrap();
        plan(&p, OutType::F16, &lens, &H100, None, |_, _| true).unwrap();
    }
    // Just below the limit: M*N = 2^31 - 2^16.
    Problem::new((1 << 15) - 1, 1 << 16, 64).batch(2).check_sm100(OutType::F16).unwrap();
    // FP4 output: D is e2m1 elements, C f32, both strided M*N.
    let p = Problem::new(1 << 15, 1 << 16, 64).batch(2);
    assert!(p.check_sm100(OutType::Nvfp4).is_err());
}

// ---------------------------------------------------------------------------------------------
// CPU: planners, validators and host layout functions.

#[test]
fn plan_rejects_every_bad_scalar_and_shape() {
    let ok = Problem::new(128, 256, 512);
    for (p, out) in [
        (Problem::new(0, 256, 512), OutType::F16),
        (Problem::new(128, 0, 512), OutType::F16),
        (Problem::new(128, 256, 0), OutType::F16),
        (ok.batch(0), OutType::F16),
        (Problem::new(128, 256, 16), OutType::F16),      // K % 32
        (Problem::new(128, 256, 48), OutType::F16),
        (Problem::new(128, 20, 512), OutType::F16),      // N % 8
        (Problem::new(128, 48, 512), OutType::Nvfp4),    // N % 32
        (ok.scalars(f32::NAN, 0.0), OutType::F16),
        (ok.scalars(f32::INFINITY, 0.0), OutType::F16),
        (ok.scalars(1.0, f32::NEG_INFINITY), OutType::F16),
        (ok.norm_constant(0.0), OutType::Nvfp4),
        (ok.norm_constant(-0.0), OutType::Nvfp4),
        (ok.norm_constant(f32::NAN), OutType::Nvfp4Ue8m0),
        (ok.norm_constant(f32::INFINITY), OutType::Nvfp4),
        (Problem::new(usize::MAX, usize::MAX, usize::MAX).batch(usize::MAX), OutType::F32),
    ] {
        let lens = BufferLens::for_problem(&p, out, false);
        for dev in [H100, B200] {
            assert!(plan(&p, out, &lens, &dev, None, |_, _| true).is_err(), "{p:?} {out}");
        }
        let wl = W4a16Lens::for_problem(&p, false);
        if out.sfd().is_none() {
            assert!(plan_w4a16(&p, out, &wl, &H100, None, |_, _| true).is_err(), "{p:?} {out}");
        }
    }
    // beta = -0.0 counts as zero (no C needed); the kernels test beta != 0 the same way.
    let p = ok.scalars(1.0, -0.0);
    plan(&p, OutType::F16, &BufferLens::for_problem(&p, OutType::F16, false), &H100, None, |_, _| true).unwrap();
    // Buffers one too long are refused as one too short are.
    let lens = BufferLens::for_problem(&ok, OutType::Bf16, true);
    for i in 0..6 {
        let mut l = lens;
        match i {
            0 => l.a += 1,
            1 => l.sfa += 1,
            2 => l.b += 1,
            3 => l.sfb += 1,
            4 => l.c = Some(l.c.unwrap() + 1),
            _ => l.d += 1,
        }
        let e = plan(&ok, OutType::Bf16, &l, &H100, None, |_, _| true).unwrap_err();
        assert!(matches!(e, Error::BufferLength { .. }), "{i}: {e}");
    }
}

#[test]
fn forced_split_k_and_configs() {
    let p = Problem::new(128, 4096, 512); // 8 k-tiles
    for c in Config::ALL.iter().copied() {
        if c.info().arch == 100 {
            assert_eq!(check_split_k(c, &p, 0).unwrap(), 1, "{c}: SM100 ignores split_k");
            assert_eq!(check_split_k(c, &p, u32::MAX).unwrap(), 1);
            continue;
        }
        for bad in [0, 9, 65536, u32::MAX] {
            let e = check_split_k(c, &p, bad).unwrap_err();
            assert!(matches!(e, Error::InvalidData { what: "split_k", .. }), "{c} {bad}: {e}");
        }
        assert_eq!(check_split_k(c, &p, 8).unwrap(), 8);
    }
    // A forced SM90 config with a tile taller than M plans (the kernel masks rows).
    let q = Problem::new(1, 64, 64);
    let lens = BufferLens::for_problem(&q, OutType::F16, false);
    for c in Config::ALL.iter().copied().filter(|c| c.info().arch == 90) {
        let r = plan(&q, OutType::F16, &lens, &H100, Some(c), |_, _| true);
        assert!(r.is_ok(), "{c}: {r:?}");
    }
}

#[test]
fn host_layout_functions_take_odd_and_empty_shapes() {
    // Zero extents give empty outputs without looping over the others, however large.
    assert!(prepack_values(&[], 0, 256, usize::MAX).unwrap().is_empty());
    assert!(prepack_values(&[], usize::MAX, 0, 1).unwrap().is_empty());
    assert!(unpack_values(&[], usize::MAX, 0, usize::MAX).unwrap().is_empty());
    assert!(to_tiled(&[], usize::MAX, 0, 3).unwrap().is_empty());
    assert!(from_tiled(&[], 0, usize::MAX, usize::MAX).unwrap().is_empty());
    // Odd K is an error; sizes beyond usize are SizeLimit, not a wrap or an abort.
    assert!(matches!(prepack_values(&[0; 3], 1, 7, 1), Err(Error::KMultiple { .. })));
    assert!(matches!(prepack_values(&[], usize::MAX, 256, 2), Err(Error::SizeLimit { .. })));
    assert!(matches!(to_tiled(&[], usize::MAX, 5, 2), Err(Error::SizeLimit { .. })));
    // Huge but representable: the length check fails before any allocation.
    assert!(matches!(prepack_values(&[0; 16], 1 << 40, 32, 1), Err(Error::BufferLength { .. })));
    assert!(matches!(from_tiled(&[0; 512], 1 << 50, 4, 1), Err(Error::BufferLength { .. })));
    // K of 2 and of 2 + 256 (a partial first and last chunk) round-trip.
    for (rows, k, batch) in [(3, 2, 2), (1, 258, 1), (129, 30, 3)] {
        let src: Vec<u8> = (0..batch * rows * k / 2).map(|i| (i * 31 + 7) as u8).collect();
        let p = prepack_values(&src, rows, k, batch).unwrap();
        assert_eq!(p.len(), layout::prepacked_bytes(rows, k, batch));
        assert_eq!(unpack_values(&p, rows, k, batch).unwrap(), src);
    }
    // Saturating sizes never wrap.
    assert_eq!(layout::prepacked_bytes(usize::MAX, usize::MAX, usize::MAX), usize::MAX);
    assert_eq!(layout::sf_bytes(usize::MAX, usize::MAX, usize::MAX), usize::MAX);
}

#[test]
fn fold_global_scales_is_checked() {
    let p = Problem::new(128, 256, 512);
    assert!(p.fold_global_scales(Some(f32::MAX), Some(2.0)).is_err());
    assert!(p.fold_global_scales(Some(f32::MIN_POSITIVE), Some(f32::MIN_POSITIVE)).is_err());
    assert!(p.fold_global_scales(Some(f32::NAN), None).is_err());
    assert_eq!(p.scalars(0.0, 0.0).fold_global_scales(Some(1e-30), Some(1e-30)).unwrap().alpha, 0.0);
    // A negative global scale is refused by the tensor constructors (GPU probe below); the fold
    // itself takes it.
    assert_eq!(p.fold_global_scales(Some(-2.0), None).unwrap().alpha, -2.0);
}

// ---------------------------------------------------------------------------------------------
// GPU cases: each skips without a driver or the device it needs.

use blockscaled_gemm::{Nvfp4Activations, Nvfp4Matrix, Nvfp4Output, Nvfp4Tensor, Quantizer};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr};
use half::{bf16, f16};
use std::sync::Arc;

/// The GEMM on a new stream of device 0, or None (printed) where there is no GPU.
fn gpu() -> Option<BlockScaledGemm> {
    if !BlockScaledGemm::driver_present() || !matches!(CudaContext::device_count(), Ok(n) if n > 0) {
        println!("skipped: no GPU");
        return None;
    }
    let stream = CudaContext::new(0).expect("context").new_stream().expect("stream");
    Some(BlockScaledGemm::new(stream).expect("gemm"))
}

fn gpu_cc(cc: (i32, i32)) -> Option<BlockScaledGemm> {
    let g = gpu()?;
    if g.device().compute_capability != cc {
        println!("skipped: device is {:?}, this case needs {cc:?}", g.device().compute_capability);
        return None;
    }
    Some(g)
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
    let a = Nvfp4Matrix::random_contest(m, k, l, 11).unwrap();
    let b = Nvfp4Matrix::random_contest(n, k, l, 12).unwrap();
    (Nvfp4Tensor::upload(&a, s).unwrap(), Nvfp4Tensor::upload(&b, s).unwrap())
}

/// SM100: a batched problem whose A batch stride (M*K) is 2^31 elements. Without the Rust check
/// the CUTLASS kernel addresses batch 1 at a wrapped, negative offset (out-of-bounds reads of
/// A: an illegal address or garbage). Expect SizeLimit ("A batch stride"), D untouched.
/// Memory: A 2 GiB, SFA 256 MiB, D 16 MiB.
#[test]
fn gpu_sm100_batch_stride_overflow_is_refused() {
    let Some(g) = gpu_cc((10, 0)) else { return };
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
}

/// Workspace limit below the need, on the calls not covered by tests/gpu.rs: W4A16 on a swapped
/// tile (the re-ordered activations) and FP4 output split through global memory (Hopper), and
/// gemm_decoded. Expect WorkspaceLimit { need, limit }, D (and SFD) untouched, workspace not grown.
#[test]
fn gpu_workspace_limit_below_need_writes_nothing() {
    let Some(g) = gpu_cc((9, 0)) else { return };
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
}

/// Forced split-K the call must refuse: 0, more ranges than k-tiles, and (prepacked B) more than
/// one range per 256 values of K. Expect InvalidData { what: "split_k" }, D untouched.
#[test]
fn gpu_forced_split_k_refusals_write_nothing() {
    let Some(g0) = gpu_cc((9, 0)) else { return };
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
}

/// Calls refused for their form: gemm_fp4 with a 16-bit output type, a prepacked A, a prepacked
/// B on SM100, a C one element short, a D one element long, global scales whose product with
/// alpha overflows. Each typed; D (and SFD) untouched.
#[test]
fn gpu_refused_forms_write_nothing() {
    let Some(g) = gpu() else { return };
    if g.device().arch().is_none() {
        println!("skipped: device {:?} runs no kernel of this build", g.device().compute_capability);
        return;
    }
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
}

/// Global scales that are not finite and positive: refused by the tensor constructors and by
/// the quantizer before it writes codes or scales.
#[test]
fn gpu_bad_global_scales_are_refused() {
    let Some(g) = gpu() else { return };
    let s = g.stream().clone();
    let (rows, k) = (16, 64);
    let v = s.alloc_zeros::<u8>(rows * k / 2).unwrap();
    let sf = s.alloc_zeros::<u8>(layout::sf_bytes(rows, k, 1)).unwrap();
    let x = s.clone_htod(&vec![f16::from_f32(1.0); rows * k]).unwrap();
    let (mut codes, mut scales) = (poison::<u8>(&s, rows * k / 2), poison::<u8>(&s, layout::sf_bytes(rows, k, 1)));
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
}

/// The computed global scale (None) on edge inputs: all zeros (scale 1, codes 0), all NaN
/// (NaN does not raise the amax: scale 1), an infinity (typed error, documented), f16 max.
#[test]
fn gpu_quantize_computed_scale_on_edge_inputs() {
    let Some(g) = gpu() else { return };
    if g.device().arch().is_none() {
        println!("skipped: device {:?} runs no quantizer of this build", g.device().compute_capability);
        return;
    }
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
}

/// Nvfp4Activations made for one shape, used with another: the quantizer refuses x of the other
/// length, the GEMM a problem of the other shape; neither writes the activations or D.
#[test]
fn gpu_activations_reused_across_shapes() {
    let Some(g) = gpu() else { return };
    if g.device().arch().is_none() {
        println!("skipped: device {:?} runs no kernel of this build", g.device().compute_capability);
        return;
    }
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
}

/// W4A16: a misaligned activation view, activations one short, an FP4 output type by the
/// forced-config route, a config without W4A16 kernels. Typed; D untouched. SM100: the
/// W4A16 call is UnsupportedDevice.
#[test]
fn gpu_w4a16_refusals_write_nothing() {
    let Some(g) = gpu() else { return };
    let s = g.stream().clone();
    let p = Problem::new(16, 256, 512);
    let (_, b) = operands(&s, 1, p.n, p.k, 1);
    let x = s.clone_htod(&vec![f16::from_f32(1.0); p.m * p.k + 8]).unwrap();
    let mut d = poison::<f16>(&s, p.cd_elems());
    if g.device().compute_capability != (9, 0) {
        let e = g.gemm_w4a16(&p, &x.slice(..p.m * p.k), &b, &mut d, None).unwrap_err();
        assert!(matches!(e, Error::UnsupportedDevice { .. }), "{e}");
        assert_poisoned(&s, &d, "D");
        return;
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
}

/// prepack/unpack of odd shapes: one row, K = 32 (one partial chunk), batch 3; K = 48 made as a
/// prepacked tensor cannot unpack (K % 32); a second prepack is a Layout error.
#[test]
fn gpu_prepack_odd_shapes() {
    let Some(g) = gpu() else { return };
    let s = g.stream().clone();
    for (rows, k, batch) in [(1, 32, 3), (129, 288, 2), (7, 2080, 1)] {
        let m = Nvfp4Matrix::random_contest(rows, k, batch, 5).unwrap();
        let t = Nvfp4Tensor::upload(&m, &s).unwrap();
        let p = t.prepack::<u8, u8>(&s).unwrap();
        let want = layout::prepack_values(m.data(), rows, k, batch).unwrap();
        assert_eq!(s.clone_dtoh(p.values()).unwrap(), want, "{rows} {k} {batch}");
        assert!(matches!(p.prepack::<u8, u8>(&s), Err(Error::Layout { .. })));
        let u = p.unpack::<u8, u8>(&s).unwrap();
        assert_eq!(s.clone_dtoh(u.values()).unwrap(), m.data(), "{rows} {k} {batch}");
    }
    let (rows, k) = (5, 48);
    let v = s.alloc_zeros::<u8>(layout::prepacked_bytes(rows, k, 1)).unwrap();
    let sf = s.alloc_zeros::<u8>(layout::sf_bytes(rows, k, 1)).unwrap();
    let t = Nvfp4Tensor::new_prepacked(v.as_view(), sf.as_view(), (1, rows, k), 1.0).unwrap();
    assert!(matches!(t.unpack::<u8, u8>(&s), Err(Error::KMultiple { .. })));
    // A standard-length buffer passed as prepacked (and the other way) is a length error.
    let std_v = s.alloc_zeros::<u8>(rows * 64 / 2).unwrap();
    let sf64 = s.alloc_zeros::<u8>(layout::sf_bytes(rows, 64, 1)).unwrap();
    assert!(matches!(Nvfp4Tensor::new_prepacked(std_v.as_view(), sf64.as_view(), (1, rows, 64), 1.0), Err(Error::BufferLength { .. })));
    let pk_v = s.alloc_zeros::<u8>(layout::prepacked_bytes(rows, 64, 1)).unwrap();
    assert!(matches!(Nvfp4Tensor::new(pk_v.as_view(), sf64.as_view(), (1, rows, 64), 1.0), Err(Error::BufferLength { .. })));
}
