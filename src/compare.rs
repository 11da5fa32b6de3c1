//! Comparing an output with the reference: error figures, the count outside tolerance, and a
//! short report. A NaN matches only a NaN in the reference; it never passes a tolerance check.

use crate::formats::OutputElement;

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

/// Compares `got` with `want` element by element against `atol + rtol * |want|`.
///
/// # Panics
/// If the lengths differ.
pub fn compare<T: OutputElement>(got: &[T], want: &[T], atol: f64, rtol: f64) -> Comparison {
    assert_eq!(got.len(), want.len(), "compare: lengths differ");
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
                c.max_abs = c.max_abs.max(d);
                if w != 0.0 {
                    c.max_rel = c.max_rel.max(d / w.abs());
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
    c
}

/// Panics with the report when `got` and `want` differ beyond tolerance.
#[track_caller]
pub fn assert_close<T: OutputElement>(got: &[T], want: &[T], atol: f64, rtol: f64) {
    let c = compare(got, want, atol, rtol);
    assert!(c.passed(), "{c}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_worst() {
        let want = [1.0f32, 2.0, 3.0, 4.0, f32::NAN, 0.0];
        let got = [1.0f32, 2.1, 3.0, 40.0, f32::NAN, f32::NAN];
        let c = compare(&got, &want, 0.0, 0.01);
        assert_eq!(c.bad, 3); // 2.1, 40, NaN-vs-0
        assert_eq!(c.nan_mismatch, 1);
        assert_eq!(c.worst, Some(5));
        assert!((c.max_abs - 36.0).abs() < 1e-9);
        assert!(!c.passed());
        assert!(c.to_string().contains("3 of 6 outside"));
        let c = compare(&[1.0f32, f32::INFINITY], &[1.0f32, f32::INFINITY], 0.0, 0.0);
        assert!(c.passed());
        let c = compare(&[1.0f32], &[f32::NAN], 1e9, 1e9);
        assert!(!c.passed(), "NaN never passes a tolerance");
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
}

impl Fp4Comparison {
    /// Every scale factor and every code equal.
    pub fn byte_equal(&self) -> bool {
        self.sfd_equal == self.groups && self.codes_bits_differ == 0
    }
    /// No scale factor further than its neighbour, no code further than one step.
    pub fn within_one_step(&self) -> bool {
        self.sfd_far == 0 && self.codes_far == 0
    }
}

impl std::fmt::Display for Fp4Comparison {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} groups: SFD {} equal, {} neighbouring, {} further; {} codes: {} equal, {} one step, {} further",
            self.groups, self.sfd_equal, self.sfd_neighbour, self.sfd_far, self.codes, self.codes_equal, self.codes_one_step, self.codes_far)
    }
}

/// Compares FP4 outputs: `d` packed e2m1 rows of `n` values, `sfd` the scale factors row-major,
/// `n / 16` per row (see [`crate::layout::from_tiled`]).
///
/// # Panics
/// If the lengths disagree with each other or with `n`.
pub fn compare_fp4(got_d: &[u8], got_sfd: &[u8], want_d: &[u8], want_sfd: &[u8], n: usize) -> Fp4Comparison {
    assert!(n.is_multiple_of(16) && got_d.len() == want_d.len() && got_sfd.len() == want_sfd.len() && got_sfd.len() * 8 == got_d.len(), "compare_fp4: lengths");
    let rank = |code: u8| if code & 8 != 0 { -((code & 7) as i32) } else { (code & 7) as i32 };
    let mut c = Fp4Comparison { groups: got_sfd.len(), ..Default::default() };
    for (gi, (&gs, &ws)) in got_sfd.iter().zip(want_sfd).enumerate() {
        match gs.abs_diff(ws) {
            0 => c.sfd_equal += 1,
            1 => {
                c.sfd_neighbour += 1;
                continue;
            }
            _ => {
                c.sfd_far += 1;
                continue;
            }
        }
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
    c
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
        got_d[9] = 0x00; // second group, whose SFD differs: not compared
        let c = compare_fp4(&got_d, &[5, 7], &want_d, &[5, 6], 16);
        assert_eq!((c.groups, c.sfd_equal, c.sfd_neighbour, c.sfd_far), (2, 1, 1, 0));
        assert_eq!((c.codes, c.codes_equal, c.codes_one_step, c.codes_far), (16, 14, 1, 1));
        assert!(!c.byte_equal() && !c.within_one_step());
        let c = compare_fp4(&want_d, &[5, 6], &want_d, &[5, 6], 16);
        assert!(c.byte_equal() && c.within_one_step(), "{c}");
        // -0 and +0 are the same point.
        let c = compare_fp4(&[0x08; 8], &[1], &[0x00; 8], &[1], 16);
        assert!(!c.byte_equal() && c.codes_equal == 16);
    }
}
