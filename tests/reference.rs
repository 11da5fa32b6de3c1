//! The exact reference against an independent dequantize-and-sum, and its algebraic properties.
use blockscaled_gemm::compare::compare;
use blockscaled_gemm::{reference_gemm, Nvfp4Matrix, OutputElement};
use half::{bf16, f16};

/// Naive D = alpha * deq(A) deq(B)ᵀ + beta C in f64 over dequantized values. Exact for data whose
/// partial sums stay within 53 bits (contest and realistic generators), so results must agree
/// bit for bit after the same final rounding.
fn naive<T: OutputElement>(a: &Nvfp4Matrix, b: &Nvfp4Matrix, alpha: f32, beta: f32, c: Option<&[T]>) -> Vec<T> {
    let (m, n, k, l) = (a.rows(), b.rows(), a.k(), a.batch());
    let (da, db) = (a.dequantize().unwrap(), b.dequantize().unwrap());
    let mut out = Vec::with_capacity(l * m * n);
    for li in 0..l {
        for i in 0..m {
            for j in 0..n {
                let ra = &da[(li * m + i) * k..][..k];
                let rb = &db[(li * n + j) * k..][..k];
                // From +0, as an FP32 accumulator starts (f64's `Sum` starts at -0 since Rust 1.82).
                let s: f64 = ra.iter().zip(rb).map(|(x, y)| *x as f64 * *y as f64).fold(0.0, |acc, v| acc + v);
                let mut v = alpha as f64 * s;
                if beta != 0.0 {
                    v += beta as f64 * c.unwrap()[(li * m + i) * n + j].to_f64();
                }
                out.push(T::from_f64(v));
            }
        }
    }
    out
}

/// Bit for bit (the sign of zero included; any NaN matches a NaN).
fn bits_equal<T: OutputElement>(got: &[T], want: &[T], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let bits = |x: T| {
        let v = x.to_f64();
        if v.is_nan() { u64::MAX } else { v.to_bits() }
    };
    if let Some(i) = (0..got.len()).find(|&i| bits(got[i]) != bits(want[i])) {
        panic!("{what}: element {i} is {:?}, the naive sum gives {:?}", got[i], want[i]);
    }
    // The crate's own comparison agrees.
    let c = compare(got, want, 0.0, 0.0).unwrap();
    assert!(c.passed(), "{what}: {c}");
}

#[test]
fn contest_data_matches_naive_bit_for_bit() {
    // Odd shapes (M, N not multiples of 128), zero scales included, batch 2, alpha and beta.
    for (seed, &(m, n, k, l)) in [(3usize, 5usize, 64usize, 1usize), (130, 72, 256, 2), (257, 16, 96, 1)].iter().enumerate() {
        let a = Nvfp4Matrix::random_contest((l, m, k), 10 + seed as u64).unwrap();
        let b = Nvfp4Matrix::random_contest((l, n, k), 20 + seed as u64).unwrap();
        let c: Vec<f16> = (0..l * m * n).map(|i| f16::from_f32((i % 13) as f32 - 6.0)).collect();
        let got: Vec<f16> = reference_gemm(&a, &b, 0.75, -1.5, Some(&c)).unwrap();
        bits_equal(&got, &naive(&a, &b, 0.75, -1.5, Some(&c)), "f16 with C");
        let got: Vec<f32> = reference_gemm(&a, &b, 1.0, 0.0, None).unwrap();
        bits_equal(&got, &naive::<f32>(&a, &b, 1.0, 0.0, None), "f32");
        let got: Vec<bf16> = reference_gemm(&a, &b, 2.0, 0.0, None).unwrap();
        bits_equal(&got, &naive::<bf16>(&a, &b, 2.0, 0.0, None), "bf16");
    }
}

#[test]
fn realistic_data_matches_naive_bit_for_bit() {
    let a = Nvfp4Matrix::random_realistic((1, 40, 512), 1).unwrap();
    let b = Nvfp4Matrix::random_realistic((1, 24, 512), 2).unwrap();
    let got: Vec<f32> = reference_gemm(&a, &b, 1.0, 0.0, None).unwrap();
    bits_equal(&got, &naive::<f32>(&a, &b, 1.0, 0.0, None), "realistic f32");
}

#[test]
fn swapping_a_and_b_transposes_d() {
    let a = Nvfp4Matrix::random_realistic((2, 33, 128), 5).unwrap();
    let b = Nvfp4Matrix::random_realistic((2, 17, 128), 6).unwrap();
    let ab: Vec<f32> = reference_gemm(&a, &b, 1.0, 0.0, None).unwrap();
    let ba: Vec<f32> = reference_gemm(&b, &a, 1.0, 0.0, None).unwrap();
    for l in 0..2 {
        for i in 0..33 {
            for j in 0..17 {
                assert_eq!(ab[(l * 33 + i) * 17 + j].to_bits(), ba[(l * 17 + j) * 33 + i].to_bits());
            }
        }
    }
}

#[test]
fn alpha_scales_exactly_and_zero_scales_give_zero() {
    let a = Nvfp4Matrix::random_contest((1, 20, 64), 8).unwrap();
    let b = Nvfp4Matrix::random_contest((1, 24, 64), 9).unwrap();
    let one: Vec<f32> = reference_gemm(&a, &b, 1.0, 0.0, None).unwrap();
    let four: Vec<f32> = reference_gemm(&a, &b, 4.0, 0.0, None).unwrap();
    assert!(one.iter().any(|&x| x != 0.0), "data must not be trivially zero");
    for (x, y) in one.iter().zip(&four) {
        assert_eq!(4.0 * x, *y);
    }
    let zero_sf = Nvfp4Matrix::from_parts((1, 20, 64), a.data().to_vec(), vec![0; a.scales().len()], None).unwrap();
    let z: Vec<f32> = reference_gemm(&zero_sf, &b, 1.0, 0.0, None).unwrap();
    assert!(z.iter().all(|&x| x == 0.0));
}

#[test]
fn extreme_scales_448_are_exact() {
    // All values 6 and all scales 448 (the largest of both formats): each product is
    // (6 * 448)^2 = 7225344 = 441 * 2^14, and K = 4096 of them sum to 441 * 2^26 = 29595009024,
    // which f32 holds exactly: the largest products neither overflow nor lose a bit.
    let k = 4096;
    let data = vec![0x77u8; k / 2];
    let scales = blockscaled_gemm::layout::to_tiled(&vec![0x7E; k / 16], (1, 1, k / 16)).unwrap();
    let a = Nvfp4Matrix::from_parts((1, 1, k), data, scales, None).unwrap();
    let d: Vec<f32> = reference_gemm(&a, &a, 1.0, 0.0, None).unwrap();
    assert_eq!(d[0] as f64, 4096.0 * (6.0f64 * 448.0).powi(2));
}

#[test]
fn mismatched_operands_are_typed_errors() {
    let a = Nvfp4Matrix::random_contest((1, 4, 64), 1).unwrap();
    let b = Nvfp4Matrix::random_contest((1, 4, 32), 1).unwrap();
    let e = reference_gemm::<f32>(&a, &b, 1.0, 0.0, None).unwrap_err();
    assert!(e.to_string().contains("K and L must agree"), "{e}");
    let e = reference_gemm::<f32>(&a, &a, 1.0, 1.0, None).unwrap_err();
    assert!(e.to_string().contains("beta = 1"), "{e}");
}
