//! The exact CPU reference: every product exact, the K sum exact, one rounding.
//!
//! Each product `a * sfa * b * sfb` is a multiple of 2^-20 (e2m1 values are multiples of 1/2,
//! ue4m3 values multiples of 2^-9), so the reference sums integers: e2m1 values times 2 as `i8`,
//! 16-element block dots as `i32`, block dot times the two scales times 2^9 each as `i64`,
//! and the K sum in `i128`. The only roundings are converting that exact sum to f64 (exact below
//! 2^53 * 2^-20) and the epilogue `alpha * sum + beta * C`, evaluated in f64 and rounded once to
//! the output type. NaN scales (0x7F) make their dot products NaN, as on the GPU.

use rayon::prelude::*;

use crate::error::{check_len, try_filled, Result};
use crate::formats::{e4m3_to_f32, OutputElement, E4M3_NAN};
use crate::layout::{padded_sf_cols, sf_batch_bytes, sf_offset, SF_VEC};
use crate::problem::{check_c, check_operand_lens, Problem, SfdFormat};
use crate::Error;

/// e2m1 code -> value * 2, as i8.
const E2M1_X2: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Rows of one operand decoded for the integer kernel.
struct Decoded {
    /// values * 2, (rows, k)
    vals: Vec<i8>,
    /// scales * 2^9 as integers, (rows, k/16); NaN scales are marked in `nan_rows`.
    scales: Vec<i64>,
    /// Rows with at least one NaN scale (they take the slow path).
    nan_rows: Vec<bool>,
    /// Scale values as f64, only for NaN rows' slow path, (rows, k/16).
    scales_f: Vec<f64>,
}

fn decode(data: &[u8], sf: &[u8], rows: usize, k: usize, l: usize, row_range: std::ops::Range<usize>) -> Decoded {
    let kb = k / SF_VEC;
    let sp = padded_sf_cols(kb);
    let sf_base = l * sf_batch_bytes(rows, k);
    let n = row_range.len();
    let mut vals = vec![0i8; n * k];
    let mut scales = vec![0i64; n * kb];
    let mut scales_f = vec![0f64; n * kb];
    let mut nan_rows = vec![false; n];
    for (i, r) in row_range.enumerate() {
        let row = &data[(l * rows + r) * k / 2..][..k / 2];
        for (j, &byte) in row.iter().enumerate() {
            vals[i * k + 2 * j] = E2M1_X2[(byte & 0xF) as usize];
            vals[i * k + 2 * j + 1] = E2M1_X2[(byte >> 4) as usize];
        }
        for s in 0..kb {
            let byte = sf[sf_base + sf_offset(r, s, sp)];
            let v = e4m3_to_f32(byte) as f64;
            if byte & 0x7F == E4M3_NAN {
                nan_rows[i] = true;
            } else {
                scales[i * kb + s] = (v * 512.0) as i64; // exact: multiples of 2^-9
            }
            scales_f[i * kb + s] = v;
        }
    }
    Decoded { vals, scales, nan_rows, scales_f }
}

#[inline]
fn block_dot(a: &[i8], b: &[i8]) -> i32 {
    a.iter().zip(b).map(|(&x, &y)| x as i32 * y as i32).sum()
}

/// The exact block-scaled dot of row `i` of `a` and row `j` of `b`, as a multiple of 2^-20.
#[inline]
fn exact_dot(a: &Decoded, i: usize, b: &Decoded, j: usize, k: usize) -> f64 {
    match exact_dot_units(a, i, b, j, k) {
        Ok(units) => units as f64 * (1.0 / (1u64 << 20) as f64),
        Err(nan) => nan,
    }
}

/// The exact dot in units of 2^-20, or `Err` with the (NaN) f64 value when a row has NaN scales.
#[inline]
fn exact_dot_units(a: &Decoded, i: usize, b: &Decoded, j: usize, k: usize) -> std::result::Result<i128, f64> {
    let kb = k / SF_VEC;
    let av = &a.vals[i * k..][..k];
    let bv = &b.vals[j * k..][..k];
    if a.nan_rows[i] || b.nan_rows[j] {
        // Slow path with NaN propagation (0 * NaN is NaN, as in the MMA's per-block scaling).
        let mut acc = 0f64;
        for s in 0..kb {
            let d = block_dot(&av[s * 16..][..16], &bv[s * 16..][..16]) as f64 / 4.0;
            acc += d * a.scales_f[i * kb + s] * b.scales_f[j * kb + s];
        }
        return Err(acc);
    }
    let asf = &a.scales[i * kb..][..kb];
    let bsf = &b.scales[j * kb..][..kb];
    let mut total: i128 = 0;
    // |block dot| <= 2304 and each scale <= 448 * 2^9, so a term is below 2^47 and 2^15 terms
    // fit an i64 before they are flushed into the i128 total.
    for chunk in (0..kb).step_by(1 << 15) {
        let end = (chunk + (1 << 15)).min(kb);
        let mut acc: i64 = 0;
        for s in chunk..end {
            let d = block_dot(&av[s * 16..][..16], &bv[s * 16..][..16]) as i64;
            acc += d * (asf[s] * bsf[s]);
        }
        total += acc as i128;
    }
    Ok(total)
}

/// Checks the raw operand buffers of a reference call whose output holds `out_elem_bytes` bytes
/// per element of (L, M, N), and `sfd` for FP4 output scale factors: the shape, every count
/// within the host's largest allocation (so no product of the dimensions below overflows), and
/// the four lengths.
fn check_operands(p: &Problem, a: &[u8], sfa: &[u8], b: &[u8], sfb: &[u8], out_elem_bytes: usize, sfd: bool) -> Result<()> {
    check_reference_shape(p, out_elem_bytes, sfd)?;
    check_operand_lens(p, [a.len(), sfa.len(), b.len(), sfb.len()])
}

/// The shape rules every reference call shares: dimensions, K a multiple of 16, every count
/// within the host's largest allocation.
fn check_reference_shape(p: &Problem, out_elem_bytes: usize, sfd: bool) -> Result<()> {
    p.check_dims(usize::MAX)?;
    if !p.k.is_multiple_of(SF_VEC) {
        return Err(Error::KMultiple { k: p.k, multiple: SF_VEC, why: "one scale per 16 elements of K" });
    }
    p.check_counts(out_elem_bytes, sfd, isize::MAX as usize, "the largest host allocation is isize::MAX bytes")
}

/// How the reference sums the K products of one output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accumulation {
    /// Exactly (integers), then one rounding to f32.
    Exact,
    /// In f32, one product at a time in K order: `acc = acc + a * sfa * b * sfb`, as CUTLASS's
    /// host reference (`gett_mainloop`) does. Every product is exact in f32; the sums round.
    Fp32KOrder,
}

/// The f32 accumulators (L, M, N) of `sum_k dec(A) sfa dec(B) sfb`, summed as `mode` says.
pub fn accumulators(p: &Problem, a: &[u8], sfa: &[u8], b: &[u8], sfb: &[u8], mode: Accumulation) -> Result<Vec<f32>> {
    check_operands(p, a, sfa, b, sfb, std::mem::size_of::<f32>(), false)?;
    let (m, n, k) = (p.m, p.n, p.k);
    let mut out = try_filled("reference accumulators (L * M * N)", p.cd_elems(), 0f32)?;
    for l in 0..p.l {
        let bd = decode(b, sfb, n, k, l, 0..n);
        let out_l = &mut out[l * m * n..][..m * n];
        match mode {
            Accumulation::Exact => out_l.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
                let ad = decode(a, sfa, m, k, l, i..i + 1);
                for (j, o) in row.iter_mut().enumerate() {
                    // i128 -> f32 rounds once (to nearest even); the power-of-two scale is exact.
                    *o = match exact_dot_units(&ad, 0, &bd, j, k) {
                        Ok(units) => units as f32 * 2f32.powi(-20),
                        Err(nan) => nan as f32,
                    };
                }
            }),
            Accumulation::Fp32KOrder => {
                let scaled = |d: &Decoded, r: usize| -> Vec<f32> {
                    (0..k).map(|kk| (d.vals[r * k + kk] as f32 * 0.5) * d.scales_f[r * (k / SF_VEC) + kk / SF_VEC] as f32).collect()
                };
                let bf: Vec<Vec<f32>> = (0..n).map(|j| scaled(&bd, j)).collect();
                out_l.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
                    let ad = decode(a, sfa, m, k, l, i..i + 1);
                    let af = scaled(&ad, 0);
                    for (o, bj) in row.iter_mut().zip(&bf) {
                        *o = af.iter().zip(bj).fold(0f32, |acc, (&x, &y)| x * y + acc);
                    }
                });
            }
        }
    }
    Ok(out)
}

/// Reference GEMM with FP4 output (CUTLASS example 72b, [`crate::fp4_out`]): D as (L, M, N/2)
/// packed e2m1 bytes and its SFD (`p.sfd_bytes()`, zero padding), from accumulators summed as
/// `mode` says. [`Accumulation::Fp32KOrder`] reproduces CUTLASS's host reference byte for byte.
/// N must be a multiple of 16; `c` (f32) is read only when beta != 0.
#[allow(clippy::too_many_arguments)]
pub fn gemm_fp4(p: &Problem, a: &[u8], sfa: &[u8], b: &[u8], sfb: &[u8], c: Option<&[f32]>, format: SfdFormat, mode: Accumulation) -> Result<(Vec<u8>, Vec<u8>)> {
    crate::fp4_out::check_whole_groups(p.n)?;
    p.check_norm_constant()?;
    check_operands(p, a, sfa, b, sfb, std::mem::size_of::<f32>(), true)?;
    check_c(p, c.map(<[f32]>::len))?;
    let acc = accumulators(p, a, sfa, b, sfb, mode)?;
    crate::fp4_out::epilogue(p, &acc, c, format)
}

/// Reference GEMM on raw buffers laid out as the kernels take them: `a` is (L, M, K/2) packed
/// bytes, `sfa` the tiled scales of A ([`crate::layout`]), `b` and `sfb` likewise for (L, N, K/2),
/// `c` (L, M, N) row-major when given. K must be a multiple of 16. C is read only when
/// beta != 0 (the kernels do not load it otherwise).
pub fn gemm<T: OutputElement>(p: &Problem, a: &[u8], sfa: &[u8], b: &[u8], sfb: &[u8], c: Option<&[T]>) -> Result<Vec<T>> {
    check_operands(p, a, sfa, b, sfb, std::mem::size_of::<T>(), false)?;
    check_c(p, c.map(<[T]>::len))?;
    const TILE_M: usize = 8;
    let (m, n, k) = (p.m, p.n, p.k);
    let (alpha, beta) = (p.alpha as f64, p.beta as f64);
    let mut out = try_filled("reference output (L * M * N)", p.cd_elems(), T::from_f64(0.0))?;
    for l in 0..p.l {
        let bd = decode(b, sfb, n, k, l, 0..n);
        let out_l = &mut out[l * m * n..][..m * n];
        out_l.par_chunks_mut(TILE_M * n).enumerate().for_each(|(t, rows_out)| {
            let r0 = t * TILE_M;
            let rows = rows_out.len() / n;
            let ad = decode(a, sfa, m, k, l, r0..r0 + rows);
            for j in 0..n {
                for i in 0..rows {
                    let s = exact_dot(&ad, i, &bd, j, k);
                    let mut v = alpha * s;
                    if beta != 0.0 {
                        let cv = c.expect("checked above")[(l * m + r0 + i) * n + j];
                        v += beta * cv.to_f64();
                    }
                    rows_out[i * n + j] = T::from_f64(v);
                }
            }
        });
    }
    Ok(out)
}

/// One output's K sum as the verdict of [`crate::compare`] needs it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dot {
    /// `sum_k a_k b_k` (block-scaled values), exact, then rounded once to f64; NaN where a scale
    /// of the row or column is NaN.
    pub sum: f64,
    /// `sum_k |a_k b_k|`, exact, then rounded once to f64: the scale of the FP32 summation error
    /// bound. NaN with `sum`.
    pub abs_sum: f64,
}

/// The exact K sums of every output (L, M, N) and the sums of their products' magnitudes, on raw
/// buffers laid out as for [`gemm`]. Both are exact integers in units of 2^-20 before the one
/// rounding to f64 (relative error at most 2^-53).
pub fn dots(p: &Problem, a: &[u8], sfa: &[u8], b: &[u8], sfb: &[u8]) -> Result<Vec<Dot>> {
    check_operands(p, a, sfa, b, sfb, std::mem::size_of::<Dot>(), false)?;
    let (m, n, k) = (p.m, p.n, p.k);
    let unit = 1.0 / (1u64 << 20) as f64;
    let mut out = try_filled("reference dots (L * M * N)", p.cd_elems(), Dot { sum: 0.0, abs_sum: 0.0 })?;
    for l in 0..p.l {
        let bd = decode(b, sfb, n, k, l, 0..n);
        out[l * m * n..][..m * n].par_chunks_mut(n).enumerate().for_each(|(i, row)| {
            let ad = decode(a, sfa, m, k, l, i..i + 1);
            for (j, o) in row.iter_mut().enumerate() {
                *o = match exact_dot_and_abs_units(&ad, 0, &bd, j, k) {
                    Some((sum, abs)) => Dot { sum: sum as f64 * unit, abs_sum: abs as f64 * unit },
                    None => Dot { sum: f64::NAN, abs_sum: f64::NAN },
                };
            }
        });
    }
    Ok(out)
}

/// [`exact_dot_units`] and `sum_k |a_k b_k|` in the same units; `None` when a row has NaN scales.
fn exact_dot_and_abs_units(a: &Decoded, i: usize, b: &Decoded, j: usize, k: usize) -> Option<(i128, i128)> {
    if a.nan_rows[i] || b.nan_rows[j] {
        return None;
    }
    let kb = k / SF_VEC;
    let (av, bv) = (&a.vals[i * k..][..k], &b.vals[j * k..][..k]);
    let (asf, bsf) = (&a.scales[i * kb..][..kb], &b.scales[j * kb..][..kb]);
    let (mut sum, mut abs) = (0i128, 0i128);
    for s in 0..kb {
        let (x, y) = (&av[s * 16..][..16], &bv[s * 16..][..16]);
        let scale = (asf[s] * bsf[s]) as i128; // below 2^36 in magnitude
        sum += block_dot(x, y) as i128 * scale;
        abs += x.iter().zip(y).map(|(&p, &q)| (p as i32 * q as i32).abs()).sum::<i32>() as i128 * scale.abs();
    }
    Some((sum, abs))
}

/// An exact sum of products `m * 2^e` (|m| < 2^47, e >= -BIAS): base-2^32 digits in i128
/// limbs from 2^-BIAS, each taking up to 2^49 additions before it could overflow. It covers every
/// product of an f32 (so f16 or bf16) activation and a decoded NVFP4 weight: the activation's
/// 24-bit integer mantissa (exponent from -149) times e2m1 * 2 (4 bits) times ue4m3 * 2^9
/// (18 bits), at 2^(e - 10); the largest lands below bit 94 + 160 + 46 of 12 * 32.
struct ExactSum {
    limbs: [i128; 12],
}

impl ExactSum {
    const BIAS: i32 = 160;

    fn new() -> Self {
        ExactSum { limbs: [0; 12] }
    }

    #[inline]
    fn add(&mut self, m: i64, e: i32) {
        let s = (e + Self::BIAS) as usize;
        self.limbs[s / 32] += (m as i128) << (s % 32);
    }

    /// The sum rounded once to f64 (to nearest even).
    fn to_f64(&self) -> f64 {
        let normalize = |d: &mut [i128; 12]| {
            for i in 0..11 {
                let carry = d[i] >> 32; // floor: d[i] - carry * 2^32 is in [0, 2^32)
                d[i] -= carry << 32;
                d[i + 1] += carry;
            }
        };
        let mut d = self.limbs;
        normalize(&mut d);
        let negative = d[11] < 0;
        if negative {
            d.iter_mut().for_each(|x| *x = -*x);
            normalize(&mut d);
        }
        let Some(top) = (0..12).rev().find(|&i| d[i] != 0) else { return 0.0 };
        // The top three digits (at least 65 significant bits) and a sticky bit for the rest,
        // below the rounding position: one correctly rounded u128 -> f64 conversion.
        let base = top as isize - 2;
        let digit = |i: isize| if i < 0 { 0u128 } else { d[i as usize] as u128 };
        let mut mant = (digit(base + 2) << 64) | (digit(base + 1) << 32) | digit(base);
        if (0..base.max(0) as usize).any(|i| d[i] != 0) {
            mant |= 1;
        }
        let v = mant as f64 * 2f64.powi(32 * base as i32 - Self::BIAS);
        if negative { -v } else { v }
    }
}

/// An f32's value as `m * 2^e` with m an integer (|m| < 2^24); None for 0 and non-finite values.
fn split_f32(x: f32) -> Option<(i64, i32)> {
    if x == 0.0 || !x.is_finite() {
        return None;
    }
    let bits = x.to_bits();
    let (exp, frac) = (((bits >> 23) & 0xFF) as i32, (bits & 0x7F_FFFF) as i64);
    let (m, e) = if exp == 0 { (frac, -149) } else { (frac | 0x80_0000, exp - 150) };
    Some((if bits >> 31 != 0 { -m } else { m }, e))
}

/// The exact K sums of a W4A16 GEMM (dense activations `a` (L, M, K) of f16 or bf16, NVFP4 `b`
/// and `sfb` as for [`gemm`]) and the sums of the products' magnitudes, each rounded once to f64:
/// the [`Dot`]s [`crate::compare::verify_w4a16`] judges by. NaN scales, NaN or infinite
/// activations give their sums in f64 as they come (NaN or infinite), `abs_sum` NaN.
pub fn w4a16_dots<TA: crate::w4a16::Activation16>(p: &Problem, a: &[TA], b: &[u8], sfb: &[u8]) -> Result<Vec<Dot>> {
    w4a16_sums(p, a, b, sfb, true)
}

/// [`w4a16_dots`]; without `with_abs` the magnitudes' sums are not formed (`abs_sum` 0), for the
/// reference GEMM, which needs the sums alone.
fn w4a16_sums<TA: crate::w4a16::Activation16>(p: &Problem, a: &[TA], b: &[u8], sfb: &[u8], with_abs: bool) -> Result<Vec<Dot>> {
    check_w4a16_operands(p, a.len(), b, sfb, std::mem::size_of::<Dot>())?;
    let (m, n, k) = (p.m, p.n, p.k);
    let kb = k / SF_VEC;
    let mut out = try_filled("reference dots (L * M * N)", p.cd_elems(), Dot { sum: 0.0, abs_sum: 0.0 })?;
    for l in 0..p.l {
        let bd = decode(b, sfb, n, k, l, 0..n);
        out[l * m * n..][..m * n].par_chunks_mut(n).enumerate().for_each(|(i, row)| {
            let av: Vec<f32> = a[(l * m + i) * k..][..k].iter().map(|x| x.to_f64() as f32).collect();
            let parts: Vec<Option<(i64, i32)>> = av.iter().map(|&x| split_f32(x)).collect();
            let special = av.iter().any(|x| !x.is_finite());
            for (j, o) in row.iter_mut().enumerate() {
                let bv = &bd.vals[j * k..][..k];
                if special || bd.nan_rows[j] {
                    let sum: f64 = (0..k).map(|kk| av[kk] as f64 * (bv[kk] as f64 * 0.5) * bd.scales_f[j * kb + kk / SF_VEC]).sum();
                    *o = Dot { sum, abs_sum: f64::NAN };
                    continue;
                }
                let (mut sum, mut abs) = (ExactSum::new(), ExactSum::new());
                for (kk, part) in parts.iter().enumerate() {
                    // b = (e2m1 * 2) * (ue4m3 * 2^9) * 2^-10
                    let w = bv[kk] as i64 * bd.scales[j * kb + kk / SF_VEC];
                    if let (Some((ma, ea)), true) = (part, w != 0) {
                        sum.add(ma * w, ea - 10);
                        if with_abs {
                            abs.add((ma * w).abs(), ea - 10);
                        }
                    }
                }
                *o = Dot { sum: sum.to_f64(), abs_sum: if with_abs { abs.to_f64() } else { 0.0 } };
            }
        });
    }
    Ok(out)
}

/// The W4A16 reference GEMM: `alpha * sum + beta * C` from the exact sums of [`w4a16_dots`], in
/// f64, rounded once to the output type. alpha is the caller's whole factor (fold the weight's
/// global scale in, as the GEMM does).
pub fn gemm_w4a16<TA: crate::w4a16::Activation16, T: OutputElement>(p: &Problem, a: &[TA], b: &[u8], sfb: &[u8], c: Option<&[T]>) -> Result<Vec<T>> {
    check_c(p, c.map(<[T]>::len))?;
    let dots = w4a16_sums(p, a, b, sfb, false)?;
    let (alpha, beta) = (p.alpha as f64, p.beta as f64);
    Ok(dots.iter().enumerate().map(|(i, d)| {
        let bc = match c {
            Some(c) if beta != 0.0 => beta * c[i].to_f64(),
            _ => 0.0,
        };
        T::from_f64(alpha * d.sum + bc)
    }).collect())
}

/// [`check_operands`] for W4A16: A holds `a_len` activations.
fn check_w4a16_operands(p: &Problem, a_len: usize, b: &[u8], sfb: &[u8], out_elem_bytes: usize) -> Result<()> {
    check_reference_shape(p, out_elem_bytes, false)?;
    check_len("A", a_len, p.a_elems(), "L * M * K activations")?;
    let rules = crate::problem::operand_rules(p);
    check_len(rules[2].0, b.len(), rules[2].1, rules[2].2)?;
    check_len(rules[3].0, sfb.len(), rules[3].1, rules[3].2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::{e2m1_from_f32, e2m1_to_f32, e4m3_from_f32};
    use crate::layout::to_tiled;
    use half::f16;

    /// Builds raw operands from f32 values that are exactly e2m1 and row-major f32 scales.
    fn raw(vals: &[f32], scales: &[f32], rows: usize, k: usize) -> (Vec<u8>, Vec<u8>) {
        let codes: Vec<u8> = vals.iter().map(|&v| e2m1_from_f32(v)).collect();
        for (c, v) in codes.iter().zip(vals) {
            assert_eq!(e2m1_to_f32(*c), *v, "test value must be exact e2m1");
        }
        let sf: Vec<u8> = scales.iter().map(|&s| e4m3_from_f32(s)).collect();
        (crate::formats::pack_e2m1_slice(&codes).unwrap(), to_tiled(&sf, (1, rows, k / 16)).unwrap())
    }

    #[test]
    fn exact_sum_rounds_once() {
        // 1 + 2^-60 - 1 = 2^-60 exactly (an f64 running sum gives 0).
        let mut s = ExactSum::new();
        s.add(1, 0);
        s.add(1, -60);
        s.add(-1, 0);
        assert_eq!(s.to_f64(), 2f64.powi(-60));
        // 2^53 + 1 + 2^-100: the tie is broken upward by the far-away sticky bit.
        let mut s = ExactSum::new();
        s.add(1, 53);
        s.add(1, 0);
        s.add(1, -100);
        assert_eq!(s.to_f64(), 2f64.powi(53) + 2.0);
        // Without it, to even.
        let mut s = ExactSum::new();
        s.add(1, 53);
        s.add(1, 0);
        assert_eq!(s.to_f64(), 2f64.powi(53));
        // Negative, the extremes of the range, and cancellation to zero.
        let mut s = ExactSum::new();
        s.add(-(1 << 46), 94);
        s.add(-3, -159);
        assert_eq!(s.to_f64(), -(2f64.powi(140) + 3.0 * 2f64.powi(-159)));
        let mut s = ExactSum::new();
        for _ in 0..1000 {
            s.add(12345, -159);
            s.add(-12345, -159);
        }
        assert_eq!(s.to_f64(), 0.0);
        assert_eq!(split_f32(-1.5), Some((-0xC0_0000, -23)));
        assert_eq!(split_f32(f32::from_bits(1)), Some((1, -149)));
        assert_eq!(split_f32(0.0), None);
    }

    #[test]
    fn w4a16_reference_by_hand() {
        // b row 0 = [3, 0.5, 0 ...] scale 2 (block 0), [-4, 0 ...] scale 0.25 (block 1);
        // a = [1.5, -2, ...1e-3 at 16...] in bf16 with a tiny value far below the others.
        let mut bvals = vec![0f32; 32];
        bvals[0] = 3.0;
        bvals[1] = 0.5;
        bvals[16] = -4.0;
        let (b, sfb) = raw(&bvals, &[2.0, 0.25], 1, 32);
        let mut a = vec![half::bf16::ZERO; 32];
        a[0] = half::bf16::from_f32(1.5);
        a[1] = half::bf16::from_f32(-2.0);
        a[16] = half::bf16::from_f32(2f32.powi(-120));
        let p = Problem::new(1, 1, 32);
        let d = w4a16_dots(&p, &a, &b, &sfb).unwrap();
        // 1.5 * 6 - 2 * 1 - 2^-120 = 7 - 2^-120, rounded once to f64: 7 (the tiny term is far
        // below 7's last bit; exact_sum_rounds_once covers sums it does reach).
        assert_eq!(d[0].sum, 7.0);
        assert_eq!(d[0].abs_sum, 11.0);
        let out: Vec<f32> = gemm_w4a16(&p.scalars(0.5, 0.0), &a, &b, &sfb, None).unwrap();
        assert_eq!(out, vec![3.5]);
        // Wrong A length is a typed error.
        assert!(matches!(w4a16_dots(&p, &a[..16], &b, &sfb), Err(Error::BufferLength { name: "A", .. })));
    }

    #[test]
    fn hand_worked_1x1x32() {
        // a = [1, 2, 0, ...] (block 0) and [6, ...] (block 1); b = [3, 0.5, ...], [-4, ...]
        let mut av = vec![0f32; 32];
        let mut bv = vec![0f32; 32];
        av[0] = 1.0;
        av[1] = 2.0;
        av[16] = 6.0;
        bv[0] = 3.0;
        bv[1] = 0.5;
        bv[16] = -4.0;
        let (a, sfa) = raw(&av, &[2.0, 0.5], 1, 32);
        let (b, sfb) = raw(&bv, &[0.25, 448.0], 1, 32);
        // block 0: (1*3 + 2*0.5) * 2 * 0.25 = 2; block 1: 6 * -4 * 0.5 * 448 = -5376
        let p = Problem::new(1, 1, 32);
        let d: Vec<f32> = gemm(&p, &a, &sfa, &b, &sfb, None).unwrap();
        assert_eq!(d, vec![2.0 - 5376.0]);
        let p = p.scalars(0.5, 2.0);
        let d: Vec<f32> = gemm(&p, &a, &sfa, &b, &sfb, Some(&[10.0f32])).unwrap();
        assert_eq!(d, vec![0.5 * (2.0 - 5376.0) + 20.0]);
    }

    #[test]
    fn single_rounding_to_f16() {
        // sum = 2048 + 1 + 2^-20 in exact arithmetic; f16 spacing at 2048 is 2, so 2049 + tiny
        // rounds up to 2050. An f32 sum loses the 2^-20 (f32 spacing at 2049 is 2^-12), and its
        // 2049, a tie in f16, rounds to even: 2048; summing in f16 also gives 2048.
        let k = 48;
        let mut av = vec![0f32; k];
        let mut bv = vec![0f32; k];
        av[0] = 4.0; bv[0] = 4.0; // block 0: 16 * 128 = 2048
        av[16] = 1.0; bv[16] = 1.0; // block 1: 1 * 1
        av[32] = 0.5; bv[32] = 0.5; // block 2: 0.25 * 2^-9 * 2^-9 = 2^-20
        let (a, sfa) = raw(&av, &[128.0, 1.0, 2f32.powi(-9)], 1, k);
        let (b, sfb) = raw(&bv, &[1.0, 1.0, 2f32.powi(-9)], 1, k);
        let d: Vec<f16> = gemm(&Problem::new(1, 1, k), &a, &sfa, &b, &sfb, None).unwrap();
        assert_eq!(d[0].to_f64(), 2050.0);
        assert_eq!(f16::from_f32(2048.0f32 + 1.0 + 2f32.powi(-20)).to_f64(), 2048.0, "an f32 sum would not tell the two apart");
    }

    #[test]
    fn nan_scale_propagates_even_with_zero_data() {
        let av = vec![0f32; 16];
        let (a, mut sfa) = raw(&av, &[1.0], 1, 16);
        let (b, sfb) = raw(&av, &[1.0], 1, 16);
        sfa[0] = 0x7F;
        let d: Vec<f32> = gemm(&Problem::new(1, 1, 16), &a, &sfa, &b, &sfb, None).unwrap();
        assert!(d[0].is_nan());
    }

    #[test]
    fn beta_zero_never_reads_c() {
        let av = vec![1f32; 16];
        let (a, sfa) = raw(&av, &[1.0], 1, 16);
        let d: Vec<f32> = gemm(&Problem::new(1, 1, 16), &a, &sfa, &a, &sfa, Some(&[f32::NAN])).unwrap();
        assert_eq!(d[0], 16.0);
    }

    #[test]
    fn length_errors_name_the_buffer() {
        let p = Problem::new(2, 2, 32);
        let e = gemm::<f32>(&p, &[0; 31], &[0; 512], &[0; 32], &[0; 512], None).unwrap_err();
        assert!(e.to_string().contains("A: holds 31 elements where exactly 32 are needed"), "{e}");
        let e = gemm::<f32>(&p, &[0; 32], &[0; 511], &[0; 32], &[0; 512], None).unwrap_err();
        assert!(e.to_string().starts_with("SFA"), "{e}");
        let e = gemm::<f32>(&Problem::new(2, 2, 24), &[0; 24], &[0; 512], &[0; 24], &[0; 512], None).unwrap_err();
        assert!(e.to_string().contains("multiple of 16"), "{e}");
    }

    #[test]
    fn outputs_beyond_the_hosts_memory_are_typed_errors() {
        // 2^23 x 2^23 outputs from 96 MiB a side: 2^50 bytes of dots, more than any address
        // space holds. A typed error, not an abort.
        let (m, k) = (1usize << 23, 16);
        let (a, sfa) = (vec![0u8; m * k / 2], vec![0u8; sf_batch_bytes(m, k)]);
        let p = Problem::new(m, m, k);
        let e = dots(&p, &a, &sfa, &a, &sfa).unwrap_err();
        assert!(matches!(e, Error::HostMemory { bytes, .. } if bytes == 1 << 50), "{e}");
        let e = gemm::<f32>(&p, &a, &sfa, &a, &sfa, None).unwrap_err();
        assert!(matches!(e, Error::HostMemory { .. }), "{e}");
        let e = accumulators(&p, &a, &sfa, &a, &sfa, Accumulation::Exact).unwrap_err();
        assert!(matches!(e, Error::HostMemory { .. }), "{e}");
    }
}
