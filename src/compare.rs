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
