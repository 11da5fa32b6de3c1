//! Sizes at and beyond the kernels' 32-bit index limits and 64-bit byte counts (issue 25,
//! findings 1 and 5): every public entry point gives a typed error naming the limit, before any
//! launch and without a panic or a wrapped count.
use blockscaled_gemm::gemm::{plan, BufferLens, DeviceFacts};
use blockscaled_gemm::{Config, Error, OutType, Problem, ANY_CLUSTERS};

const H100: DeviceFacts = DeviceFacts { ordinal: 0, compute_capability: (9, 0), sm_count: 132, max_clusters: ANY_CLUSTERS };
const B200: DeviceFacts = DeviceFacts { ordinal: 0, compute_capability: (10, 0), sm_count: 148, max_clusters: ANY_CLUSTERS };

/// `plan` on lengths computed from the problem itself, for every device, automatic and forced
/// configs.
fn plans(p: &Problem, out: OutType) -> Vec<Result<Config, Error>> {
    let lens = BufferLens::for_problem(p, out, false);
    let mut all = Vec::new();
    for device in [H100, B200] {
        all.push(plan(p, out, &lens, &device, None, |_, _| true));
        for c in Config::ALL.iter().copied().filter(|c| c.compute_capability() == device.compute_capability) {
            all.push(plan(p, out, &lens, &device, Some(c), |_, _| true));
        }
    }
    all
}

#[test]
fn n_near_2_pow_31_is_refused_before_any_launch() {
    // Finding 1: N + 255 wraps in the SM90 host adapter and kernel.
    for r in plans(&Problem::new(1, 2147483584, 32), OutType::F16) {
        let e = r.unwrap_err();
        assert!(matches!(e, Error::SizeLimit { what: "N rounded up", max: 2147483647, .. }), "{e}");
    }
    // Sm90_128x64x64 with N in (2^31 - 128, 2^31 - 64]: the kernel's n + 127 wrapped and hung.
    for n in [2147483520 + 8, 2147483584] {
        let lens = BufferLens::for_problem(&Problem::new(64, n, 64), OutType::F16, false);
        let e = plan(&Problem::new(64, n, 64), OutType::F16, &lens, &H100, Some(Config::Sm90_128x64x64), |_, _| true).unwrap_err();
        assert!(matches!(e, Error::SizeLimit { what: "N rounded up", .. }), "{e}");
    }
    // The largest extent passes on SM90. On SM100 B's scales over that N span 2^33 bytes, past
    // what CUTLASS's 32-bit scale layouts index: refused, naming the limit.
    let p = Problem::new(1, Problem::MAX_EXTENT, 32);
    let lens = BufferLens::for_problem(&p, OutType::F16, false);
    plan(&p, OutType::F16, &lens, &H100, None, |_, _| true).unwrap();
    for c in Config::ALL.iter().copied().filter(|c| c.info().arch == 90) {
        plan(&p, OutType::F16, &lens, &H100, Some(c), |_, _| true).unwrap();
    }
    let e = plan(&p, OutType::F16, &lens, &B200, None, |_, _| true).unwrap_err();
    assert!(matches!(e, Error::SizeLimit { what: "SFB bytes", max: 2147483647, .. }) && e.to_string().contains("SM100"), "{e}");
}

#[test]
fn a_tile_of_few_rows_counts_its_own_tiles() {
    // Finding 1, forced stream tile: M = 64, N = 2^30, L = 64 passes validate's count of 64 x 64
    // tiles (2^30), but the 8-row stream tile counts 8 * 2^23 * 64 = 2^32: a typed error naming
    // the limit (it was the shim's CannotImplement), while the rule's 32-row tile (2^30) plans.
    let p = Problem::new(64, 1 << 30, 32).batch(64);
    let lens = BufferLens::for_problem(&p, OutType::F16, false);
    let e = plan(&p, OutType::F16, &lens, &H100, Some(Config::Sm90_Stream_8x128x64), |_, _| true).unwrap_err();
    assert!(matches!(e, Error::SizeLimit { what: "output tiles of the config", value, max: 2147483647, .. } if value == 1 << 32), "{e}");
    assert!(e.to_string().contains("tile 8 x 128"), "{e}");
    plan(&p, OutType::F16, &lens, &H100, None, |_, _| true).unwrap();
}

#[test]
fn plan_of_finding_5_is_an_error_not_a_panic() {
    // M = 1, N = 4, K = 2^31 - 32, L = 2^30, f32: validate accepted it and plan panicked in
    // layout.rs computing SFA's size.
    for r in plans(&Problem::new(1, 4, 2147483616).batch(1 << 30), OutType::F32) {
        let e = r.unwrap_err();
        assert!(matches!(e, Error::SizeLimit { what: "K rounded up", .. }), "{e}");
    }
    // The same at the largest K the kernels take: now the padded SFA is what overflows.
    for r in plans(&Problem::new(1, 4, Problem::MAX_EXTENT).batch(1 << 30), OutType::F32) {
        let e = r.unwrap_err();
        assert!(matches!(e, Error::SizeLimit { what: "SFA bytes", .. }), "{e}");
        assert!(e.to_string().contains("64-bit"), "{e}");
    }
    // And beyond usize: the lengths saturate, validate names the count.
    for r in plans(&Problem::new(1, 4, Problem::MAX_EXTENT).batch(i32::MAX as usize), OutType::F32) {
        assert!(matches!(r, Err(Error::SizeLimit { .. })), "{r:?}");
    }
}

#[test]
fn tile_counts_beyond_i32_are_refused() {
    let p = Problem::new(1 << 20, 1 << 20, 32).batch(8);
    for r in plans(&p, OutType::Bf16) {
        let e = r.unwrap_err();
        assert!(matches!(e, Error::SizeLimit { what: "output tiles", .. }), "{e}");
    }
}
