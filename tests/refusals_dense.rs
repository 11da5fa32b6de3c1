//! The dense GEMM, W4A16 and quantizer planners, validators and host layouts under bad and extreme
//! inputs (from an adversarial review, 2026-11-28), on the CPU. The same calls on a GPU, with
//! poisoned outputs: tests/gpu_refusals.rs.
#![allow(clippy::type_complexity)]
use blockscaled_gemm::gemm::{plan, BufferLens, DeviceFacts};
use blockscaled_gemm::layout::{self, prepack_values, unpack_values, to_tiled, from_tiled};
use blockscaled_gemm::w4a16::{plan_w4a16, W4a16Lens};
use blockscaled_gemm::dispatch::check_split_k;
use blockscaled_gemm::{Config, Error, OutType, Problem, ANY_CLUSTERS};

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
    assert!(prepack_values(&[], (usize::MAX, 0, 256)).unwrap().is_empty());
    assert!(prepack_values(&[], (1, usize::MAX, 0)).unwrap().is_empty());
    assert!(unpack_values(&[], (usize::MAX, usize::MAX, 0)).unwrap().is_empty());
    assert!(to_tiled(&[], (3, usize::MAX, 0)).unwrap().is_empty());
    assert!(from_tiled(&[], (usize::MAX, 0, usize::MAX)).unwrap().is_empty());
    // Odd K is an error; sizes beyond usize are SizeLimit, not a wrap or an abort.
    assert!(matches!(prepack_values(&[0; 3], (1, 1, 7)), Err(Error::KMultiple { .. })));
    assert!(matches!(prepack_values(&[], (2, usize::MAX, 256)), Err(Error::SizeLimit { .. })));
    assert!(matches!(to_tiled(&[], (2, usize::MAX, 5)), Err(Error::SizeLimit { .. })));
    // Huge but representable: the length check fails before any allocation.
    assert!(matches!(prepack_values(&[0; 16], (1, 1 << 40, 32)), Err(Error::BufferLength { .. })));
    assert!(matches!(from_tiled(&[0; 512], (1, 1 << 50, 4)), Err(Error::BufferLength { .. })));
    // K of 2 and of 2 + 256 (a partial first and last chunk) round-trip.
    for (rows, k, batch) in [(3, 2, 2), (1, 258, 1), (129, 30, 3)] {
        let src: Vec<u8> = (0..batch * rows * k / 2).map(|i| (i * 31 + 7) as u8).collect();
        let p = prepack_values(&src, (batch, rows, k)).unwrap();
        assert_eq!(p.len(), layout::prepacked_bytes((batch, rows, k)));
        assert_eq!(unpack_values(&p, (batch, rows, k)).unwrap(), src);
    }
    // Saturating sizes never wrap.
    assert_eq!(layout::prepacked_bytes((usize::MAX, usize::MAX, usize::MAX)), usize::MAX);
    assert_eq!(layout::sf_bytes((usize::MAX, usize::MAX, usize::MAX)), usize::MAX);
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
