//! The grouped (MoE and list-form) API under bad inputs (from an adversarial review, 2026-11-28):
//! host-only cases run everywhere; the device cases skip without a GPU ("skipped: no GPU"), poison
//! their outputs and check a refused call left them byte-identical.
#![allow(clippy::too_many_arguments, clippy::type_complexity, dropping_copy_types, clippy::drop_non_drop)]
use blockscaled_gemm::cutlass_host::describe_grouped;
use blockscaled_gemm::grouped::{check_offsets, expert_offsets, moe_scale_starts, moe_scales, reference_moe, MAX_EXPERTS};
use blockscaled_gemm::{Config, Error, ListProblem, MoeProblem, Nvfp4Matrix, OutType};

#[test]
fn cpu_describe_grouped_past_sm100_limit_is_typed() {
    let c = Config::Sm100_1Sm_128x128x256;
    if !c.is_built_grouped(OutType::F16) {
        println!("skipped: no SM100 grouped kernel in this build");
        return;
    }
    // Past SM100's scale-layout limit (A's scales over T rows), where validate passes.
    let rows = (i32::MAX as usize / 512 / 112) * 128 + 1;
    let p = MoeProblem::new(rows, 128, 7168, 1);
    p.validate(OutType::F16).unwrap();
    assert!(p.check_sm100(OutType::F16).is_err());
    let e = describe_grouped(c, OutType::F16, &p, &[0, rows as i32], None, 0).unwrap_err();
    println!("{e}");
    assert!(matches!(e, Error::SizeLimit { .. }), "{e:?}");
}

/// Host offsets: every rule named; values at the i32 edges; a row count past i32 never matches.
#[test]
fn cpu_offsets_edges() {
    for (o, t) in [
        (vec![0, -1, 5], 5usize),
        (vec![i32::MIN, 0, 5], 5),
        (vec![0, i32::MAX, 5], 5),
        (vec![0, 5, i32::MIN], 5),
        (vec![0, 3], 2),
        (vec![0, 2], usize::MAX),
        (vec![0, -1], usize::MAX),
        (vec![0, 0], (1usize << 32)),
        (vec![0], 0),
        (vec![], 0),
    ] {
        let e = check_offsets(&o, t).unwrap_err();
        assert!(matches!(e, Error::InvalidData { what: "offsets", .. }), "{o:?} {t}: {e:?}");
        // moe_scale_starts takes T from the last offset: it accepts exactly the well-formed ones.
        let well_formed = o.len() >= 2 && o[0] == 0 && o.windows(2).all(|w| w[0] <= w[1]);
        assert_eq!(moe_scale_starts(&o).is_ok(), well_formed, "{o:?}");
    }
    check_offsets(&[0, 0, 0], 0).unwrap();
    check_offsets(&[0, i32::MAX], i32::MAX as usize).unwrap();
    assert_eq!(moe_scale_starts(&[0, i32::MAX]).unwrap(), vec![0, (i32::MAX as usize).div_ceil(128) * 128]);
    assert!(check_offsets(&vec![0; MAX_EXPERTS + 1], 0).is_ok());
    assert!(check_offsets(&vec![0; MAX_EXPERTS + 2], 0).is_err());
    // Counts past i32 in total.
    assert!(matches!(expert_offsets(&[i32::MAX as usize, 1]), Err(Error::InvalidData { .. })));
    assert!(matches!(expert_offsets(&[usize::MAX, usize::MAX]), Err(Error::InvalidData { .. })));
    assert_eq!(expert_offsets(&[]).unwrap(), vec![0]);
    // Zero-row experts and every expert empty but one.
    let x = Nvfp4Matrix::random_contest(3, 64, 1, 9).unwrap();
    let s = moe_scales(&x, &[0, 0, 3, 3]).unwrap();
    assert_eq!(s.len(), MoeProblem::new(3, 32, 64, 3).sfa_bytes());
    // x batched: refused by both host helpers (typed).
    let xb = Nvfp4Matrix::random_contest(3, 64, 2, 9).unwrap();
    assert!(matches!(moe_scales(&xb, &[0, 3]), Err(Error::InvalidData { what: "x", .. })));
    let w = Nvfp4Matrix::random_contest(32, 64, 1, 10).unwrap();
    assert!(reference_moe::<f32>(&xb, &w, &[0, 3], &[1.0], 1.0).is_err());
    // Expert scales of the wrong count, and w of the wrong K.
    assert!(reference_moe::<f32>(&x, &w, &[0, 3], &[1.0, 1.0], 1.0).is_err());
    let wk = Nvfp4Matrix::random_contest(32, 128, 1, 10).unwrap();
    assert!(reference_moe::<f32>(&x, &wk, &[0, 3], &[1.0], 1.0).is_err());
}

// ---------------------------------------------------------------------------------------------
// Device cases: each skips without a GPU. Outputs are poisoned (0xA5 bytes) and must come back
// byte-identical after a refused call.

use blockscaled_gemm::{BlockScaledGemm, ListArrays, ListGroup, MoeActivations, Nvfp4Output, Nvfp4Tensor, Quantizer};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr};
use half::{bf16, f16};
use std::sync::Arc;

fn gpu() -> Option<BlockScaledGemm> {
    if !BlockScaledGemm::driver_present() || !matches!(CudaContext::device_count(), Ok(n) if n > 0) {
        println!("skipped: no GPU");
        return None;
    }
    let stream = CudaContext::new(0).expect("context").new_stream().expect("stream");
    Some(BlockScaledGemm::new(stream).expect("BlockScaledGemm"))
}

fn hopper() -> Option<BlockScaledGemm> {
    let g = gpu()?;
    if g.device().compute_capability != (9, 0) {
        println!("skipped: not an SM90 device");
        return None;
    }
    Some(g)
}

const POISON: u8 = 0xA5;

fn poisoned<T: DeviceRepr + Copy>(s: &Arc<CudaStream>, n: usize, x: T) -> CudaSlice<T> {
    s.clone_htod(&vec![x; n]).unwrap()
}
fn poison_f16(s: &Arc<CudaStream>, n: usize) -> CudaSlice<f16> {
    poisoned(s, n, f16::from_bits(u16::from_le_bytes([POISON; 2])))
}
fn poison_u8(s: &Arc<CudaStream>, n: usize) -> CudaSlice<u8> {
    poisoned(s, n, POISON)
}
fn untouched_f16(s: &Arc<CudaStream>, d: &CudaSlice<f16>, what: &str) {
    assert!(s.clone_dtoh(d).unwrap().iter().all(|x| x.to_bits() == 0xA5A5), "{what}: D was written");
}
fn untouched_u8(s: &Arc<CudaStream>, d: &CudaSlice<u8>, what: &str) {
    assert!(s.clone_dtoh(d).unwrap().iter().all(|&x| x == POISON), "{what}: buffer was written");
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
    let x = Nvfp4Matrix::random_contest(t, k, 1, 1).unwrap();
    let w = Nvfp4Matrix::random_contest(n, k, e, 2).unwrap();
    let offsets = expert_offsets(&[30, 0, 50, 20]).unwrap();
    let sfa = moe_scales(&x, &offsets).unwrap();
    let a = MoeActivations::new(s.clone_htod(x.data()).unwrap(), s.clone_htod(&sfa).unwrap(), (t, k), 1.0).unwrap();
    let b = Nvfp4Tensor::upload(&w, s).unwrap();
    let o = s.clone_htod(&offsets).unwrap();
    let es = s.clone_htod(&[1.0f32, 0.5, 2.0, 0.25]).unwrap();
    Moe { p: MoeProblem::new(t, n, k, e), x, w, offsets, a, b, o, es }
}

#[test]
fn gpu_moe_gemm_bad_lengths_and_shapes_write_nothing() {
    let Some(g) = gpu() else { return };
    let s = g.stream().clone();
    let m = moe(&s);
    let mut d = poison_f16(&s, m.p.d_elems());
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
    // A's scales in the dense layout (T rows padded once) instead of the MoE one.
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
    untouched_f16(&s, &d, "bad lengths");
}

#[test]
fn gpu_moe_gemm_bad_scalars_alignment_and_configs_write_nothing() {
    let Some(g) = gpu() else { return };
    let s = g.stream().clone();
    let m = moe(&s);
    let mut d = poison_f16(&s, m.p.d_elems() + 8);
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
    let mut dv = poison_u8(&s, m.p.d_elems() / 2);
    let mut sfd = poison_u8(&s, m.p.sfd_bytes());
    let e = g.moe_gemm_fp4(&m.p, OutType::F16, &m.a, &m.b, &m.o, &m.es, Nvfp4Output::new(&mut dv, &mut sfd), None).unwrap_err();
    assert!(matches!(e, Error::InvalidData { what: "out", .. }), "{e:?}");
    for nc in [0.0f32, -1.0, f32::NAN, f32::INFINITY] {
        let e = g.moe_gemm_fp4(&m.p.norm_constant(nc), OutType::Nvfp4, &m.a, &m.b, &m.o, &m.es, Nvfp4Output::new(&mut dv, &mut sfd), None).unwrap_err();
        assert!(matches!(e, Error::NormConstant { .. }), "{nc}: {e:?}");
    }
    // SFD in the dense layout.
    let mut sfd_dense = poison_u8(&s, blockscaled_gemm::layout::sf_bytes(m.p.rows, m.p.n, 1));
    let e = g.moe_gemm_fp4(&m.p, OutType::Nvfp4, &m.a, &m.b, &m.o, &m.es, Nvfp4Output::new(&mut dv, &mut sfd_dense), None).unwrap_err();
    assert!(matches!(e, Error::BufferLength { name: "SFD", .. }), "{e:?}");
    untouched_f16(&s, &d, "bad scalars");
    untouched_u8(&s, &dv, "FP4 D");
    untouched_u8(&s, &sfd, "FP4 SFD");
    untouched_u8(&s, &sfd_dense, "FP4 dense SFD");
}

#[test]
fn gpu_moe_gemm_workspace_limit_writes_nothing() {
    let Some(g) = hopper() else { return };
    let s = g.stream().clone();
    let m = moe(&s);
    let mut d = poison_f16(&s, m.p.d_elems());
    // The swapped tile decodes A into the workspace: a fresh GEMM limited to 0 bytes refuses it.
    g.set_workspace_limit(Some(0));
    let e = g.moe_gemm(&m.p, &m.a, &m.b, &m.o, &m.es, &mut d, Some(Config::Sm90_Swapped_128x128x64)).unwrap_err();
    assert!(matches!(e, Error::WorkspaceLimit { .. }), "{e:?}");
    assert!(g.moe_workspace_size(&m.p, OutType::F16, Some(Config::Sm90_Swapped_128x128x64)).unwrap() > 0);
    g.set_workspace_limit(None);
    untouched_f16(&s, &d, "workspace limit");
}

/// Device offsets the host never checked: each expert covers the running maximum of the
/// offsets clamped to [0, T] (moe_gemm's documented reading). Offsets that leave every expert
/// empty must leave D (and on Hopper, FP4 SFD) as it was; offsets that give one expert every row
/// must give that expert's GEMM.
#[test]
fn gpu_moe_gemm_device_offsets_outside_the_contract() {
    let Some(g) = gpu() else { return };
    let s = g.stream().clone();
    let m = moe(&s);
    let t = m.p.rows as i32;
    for bad in [vec![t + 1000; 5], vec![i32::MIN; 5], vec![i32::MAX; 5], vec![t, 0, 0, 0, 0], vec![0; 5]] {
        let o = s.clone_htod(&bad).unwrap();
        let configs: &[Option<Config>] = if g.device().compute_capability == (9, 0) { &[None, Some(Config::Sm90_Swapped_128x128x64)] } else { &[None] };
        for &config in configs {
            let mut d = poison_f16(&s, m.p.d_elems());
            g.moe_gemm(&m.p, &m.a, &m.b, &o, &m.es, &mut d, config).unwrap();
            untouched_f16(&s, &d, &format!("{config:?} offsets {bad:?} (no expert has rows)"));
        }
        if g.device().compute_capability == (9, 0) {
            let (mut dv, mut sfd) = (poison_u8(&s, m.p.d_elems() / 2), poison_u8(&s, m.p.sfd_bytes()));
            g.moe_gemm_fp4(&m.p, OutType::Nvfp4, &m.a, &m.b, &o, &m.es, Nvfp4Output::new(&mut dv, &mut sfd), None).unwrap();
            untouched_u8(&s, &dv, "FP4 D, no expert has rows");
            untouched_u8(&s, &sfd, "FP4 SFD on Hopper, no expert has rows");
        }
    }
    // [0, MAX, MIN, 0, T] reads as [0, T, T, T, T]: expert 0 holds every row.
    let device = [0, i32::MAX, i32::MIN, 0, t];
    let clamped = [0, t, t, t, t];
    let sfa = moe_scales(&m.x, &clamped).unwrap();
    let a = MoeActivations::new(s.clone_htod(m.x.data()).unwrap(), s.clone_htod(&sfa).unwrap(), (m.p.rows, m.p.k), 1.0).unwrap();
    let mut d = poison_f16(&s, m.p.d_elems());
    g.moe_gemm(&m.p, &a, &m.b, &s.clone_htod(&device).unwrap(), &m.es, &mut d, None).unwrap();
    let want: Vec<f16> = reference_moe(&m.x, &m.w, &clamped, &[1.0, 0.5, 2.0, 0.25], 1.0).unwrap();
    let got = s.clone_dtoh(&d).unwrap();
    assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "clamped offsets: expert 0's GEMM");
}

/// T = 0: checked, nothing launched, Ok.
#[test]
fn gpu_moe_gemm_zero_rows() {
    let Some(g) = gpu() else { return };
    let s = g.stream().clone();
    let p = MoeProblem::new(0, 256, 512, 4);
    let a = MoeActivations::new(s.alloc_zeros::<u8>(0).unwrap(), poison_u8(&s, p.sfa_bytes()), (0, 512), 1.0).unwrap();
    let w = Nvfp4Matrix::random_contest(256, 512, 4, 3).unwrap();
    let b = Nvfp4Tensor::upload(&w, &s).unwrap();
    let mut d = s.alloc_zeros::<f16>(0).unwrap();
    g.moe_gemm(&p, &a, &b, &s.clone_htod(&[0i32; 5]).unwrap(), &s.clone_htod(&[1.0f32; 4]).unwrap(), &mut d, None).unwrap();
    // Zero rows but the wrong offsets count is still refused.
    let e = g.moe_gemm(&p, &a, &b, &s.clone_htod(&[0i32; 4]).unwrap(), &s.clone_htod(&[1.0f32; 4]).unwrap(), &mut d, None).unwrap_err();
    assert!(matches!(e, Error::BufferLength { name: "offsets", .. }), "{e:?}");
}

#[test]
fn gpu_moe_gemm_w4a16_bad_inputs_write_nothing() {
    let Some(g) = hopper() else { return };
    let s = g.stream().clone();
    let m = moe(&s);
    // One element more than A, so that a view one element in stays inside the buffer.
    let x = s.clone_htod(&vec![bf16::from_f32(0.5); m.p.rows * m.p.k + 1]).unwrap();
    let x_a = x.slice(0..m.p.rows * m.p.k);
    let mut d = poison_f16(&s, m.p.d_elems());
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
    untouched_f16(&s, &d, "w4a16");
}

#[test]
fn gpu_quantize_moe_bad_inputs_write_nothing() {
    let Some(g) = gpu() else { return };
    let s = g.stream().clone();
    let q = Quantizer::new(s.clone());
    let (t, k, e) = (100usize, 512usize, 4usize);
    let x = s.clone_htod(&vec![bf16::from_f32(0.25); t * k]).unwrap();
    let o = s.clone_htod(&expert_offsets(&[30, 0, 50, 20]).unwrap()).unwrap();
    let sfb = blockscaled_gemm::grouped::moe_sfa_bytes(t, k, e);
    let (mut codes, mut scales) = (poison_u8(&s, t * k / 2), poison_u8(&s, sfb));
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
    untouched_u8(&s, &codes, "quantize_moe codes");
    untouched_u8(&s, &scales, "quantize_moe scales");
}

#[test]
fn gpu_grouped_list_bad_groups_write_nothing() {
    let Some(g) = gpu() else { return };
    let s = g.stream().clone();
    let up = |m: &Nvfp4Matrix| Nvfp4Tensor::upload(m, &s).unwrap();
    let a0 = up(&Nvfp4Matrix::random_contest(16, 256, 1, 4).unwrap());
    let b0 = up(&Nvfp4Matrix::random_contest(128, 256, 1, 5).unwrap());
    let b_other_k = up(&Nvfp4Matrix::random_contest(128, 512, 1, 6).unwrap());
    let b_batched = up(&Nvfp4Matrix::random_contest(128, 256, 2, 7).unwrap());
    let mut d0 = poison_f16(&s, 16 * 128);
    let mut d1 = poison_f16(&s, 16 * 128);
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
        let mut ds: Vec<CudaSlice<f16>> = (0..MAX_EXPERTS + 1).map(|_| poison_f16(&s, 16 * 128)).collect();
        let mut groups: Vec<_> = ds.iter_mut().map(|d| ListGroup { a: &a0, b: &b0, d, alpha: 1.0 }).collect();
        let e = g.grouped_list(&mut groups, None).unwrap_err();
        assert!(matches!(e, Error::Dimension { dim: "groups", .. }), "{e:?}");
        drop(groups);
        for d in &ds {
            untouched_f16(&s, d, "too many groups");
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
        let (mut dv, mut sfd) = (poison_u8(&s, 16 * 64), poison_u8(&s, blockscaled_gemm::Problem::new(16, 128, 256).sfd_bytes()));
        let mut groups = [ListGroup { a: &a0, b: &b0, d: Nvfp4Output::new(&mut dv, &mut sfd), alpha: 1.0 }];
        let e = g.grouped_list_fp4(OutType::Bf16, 1.0, &mut groups, None).unwrap_err();
        assert!(matches!(e, Error::InvalidData { what: "out", .. }), "{e:?}");
        let e = g.grouped_list_fp4(OutType::Nvfp4, f32::NAN, &mut groups, None).unwrap_err();
        assert!(matches!(e, Error::NormConstant { .. }), "{e:?}");
        drop(groups);
        untouched_u8(&s, &dv, "list FP4 D");
        untouched_u8(&s, &sfd, "list FP4 SFD");
    }
    untouched_f16(&s, &d0, "list group 0");
    untouched_f16(&s, &d1, "list group 1");
}

#[test]
fn gpu_grouped_list_raw_bad_arrays_are_refused() {
    let Some(g) = gpu() else { return };
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
}

/// select_list_config says it "errors as the call would": on bounds the call refuses it must
/// refuse too (before the fix it returned a config for zero groups).
#[test]
fn gpu_select_list_config_refuses_what_the_call_refuses() {
    let Some(g) = gpu() else { return };
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
}
