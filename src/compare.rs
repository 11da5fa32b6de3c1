//! Judging an output against the exact reference.
//!
//! - [`verdict`] (and [`verify`], [`verify_matrices`]): the criterion results are held to. Per
//!   element: *exact* (equal to the exact result rounded once to the output type), else *within
//!   the FP32 bound* derived below, else *failed*; the report names the worst element, its value,
//!   the reference's and its bound.
//! - [`compare`]: the contest's `|got - want| <= atol + rtol * |want|` (atol = rtol = 1e-3), kept
//!   as an option. It rejects legitimate FP32 results: a sum that cancels to near 0 carries an
//!   absolute error far above 1e-3, and a value near a bf16 rounding boundary may round to the
//!   neighbour, 2^-8 away relatively.
//! - [`compare_fp4`]: FP4 outputs, group by group.
//!
//! # The FP32 bound
//!
//! Every kernel computes each product `p_k = a_k * b_k` (block-scaled values) exactly: an e2m1
//! value times a ue4m3 scale has at most 5 significant bits and lies in [2^-10, 2688], so it is
//! exact in FP16 (see [`crate::formats`]), and a product of two FP16 values is exact in FP32 (22 bits, at
//! least 2^-20; SM100's block-scaled MMA forms the same products). The K products of one output
//! are then summed in FP32 in an order the kernel chooses: wgmma or UMMA trees, k-tile after
//! k-tile, split-K partial sums added at the end.
//!
//! *Summation.* With `S = sum_k |p_k|`, any order of summing K terms by two-operand additions,
//! each with relative error at most `u'`, errs by at most `gamma_{K-1}(u') * S`, where
//! `gamma_n(u') = n u' / (1 - n u')` (Higham, *Accuracy and Stability of Numerical Algorithms*,
//! §4.2): the bound depends on the number of additions, not on their order, and split-K only
//! regroups them (S partials of K terms are still K - 1 additions). Tensor cores are not IEEE
//! adders: they add several products and the accumulator in one fused step that aligns the
//! addends to the largest exponent and truncates (Fasi et al., "Numerical behavior of NVIDIA
//! tensor cores", PeerJ CS 2021; Khattak and Mikaitis 2025 for H100 and B200). A fused step of
//! t products errs by less than one ulp of its largest addend per truncated addend plus one for
//! the result: at most `(t + 1) u'` times the sum of its addends' magnitudes, with
//! `u' = 2^-23` (one ulp, truncation, where round-to-nearest would give half). Counting each
//! fused step as t + 1 additions, K products in steps of t >= 4 plus at most K / 64 split-K
//! partials are fewer than `n = 2K` additions, hence
//!
//! ```text
//! |acc - sum_k p_k| <= E_acc = gamma_{2K}(2^-23) * S
//! ```
//!
//! (no underflow: every partial sum is a multiple of 2^-20 or 0). This is a worst-case bound;
//! typical errors are near `sqrt(K) * 2^-24 * S`. Where `2K * 2^-23 >= 1` (K >= 2^22) it is
//! infinite and only NaN, infinities beyond overflow and exact results are judged.
//!
//! *Epilogue.* `v = alpha * acc + beta * C` in FP32 takes at most three roundings to nearest
//! (alpha * acc, beta * C and their sum; an FMA takes fewer), each of relative error `u = 2^-24`,
//! plus at most `2^-126` absolute each where a device flushes subnormals to zero. With
//! `t = |alpha| (|s| + E_acc)`, `w = |beta C|` and `s` the exact sum:
//!
//! ```text
//! |v - (alpha s + beta C)| <= B = |alpha| E_acc + 3u (t + w) + 3 * 2^-126
//! ```
//!
//! (B also carries `2^-50 (t + w)` for the f64 arithmetic that computes it).
//!
//! *Final rounding.* D is `v` rounded to nearest in the output type, a monotone function, so D
//! lies in `[rnd(x - B), rnd(x + B)]` with `x` the exact result: that interval is the criterion.
//! It holds half an ulp of the output type on either side at the value (an ulp more where the
//! interval crosses a power of two), nothing more for f32 output (v is already f32), and
//! overflow to infinity where `x + B` rounds to infinity. Where `t + w` reaches f32's largest
//! value an FP32 intermediate may overflow even though `x` is finite; infinities and NaN then
//! count as within the bound.
//!
//! NaN: the exact result is NaN only where a scale is NaN (0x7F) or C holds NaN; then D must be
//! NaN. A NaN elsewhere fails.

use crate::error::{check_len, product, Error, Result};
use crate::formats::OutputElement;
use crate::problem::{OutType, Problem, SfdFormat};
use crate::reference::Dot;
use crate::Nvfp4Matrix;

/// The result of [`compare`].
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// Elements compared.
    pub count: usize,
    /// Largest |got - want| over finite pairs.
    pub max_abs: f64,
    /// Largest |got - want| / |want| over finite pairs with want != 0.
    pub max_rel: f64,
    /// Elements outside `atol + rtol * |want|`, NaN mismatches included.
    pub bad: usize,
    /// Elements where exactly one of got and want is NaN.
    pub nan_mismatch: usize,
    /// Index of the worst element (largest excess over its tolerance), if any is bad.
    pub worst: Option<usize>,
    /// got and want at `worst`.
    pub worst_values: Option<(f64, f64)>,
    /// Tolerances used.
    pub atol: f64,
    /// Tolerances used.
    pub rtol: f64,
}

impl Comparison {
    /// True when no element is outside tolerance.
    pub fn passed(&self) -> bool {
        self.bad == 0
    }
}

impl std::fmt::Display for Comparison {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} of {} outside atol={:e} rtol={:e} (max abs {:.3e}, max rel {:.3e}, NaN mismatches {})",
            self.bad, self.count, self.atol, self.rtol, self.max_abs, self.max_rel, self.nan_mismatch)?;
        if let (Some(i), Some((g, w))) = (self.worst, self.worst_values) {
            write!(f, "; worst at index {i}: got {g}, want {w}")?;
        }
        Ok(())
    }
}

/// Compares `got` with `want` element by element against `atol + rtol * |want|`; fails where
/// their lengths differ.
pub fn compare<T: OutputElement>(got: &[T], want: &[T], atol: f64, rtol: f64) -> Result<Comparison> {
    check_len("got", got.len(), want.len(), "one element for each of want")?;
    let mut c = Comparison { count: got.len(), max_abs: 0.0, max_rel: 0.0, bad: 0, nan_mismatch: 0, worst: None, worst_values: None, atol, rtol };
    let mut worst_excess = f64::NEG_INFINITY;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let (g, w) = (g.to_f64(), w.to_f64());
        let excess = match (g.is_nan(), w.is_nan()) {
            (true, true) => continue,
            (true, false) | (false, true) => {
                c.nan_mismatch += 1;
                f64::INFINITY
            }
            _ if g == w => continue, // equal infinities too
            _ => {
                let d = (g - w).abs();
                if g.is_finite() && w.is_finite() {
                    c.max_abs = c.max_abs.max(d);
                    if w != 0.0 {
                        c.max_rel = c.max_rel.max(d / w.abs());
                    }
                }
                d - (atol + rtol * w.abs())
            }
        };
        if excess > 0.0 || excess.is_nan() {
            c.bad += 1;
            if excess > worst_excess || c.worst.is_none() {
                worst_excess = excess;
                c.worst = Some(i);
                c.worst_values = Some((g, w));
            }
        }
    }
    Ok(c)
}

/// For tests: panics with the report when `got` and `want` differ beyond tolerance or in length.
#[track_caller]
pub fn assert_close<T: OutputElement>(got: &[T], want: &[T], atol: f64, rtol: f64) {
    match compare(got, want, atol, rtol) {
        Ok(c) => assert!(c.passed(), "{c}"),
        Err(e) => panic!("{e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A review probe: `max_abs` and `max_rel` are documented over finite pairs, and took an
    /// infinity against a finite value (max abs inf).
    #[test]
    fn maxima_are_over_finite_pairs() {
        let c = compare(&[f32::INFINITY, 1.5, 2.0], &[1.0f32, 1.0, f32::NEG_INFINITY], 1e-3, 1e-3).unwrap();
        assert_eq!((c.bad, c.max_abs, c.max_rel), (3, 0.5, 0.5), "{c}");
        assert_eq!(c.worst, Some(0));
    }

    #[test]
    fn counts_and_worst() {
        let want = [1.0f32, 2.0, 3.0, 4.0, f32::NAN, 0.0];
        let got = [1.0f32, 2.1, 3.0, 40.0, f32::NAN, f32::NAN];
        let c = compare(&got, &want, 0.0, 0.01).unwrap();
        assert_eq!(c.bad, 3); // 2.1, 40, NaN-vs-0
        assert_eq!(c.nan_mismatch, 1);
        assert_eq!(c.worst, Some(5));
        assert!((c.max_abs - 36.0).abs() < 1e-9);
        assert!(!c.passed());
        assert!(c.to_string().contains("3 of 6 outside"));
        let c = compare(&[1.0f32, f32::INFINITY], &[1.0f32, f32::INFINITY], 0.0, 0.0).unwrap();
        assert!(c.passed());
        let c = compare(&[1.0f32], &[f32::NAN], 1e9, 1e9).unwrap();
        assert!(!c.passed(), "NaN never passes a tolerance");
        assert!(matches!(compare(&[1.0f32], &[1.0, 2.0], 0.0, 0.0), Err(Error::BufferLength { name: "got", got: 1, want: 2, .. })));
    }
}

/// The result of [`compare_fp4`]: FP4 outputs compared group by group (16 outputs and their
/// scale factor).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fp4Comparison {
    /// Groups compared.
    pub groups: usize,
    /// Groups whose scale factor is equal.
    pub sfd_equal: usize,
    /// Groups whose scale factor is the neighbouring code (what a different FP32 summation
    /// order can cause when the unrounded scale lies at a rounding point).
    pub sfd_neighbour: usize,
    /// Groups whose scale factor differs by more than one code.
    pub sfd_far: usize,
    /// Codes compared (in groups with equal scale factors).
    pub codes: usize,
    /// Codes equal.
    pub codes_equal: usize,
    /// Codes one e2m1 step apart (-0 and +0 are the same point).
    pub codes_one_step: usize,
    /// Codes further apart.
    pub codes_far: usize,
    /// Codes whose bits differ (a -0 against a +0 counts here, not in `codes_equal`'s complement).
    pub codes_bits_differ: usize,
    /// Codes compared by value in groups whose scale factors are neighbours.
    pub neighbour_codes: usize,
    /// Of those, codes whose values (code times scale factor) are further apart than two
    /// roundings of one value allow (see [`compare_fp4`]).
    pub neighbour_codes_far: usize,
}

impl Fp4Comparison {
    /// Every scale factor and every code equal.
    pub fn byte_equal(&self) -> bool {
        self.sfd_equal == self.groups && self.codes_bits_differ == 0
    }
    /// No scale factor further than its neighbour, no code further than one step, and in groups
    /// whose scale factors are neighbours no value further than the two roundings allow.
    pub fn within_one_step(&self) -> bool {
        self.sfd_far == 0 && self.codes_far == 0 && self.neighbour_codes_far == 0
    }
}

impl std::fmt::Display for Fp4Comparison {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} groups: SFD {} equal, {} neighbouring, {} further; {} codes: {} equal, {} one step, {} further; {} codes of neighbouring groups, {} beyond their roundings",
            self.groups, self.sfd_equal, self.sfd_neighbour, self.sfd_far, self.codes, self.codes_equal, self.codes_one_step, self.codes_far, self.neighbour_codes, self.neighbour_codes_far)
    }
}

/// Compares FP4 outputs: `d` packed e2m1 rows of `n` values, `sfd` the scale factors row-major,
/// `n / 16` per row (see [`crate::layout::from_tiled`]), in `format`. Fails where `n` is not a
/// positive multiple of 16 or the lengths disagree with each other or with `n`.
///
/// Two scale factors are neighbours where both are finite values of `format` one encoding apart
/// (the next value up or down); a NaN (ue4m3 0x7F, ue8m0 0xFF) or, in ue4m3, a byte with the sign
/// bit set is only ever equal to the same byte. In groups with equal scale factors the codes are
/// compared in e2m1 steps. In groups with neighbouring ones (two quantizations of one value v
/// whose FP32 sums differ slightly, with the scales S1 and S2 either side of a rounding point) the
/// decoded values are compared: each code c of scale S is v / S rounded to e2m1 and saturated at
/// 6 (both in the units of v times the norm constant), so `|c S - v| <= e(c, S)`, where e(c, S)
/// is h(c) S with h(c) half the larger e2m1 gap beside c (0.25 up to 1.5, 0.5 at 2 and 3, 1 at 4
/// and 6), except where ue4m3's rounding of the scale to nearest can leave v / S above 6: by up
/// to 3 ulp(S) / S, so at code 6, and for S = 0 at every code, e(c, S) is at least 3 ulp(S)
/// (ue8m0 rounds its scale up, so v / S never exceeds 6 there). Then
/// `|c1 S1 - c2 S2| <= e(c1, S1) + e(c2, S2) + max(S1, S2) / 16`, the last term for the sums'
/// difference. Codes further apart count in `neighbour_codes_far`; in groups whose scale factors
/// are further apart nothing is compared.
pub fn compare_fp4(got_d: &[u8], got_sfd: &[u8], want_d: &[u8], want_sfd: &[u8], n: usize, format: SfdFormat) -> Result<Fp4Comparison> {
    if n == 0 || !n.is_multiple_of(16) {
        return Err(Error::InvalidData { what: "n", detail: format!("{n} is not a positive multiple of 16 (one scale factor per 16 outputs)") });
    }
    if !got_d.len().is_multiple_of(n / 2) {
        return Err(Error::InvalidData { what: "got_d", detail: format!("{} bytes are not whole rows of n / 2 = {} bytes", got_d.len(), n / 2) });
    }
    let rows = got_d.len() / (n / 2);
    check_len("want_d", want_d.len(), got_d.len(), "as many bytes as got_d")?;
    check_len("got_sfd", got_sfd.len(), rows * (n / 16), "n / 16 scale factors per row of got_d")?;
    check_len("want_sfd", want_sfd.len(), got_sfd.len(), "as many scale factors as got_sfd")?;
    let rank = |code: u8| if code & 8 != 0 { -((code & 7) as i32) } else { (code & 7) as i32 };
    // Finite scale bytes of both formats are ordered as their values, one encoding a step.
    let finite = |b: u8| match format {
        SfdFormat::Ue4m3 => b < 0x7F,
        SfdFormat::Ue8m0 => b != 0xFF,
    };
    let scale = |b: u8| match format {
        SfdFormat::Ue4m3 => crate::formats::ue4m3_to_f32(b) as f64,
        SfdFormat::Ue8m0 => crate::formats::ue8m0_to_f32(b) as f64,
    };
    // Half the larger e2m1 gap beside each magnitude 0, 0.5, 1, 1.5, 2, 3, 4, 6.
    const HALF_GAP: [f64; 8] = [0.25, 0.25, 0.25, 0.25, 0.5, 0.5, 1.0, 1.0];
    // e(c, S) of the doc above for code `code` and scale byte `b`.
    let error = |code: u8, b: u8| {
        let (m, s) = ((code & 7) as usize, scale(b));
        match format {
            SfdFormat::Ue4m3 if m == 7 || b == 0 => {
                // The gap to the next ue4m3 value (at 448, the largest, the gap below it).
                let ulp = if b < 0x7E { scale(b + 1) - s } else { s - scale(b - 1) };
                (HALF_GAP[m] * s).max(3.0 * ulp)
            }
            _ => HALF_GAP[m] * s,
        }
    };
    let mut c = Fp4Comparison { groups: got_sfd.len(), ..Default::default() };
    for (gi, (&gs, &ws)) in got_sfd.iter().zip(want_sfd).enumerate() {
        if gs != ws {
            if finite(gs) && finite(ws) && gs.abs_diff(ws) == 1 {
                c.sfd_neighbour += 1;
                let (sg, sw) = (scale(gs), scale(ws));
                for (&g, &w) in got_d[gi * 8..][..8].iter().zip(&want_d[gi * 8..][..8]) {
                    for (x, y) in [(g & 15, w & 15), (g >> 4, w >> 4)] {
                        let (vx, vy) = (crate::formats::e2m1_to_f32(x) as f64 * sg, crate::formats::e2m1_to_f32(y) as f64 * sw);
                        let bound = error(x, gs) + error(y, ws) + sg.max(sw) / 16.0;
                        c.neighbour_codes += 1;
                        c.neighbour_codes_far += usize::from((vx - vy).abs() > bound);
                    }
                }
            } else {
                c.sfd_far += 1;
            }
            continue;
        }
        c.sfd_equal += 1;
        for (&g, &w) in got_d[gi * 8..][..8].iter().zip(&want_d[gi * 8..][..8]) {
            for (x, y) in [(g & 15, w & 15), (g >> 4, w >> 4)] {
                c.codes += 1;
                c.codes_bits_differ += usize::from(x != y);
                match (rank(x) - rank(y)).abs() {
                    0 => c.codes_equal += 1,
                    1 => c.codes_one_step += 1,
                    _ => c.codes_far += 1,
                }
            }
        }
    }
    Ok(c)
}

#[cfg(test)]
mod fp4_tests {
    use super::*;

    #[test]
    fn fp4_comparison_counts_steps() {
        let want_d = vec![0x21u8; 16]; // codes 1 and 2
        let mut got_d = want_d.clone();
        got_d[0] = 0x22; // 1 -> 2: one step
        got_d[1] = 0x81; // 2 -> -0: two steps
        got_d[9] = 0x00; // second group, whose SFD is a neighbour: compared by value
        let c = compare_fp4(&got_d, &[5, 7], &want_d, &[5, 6], 16, SfdFormat::Ue4m3).unwrap();
        assert_eq!((c.groups, c.sfd_equal, c.sfd_neighbour, c.sfd_far), (2, 1, 1, 0));
        assert_eq!((c.codes, c.codes_equal, c.codes_one_step, c.codes_far), (16, 14, 1, 1));
        // got 0 against 0.5 S is within the two roundings, 0 against 1.0 S is not.
        assert_eq!((c.neighbour_codes, c.neighbour_codes_far), (16, 1), "{c}");
        assert!(!c.byte_equal() && !c.within_one_step());
        let c = compare_fp4(&want_d, &[5, 6], &want_d, &[5, 6], 16, SfdFormat::Ue4m3).unwrap();
        assert!(c.byte_equal() && c.within_one_step(), "{c}");
        // -0 and +0 are the same point.
        let c = compare_fp4(&[0x08; 8], &[1], &[0x00; 8], &[1], 16, SfdFormat::Ue4m3).unwrap();
        assert!(!c.byte_equal() && c.codes_equal == 16);
    }

    #[test]
    fn fp4_comparison_neighbour_groups_by_value() {
        // One group quantized by the reference's own epilogue twice, its amax just below and just
        // above the rounding point between two neighbouring scales (the two sides' values 1e-6
        // apart, as two FP32 summation orders leave them): every pair must pass; in groups of
        // normal scales a code moved far must not.
        use crate::formats::{pack_e2m1, ue4m3_to_f32, ue8m0_to_f32};
        use crate::fp4_out::quantize_group;
        let pairs = [
            (SfdFormat::Ue4m3, 0x00u8), (SfdFormat::Ue4m3, 0x01), (SfdFormat::Ue4m3, 0x02), (SfdFormat::Ue4m3, 0x07),
            (SfdFormat::Ue4m3, 0x08), (SfdFormat::Ue4m3, 0x38), (SfdFormat::Ue4m3, 0x3F), (SfdFormat::Ue4m3, 0x7D),
            (SfdFormat::Ue8m0, 0x40), (SfdFormat::Ue8m0, 0x7F), (SfdFormat::Ue8m0, 0xF0),
        ];
        let mut far_checked = 0;
        for (format, lo) in pairs {
            let value = |b: u8| match format {
                SfdFormat::Ue4m3 => ue4m3_to_f32(b) as f64,
                SfdFormat::Ue8m0 => ue8m0_to_f32(b) as f64,
            };
            // amax * st / 6 at which the scale turns from lo to lo + 1: ue4m3 rounds to nearest,
            // ue8m0 up.
            let point = match format {
                SfdFormat::Ue4m3 => (value(lo) + value(lo + 1)) / 2.0,
                SfdFormat::Ue8m0 => value(lo),
            };
            for (seed, st) in (0..100u64).zip([1.0f32, 1.5, 300.0, 0.01].into_iter().cycle()) {
                let mut rng = crate::SplitMix64::new(seed);
                let amax = 6.0 * point / st as f64;
                let v: Vec<f64> = (0..16).map(|i| if i == 5 { -amax } else { (rng.unit() * 2.0 - 1.0) * amax }).collect();
                let quantize = |f: f64| {
                    let g: [f32; 16] = std::array::from_fn(|i| (v[i] * f) as f32);
                    let mut codes = [0u8; 16];
                    let sfd = quantize_group(&g, st, format, &mut codes);
                    (codes.chunks(2).map(|p| pack_e2m1(p[0], p[1])).collect::<Vec<u8>>(), sfd)
                };
                let ((a, sa), (b, sb)) = (quantize(1.0 - 1e-6), quantize(1.0 + 1e-6));
                assert_eq!((sa, sb), (lo, lo + 1), "{format:?} {lo:#04x}: the group does not straddle the rounding point");
                let c = compare_fp4(&a, &[sa], &b, &[sb], 16, format).unwrap();
                assert!(c.within_one_step() && c.neighbour_codes == 16, "{format:?} {lo:#04x} st {st} seed {seed}: {c}");
                if value(lo) >= 1.0 / 64.0 {
                    // One code moved far (2 or more to 0, below 2 to 6).
                    let mut bad = a.clone();
                    let x = bad[3] & 15;
                    bad[3] = (bad[3] & 0xF0) | if x & 7 >= 4 { x & 8 } else { x | 7 };
                    let c = compare_fp4(&bad, &[sa], &b, &[sb], 16, format).unwrap();
                    assert!(!c.within_one_step() && c.neighbour_codes_far >= 1, "{format:?} {lo:#04x} seed {seed}: {x:#x} moved and passed: {c}");
                    far_checked += 1;
                }
            }
        }
        assert!(far_checked >= 500, "{far_checked}");
    }

    #[test]
    fn fp4_comparison_scale_neighbours_by_format() {
        let d = [0u8; 8];
        let sfd = |got: u8, want: u8, format| {
            let c = compare_fp4(&d, &[got], &d, &[want], 16, format).unwrap();
            (c.sfd_equal, c.sfd_neighbour, c.sfd_far)
        };
        use SfdFormat::{Ue4m3, Ue8m0};
        // ue4m3: 448 (0x7E) and NaN (0x7F) are not neighbours; sign-bit bytes are never valid.
        assert_eq!(sfd(0x7F, 0x7E, Ue4m3), (0, 0, 1));
        assert_eq!(sfd(0x7E, 0x7F, Ue4m3), (0, 0, 1));
        assert_eq!(sfd(0x7E, 0x7D, Ue4m3), (0, 1, 0));
        assert_eq!(sfd(0x80, 0x81, Ue4m3), (0, 0, 1));
        assert_eq!(sfd(0x00, 0x01, Ue4m3), (0, 1, 0));
        assert_eq!(sfd(0x7F, 0x7F, Ue4m3), (1, 0, 0));
        // ue8m0: 0x7E and 0x7F are 0.5 and 1.0; 0xFF is NaN.
        assert_eq!(sfd(0x7F, 0x7E, Ue8m0), (0, 1, 0));
        assert_eq!(sfd(0xFF, 0xFE, Ue8m0), (0, 0, 1));
        assert_eq!(sfd(0xFE, 0xFD, Ue8m0), (0, 1, 0));
        assert_eq!(sfd(0x81, 0x80, Ue8m0), (0, 1, 0));
        assert_eq!(sfd(0x00, 0x01, Ue8m0), (0, 1, 0)); // 2^-127 and 2^-126
        assert_eq!(sfd(0x7F, 0x80, Ue4m3), (0, 0, 1));
        assert_eq!(sfd(0xFF, 0xFE, Ue4m3), (0, 0, 1));
    }
}

/// f32's unit roundoff (round to nearest): 2^-24.
const U: f64 = 1.0 / (1u64 << 24) as f64;

/// `gamma_{2K}(2^-23)`: the factor of `sum_k |a_k b_k|` that bounds the FP32 summation error of
/// a K-term dot in any order, tensor-core truncation included (module docs); infinite where
/// `2K * 2^-23 >= 1`.
pub fn summation_gamma(k: usize) -> f64 {
    let nu = 2.0 * k as f64 * (2.0 * U);
    if nu >= 1.0 { f64::INFINITY } else { nu / (1.0 - nu) }
}

/// One output element as the verdict sees it: the exact result and how far an FP32 computation
/// may stray from it before the final rounding.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Expected {
    /// `alpha * sum + beta * C` from the exact sum, in f64 (NaN or infinite as it comes).
    pub exact: f64,
    /// B of the module docs: the largest `|v - exact|` of the FP32 value `v` before D's rounding.
    pub fp32_bound: f64,
    /// An FP32 intermediate may overflow (`|alpha| (|s| + E_acc) + |beta C|` reaches f32's
    /// largest value): an infinite or NaN D is then within the bound.
    pub may_overflow: bool,
}

/// The expected values of every output (L, M, N) of `p` from the exact [`Dot`]s of
/// [`crate::reference::dots`] and C (read only when beta != 0, as the kernels do). Fails where
/// alpha or beta is not finite (what the GEMMs refuse), or the lengths disagree with `p`.
pub fn expected<T: OutputElement>(p: &Problem, dots: &[Dot], c: Option<&[T]>) -> Result<Vec<Expected>> {
    p.check_scalars()?;
    check_len("dots", dots.len(), p.cd_elems(), "L * M * N, one per output")?;
    crate::problem::check_c(p, c.map(<[T]>::len))?;
    let (alpha, beta) = (p.alpha as f64, p.beta as f64);
    let gamma = summation_gamma(p.k);
    // The f64 sums are the exact integers rounded once: S may be 2^-53 below the exact S.
    let s_round = 1.0 + 2f64.powi(-52);
    Ok(dots.iter().enumerate().map(|(i, d)| {
        let bc = match c {
            Some(c) if beta != 0.0 => beta * c[i].to_f64(),
            _ => 0.0,
        };
        let exact = alpha * d.sum + bc;
        let e_acc = if d.abs_sum == 0.0 { 0.0 } else { gamma * d.abs_sum * s_round };
        let (t, w) = (alpha.abs() * (d.sum.abs() + e_acc), bc.abs());
        let fp32_bound = alpha.abs() * e_acc + (3.0 * U + 2f64.powi(-50)) * (t + w) + 3.0 * f32::MIN_POSITIVE as f64;
        // Overflow is judged only where the exact result is finite (an infinite C asks for its
        // infinity), and, where the summation bound is infinite (K >= 2^22), from the partial
        // sums' own bound under the model above, |acc| <= S (1 + u')^(2K), so that a NaN still
        // fails where nothing can overflow.
        let t_over = if e_acc.is_finite() { t } else { alpha.abs() * d.abs_sum * s_round * (2.0 * p.k as f64 * (2.0 * U).ln_1p()).exp() };
        Expected { exact, fp32_bound, may_overflow: exact.is_finite() && (t_over + w) * (1.0 + 4.0 * U) >= f32::MAX as f64 }
    }).collect())
}

/// How one element fared under [`verdict`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Judged {
    /// Flat index of the element.
    pub index: usize,
    /// The result.
    pub got: f64,
    /// The reference: the exact result rounded once to the output type.
    pub reference: f64,
    /// The exact result.
    pub exact: f64,
    /// Its FP32 bound B (see the module docs).
    pub bound: f64,
    /// The least FP32 error that explains `got`: the distance from `exact` to the nearest value
    /// that rounds to `got` in the output type (0 for the reference itself).
    pub needed: f64,
    /// `needed / bound`: the share of the bound `got` uses, at most 1 within it; infinite for a
    /// NaN mismatch.
    pub ratio: f64,
}

impl std::fmt::Display for Judged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "index {}: got {:e}, reference {:e} (exact {:e}); it needs an FP32 error of {:e}, the bound is {:e} ({:.3} of it)",
            self.index, self.got, self.reference, self.exact, self.needed, self.bound, self.ratio)
    }
}

/// The reals that round to `d` in the output type `out`, as `[lo, hi]` (midpoints included;
/// for an infinity, everything beyond the overflow threshold).
fn rounding_cell(d: f64, out: OutType) -> (f64, f64) {
    let (sig, emin, max) = match out {
        OutType::F16 => (11, -14, 65504.0),
        OutType::Bf16 => (8, -126, 3.3895313892515355e38),
        _ => (24, -126, f32::MAX as f64),
    };
    let exponent = |a: f64| ((a.to_bits() >> 52) & 0x7FF) as i32 - 1023;
    let half_ulp = |a: f64| 2f64.powi(exponent(a).max(emin) - sig);
    if d.is_infinite() {
        let t = max + half_ulp(max);
        return if d > 0.0 { (t, f64::INFINITY) } else { (f64::NEG_INFINITY, -t) };
    }
    let a = d.abs();
    let away = half_ulp(a);
    // Below a power of two the spacing halves (except among subnormals).
    let toward = if a != 0.0 && a.to_bits() & ((1u64 << 52) - 1) == 0 && exponent(a) > emin { away / 2.0 } else { away };
    match d {
        _ if a == 0.0 => (-away, away),
        _ if d > 0.0 => (d - toward, d + away),
        _ => (d - away, d + toward),
    }
}

/// The result of [`verdict`]: counts and the worst element.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    /// Elements judged.
    pub count: usize,
    /// Elements equal to the reference (-0 and +0 are equal; NaN where the exact result is NaN).
    pub exact: usize,
    /// Elements not exact but within the FP32 bound.
    pub within: usize,
    /// Elements beyond it.
    pub failed: usize,
    /// The failed element with the largest ratio; if none failed, the element that comes
    /// closest to its bound (`None` when every element is exact).
    pub worst: Option<Judged>,
}

impl Verdict {
    /// True when no element failed.
    pub fn passed(&self) -> bool {
        self.failed == 0
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.passed() {
            write!(f, "all {} exact or within the FP32 bound ({} exact, {} within)", self.count, self.exact, self.within)?;
            if let Some(w) = &self.worst {
                write!(f, "; closest to its bound: {w}")?;
            }
        } else {
            write!(f, "{} of {} beyond the FP32 bound ({} exact, {} within)", self.failed, self.count, self.exact, self.within)?;
            if let Some(w) = &self.worst {
                write!(f, "; worst: {w}")?;
            }
        }
        Ok(())
    }
}

/// Judges `got` against `expected` element by element, by the criterion of the module docs:
/// exact, else within `[rnd(exact - B), rnd(exact + B)]` in the output type, else failed.
pub fn verdict<T: OutputElement>(got: &[T], expected: &[Expected]) -> Result<Verdict> {
    check_len("D", got.len(), expected.len(), "one result per expected element")?;
    let mut v = Verdict { count: got.len(), exact: 0, within: 0, failed: 0, worst: None };
    let mut worst_failed = false;
    for (index, (g, e)) in got.iter().zip(expected).enumerate() {
        let g = g.to_f64();
        let reference = T::from_f64(e.exact).to_f64();
        // Equal values, equal infinities, or NaN where NaN is exact.
        if g == reference || (g.is_nan() && e.exact.is_nan()) {
            v.exact += 1;
            continue;
        }
        let judged = |needed: f64, ratio: f64| Judged { index, got: g, reference, exact: e.exact, bound: e.fp32_bound, needed, ratio };
        let (failed, j) = if !g.is_finite() && e.may_overflow && !e.exact.is_nan() {
            (false, judged(f64::NAN, 1.0))
        } else if g.is_nan() || !e.exact.is_finite() {
            (true, judged(f64::INFINITY, f64::INFINITY))
        } else {
            // Rounding is monotone: D can be any value between the roundings of the ends.
            let lo = T::from_f64(e.exact - e.fp32_bound).to_f64();
            let hi = T::from_f64(e.exact + e.fp32_bound).to_f64();
            let (cell_lo, cell_hi) = rounding_cell(g, T::OUT);
            let needed = if g > e.exact { cell_lo - e.exact } else { e.exact - cell_hi }.max(0.0);
            let ratio = if needed == 0.0 { 0.0 } else { needed / e.fp32_bound };
            (!(lo <= g && g <= hi), judged(needed, ratio))
        };
        if failed {
            v.failed += 1;
        } else {
            v.within += 1;
        }
        // Failed elements outrank the others; then the larger ratio.
        let better = match &v.worst {
            None => true,
            Some(w) => (failed && !worst_failed) || (failed == worst_failed && j.ratio > w.ratio),
        };
        if better {
            v.worst = Some(j);
            worst_failed = failed;
        }
    }
    Ok(v)
}

/// Judges a GEMM result `got` (L, M, N) on raw operands laid out as the kernels take them (see
/// [`crate::reference::gemm`]) by [`verdict`]; C is read only when beta != 0.
pub fn verify<T: OutputElement>(p: &Problem, a: &[u8], sfa: &[u8], b: &[u8], sfb: &[u8], c: Option<&[T]>, got: &[T]) -> Result<Verdict> {
    crate::problem::check_c(p, c.map(<[T]>::len))?;
    let dots = crate::reference::dots(p, a, sfa, b, sfb)?;
    verdict(got, &expected(p, &dots, c)?)
}

/// Judges a W4A16 result `got` (L, M, N) against the exact sums of
/// [`crate::reference::w4a16_dots`] by [`verdict`]: each product of an activation and a decoded
/// weight is exact in FP32, so the FP32 bound is the one of [`verify`]. It assumes no product
/// falls below f32's normal range (|a b| >= 2^-126 or 0), as activations of a model do.
pub fn verify_w4a16<TA: crate::w4a16::Activation16, T: OutputElement>(p: &Problem, a: &[TA], b: &[u8], sfb: &[u8], c: Option<&[T]>, got: &[T]) -> Result<Verdict> {
    crate::problem::check_c(p, c.map(<[T]>::len))?;
    let dots = crate::reference::w4a16_dots(p, a, b, sfb)?;
    verdict(got, &expected(p, &dots, c)?)
}

/// [`verify`] for host matrices, A (L, M, K) and B (L, N, K), as [`crate::reference_gemm`]
/// takes them (their global scales folded into alpha, as the GEMM folds them).
pub fn verify_matrices<T: OutputElement>(a: &Nvfp4Matrix, b: &Nvfp4Matrix, alpha: f32, beta: f32, c: Option<&[T]>, got: &[T]) -> Result<Verdict> {
    let p = crate::matrix::pair_problem(a, b, alpha, beta)?;
    verify(&p, a.data(), a.scales(), b.data(), b.scales(), c, got)
}

/// The default budget of [`sample_rows`]: 2^33 multiply-adds of the reference, about 2 s on
/// 2 cores.
pub const SAMPLE_BUDGET: u128 = 1 << 33;

/// How many rows [`sample_rows`] picks at most (M where every row fits the budget), without
/// listing them: to size what a verification will hold.
pub fn sample_row_count(p: &Problem, budget: u128) -> usize {
    let m = p.m;
    // A row costs at least one step, so an empty problem (N, K or L zero) does not take all of
    // M's rows.
    let per_row = product(&[p.n, p.k, p.l]).max(1);
    if m == 0 || per_row.saturating_mul(m as u128) <= budget {
        return m;
    }
    (budget / per_row.max(1)).max(2).min(m as u128) as usize
}

/// The rows of M a verification covers within `budget` multiply-adds of the reference: all when
/// `M * N * K * L` fits, else R rows spread evenly over M, first and last included, with R the
/// most that fit but at least 2 (1 when M = 1). [`Error::HostMemory`] where the host cannot
/// hold the list (a budget near M rows of a huge M).
pub fn sample_rows(p: &Problem, budget: u128) -> Result<Vec<usize>> {
    let (m, r) = (p.m, sample_row_count(p, budget));
    let mut rows = crate::error::try_vec("the sampled rows", r)?;
    if r == m {
        rows.extend(0..m);
    } else if r == 1 {
        rows.push(0);
    } else {
        rows.extend((0..r).map(|i| (i as u128 * (m as u128 - 1) / (r as u128 - 1)) as usize));
        rows.dedup();
    }
    Ok(rows)
}

#[cfg(test)]
mod verdict_tests {
    use super::*;
    use half::{bf16, f16};

    fn one(exact: f64, fp32_bound: f64) -> Vec<Expected> {
        vec![Expected { exact, fp32_bound, may_overflow: false }]
    }

    /// A review probe: the verifiers took a NaN or infinite beta (or alpha, through a raw
    /// Problem) and judged every element against a NaN exact result; they refuse what the
    /// GEMMs refuse.
    #[test]
    fn expected_checks_alpha_and_beta() {
        let d = [Dot { sum: 1.0, abs_sum: 1.0 }];
        for (alpha, beta) in [(f32::NAN, 0.0), (f32::INFINITY, 0.0), (1.0, f32::NAN), (1.0, f32::INFINITY)] {
            let p = Problem::new(1, 1, 32).scalars(alpha, beta);
            assert!(matches!(expected::<f32>(&p, &d, Some(&[0.0])), Err(Error::NonFiniteScalar { .. })), "{alpha} {beta}");
        }
        let a = crate::Nvfp4Matrix::random_contest((1, 2, 32), 1).unwrap();
        let b = crate::Nvfp4Matrix::random_contest((1, 8, 32), 2).unwrap();
        let c = [0.0f32; 16];
        let got = crate::reference_gemm(&a, &b, 1.0, 0.5, Some(&c[..])).unwrap();
        assert!(verify_matrices(&a, &b, 1.0, 0.5, Some(&c[..]), &got).unwrap().passed());
        assert!(matches!(verify_matrices(&a, &b, 1.0, f32::NAN, Some(&c[..]), &got), Err(Error::NonFiniteScalar { name: "beta", .. })));
    }

    #[test]
    fn bf16_rounding_near_a_boundary() {
        // exact just below the midpoint of 1 and 1 + 2^-7: the reference is 1. An FP32 value
        // within B of it may lie above the midpoint and round to 1 + 2^-7.
        let exact = 1.0 + 2f64.powi(-8) - 2f64.powi(-20);
        let up = [bf16::from_f64(1.0 + 2f64.powi(-7))];
        let v = verdict(&up, &one(exact, 2f64.powi(-19))).unwrap();
        assert!(v.passed() && v.within == 1, "{v}");
        let w = v.worst.unwrap();
        // It needs the FP32 value at the midpoint at least: 2^-20 of a bound of 2^-19.
        assert_eq!((w.needed, w.bound, w.ratio), (2f64.powi(-20), 2f64.powi(-19), 0.5), "{w}");
        // With B below the distance to the midpoint that rounding is not legitimate.
        let v = verdict(&up, &one(exact, 2f64.powi(-21))).unwrap();
        assert!(!v.passed(), "{v}");
        let w = v.worst.unwrap();
        assert!(w.ratio == 2.0 && w.got == 1.0 + 2f64.powi(-7) && w.reference == 1.0 && w.exact == exact, "{w}");
        assert!(v.to_string().contains("1 of 1 beyond the FP32 bound"), "{v}");
        // The reference itself is exact, whatever B.
        let v = verdict(&[bf16::from_f64(1.0)], &one(exact, 0.0)).unwrap();
        assert_eq!((v.exact, v.within, v.failed), (1, 0, 0));
    }

    #[test]
    fn off_by_the_bound_passes_and_a_step_more_fails() {
        // f32 output: D is the FP32 value itself; the interval is [rnd(x - B), rnd(x + B)].
        let (x, b) = (0.1f64, 3e-7f64);
        let hi = (x + b) as f32;
        let lo = (x - b) as f32;
        let e = one(x, b);
        assert!(verdict(&[hi], &e).unwrap().passed());
        assert!(verdict(&[lo], &e).unwrap().passed());
        let v = verdict(&[f32::from_bits(hi.to_bits() + 1)], &e).unwrap();
        assert!(!v.passed() && v.worst.unwrap().ratio > 1.0, "{v}");
        assert!(!verdict(&[f32::from_bits(lo.to_bits() - 1)], &e).unwrap().passed());
        // Cancellation near zero: a tiny exact result, an FP32 error far above 1e-3 that the
        // bound allows and the contest tolerance does not.
        let e = one(1e-6, 0.05);
        let got = [0.04f32];
        assert!(verdict(&got, &e).unwrap().passed());
        assert!(!compare(&got, &[1e-6f32], 1e-3, 1e-3).unwrap().passed());
    }

    #[test]
    fn nan_and_infinity() {
        let e = one(f64::NAN, 1.0);
        assert_eq!(verdict(&[f32::NAN], &e).unwrap().exact, 1, "NaN where NaN is exact");
        let v = verdict(&[1.0f32], &e).unwrap();
        assert!(!v.passed() && v.worst.unwrap().ratio.is_infinite(), "{v}");
        let v = verdict(&[f32::NAN], &one(1.0, 1e9)).unwrap();
        assert!(!v.passed(), "NaN never passes a bound, however wide: {v}");
        assert!(!verdict(&[f16::INFINITY], &one(1.0, 1e3)).unwrap().passed());
        // Beyond f16's range the rounding goes to infinity: inf is the reference, or within.
        assert_eq!(verdict(&[f16::INFINITY], &one(70000.0, 1.0)).unwrap().exact, 1);
        let v = verdict(&[f16::INFINITY], &one(65519.0, 2.0)).unwrap();
        assert!(v.passed() && v.within == 1, "65519 + 2 rounds to inf in f16: {v}");
        assert_eq!(v.worst.unwrap().needed, 1.0, "the overflow threshold is 65520");
        assert!(!verdict(&[f16::NEG_INFINITY], &one(65519.0, 2.0)).unwrap().passed());
        // An FP32 intermediate that may overflow: inf and NaN are within.
        let e = vec![Expected { exact: 1.0, fp32_bound: 1.0, may_overflow: true }];
        assert!(verdict(&[f32::INFINITY], &e).unwrap().passed());
        assert!(verdict(&[f32::NAN], &e).unwrap().passed());
        // An infinite exact result (C holds inf) needs that infinity.
        assert!(!verdict(&[f32::MAX], &one(f64::INFINITY, 0.0)).unwrap().passed());
        // Through `expected`: C = +inf makes the exact result +inf, which only +inf matches (the
        // FP32 intermediate's overflow does not excuse NaN or -inf there).
        let p = Problem::new(1, 1, 32).scalars(1.0, 1.0);
        let e = expected::<f32>(&p, &[Dot { sum: 1.0, abs_sum: 1.0 }], Some(&[f32::INFINITY])).unwrap();
        assert!(verdict(&[f32::INFINITY], &e).unwrap().passed());
        for bad in [f32::NAN, f32::NEG_INFINITY, f32::MAX] {
            assert!(!verdict(&[bad], &e).unwrap().passed(), "{bad} where C is +inf");
        }
        // K >= 2^22 (an infinite summation bound): a NaN fails where no partial sum can overflow.
        let p = Problem::new(1, 1, 1 << 22);
        let e = expected::<f32>(&p, &[Dot { sum: 3.0, abs_sum: 5.0 }], None).unwrap();
        assert!(!e[0].may_overflow && !verdict(&[f32::NAN], &e).unwrap().passed());
        assert!(verdict(&[1.0f32, 2.0], &one(1.0, 0.0)).is_err(), "lengths");
    }

    #[test]
    fn worst_is_the_failed_element_with_the_largest_ratio() {
        let e: Vec<Expected> = [1.0, 2.0, 3.0, 4.0].iter().map(|&x| Expected { exact: x, fp32_bound: 0.01, may_overflow: false }).collect();
        let v = verdict(&[1.0f32, 2.005, 3.1, 4.5], &e).unwrap();
        assert_eq!((v.exact, v.within, v.failed), (1, 1, 2));
        assert_eq!(v.worst.unwrap().index, 3);
        let v = verdict(&[1.0f32, 2.005, 3.0, 4.009], &e).unwrap();
        assert!(v.passed());
        assert_eq!(v.worst.unwrap().index, 3, "closest to its bound");
        assert!(v.to_string().starts_with("all 4 exact or within the FP32 bound (2 exact, 2 within)"), "{v}");
    }

    #[test]
    fn rounding_cells() {
        assert_eq!(rounding_cell(1.0, OutType::Bf16), (1.0 - 2f64.powi(-9), 1.0 + 2f64.powi(-8)));
        assert_eq!(rounding_cell(-3.0, OutType::F16), (-3.0 - 2f64.powi(-10), -3.0 + 2f64.powi(-10)));
        assert_eq!(rounding_cell(0.0, OutType::F16), (-(2f64.powi(-25)), 2f64.powi(-25)));
        assert_eq!(rounding_cell(2f64.powi(-14), OutType::F16), (2f64.powi(-14) - 2f64.powi(-25), 2f64.powi(-14) + 2f64.powi(-25)));
        assert_eq!(rounding_cell(f64::INFINITY, OutType::F16), (65520.0, f64::INFINITY));
        assert_eq!(rounding_cell(1.0, OutType::F32), (1.0 - 2f64.powi(-25), 1.0 + 2f64.powi(-24)));
        // Every value in the cell rounds to d, and just outside it does not.
        for (x, out) in [(1.0f64, OutType::Bf16), (5.0, OutType::F16), (-1e-6, OutType::F16), (3.0e38, OutType::Bf16), (-0.75, OutType::Bf16)] {
            let r = |x: f64| match out { OutType::Bf16 => <bf16 as OutputElement>::from_f64(x).to_f64(), _ => <f16 as OutputElement>::from_f64(x).to_f64() };
            let d = r(x);
            let (lo, hi) = rounding_cell(d, out);
            let ulp = 2f64.powi(-40) * d.abs().max(1e-30);
            assert_eq!((r(lo + ulp), r(hi - ulp)), (d, d), "{d} {out:?}");
            assert_ne!(r(lo - ulp), d, "{d} {out:?}");
            assert_ne!(r(hi + ulp), d, "{d} {out:?}");
        }
    }

    #[test]
    fn summation_gamma_values() {
        let g = summation_gamma(7168);
        let nu = 2.0 * 7168.0 * 2f64.powi(-23);
        assert!((g - nu / (1.0 - nu)).abs() < 1e-18);
        assert!(summation_gamma(1 << 22).is_infinite() && summation_gamma((1 << 22) - 1).is_finite());
    }

    #[test]
    fn sample_rows_never_panics() {
        let p = |m: usize, n: usize, k: usize, l: usize| Problem::new(m, n, k).batch(l);
        // Issue 25, finding 3: M = 1 beyond the budget (the old `.clamp(2, m)` panicked).
        let rows = |q: &Problem, budget: u128| sample_rows(q, budget).unwrap();
        assert_eq!(rows(&p(1, 65536, 131104, 1), SAMPLE_BUDGET), vec![0]);
        assert_eq!(rows(&p(1, 8, 32, 1), 10), vec![0]);
        assert_eq!(rows(&p(2, 8, 32, 1), 10), vec![0, 1]);
        assert_eq!(rows(&p(5, 8, 32, 1), 10), vec![0, 4]);
        assert_eq!(rows(&p(5, 8, 32, 1), 256 * 3), vec![0, 2, 4]);
        assert_eq!(rows(&p(5, 8, 32, 1), 256 * 5), vec![0, 1, 2, 3, 4]);
        // Products beyond u64 and usize: no overflow.
        assert_eq!(rows(&p(1 << 31, 1 << 31, 1 << 31, 1 << 31), SAMPLE_BUDGET), vec![0, (1 << 31) - 1]);
        let r = rows(&p(usize::MAX, 1, 16, 1), 1 << 20);
        assert_eq!((r.len(), r[0], *r.last().unwrap()), (65536, 0, usize::MAX - 1));
        // A review probe: a zero N, K or L made every row free, so all of a huge M was listed
        // (an abort); a budget covering a huge M asks for a list the host cannot hold.
        assert_eq!(rows(&p(usize::MAX, 0, 32, 1), 1 << 10).len(), 1 << 10);
        assert_eq!(rows(&p(1 << 40, 8, 0, 1), 1 << 10).len(), 1 << 10);
        assert!(matches!(sample_rows(&p(usize::MAX, 8, 32, 1), u128::MAX), Err(Error::HostMemory { .. })));
    }
}
