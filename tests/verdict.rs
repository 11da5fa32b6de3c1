//! The verification verdict on the CPU: GPU results modelled by FP32 sums in other orders than
//! the reference's, on the general data of issue 25 (every e2m1 code, scales 0x10..=0x58, odd M
//! and N, L = 2, alpha 0.75), for bf16, f16 and f32 output. The verdict must pass every such
//! result and fail wrong ones; the contest tolerance rejects some correct ones.
use blockscaled_gemm::compare::{compare, expected, verdict, verify_matrices, Expected};
use blockscaled_gemm::layout::to_tiled;
use blockscaled_gemm::reference::{self, dots};
use blockscaled_gemm::{reference_gemm, Nvfp4Matrix, OutputElement, Problem, SplitMix64};
use half::{bf16, f16};

/// Random bytes for the values (every e2m1 code, both signs) and scales uniform in 0x10..=0x58
/// (2^-5 ..= 16).
fn general(rows: usize, k: usize, l: usize, seed: u64) -> Nvfp4Matrix {
    let mut rng = SplitMix64::new(seed);
    let data = rng.bytes(l * rows * k / 2).unwrap();
    let sf: Vec<u8> = (0..l * rows * k / 16).map(|_| 0x10 + rng.below(0x49) as u8).collect();
    Nvfp4Matrix::from_parts((l, rows, k), data, to_tiled(&sf, (l, rows, k / 16)).unwrap(), None).unwrap()
}

/// A with row 0 of batch 0 repeating its first half in its second, and B with row 0 of batch 0
/// equal to that row in the first half and its negation in the second: D[0, 0, 0] is exactly 0
/// while its partial sums are large, the FP32 cancellation of the issue.
fn with_cancellation(a: &Nvfp4Matrix, b: &Nvfp4Matrix) -> (Nvfp4Matrix, Nvfp4Matrix) {
    let k = a.k();
    let (mut ad, mut bd) = (a.data().to_vec(), b.data().to_vec());
    let (mut asf, mut bsf) = (a.scales_row_major().unwrap(), b.scales_row_major().unwrap());
    let half_bytes = k / 4;
    let first: Vec<u8> = ad[..half_bytes].to_vec();
    ad[half_bytes..2 * half_bytes].copy_from_slice(&first);
    bd[..half_bytes].copy_from_slice(&first);
    for (i, byte) in first.iter().enumerate() {
        bd[half_bytes + i] = byte ^ 0x88; // both nibbles negated
    }
    let kb = k / 16;
    let first_sf: Vec<u8> = asf[..kb / 2].to_vec();
    asf[kb / 2..kb].copy_from_slice(&first_sf);
    bsf[..kb / 2].copy_from_slice(&first_sf);
    bsf[kb / 2..kb].copy_from_slice(&first_sf);
    let rebuild = |m: &Nvfp4Matrix, d: Vec<u8>, sf: Vec<u8>| Nvfp4Matrix::from_parts((m.batch(), m.rows(), k), d, to_tiled(&sf, (m.batch(), m.rows(), kb)).unwrap(), None).unwrap();
    (rebuild(a, ad, asf), rebuild(b, bd, bsf))
}

/// FP32 summation orders a GPU may use.
#[derive(Clone, Copy, Debug)]
enum Order {
    /// One product at a time, K ascending (CUTLASS's host reference).
    Forward,
    /// K descending.
    Reverse,
    /// A balanced binary tree.
    Pairwise,
    /// Four K ranges summed apart in 16-product groups (pairwise in the group, as an MMA's tree),
    /// then the partials added: split-K.
    SplitK4,
    /// 16 products and the accumulator added exactly, then truncated to f32 (round toward zero):
    /// a tensor core's fused, truncating step.
    Truncating16,
}

fn pairwise(x: &[f32]) -> f32 {
    match x.len() {
        0 => 0.0,
        1 => x[0],
        n => pairwise(&x[..n / 2]) + pairwise(&x[n / 2..]),
    }
}

/// f64 to f32 rounding toward zero.
fn to_f32_rz(x: f64) -> f32 {
    let r = x as f32;
    if (r as f64).abs() > x.abs() { f32::from_bits(r.to_bits() - 1) } else { r }
}

fn sum(p: &[f32], order: Order) -> f32 {
    match order {
        Order::Forward => p.iter().fold(0.0, |acc, &x| acc + x),
        Order::Reverse => p.iter().rev().fold(0.0, |acc, &x| acc + x),
        Order::Pairwise => pairwise(p),
        Order::SplitK4 => {
            let range = p.len().div_ceil(4).div_ceil(16) * 16;
            let partials: Vec<f32> = p.chunks(range).map(|r| r.chunks(16).fold(0.0, |acc, g| acc + pairwise(g))).collect();
            partials.iter().fold(0.0, |acc, &x| acc + x)
        }
        // Products are multiples of 2^-20 below 2^27: 16 of them and the accumulator sum exactly
        // in f64.
        Order::Truncating16 => p.chunks(16).fold(0.0, |acc, g| to_f32_rz(acc as f64 + g.iter().map(|&x| x as f64).sum::<f64>())),
    }
}

/// The modelled GPU result: exact products, FP32 sums in `order`, `alpha * acc + beta * C` in
/// FP32, one rounding to T.
fn gpu_model<T: OutputElement>(a: &Nvfp4Matrix, b: &Nvfp4Matrix, alpha: f32, beta: f32, c: Option<&[T]>, order: Order) -> Vec<T> {
    let (m, n, k, l) = (a.rows(), b.rows(), a.k(), a.batch());
    // e2m1 * scale, exact in f32 (no global scale here).
    let (da, db) = (a.dequantize().unwrap(), b.dequantize().unwrap());
    let mut out = Vec::with_capacity(l * m * n);
    let mut products = vec![0f32; k];
    for li in 0..l {
        for i in 0..m {
            let ra = &da[(li * m + i) * k..][..k];
            for j in 0..n {
                let rb = &db[(li * n + j) * k..][..k];
                for ((p, x), y) in products.iter_mut().zip(ra).zip(rb) {
                    *p = x * y; // exact
                }
                let mut v = alpha * sum(&products, order);
                if beta != 0.0 {
                    v += beta * c.unwrap()[(li * m + i) * n + j].to_f64() as f32;
                }
                out.push(T::from_f64(v as f64));
            }
        }
    }
    out
}

const ORDERS: [Order; 5] = [Order::Forward, Order::Reverse, Order::Pairwise, Order::SplitK4, Order::Truncating16];

/// Every order passes the verdict. Returns how many orders' results the contest tolerance
/// rejected, and the most elements of one order that were not exact (within the bound).
fn check_orders<T: OutputElement>(a: &Nvfp4Matrix, b: &Nvfp4Matrix, alpha: f32, beta: f32, c: Option<&[T]>) -> (usize, usize) {
    let want: Vec<T> = reference_gemm(a, b, alpha, beta, c).unwrap();
    let (mut contest_rejected, mut most_within) = (0, 0);
    for order in ORDERS {
        let got = gpu_model(a, b, alpha, beta, c, order);
        let v = verify_matrices(a, b, alpha, beta, c, &got).unwrap();
        assert!(v.passed(), "{:?} {order:?} alpha={alpha} beta={beta}: {v}", T::OUT);
        assert_eq!(v.count, got.len());
        assert!(v.exact + v.within == v.count);
        if let Some(w) = v.worst {
            assert!(w.ratio <= 1.0, "{w}");
        }
        eprintln!("{:?} {order:?} alpha={alpha} beta={beta}: {v}", T::OUT);
        contest_rejected += usize::from(!compare(&got, &want, 1e-3, 1e-3).unwrap().passed());
        most_within = most_within.max(v.within);
    }
    (contest_rejected, most_within)
}

#[test]
fn fp32_orders_pass_the_verdict_on_general_data() {
    let (m, n, k, l) = (67, 93, 4096, 2);
    let (a, b) = with_cancellation(&general(m, k, l, 1), &general(n, k, l, 2));
    assert_eq!(reference_gemm::<f32>(&a, &b, 1.0, 0.0, None).unwrap()[0], 0.0, "the cancelling element is exactly 0");
    // The cancelling element's FP32 error is far above the contest's atol in every type.
    let forward = gpu_model::<f32>(&a, &b, 0.75, 0.0, None, Order::Forward);
    assert!(forward[0].abs() > 1e-3, "the cancellation leaves {}", forward[0]);
    // bf16: besides it, values near a rounding boundary round to the neighbour (2^-8 apart
    // relatively, beyond rtol).
    let (rejected, within) = check_orders::<bf16>(&a, &b, 0.75, 0.0, None);
    assert!(rejected > 0 && within > 1, "the contest tolerance should reject correct bf16 results: {rejected} {within}");
    assert!(check_orders::<f16>(&a, &b, 0.75, 0.0, None).0 > 0, "the contest tolerance should reject a correct f16 result");
    assert!(check_orders::<f32>(&a, &b, 0.75, 0.0, None).0 > 0);
    // With C: beta * C in FP32 before the rounding.
    let mut rng = SplitMix64::new(5);
    let c: Vec<bf16> = (0..l * m * n).map(|_| bf16::from_f64((rng.normal() * 1000.0).round() / 8.0)).collect();
    check_orders(&a, &b, 0.75, -1.5, Some(&c));
    let c: Vec<f32> = (0..l * m * n).map(|_| (rng.normal() * 1000.0) as f32).collect();
    check_orders(&a, &b, -0.3, 0.25, Some(&c));
}

#[test]
fn wrong_results_fail_the_verdict() {
    let (m, n, k, l) = (21, 19, 512, 2);
    let (a, b) = (general(m, k, l, 3), general(n, k, l, 4));
    let got = gpu_model::<bf16>(&a, &b, 0.75, 0.0, None, Order::Reverse);
    assert!(verify_matrices(&a, &b, 0.75, 0.0, None, &got).unwrap().passed());
    // A wrong index: each row reversed.
    let swapped: Vec<bf16> = got.chunks(n).flat_map(|r| r.iter().rev().copied()).collect();
    let v = verify_matrices(&a, &b, 0.75, 0.0, None, &swapped).unwrap();
    assert!(v.failed > (l * m * n) / 2, "{v}");
    let w = v.worst.unwrap();
    assert!(w.ratio > 1.0 && w.got == swapped[w.index].to_f64(), "{w}");
    // A lost K half: the result of K / 2.
    let short = |x: &Nvfp4Matrix| {
        let rows: Vec<u8> = x.data().chunks(k / 2).flat_map(|r| r.iter().enumerate().map(|(i, &v)| if i < k / 4 { v } else { 0 })).collect();
        Nvfp4Matrix::from_parts((l, x.rows(), k), rows, x.scales().to_vec(), None).unwrap()
    };
    let half_k = gpu_model::<bf16>(&short(&a), &b, 0.75, 0.0, None, Order::Forward);
    assert!(!verify_matrices(&a, &b, 0.75, 0.0, None, &half_k).unwrap().passed());
    // One element off by one bf16 step more than its bound allows.
    let p = Problem::new(m, n, k).batch(l).scalars(0.75, 0.0);
    let d = dots(&p, a.data(), a.scales(), b.data(), b.scales()).unwrap();
    let e: Vec<Expected> = expected::<bf16>(&p, &d, None).unwrap();
    let hi = bf16::from_f64(e[7].exact + e[7].fp32_bound);
    let mut edge = got.clone();
    edge[7] = hi;
    assert!(verdict(&edge, &e).unwrap().passed(), "the upper end of the interval is within");
    edge[7] = bf16::from_bits(if hi.to_f64() > 0.0 { hi.to_bits() + 1 } else { hi.to_bits() - 1 });
    let v = verdict(&edge, &e).unwrap();
    assert_eq!((v.failed, v.worst.unwrap().index), (1, 7), "{v}");
    // NaN where the result is finite.
    let mut nan = got.clone();
    nan[3] = bf16::NAN;
    assert_eq!(verdict(&nan, &e).unwrap().failed, 1);
}

#[test]
fn dots_are_the_exact_sums_and_magnitudes() {
    let (m, n, k, l) = (13, 9, 256, 2);
    let (a, b) = (general(m, k, l, 6), general(n, k, l, 7));
    let p = Problem::new(m, n, k).batch(l);
    let d = dots(&p, a.data(), a.scales(), b.data(), b.scales()).unwrap();
    let exact = reference::accumulators(&p, a.data(), a.scales(), b.data(), b.scales(), reference::Accumulation::Exact).unwrap();
    let abs = |x: &Nvfp4Matrix| Nvfp4Matrix::from_parts((l, x.rows(), k), x.data().iter().map(|v| v & 0x77).collect(), x.scales().to_vec(), None).unwrap();
    let abs_sum: Vec<f64> = reference_gemm::<f32>(&abs(&a), &abs(&b), 1.0, 0.0, None).unwrap().iter().map(|&x| x as f64).collect();
    for i in 0..d.len() {
        assert_eq!(d[i].sum as f32, exact[i], "element {i}");
        assert_eq!(d[i].abs_sum as f32 as f64, abs_sum[i], "element {i}");
        assert!(d[i].abs_sum >= d[i].sum.abs());
        // The independent sum in f64 (exact here: 53 bits hold these sums).
        let (li, r, j) = (i / (m * n), (i / n) % m, i % n);
        let s: f64 = (0..k).map(|kk| a.value(li, r, kk) as f64 * b.value(li, j, kk) as f64).sum();
        assert_eq!(d[i].sum, s, "element {i}");
    }
    // A NaN scale makes both NaN, and the verdict then wants NaN.
    let mut sf = a.scales().to_vec();
    sf[0] = 0x7F;
    let an = Nvfp4Matrix::from_parts((l, m, k), a.data().to_vec(), sf, None).unwrap();
    let d = dots(&p, an.data(), an.scales(), b.data(), b.scales()).unwrap();
    assert!(d[0].sum.is_nan() && d[0].abs_sum.is_nan() && !d[n].sum.is_nan());
    let want: Vec<f32> = reference_gemm(&an, &b, 1.0, 0.0, None).unwrap();
    assert!(verify_matrices(&an, &b, 1.0, 0.0, None, &want).unwrap().passed());
    let mut got = want.clone();
    got[0] = 1.0;
    assert!(!verify_matrices(&an, &b, 1.0, 0.0, None, &got).unwrap().passed());
}

#[test]
fn verify_errors_are_typed() {
    let (a, b) = (general(4, 64, 1, 1), general(4, 32, 1, 1));
    let e = verify_matrices::<f32>(&a, &b, 1.0, 0.0, None, &[0.0; 16]).unwrap_err();
    assert!(e.to_string().contains("K and L must agree"), "{e}");
    let e = verify_matrices::<f32>(&a, &a, 1.0, 0.0, None, &[0.0; 15]).unwrap_err();
    assert!(e.to_string().starts_with("D: holds 15"), "{e}");
    let e = verify_matrices::<f32>(&a, &a, 1.0, 1.0, None, &[0.0; 16]).unwrap_err();
    assert!(e.to_string().contains("beta = 1"), "{e}");
    // Sizes beyond the host: a typed error before anything is allocated.
    let p = Problem::new(1 << 40, 4, 1 << 30);
    let e = reference::gemm::<f32>(&p, &[], &[], &[], &[], None).unwrap_err();
    assert!(e.to_string().contains("A bytes") && e.to_string().contains("isize::MAX"), "{e}");
    let e = dots(&p, &[], &[], &[], &[]).unwrap_err();
    assert!(e.to_string().contains("A bytes"), "{e}");
}
