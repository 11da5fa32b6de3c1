//! The host-side layout, FP4 epilogue, SwiGLU and comparison API, driven with inputs a caller
//! controls (first written by an adversarial review of that surface).

use blockscaled_gemm::compare::{compare, compare_fp4, verify_matrices};
use blockscaled_gemm::formats::{e2m1_to_f32, ue4m3_to_f32};
use blockscaled_gemm::fp4_out::{e2m1_from_f32_cutlass, epilogue, quantize_group, sfd_from_f32, sfd_to_f32};
use blockscaled_gemm::layout::*;
use blockscaled_gemm::swiglu::swiglu_rows;
use blockscaled_gemm::{reference_gemm, Error, Nvfp4Matrix, Problem, SfdFormat};
use std::time::Instant;

fn odd_bytes(n: usize, seed: usize) -> Vec<u8> {
    (0..n).map(|i| ((i.wrapping_mul(2654435761).wrapping_add(seed)) >> 3) as u8 | 1).collect()
}

#[test]
fn tiled_round_trips_on_many_shapes() {
    for rows in [1usize, 2, 31, 32, 33, 127, 128, 129, 255, 256, 257, 300] {
        for cols in [1usize, 2, 3, 4, 5, 7, 8, 9, 16, 17] {
            for batch in [1usize, 2, 3] {
                let src = odd_bytes(rows * cols * batch, rows + cols);
                let t = to_tiled(&src, (batch, rows, cols)).unwrap();
                assert_eq!(t.len(), batch * padded_rows(rows) * padded_sf_cols(cols));
                assert_eq!(t.len(), sf_bytes((batch, rows, cols * 16)));
                assert_eq!(Some(t.len()), checked_sf_bytes((batch, rows, cols * 16)));
                assert_eq!(t.iter().filter(|&&b| b != 0).count(), src.len(), "padding is zero");
                assert_eq!(from_tiled(&t, (batch, rows, cols)).unwrap(), src);
                // Every position through sf_offset_elem.
                for l in 0..batch {
                    for r in (0..rows).step_by(7) {
                        for s in 0..cols {
                            assert_eq!(t[sf_offset_elem(l, r, s * 16, rows, cols * 16)], src[(l * rows + r) * cols + s]);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn tiled_zero_sizes_and_bad_lengths() {
    for (rows, cols, batch) in [(0, 5, 2), (5, 0, 2), (5, 5, 0), (0, 0, 0), (usize::MAX, 0, 1), (0, usize::MAX, 1), (usize::MAX, usize::MAX, 0)] {
        let t = Instant::now();
        assert_eq!(to_tiled(&[], (batch, rows, cols)).unwrap(), Vec::<u8>::new(), "{rows} {cols} {batch}");
        assert_eq!(from_tiled(&[], (batch, rows, cols)).unwrap(), Vec::<u8>::new(), "{rows} {cols} {batch}");
        assert!(t.elapsed().as_millis() < 100);
    }
    assert!(matches!(to_tiled(&[1, 2, 3], (1, 1, 2)), Err(Error::BufferLength { got: 3, want: 2, .. })));
    assert!(matches!(from_tiled(&[0; 511], (1, 1, 1)), Err(Error::BufferLength { got: 511, want: 512, .. })));
    assert!(matches!(from_tiled(&[0; 513], (1, 1, 1)), Err(Error::BufferLength { got: 513, want: 512, .. })));
    // Sizes beyond usize: typed errors, at once.
    let t = Instant::now();
    for (rows, cols, batch) in [(usize::MAX, 1, 1), (1, usize::MAX, 1), (1, 1, usize::MAX), (1 << 40, 1 << 30, 1), (usize::MAX - 100, 3, 1), (3, usize::MAX - 2, 1)] {
        assert!(matches!(to_tiled(&[1], (batch, rows, cols)), Err(Error::SizeLimit { .. })), "{rows} {cols} {batch}");
        assert!(matches!(from_tiled(&[1], (batch, rows, cols)), Err(Error::SizeLimit { .. })), "{rows} {cols} {batch}");
    }
    // Row-major fits, tiled does not (padding of scale columns to 4).
    let rows = usize::MAX / 3;
    assert!(matches!(to_tiled(&[1], (1, rows, 1)), Err(Error::SizeLimit { what: "tiled scale bytes", .. })));
    // Tiled fits, the allocation is just too large: HostMemory, not an abort.
    let r = to_tiled(&[], (1, 0, 1));
    assert!(r.is_ok());
    assert!(t.elapsed().as_millis() < 100);
    // Padded sizes saturate.
    assert_eq!(padded_sf_cols(usize::MAX), usize::MAX);
    assert_eq!(padded_rows(0), 0);
    assert_eq!(padded_sf_cols(0), 0);
    assert_eq!(sf_bytes((usize::MAX, usize::MAX, usize::MAX)), usize::MAX);
    assert_eq!(sf_batch_bytes(0, 16), 0);
    assert_eq!(sf_batch_bytes(1, 15), 0, "K below 16 has no scale column");
    assert_eq!(checked_sf_bytes((usize::MAX, 0, 0)), Some(0));
}

#[test]
fn prepack_round_trips_and_refusals() {
    for k in [2usize, 4, 30, 32, 62, 254, 256, 258, 510, 512, 514, 1000, 7168] {
        for rows in [1usize, 2, 3, 17] {
            for batch in [1usize, 2] {
                let src = odd_bytes(batch * rows * k / 2, k);
                let p = prepack_values(&src, (batch, rows, k)).unwrap();
                assert_eq!(p.len(), prepacked_bytes((batch, rows, k)));
                assert_eq!(p.len(), batch * prepack_chunks(k) * rows * PREPACK_CHUNK_BYTES);
                assert_eq!(p.iter().filter(|&&b| b != 0).count(), src.len());
                assert_eq!(unpack_values(&p, (batch, rows, k)).unwrap(), src, "{rows} {k} {batch}");
            }
        }
    }
    for k in [1usize, 3, 17, usize::MAX] {
        assert!(matches!(prepack_values(&[], (1, 1, k)), Err(Error::KMultiple { multiple: 2, .. })), "{k}");
        assert!(matches!(unpack_values(&[], (1, 1, k)), Err(Error::KMultiple { multiple: 2, .. })), "{k}");
    }
    let t = Instant::now();
    for (rows, k, batch) in [(0, 32, 1), (usize::MAX, 0, 1), (1, 0, usize::MAX), (usize::MAX, 32, 0), (0, usize::MAX - 1, usize::MAX)] {
        assert_eq!(prepack_values(&[], (batch, rows, k)).unwrap(), Vec::<u8>::new(), "{rows} {k} {batch}");
        assert_eq!(unpack_values(&[], (batch, rows, k)).unwrap(), Vec::<u8>::new(), "{rows} {k} {batch}");
    }
    for (rows, k, batch) in [(usize::MAX, 32, 1), (1, usize::MAX - 1, 2), (1 << 40, 1 << 30, 1), (1, 2, usize::MAX)] {
        assert!(matches!(prepack_values(&[1], (batch, rows, k)), Err(Error::SizeLimit { .. })), "{rows} {k} {batch}");
        assert!(matches!(unpack_values(&[1], (batch, rows, k)), Err(Error::SizeLimit { .. })), "{rows} {k} {batch}");
    }
    // Standard fits, prepacked (K rounded up to 256) does not.
    let (rows, k) = (usize::MAX / 64, 2);
    assert!(matches!(prepack_values(&[1], (1, rows, k)), Err(Error::SizeLimit { .. })));
    assert!(t.elapsed().as_millis() < 100);
    assert!(matches!(prepack_values(&[1; 15], (1, 1, 32)), Err(Error::BufferLength { got: 15, want: 16, .. })));
    assert!(matches!(unpack_values(&[1; 16], (1, 1, 32)), Err(Error::BufferLength { got: 16, want: 128, .. })));
    // Prepacked bytes past K that are not zero are dropped by unpack.
    let mut p = prepack_values(&[7; 16], (1, 1, 32)).unwrap();
    p[100] = 9;
    assert_eq!(unpack_values(&p, (1, 1, 32)).unwrap(), vec![7; 16]);
}

#[test]
fn e2m1_and_sfd_conversions() {
    // Every e2m1 code decodes and re-encodes to itself.
    for code in 0u8..16 {
        assert_eq!(e2m1_from_f32_cutlass(e2m1_to_f32(code)), code, "{code}");
    }
    // Midpoints round to the even code; just past them to the odd one.
    let grid = [0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
    for i in 0..7 {
        let mid = (grid[i] + grid[i + 1]) / 2.0;
        let even = if i % 2 == 0 { i } else { i + 1 } as u8;
        assert_eq!(e2m1_from_f32_cutlass(mid), even, "{mid}");
        assert_eq!(e2m1_from_f32_cutlass(-mid), even | 8, "-{mid}");
        assert_eq!(e2m1_from_f32_cutlass(f32::from_bits(mid.to_bits() + 1)), (i + 1) as u8);
        assert_eq!(e2m1_from_f32_cutlass(f32::from_bits(mid.to_bits() - 1)), i as u8);
    }
    assert_eq!(e2m1_from_f32_cutlass(-0.0), 8);
    assert_eq!(e2m1_from_f32_cutlass(1e30), 7);
    assert_eq!(e2m1_from_f32_cutlass(-1e30), 0xF);
    // Every scale byte round trips through its value.
    for b in 0u8..=0x7E {
        assert_eq!(sfd_from_f32(SfdFormat::Ue4m3, sfd_to_f32(SfdFormat::Ue4m3, b)), b, "ue4m3 {b:#x}");
        assert_eq!(sfd_to_f32(SfdFormat::Ue4m3, b), ue4m3_to_f32(b));
    }
    for b in 0u8..=0xFE {
        assert_eq!(sfd_from_f32(SfdFormat::Ue8m0, sfd_to_f32(SfdFormat::Ue8m0, b)), b, "ue8m0 {b:#x}");
        // Just above a power of two: rounds up (saturating at 0xFE).
        let x = sfd_to_f32(SfdFormat::Ue8m0, b);
        let up = f32::from_bits(x.to_bits() + 1);
        let want = if b == 0xFE || b == 0 { b.max(if b == 0 { 1 } else { 0 }) } else { b + 1 };
        if b != 0 {
            assert_eq!(sfd_from_f32(SfdFormat::Ue8m0, up), want, "ue8m0 above {b:#x}");
        }
    }
    for x in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        assert_eq!(sfd_from_f32(SfdFormat::Ue8m0, x), 0xFF);
    }
    assert_eq!(sfd_from_f32(SfdFormat::Ue4m3, -0.0), 0);
    assert_eq!(sfd_from_f32(SfdFormat::Ue4m3, -448.0), 0x7E, "documented: ue4m3 drops the sign of its input");
}

#[test]
fn epilogue_matches_groups_and_refuses() {
    let (m, n, l) = (3usize, 48usize, 2usize);
    let acc: Vec<f32> = (0..l * m * n).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.173).collect();
    let c: Vec<f32> = (0..l * m * n).map(|i| ((i * 11 % 13) as f32 - 6.0) * 0.5).collect();
    for format in [SfdFormat::Ue4m3, SfdFormat::Ue8m0] {
        let p = Problem::new(m, n, 64).batch(l).scalars(0.75, -1.25).norm_constant(3.0);
        let (d, sfd) = epilogue(&p, &acc, Some(&c), format).unwrap();
        assert_eq!(d.len(), l * m * n / 2);
        assert_eq!(sfd.len(), p.sfd_bytes());
        let rm = from_tiled(&sfd, (l, m, n / 16)).unwrap();
        assert_eq!(sfd.iter().filter(|&&b| b != 0).count(), rm.iter().filter(|&&b| b != 0).count(), "padding zero");
        for li in 0..l {
            for r in 0..m {
                for g in 0..n / 16 {
                    let base = (li * m + r) * n + g * 16;
                    let v: [f32; 16] = std::array::from_fn(|j| 0.75 * acc[base + j] + -1.25 * c[base + j]);
                    let mut codes = [0u8; 16];
                    let sf = quantize_group(&v, 3.0, format, &mut codes);
                    assert_eq!(rm[(li * m + r) * (n / 16) + g], sf);
                    for j in 0..16 {
                        let byte = d[(base + j) / 2];
                        assert_eq!(if j % 2 == 0 { byte & 15 } else { byte >> 4 }, codes[j]);
                    }
                }
            }
        }
    }
    let p = Problem::new(1, 16, 32);
    assert!(matches!(epilogue(&p, &[0.0; 15], None, SfdFormat::Ue4m3), Err(Error::BufferLength { .. })));
    assert!(epilogue(&Problem::new(1, 8, 32), &[0.0; 8], None, SfdFormat::Ue4m3).is_err());
    assert!(matches!(epilogue(&Problem::new(1, 16, 32).scalars(1.0, 1.0), &[0.0; 16], None, SfdFormat::Ue4m3), Err(Error::BetaWithoutC { .. })));
    // Empty and huge problems: quick.
    let t = Instant::now();
    for (m, n, l) in [(0, 16, 1), (usize::MAX, 0, 1), (1, 16, 0), (usize::MAX, 16, usize::MAX)] {
        let p = Problem::new(m, n, 32).batch(l);
        let r = epilogue(&p, &[], None, SfdFormat::Ue8m0);
        if p.cd_elems() == 0 {
            assert_eq!(r.unwrap(), (vec![], vec![]));
        } else {
            assert!(r.is_err());
        }
    }
    assert!(t.elapsed().as_millis() < 100);
    // A NaN accumulator: NaN propagates to the scale; codes are ±6 as documented.
    let mut acc = [1.0f32; 16];
    acc[3] = f32::NAN;
    let (d, sfd) = epilogue(&Problem::new(1, 16, 32), &acc, None, SfdFormat::Ue4m3).unwrap();
    assert_eq!(sfd[0], 0x7F);
    assert!(d.iter().all(|&b| b == 0x77), "{d:?}");
}

#[test]
fn quantize_group_every_code_and_scale() {
    // A group holding every e2m1 magnitude times a scale s comes back exactly when sfd*… is s.
    for format in [SfdFormat::Ue4m3, SfdFormat::Ue8m0] {
        for st in [1.0f32, 6.0, 448.0] { // 6 * st / 6 <= 448: the scale does not saturate
            let mut codes = [0u8; 16];
            let v: [f32; 16] = std::array::from_fn(|i| e2m1_to_f32(i as u8));
            let sf = quantize_group(&v, st, format, &mut codes);
            let s = sfd_to_f32(format, sf) / st;
            for (i, &c) in codes.iter().enumerate() {
                let back = e2m1_to_f32(c) * s;
                // At most one e2m1 step of error at the group's scale.
                assert!((back - v[i]).abs() <= 2.0 * s * 1.0001 || (v[i] == 0.0 && back == 0.0), "{format:?} st {st}: {} -> {back} (s {s})", v[i]);
            }
        }
    }
}

#[test]
fn swiglu_rows_shapes() {
    // Zero K with a batch * rows product beyond usize: zero elements are needed, none given.
    let r = swiglu_rows::<f32>(&[], (usize::MAX, 2, 0));
    assert_eq!(r.unwrap(), Vec::<f32>::new());
    assert_eq!(swiglu_rows::<f32>(&[], (0, 5, 7)).unwrap(), Vec::<f32>::new());
    assert_eq!(swiglu_rows::<f32>(&[], (3, 5, 0)).unwrap(), Vec::<f32>::new());
    assert_eq!(swiglu_rows::<f32>(&[], (1, 0, usize::MAX)).unwrap(), Vec::<f32>::new());
    assert!(matches!(swiglu_rows::<f32>(&[1.0; 4], (1, 1, usize::MAX)), Err(Error::SizeLimit { .. })));
    assert!(swiglu_rows::<f32>(&[1.0; 4], (1, 1, usize::MAX / 2 + 1)).is_err());
    assert!(swiglu_rows::<f32>(&[1.0; 3], (1, 1, 1)).is_err());
    assert_eq!(swiglu_rows::<f32>(&[1.0; 4], (1, 2, 1)).unwrap().len(), 2);
    assert_eq!(swiglu_rows::<f32>(&[1.0; 4], (2, 1, 1)).unwrap().len(), 2);
}

#[test]
fn compare_fp4_neighbour_scale_compares_values() {
    // SFD one code apart: the codes are compared by value, so 6 against 0 is far.
    let want = [0x00u8; 8];
    let got = [0x77u8; 8];
    let c = compare_fp4(&got, &[0x39], &want, &[0x38], 16, SfdFormat::Ue4m3).unwrap();
    assert!(!c.within_one_step() && c.neighbour_codes_far == 16, "{c}");
    // The same codes at neighbouring scales (1.125 and 1.0) pass.
    let c = compare_fp4(&got, &[0x39], &got, &[0x38], 16, SfdFormat::Ue4m3).unwrap();
    assert!(c.within_one_step() && c.neighbour_codes == 16, "{c}");
}

#[test]
fn compare_fp4_shapes() {
    assert!(compare_fp4(&[], &[], &[], &[], 0, SfdFormat::Ue4m3).is_err());
    assert!(compare_fp4(&[], &[], &[], &[], 24, SfdFormat::Ue4m3).is_err());
    let c = compare_fp4(&[], &[], &[], &[], 16, SfdFormat::Ue4m3).unwrap();
    assert!(c.byte_equal() && c.within_one_step() && c.groups == 0);
    assert!(compare_fp4(&[0; 9], &[0], &[0; 9], &[0], 16, SfdFormat::Ue4m3).is_err());
    assert!(compare_fp4(&[0; 8], &[0], &[0; 16], &[0], 16, SfdFormat::Ue4m3).is_err());
    assert!(compare_fp4(&[0; 8], &[0, 0], &[0; 8], &[0, 0], 16, SfdFormat::Ue4m3).is_err());
    assert!(compare_fp4(&[0; 8], &[0], &[0; 8], &[0, 0], 16, SfdFormat::Ue4m3).is_err());
    assert!(compare_fp4(&[0; 8], &[0], &[0; 8], &[0], usize::MAX - 15, SfdFormat::Ue4m3).is_err());
    // Every pair of codes: the step count is the distance on -6..6 with ±0 one point.
    let order = [0xFu8, 0xE, 0xD, 0xC, 0xB, 0xA, 0x9, 0x0, 0x1, 0x2, 0x3, 0x4, 0x5, 0x6, 0x7];
    let pos = |c: u8| if c == 8 { 7 } else { order.iter().position(|&x| x == c).unwrap() as i32 };
    for x in 0u8..16 {
        for y in 0u8..16 {
            let g = [x | (x << 4); 8];
            let w = [y | (y << 4); 8];
            let c = compare_fp4(&g, &[1], &w, &[1], 16, SfdFormat::Ue4m3).unwrap();
            let steps = (pos(x) - pos(y)).abs();
            assert_eq!(c.codes_one_step, if steps == 1 { 16 } else { 0 }, "{x} {y}");
            assert_eq!(c.codes_far, if steps > 1 { 16 } else { 0 }, "{x} {y}");
            assert_eq!(c.codes_bits_differ, if x != y { 16 } else { 0 });
        }
    }
}

#[test]
fn compare_max_abs_over_finite_pairs() {
    // Documented: max_abs is "Largest |got - want| over finite pairs".
    let c = compare(&[f32::INFINITY, 1.5], &[1.0f32, 1.0], 1e-3, 1e-3).unwrap();
    eprintln!("{c}");
    assert_eq!(c.bad, 2);
    assert_eq!(c.max_abs, 0.5, "an infinite pair counted in max_abs");
}

#[test]
fn compare_odd_tolerances() {
    let c = compare(&[1.0f32, 2.0], &[1.0f32, 2.0], f64::NAN, f64::NAN).unwrap();
    assert!(c.passed(), "equal values pass whatever the tolerance");
    let c = compare(&[1.0f32], &[1.1f32], f64::NAN, 0.0).unwrap();
    assert!(!c.passed());
    let c = compare(&[-0.0f32], &[0.0f32], -1.0, -1.0).unwrap();
    assert!(c.passed());
    let c = compare(&[f32::NEG_INFINITY], &[f32::INFINITY], f64::INFINITY, 0.0).unwrap();
    assert!(!c.passed(), "opposite infinities");
    let c = compare::<f32>(&[], &[], 0.0, 0.0).unwrap();
    assert!(c.passed() && c.count == 0);
}

#[test]
fn verify_matrices_passes_right_and_fails_wrong() {
    for (m, n, k, l) in [(5usize, 24usize, 64usize, 2usize), (1, 8, 32, 1), (130, 16, 96, 1)] {
        let a = Nvfp4Matrix::random_contest((l, m, k), 3).unwrap();
        let b = Nvfp4Matrix::random_contest((l, n, k), 4).unwrap();
        let c: Vec<half::bf16> = (0..l * m * n).map(|i| half::bf16::from_f32(i as f32 * 0.01)).collect();
        let d = reference_gemm(&a, &b, 0.5, 0.25, Some(&c)).unwrap();
        let v = verify_matrices(&a, &b, 0.5, 0.25, Some(&c), &d).unwrap();
        assert!(v.passed() && v.exact == d.len(), "{v}");
        // A wrong C term (beta = 0 reference) fails where C is not tiny.
        let d0 = reference_gemm::<half::bf16>(&a, &b, 0.5, 0.0, None).unwrap();
        let v = verify_matrices(&a, &b, 0.5, 0.25, Some(&c), &d0).unwrap();
        assert!(!v.passed(), "{v}");
        // One element off by a lot fails.
        let mut bad = d.clone();
        bad[d.len() / 2] = half::bf16::from_f32(bad[d.len() / 2].to_f32() * 2.0 + 1.0);
        assert_eq!(verify_matrices(&a, &b, 0.5, 0.25, Some(&c), &bad).unwrap().failed, 1);
        // NaN fails.
        bad[0] = half::bf16::NAN;
        assert!(!verify_matrices(&a, &b, 0.5, 0.25, Some(&c), &bad).unwrap().passed());
        // Lengths.
        assert!(verify_matrices(&a, &b, 0.5, 0.25, Some(&c), &d[1..]).is_err());
        assert!(verify_matrices(&a, &b, 0.5, 0.25, Some(&c[1..]), &d).is_err());
        assert!(verify_matrices::<half::bf16>(&a, &b, 0.5, 0.25, None, &d).is_err());
        // Non-finite alpha / beta.
        for (al, be) in [(f32::NAN, 0.0), (f32::INFINITY, 0.0), (1.0, f32::NAN), (1.0, f32::INFINITY)] {
            let r = verify_matrices(&a, &b, al, be, Some(&c), &d);
            assert!(matches!(r, Err(Error::NonFiniteScalar { .. }) | Err(Error::InvalidData { what: "alpha", .. })), "{al} {be}: {r:?}");
        }
    }
    let a = Nvfp4Matrix::random_contest((1, 4, 64), 3).unwrap();
    let b = Nvfp4Matrix::random_contest((1, 4, 32), 4).unwrap();
    assert!(verify_matrices::<f32>(&a, &b, 1.0, 0.0, None, &[0.0; 16]).is_err());
}

#[test]
fn sf_offset_out_of_precondition_does_not_panic() {
    // Documented: unchecked "as in an indexing loop" for positions inside a layout that fits.
    // Outside it the result is meaningless, but no panic in builds with overflow checks.
    assert!(std::panic::catch_unwind(|| sf_offset(usize::MAX, 0, 4)).is_ok());
    assert!(std::panic::catch_unwind(|| sf_offset_elem(usize::MAX, 0, 0, 1, 16)).is_ok());
}

/// An FP32 GEMM as a kernel may compute it: exact products, summed in blocks of `t` with the
/// block sum truncated toward zero to f32 and added to the accumulator with truncation (the
/// tensor-core model of the compare module docs), blocks in a shuffled order; then alpha * acc
/// and beta * C in f32, and one rounding to T.
fn simulated<T: blockscaled_gemm::OutputElement>(a: &Nvfp4Matrix, b: &Nvfp4Matrix, alpha: f32, beta: f32, c: &[T], t: usize, seed: u64) -> Vec<T> {
    let (m, n, k, l) = (a.rows(), b.rows(), a.k(), a.batch());
    let ga = a.global_scale().unwrap_or(1.0);
    let gb = b.global_scale().unwrap_or(1.0);
    let alpha = alpha * ga * gb;
    let trunc = |x: f64| -> f32 {
        let f = x as f32;
        if (f as f64).abs() > x.abs() { f32::from_bits(f.to_bits() - 1) } else { f }
    };
    let mut rng = blockscaled_gemm::SplitMix64::new(seed);
    let mut out = Vec::with_capacity(l * m * n);
    for li in 0..l {
        for i in 0..m {
            for j in 0..n {
                let mut blocks: Vec<usize> = (0..k.div_ceil(t)).collect();
                for x in (1..blocks.len()).rev() {
                    blocks.swap(x, rng.below(x as u64 + 1) as usize);
                }
                let mut acc = 0f32;
                for bl in blocks {
                    let mut s = acc as f64;
                    for kk in bl * t..((bl + 1) * t).min(k) {
                        s += a.value(li, i, kk) as f64 * b.value(li, j, kk) as f64;
                    }
                    acc = trunc(s);
                }
                let idx = (li * m + i) * n + j;
                let v = alpha * acc + beta * c[idx].to_f64() as f32;
                out.push(T::from_f64(v as f64));
            }
        }
    }
    out
}

#[test]
fn verify_matrices_passes_simulated_fp32_gemms() {
    use half::{bf16, f16};
    for (m, n, k, l, seed) in [(4usize, 16usize, 256usize, 1usize, 1u64), (3, 8, 2048, 2, 2), (2, 8, 7168, 1, 3)] {
        for kind in 0..3 {
            let (a, b) = match kind {
                0 => (Nvfp4Matrix::random_contest((l, m, k), seed).unwrap(), Nvfp4Matrix::random_contest((l, n, k), seed + 9).unwrap()),
                1 => (Nvfp4Matrix::random_realistic((l, m, k), seed).unwrap(), Nvfp4Matrix::random_realistic((l, n, k), seed + 9).unwrap()),
                _ => (Nvfp4Matrix::random_gaussian((l, m, k), seed).unwrap(), Nvfp4Matrix::random_gaussian((l, n, k), seed + 9).unwrap()),
            };
            for t in [1usize, 4, 16, 64] {
                let cf: Vec<f32> = (0..l * m * n).map(|i| (i as f32 - 7.0) * 0.37).collect();
                let c16: Vec<bf16> = cf.iter().map(|&x| bf16::from_f32(x)).collect();
                let ch: Vec<f16> = cf.iter().map(|&x| f16::from_f32(x)).collect();
                let d = simulated(&a, &b, 0.37, -0.6, &c16, t, seed * 31 + t as u64);
                let v = verify_matrices(&a, &b, 0.37, -0.6, Some(&c16), &d).unwrap();
                assert!(v.passed(), "bf16 {m} {n} {k} {l} kind {kind} t {t}: {v}");
                let d = simulated(&a, &b, 1.0, 0.5, &ch, t, seed + t as u64);
                let v = verify_matrices(&a, &b, 1.0, 0.5, Some(&ch), &d).unwrap();
                assert!(v.passed(), "f16 {m} {n} {k} {l} kind {kind} t {t}: {v}");
                let d = simulated(&a, &b, 0.001, 0.0, &cf, t, seed + 5 * t as u64);
                let v = verify_matrices::<f32>(&a, &b, 0.001, 0.0, None, &d).unwrap();
                assert!(v.passed(), "f32 {m} {n} {k} {l} kind {kind} t {t}: {v}");
                eprintln!("kind {kind} k {k} t {t}: {v}");
            }
        }
    }
}

#[test]
fn sfd_conversions_over_the_f32_range() {
    // ue4m3: nearest of the 127 finite values, ties to the even code, saturating at 448;
    // ue8m0: the least power of two not below |x| (2^-127 ..= 2^127), exact powers kept.
    let grid: Vec<f64> = (0u8..=0x7E).map(|b| ue4m3_to_f32(b) as f64).collect();
    let mut bits = 0u32;
    while bits < 0x7F80_0000 {
        for sign in [0u32, 0x8000_0000] {
            let x = f32::from_bits(bits | sign);
            let m = x.abs() as f64;
            let got = sfd_from_f32(SfdFormat::Ue4m3, x);
            let want = if m >= 448.0 { 0x7E } else {
                let i = grid.partition_point(|&g| g <= m); // first above m
                let lo = i - 1;
                if i == grid.len() { lo as u8 } else {
                    let (dl, dh) = (m - grid[lo], grid[i] - m);
                    if dl < dh || (dl == dh && lo % 2 == 0) { lo as u8 } else { i as u8 }
                }
            };
            assert_eq!(got, want, "ue4m3 of {x:e}");
            let got = sfd_from_f32(SfdFormat::Ue8m0, x);
            let want = {
                let mut e = -127i32;
                while e < 127 && 2f64.powi(e) < m { e += 1; }
                (e + 127) as u8
            };
            assert_eq!(got, want, "ue8m0 of {x:e}");
        }
        bits += 0x1_0001; // every exponent, a spread of mantissas
    }
}

#[test]
fn quantize_group_never_panics() {
    let specials = [0.0f32, -0.0, f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, f32::MIN, f32::MIN_POSITIVE, f32::from_bits(1), -f32::from_bits(1), 1.0, -6.0, 448.0, 2688.0];
    let mut rng = blockscaled_gemm::SplitMix64::new(5);
    for _ in 0..20000 {
        let v: [f32; 16] = std::array::from_fn(|_| if rng.below(3) == 0 { specials[rng.below(specials.len() as u64) as usize] } else { f32::from_bits(rng.next_u64() as u32) });
        for st in [f32::from_bits(1), 1e-30, 1.0, 2688.0, 1e30, f32::MAX, f32::NAN, -1.0, 0.0, f32::INFINITY] {
            for format in [SfdFormat::Ue4m3, SfdFormat::Ue8m0] {
                let mut codes = [0u8; 16];
                let _ = quantize_group(&v, st, format, &mut codes);
                assert!(codes.iter().all(|&c| c < 16));
            }
        }
    }
}

#[test]
fn verify_w4a16_passes_simulated_fp32_gemms() {
    use blockscaled_gemm::compare::verify_w4a16;
    use half::{bf16, f16};
    let (m, n, k, l) = (3usize, 8usize, 4096usize, 2usize);
    let b = Nvfp4Matrix::random_realistic((l, n, k), 11).unwrap();
    let mut rng = blockscaled_gemm::SplitMix64::new(12);
    let af: Vec<f32> = (0..l * m * k).map(|_| (rng.normal() * 2f64.powi(rng.below(12) as i32 - 10)) as f32).collect();
    let a: Vec<bf16> = af.iter().map(|&x| bf16::from_f32(x)).collect();
    let p = Problem::new(m, n, k).batch(l).scalars(0.8, 0.0);
    for t in [1usize, 8, 32] {
        let mut out = Vec::new();
        for li in 0..l {
            for i in 0..m {
                for j in 0..n {
                    let mut acc = 0f32;
                    for blk in (0..k).step_by(t).rev() {
                        let mut s = acc as f64;
                        for kk in blk..blk + t {
                            s += a[(li * m + i) * k + kk].to_f64() * b.value(li, j, kk) as f64;
                        }
                        let f = s as f32;
                        acc = if (f as f64).abs() > s.abs() { f32::from_bits(f.to_bits() - 1) } else { f };
                    }
                    out.push(f16::from_f32(0.8 * acc));
                }
            }
        }
        let v = verify_w4a16::<bf16, f16>(&p, &a, b.data(), b.scales(), None, &out).unwrap();
        assert!(v.passed(), "t {t}: {v}");
        let mut bad = out.clone();
        assert!(out.iter().all(|x| x.is_finite()));
        bad[5] = f16::from_f32(bad[5].to_f32() * 1.5 + 1.0);
        assert!(!verify_w4a16::<bf16, f16>(&p, &a, b.data(), b.scales(), None, &bad).unwrap().passed());
    }
    let bad_p = Problem::new(m, n, k).batch(l).scalars(f32::NAN, 0.0);
    assert!(matches!(verify_w4a16::<bf16, f16>(&bad_p, &a, b.data(), b.scales(), None, &[f16::ZERO; 48]), Err(Error::NonFiniteScalar { .. })));
}
