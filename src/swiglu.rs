//! SwiGLU, `silu(gate) * up`, as the fused quantizer computes it on the GPU
//! ([`crate::Quantizer::quantize_swiglu_into`]): every step one IEEE f32 operation (or a fused
//! multiply-add) in a fixed order, mirrored line for line by `cpp/quant/swiglu.cuh`, so the host
//! and the device agree bit for bit. Nothing here is `libm`'s: its `expf` differs between
//! platforms and from CUDA's.
//!
//! - `exp(x)`: Cody-Waite reduction `x = n ln2 + r` (n = rint(x log2 e), ln2 split as
//!   0.693359375 - 2.12194440e-4 so `n * 0.693359375` is exact for |n| <= 149), the degree-5
//!   polynomial of Cephes `expf` for `(e^r - 1 - r) / r^2` on |r| <= ln2/2, `1 + r + p r^2`, then
//!   times 2^n in two exact power-of-two steps (the second rounds once where the result is
//!   subnormal). Below 1 ulp from the true value (0.99 at worst over 400,001 points of its range,
//!   unit test); +Inf above 88.72283, +0 below
//!   -103.27893, NaN for NaN.
//! - `silu(x) = x / (1 + exp(-x))`: -0 for x below about -88.7 down to the largest negative
//!   finite value, NaN at -inf (-inf / inf, as PyTorch's `silu` gives), x itself above about 17.
//! - `swiglu(g, u) = round_T(silu(g) * u)`, rounded to the input type T (nearest, ties to even),
//!   as an unfused `silu_and_mul` would store it before quantizing.

use crate::error::{check_len, checked_product, try_collect, Result};
use crate::matrix::HostFloat;

// The same f32 values as cpp/quant/swiglu.cuh's literals (LOG2_E is its 1.44269504088896341f,
// 0x3FB8AA3B).
const LOG2E: f32 = std::f32::consts::LOG2_E;
#[allow(clippy::excessive_precision)]
const LN2_HI: f32 = 0.693359375; // exact: nine significant bits
#[allow(clippy::excessive_precision)]
const LN2_LO: f32 = -2.12194440e-4;
#[allow(clippy::excessive_precision)]
const P: [f32; 6] = [1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1];
/// Above this `exp` is +Inf, below [`EXP_MIN`] +0.
pub const EXP_MAX: f32 = 88.722_83;
/// See [`EXP_MAX`].
pub const EXP_MIN: f32 = -103.278_93;

fn pow2(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23) // k in [-126, 127]
}

/// e^x, deterministically (see the module docs).
pub fn exp(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    if x > EXP_MAX {
        return f32::INFINITY;
    }
    if x < EXP_MIN {
        return 0.0;
    }
    let n = (x * LOG2E).round_ties_even();
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, x));
    let z = r * r;
    let mut p = P[0];
    for c in &P[1..] {
        p = p.mul_add(r, *c);
    }
    let y = p.mul_add(z, r) + 1.0;
    let n = n as i32; // in [-149, 128]
    let n1 = n / 2;
    y * pow2(n1) * pow2(n - n1)
}

/// x / (1 + e^-x).
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// `silu(gate) * up`, rounded to T.
pub fn swiglu<T: HostFloat>(gate: T, up: T) -> T {
    T::narrow(silu(gate.widen_one()) * up.widen_one())
}

/// The SwiGLU of each row of `x` (batch, rows, 2K), whose first K values are the gate and last K
/// the up projection: (batch, rows, K).
///
/// Fails where `x` does not hold `batch * rows * 2K` values ([`crate::Error::SizeLimit`] where
/// that count does not fit in `usize`).
pub fn swiglu_rows<T: HostFloat>(x: &[T], (batch, rows, k): (usize, usize, usize)) -> Result<Vec<T>> {
    const RULE: &str = "batch * rows * 2K (gate and up halves)";
    let want = checked_product("x", RULE, &[("batch", batch), ("rows", rows), ("K", k), ("gate and up", 2)])?;
    check_len("x", x.len(), want, RULE)?;
    // `want` fits, so 2K does wherever there are rows; with none, `x` is empty.
    let width = k.saturating_mul(2).max(1);
    try_collect("SwiGLU output", want / 2, x.chunks_exact(width).flat_map(|row| row[..k].iter().zip(&row[k..]).map(|(g, u)| swiglu(*g, *u))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    /// |a - b| in units of f32's last place at b (b > 0).
    fn ulps(a: f32, b: f64) -> f64 {
        let ulp = 2f64.powi(b.log2().floor().max(-126.0) as i32 - 23);
        (a as f64 - b).abs() / ulp
    }

    #[test]
    fn exp_within_two_ulp_over_its_range() {
        let (mut worst, mut worst_x) = (0f64, 0f32);
        let steps = 400_000;
        for i in 0..=steps {
            let x = EXP_MIN + (EXP_MAX - EXP_MIN) * (i as f32 / steps as f32);
            let want = (x as f64).exp();
            if want > f32::MAX as f64 {
                assert_eq!(exp(x), f32::INFINITY, "exp({x})");
            } else if want >= f32::MIN_POSITIVE as f64 {
                let e = ulps(exp(x), want);
                if e > worst {
                    (worst, worst_x) = (e, x);
                }
            } else {
                // Subnormal results: within one unit of the smallest subnormal.
                assert!((exp(x) as f64 - want).abs() <= f32::from_bits(1) as f64, "exp({x}) = {:e}, want {want:e}", exp(x));
            }
        }
        eprintln!("exp: worst error {worst:.3} ulp at x = {worst_x}");
        assert!(worst < 1.0, "worst error {worst} ulp at x = {worst_x}");
        for x in [0.0f32, -0.0, 1e-30, -1e-30, 1.0, -1.0, 0.5, 10.0] {
            assert!(ulps(exp(x), (x as f64).exp()) <= 2.0, "exp({x})");
        }
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(100.0), f32::INFINITY);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(-200.0), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn silu_and_swiglu() {
        assert_eq!(silu(0.0), 0.0);
        assert_eq!(silu(100.0), 100.0);
        assert_eq!(silu(-100.0).to_bits(), (-0.0f32).to_bits());
        assert_eq!(silu(f32::MIN).to_bits(), (-0.0f32).to_bits());
        assert!(silu(f32::NEG_INFINITY).is_nan(), "-inf / inf, as documented");
        assert_eq!(silu(f32::INFINITY), f32::INFINITY);
        assert!((silu(1.0) - 0.731_058_6).abs() < 1e-6);
        assert!((silu(-2.0) + 0.238_405_85).abs() < 1e-6);
        let (g, u) = (half::bf16::from_f32(1.5), half::bf16::from_f32(-3.0));
        // silu(1.5) * -3 = -3.67909 (1.5 / (1 + e^-1.5) * -3 in f64), bf16 -3.671875.
        assert_eq!(swiglu(g, u), half::bf16::from_f64(1.5 / (1.0 + (-1.5f64).exp()) * -3.0));
        let x: Vec<f32> = vec![1.0, 2.0, 3.0, 4.0, /* row 2 */ -1.0, 0.5, 2.0, -2.0];
        let h = swiglu_rows(&x, (1, 2, 2)).unwrap();
        assert_eq!(h, vec![silu(1.0) * 3.0, silu(2.0) * 4.0, silu(-1.0) * 2.0, silu(0.5) * -2.0]);
        assert!(swiglu_rows(&x, (1, 2, 3)).is_err());
        assert!(swiglu_rows(&x, (1, 1, usize::MAX / 2 + 1)).is_err());
    }

    /// A review probe: K = 0 with a batch * rows beyond usize needs zero elements, and was
    /// refused as needing usize::MAX.
    #[test]
    fn zero_width_rows_need_nothing() {
        assert_eq!(swiglu_rows::<f32>(&[], (usize::MAX, 2, 0)).unwrap(), Vec::<f32>::new());
        assert_eq!(swiglu_rows::<f32>(&[], (2, usize::MAX, 0)).unwrap(), Vec::<f32>::new());
        assert_eq!(swiglu_rows::<f32>(&[], (0, usize::MAX, usize::MAX)).unwrap(), Vec::<f32>::new());
        assert!(matches!(swiglu_rows::<f32>(&[1.0; 4], (usize::MAX, 2, 1)), Err(Error::SizeLimit { .. })));
        assert!(matches!(swiglu_rows::<f32>(&[1.0; 4], (1, 1, usize::MAX)), Err(Error::SizeLimit { .. })));
        assert!(matches!(swiglu_rows::<f32>(&[1.0; 3], (1, 1, 1)), Err(Error::BufferLength { got: 3, want: 2, .. })));
    }
}
