//! FP4 output, as CUTLASS example 72b writes it (`LinCombBlockScaleFactor`): D in e2m1 plus one
//! scale factor (SFD) per 16 outputs along N, in the 128x4 tiled layout over (M, N/16).
//!
//! The arithmetic is that of CUTLASS's host reference (`Gemm3x` with `SfStrategy::SfDGen`,
//! `tools/util/include/cutlass/util/reference/host/gett.hpp`), step by step in f32, so results
//! match it byte for byte (tests/cutlass_host.rs calls that reference through the shim). For
//! each row and each 16 columns of `v = alpha * acc + beta * C`:
//!
//! ```text
//! sfd   = Sf(max|v| * (st * (1 / 6)))            // st: the normalization constant
//! scale = min(st * (1 / float(sfd)), FLT_MAX)    // NaN-propagating min
//! d     = e2m1(v * scale)
//! ```
//!
//! so `v ≈ d * sfd / st`: the next GEMM takes D and SFD as its A operand and `1 / st` in alpha.
//! The conversions are CUTLASS's host ones, which differ from PTX `cvt` in corner cases: e2m1
//! NaN gives ±6 with the NaN's sign, ue4m3 drops the sign of its input, and ue8m0 rounds up.

use crate::error::{check_len, try_zeros, Error, Result};
use crate::formats::{e2m1_from_f32, ue4m3_from_f32, ue4m3_to_f32, ue8m0_to_f32};
use crate::layout::{padded_sf_cols, sf_batch_bytes, sf_offset, SF_VEC};
use crate::problem::{check_c, Problem, SfdFormat};

/// `cutlass::NumericConverter<float_e2m1_t, float>` on the host: round to nearest even,
/// saturating at ±6, sign kept (so -0.1 gives -0, 0x8); NaN gives 6 with the NaN's sign.
pub fn e2m1_from_f32_cutlass(x: f32) -> u8 {
    if x.is_nan() {
        return if x.is_sign_negative() { 0xF } else { 0x7 };
    }
    e2m1_from_f32(x)
}

/// `static_cast<float_ue4m3_t>(x)` / `static_cast<float_ue8m0_t>(x)` on the host.
///
/// ue4m3: the magnitude rounded to nearest even, saturating at 448 (0x7E), NaN 0x7F.
/// ue8m0: the exponent of `x`, plus one when the mantissa is not zero (rounding up), except at
/// 2^127 (saturation) and for subnormals up to 2^-127; NaN and infinities give 0xFF.
pub fn sfd_from_f32(format: SfdFormat, x: f32) -> u8 {
    match format {
        SfdFormat::Ue4m3 => ue4m3_from_f32(x.abs()),
        SfdFormat::Ue8m0 => {
            if !x.is_finite() {
                return 0xFF;
            }
            let bits = x.to_bits();
            let exp = ((bits >> 23) & 0xFF) as u8;
            let mant = bits & 0x7F_FFFF;
            if mant > 0 && exp != 0xFE && !(exp == 0 && mant <= 0x40_0000) {
                exp + 1
            } else {
                exp
            }
        }
    }
}

/// The value of an SFD byte as CUTLASS's host converts it to float (ue8m0 0 is 2^-127, 0xFF NaN).
pub fn sfd_to_f32(format: SfdFormat, byte: u8) -> f32 {
    match format {
        SfdFormat::Ue4m3 => ue4m3_to_f32(byte),
        SfdFormat::Ue8m0 => ue8m0_to_f32(byte), // 0 is 2^-127 (subnormal), 0xFF NaN
    }
}

/// CUTLASS's host `maximum_with_nan_propagation<float>`.
#[inline]
fn max_nan(l: f32, r: f32) -> f32 {
    if l > r || l.is_nan() {
        l
    } else {
        r
    }
}

/// CUTLASS's host `minimum_with_nan_propagation<float>`.
#[inline]
fn min_nan(l: f32, r: f32) -> f32 {
    if l < r || l.is_nan() {
        l
    } else {
        r
    }
}

/// Quantizes one group of 16 epilogue values: returns the SFD byte and writes the e2m1 codes of
/// `v` into `codes`. `norm_constant` must be finite and positive ([`Problem::check_norm_constant`]);
/// other values give meaningless bytes (CUTLASS's arithmetic, unchecked).
pub fn quantize_group(v: &[f32; SF_VEC], norm_constant: f32, format: SfdFormat, codes: &mut [u8; SF_VEC]) -> u8 {
    // `1.0f / 6.0f` with 6 = numeric_limits<float_e2m1_t>::max().
    let st_scaled_down = norm_constant * (1.0f32 / 6.0f32);
    let amax = v.iter().fold(0.0f32, |m, x| max_nan(m, x.abs()));
    let sfd = sfd_from_f32(format, amax * st_scaled_down);
    let scale = min_nan(norm_constant * (1.0f32 / sfd_to_f32(format, sfd)), f32::MAX);
    for (c, &x) in codes.iter_mut().zip(v) {
        *c = e2m1_from_f32_cutlass(x * scale);
    }
    sfd
}

/// N of an FP4 output: whole groups of 16 outputs a row (one scale factor each).
pub(crate) fn check_whole_groups(n: usize) -> Result<()> {
    if !n.is_multiple_of(SF_VEC) {
        return Err(Error::InvalidData { what: "N", detail: format!("{n}: FP4 output needs whole groups of 16 outputs per row") });
    }
    Ok(())
}

/// The FP4 epilogue over f32 accumulators `acc` (L, M, N): `v = alpha * acc`, plus `beta * C`
/// (two roundings, no fused multiply-add) when beta != 0, then [`quantize_group`] per 16
/// columns. Returns D, (L, M, N/2) packed bytes, and SFD, `p.sfd_bytes()` bytes with zero
/// padding. Fails where N is not a multiple of 16, `acc` or a given `c` does not hold L * M * N
/// values, beta != 0 has no `c`, alpha or beta is not finite, or the norm constant is not
/// finite and positive (as `gemm_fp4`).
pub fn epilogue(p: &Problem, acc: &[f32], c: Option<&[f32]>, format: SfdFormat) -> Result<(Vec<u8>, Vec<u8>)> {
    let (m, n) = (p.m, p.n);
    p.check_scalars()?;
    p.check_norm_constant()?;
    check_whole_groups(n)?;
    check_len("accumulators", acc.len(), p.cd_elems(), "L * M * N")?;
    check_c(p, c.map(<[f32]>::len))?;
    if p.cd_elems() == 0 {
        return Ok((Vec::new(), Vec::new())); // no outputs: no loop over (possibly usize::MAX) rows
    }
    let c = c.filter(|_| p.beta != 0.0);
    let sp = padded_sf_cols(n / SF_VEC);
    let mut d = try_zeros("D", p.cd_elems() / 2)?;
    let mut sfd = try_zeros("SFD", p.sfd_bytes())?;
    let mut v = [0f32; SF_VEC];
    let mut codes = [0u8; SF_VEC];
    for l in 0..p.l {
        for row in 0..m {
            let base = (l * m + row) * n;
            for g in 0..n / SF_VEC {
                for (j, x) in v.iter_mut().enumerate() {
                    let idx = base + g * SF_VEC + j;
                    let mut y = p.alpha * acc[idx];
                    if let Some(c) = c {
                        y += p.beta * c[idx]; // beta * C + v, two roundings (addition commutes)
                    }
                    *x = y;
                }
                sfd[l * sf_batch_bytes(m, n) + sf_offset(row, g, sp)] = quantize_group(&v, p.norm_constant, format, &mut codes);
                for (j, pair) in codes.chunks_exact(2).enumerate() {
                    d[(base + g * SF_VEC) / 2 + j] = pair[0] | (pair[1] << 4);
                }
            }
        }
    }
    Ok((d, sfd))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A review probe: the epilogue took any norm constant (NaN gave NaN scale bytes, -1 flipped
    /// every sign); it refuses what `gemm_fp4` refuses.
    #[test]
    fn the_epilogue_checks_its_norm_constant() {
        let acc = [1.0f32; 16];
        for bad in [f32::NAN, -1.0, 0.0, f32::INFINITY] {
            let p = Problem::new(1, 16, 32).norm_constant(bad);
            assert!(matches!(epilogue(&p, &acc, None, SfdFormat::Ue4m3), Err(Error::NormConstant { .. })), "{bad}");
        }
        assert!(epilogue(&Problem::new(1, 16, 32).norm_constant(1.0), &acc, None, SfdFormat::Ue4m3).is_ok());
    }

    /// A review probe: the epilogue took a NaN or infinite alpha or beta (NaN scale bytes and ±6
    /// codes); it refuses them as `gemm_fp4` does.
    #[test]
    fn the_epilogue_checks_alpha_and_beta() {
        let (acc, c) = ([1.0f32; 16], [1.0f32; 16]);
        for (alpha, beta) in [(f32::NAN, 0.0), (f32::INFINITY, 0.0), (1.0, f32::NAN), (1.0, f32::NEG_INFINITY)] {
            let p = Problem::new(1, 16, 32).scalars(alpha, beta);
            assert!(matches!(epilogue(&p, &acc, Some(&c), SfdFormat::Ue4m3), Err(Error::NonFiniteScalar { .. })), "{alpha} {beta}");
        }
        assert!(epilogue(&Problem::new(1, 16, 32).scalars(1.0, 1.0), &acc, Some(&c), SfdFormat::Ue4m3).is_ok());
    }

    #[test]
    fn conversions_at_their_corners() {
        // e2m1: ties to even, sign kept, saturation, NaN keeps its sign.
        assert_eq!(e2m1_from_f32_cutlass(0.25), 0x0);
        assert_eq!(e2m1_from_f32_cutlass(-0.25), 0x8);
        assert_eq!(e2m1_from_f32_cutlass(0.75), 0x2);
        assert_eq!(e2m1_from_f32_cutlass(5.0), 0x6);
        assert_eq!(e2m1_from_f32_cutlass(5.0001), 0x7);
        assert_eq!(e2m1_from_f32_cutlass(f32::NEG_INFINITY), 0xF);
        assert_eq!(e2m1_from_f32_cutlass(f32::NAN), 0x7);
        assert_eq!(e2m1_from_f32_cutlass(-f32::NAN), 0xF);
        // ue4m3: magnitude, RNE, saturation at 448, NaN.
        assert_eq!(sfd_from_f32(SfdFormat::Ue4m3, -1.0), 0x38);
        assert_eq!(sfd_from_f32(SfdFormat::Ue4m3, 464.0), 0x7E);
        assert_eq!(sfd_from_f32(SfdFormat::Ue4m3, f32::INFINITY), 0x7E);
        assert_eq!(sfd_from_f32(SfdFormat::Ue4m3, f32::NAN), 0x7F);
        assert_eq!(sfd_from_f32(SfdFormat::Ue4m3, 2f32.powi(-10)), 0x00); // half the smallest subnormal: tie to 0
        // ue8m0: rounds up; exact powers stay; 2^127 saturates; tiny values stay at 2^-127.
        assert_eq!(sfd_from_f32(SfdFormat::Ue8m0, 1.0), 127);
        assert_eq!(sfd_from_f32(SfdFormat::Ue8m0, 1.0001), 128);
        assert_eq!(sfd_from_f32(SfdFormat::Ue8m0, f32::MAX), 0xFE);
        assert_eq!(sfd_from_f32(SfdFormat::Ue8m0, 0.0), 0);
        assert_eq!(sfd_from_f32(SfdFormat::Ue8m0, f32::from_bits(0x0040_0001)), 1);
        assert_eq!(sfd_to_f32(SfdFormat::Ue8m0, 0), 2f32.powi(-127));
        assert_eq!(sfd_to_f32(SfdFormat::Ue8m0, 130), 8.0);
        assert!(sfd_to_f32(SfdFormat::Ue8m0, 0xFF).is_nan());
    }

    #[test]
    fn a_group_round_trips_within_one_e2m1_step() {
        let v: [f32; 16] = std::array::from_fn(|i| (i as f32 - 7.5) * 0.37);
        let mut codes = [0u8; 16];
        for format in [SfdFormat::Ue4m3, SfdFormat::Ue8m0] {
            for st in [1.0f32, 2.0, 100.0] { // amax * st / 6 stays below 448: no saturation
                let sf = quantize_group(&v, st, format, &mut codes);
                let s = sfd_to_f32(format, sf) / st;
                for (&x, &c) in v.iter().zip(&codes) {
                    let back = crate::formats::e2m1_to_f32(c) * s;
                    // One e2m1 step at the top of the range is 2 (4 -> 6), times the scale.
                    assert!((back - x).abs() <= 1.0 * s + 1e-6, "st {st} {format:?}: {x} -> {back}");
                }
            }
        }
        // All zeros: scale 0, every code +0.
        let sf = quantize_group(&[0.0; 16], 1.0, SfdFormat::Ue4m3, &mut codes);
        assert_eq!((sf, codes), (0, [0; 16]));
    }
}
