//! Problem shapes, output types and the validation every launch passes before any FFI call.

use crate::error::{Error, Result};
use crate::layout;

/// Output type of D. For the 16- and 32-bit types C has D's type; for the FP4 types D is packed
/// e2m1 (two per byte, like A and B) with one scale factor generated per 16 outputs along N
/// (SFD, the 128x4 tiled layout over (M, N/16)), and C is f32, as in CUTLASS example 72b.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OutType {
    /// IEEE half (`half::f16`).
    F16,
    /// bfloat16 (`half::bf16`).
    Bf16,
    /// f32.
    F32,
    /// NVFP4: e2m1 values with ue4m3 SFD, the input format of the next NVFP4 GEMM.
    Nvfp4,
    /// e2m1 values with ue8m0 SFD (power-of-two scales, CUTLASS example 72b's output).
    Nvfp4Ue8m0,
}

/// Element type of a generated scale factor (SFD) of an FP4 output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SfdFormat {
    /// ue4m3 (`cutlass::float_ue4m3_t`): NVFP4 scales.
    Ue4m3,
    /// ue8m0 (`cutlass::float_ue8m0_t`): powers of two.
    Ue8m0,
}

impl OutType {
    /// Every output type, in table order.
    pub const ALL: [OutType; 5] = [OutType::F16, OutType::Bf16, OutType::F32, OutType::Nvfp4, OutType::Nvfp4Ue8m0];

    /// Bits per element of D.
    pub const fn bits(self) -> usize {
        match self {
            OutType::F16 | OutType::Bf16 => 16,
            OutType::F32 => 32,
            OutType::Nvfp4 | OutType::Nvfp4Ue8m0 => 4,
        }
    }
    /// Elements per 16 bytes of D: N must be a multiple of this.
    pub const fn n_multiple(self) -> usize {
        128 / self.bits()
    }
    /// The SFD format of an FP4 output; `None` for the others.
    pub const fn sfd(self) -> Option<SfdFormat> {
        match self {
            OutType::Nvfp4 => Some(SfdFormat::Ue4m3),
            OutType::Nvfp4Ue8m0 => Some(SfdFormat::Ue8m0),
            _ => None,
        }
    }
    /// Index in the kernel table: the launch ABI's `OutKind`.
    pub const fn index(self) -> u32 {
        self.kind() as u32
    }
    pub(crate) const fn kind(self) -> crate::sys::OutKind {
        use crate::sys::OutKind as K;
        match self {
            OutType::F16 => K::F16,
            OutType::Bf16 => K::Bf16,
            OutType::F32 => K::F32,
            OutType::Nvfp4 => K::Nvfp4,
            OutType::Nvfp4Ue8m0 => K::Nvfp4Ue8m0,
        }
    }
    /// Lower-case name: "f16", "bf16", "f32", "nvfp4", "nvfp4-ue8m0".
    pub const fn name(self) -> &'static str {
        match self {
            OutType::F16 => "f16",
            OutType::Bf16 => "bf16",
            OutType::F32 => "f32",
            OutType::Nvfp4 => "nvfp4",
            OutType::Nvfp4Ue8m0 => "nvfp4-ue8m0",
        }
    }
    /// Bytes of D for `elems` elements (FP4: two per byte).
    pub const fn d_bytes(self, elems: usize) -> usize {
        elems * self.bits() / 8
    }
}

impl std::fmt::Display for OutType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// D[m, n, l] = alpha * sum_k A[m, k, l] B[n, k, l] (block-scaled) + beta * C[m, n, l].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Problem {
    /// Rows of A, C and D.
    pub m: usize,
    /// Rows of B; columns of C and D.
    pub n: usize,
    /// The reduction extent (elements, not bytes).
    pub k: usize,
    /// Batch count.
    pub l: usize,
    /// Scale of the product.
    pub alpha: f32,
    /// Scale of C.
    pub beta: f32,
    /// FP4 outputs only: the normalization constant of CUTLASS example 72b (SFD is
    /// `max|D| * norm_constant / 6` per 16 outputs, see [`crate::fp4_out`]); finite and > 0.
    pub norm_constant: f32,
}

impl Problem {
    /// A problem with alpha = 1, beta = 0, L = 1.
    pub const fn new(m: usize, n: usize, k: usize) -> Self {
        Problem { m, n, k, l: 1, alpha: 1.0, beta: 0.0, norm_constant: 1.0 }
    }
    /// Sets the normalization constant of an FP4 output.
    pub const fn norm_constant(mut self, norm_constant: f32) -> Self {
        self.norm_constant = norm_constant;
        self
    }
    /// Sets the batch count.
    pub const fn batch(mut self, l: usize) -> Self {
        self.l = l;
        self
    }
    /// Sets alpha and beta.
    pub const fn scalars(mut self, alpha: f32, beta: f32) -> Self {
        self.alpha = alpha;
        self.beta = beta;
        self
    }
    /// Packed bytes of A: `L * M * K / 2`.
    pub const fn a_bytes(&self) -> usize {
        self.l * self.m * self.k / 2
    }
    /// Packed bytes of B: `L * N * K / 2`.
    pub const fn b_bytes(&self) -> usize {
        self.l * self.n * self.k / 2
    }
    /// Bytes of SFA in the tiled layout.
    pub const fn sfa_bytes(&self) -> usize {
        layout::sf_bytes(self.m, self.k, self.l)
    }
    /// Bytes of SFB in the tiled layout.
    pub const fn sfb_bytes(&self) -> usize {
        layout::sf_bytes(self.n, self.k, self.l)
    }
    /// Elements of C and D: `L * M * N`.
    pub const fn cd_elems(&self) -> usize {
        self.l * self.m * self.n
    }
    /// Bytes of the generated scale factors of an FP4 output (tiled over (M, N/16)).
    pub const fn sfd_bytes(&self) -> usize {
        layout::sf_bytes(self.m, self.n, self.l)
    }
    /// 2 * M * N * K * L.
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64 * self.l as f64
    }

    /// Checks that M, N, K and L are each in `1..=max`.
    pub fn check_dims(&self, max: usize) -> Result<()> {
        for (dim, value) in [("M", self.m), ("N", self.n), ("K", self.k), ("L", self.l)] {
            if value == 0 || value > max {
                return Err(Error::Dimension { dim, value, max });
            }
        }
        Ok(())
    }

    /// Checks the shape rules every kernel shares: dimensions in 1..=i32::MAX with byte counts
    /// that fit, K % 32 == 0 (16-byte rows of packed A and B), N a multiple of 16 bytes of output,
    /// finite alpha and beta, and for FP4 output a finite, positive norm constant. `has_c` says
    /// whether a C matrix is given.
    pub fn validate(&self, out: OutType, has_c: bool) -> Result<()> {
        self.check_dims(i32::MAX as usize)?;
        if !self.k.is_multiple_of(32) {
            return Err(Error::KMultiple { k: self.k, multiple: 32, why: "rows of packed A and B must be whole 16-byte units" });
        }
        if !self.n.is_multiple_of(out.n_multiple()) {
            return Err(Error::NMultiple { n: self.n, multiple: out.n_multiple(), out });
        }
        // Every byte count must fit in usize (and the kernels' 64-bit strides).
        let fits = |a: usize, b: usize, c: usize| a.checked_mul(b).and_then(|x| x.checked_mul(c)).is_some_and(|x| x <= i64::MAX as usize);
        let widest = self.m.max(self.n);
        if !fits(self.l, widest, self.k) || !fits(self.l * self.m, self.n, out.bits().div_ceil(8)) {
            return Err(Error::Dimension { dim: "L", value: self.l, max: i64::MAX as usize / (widest * self.k.max(self.n)) });
        }
        for (name, value) in [("alpha", self.alpha), ("beta", self.beta)] {
            if !value.is_finite() {
                return Err(Error::NonFiniteScalar { name, value });
            }
        }
        if self.beta != 0.0 && !has_c {
            return Err(Error::BetaWithoutC { beta: self.beta });
        }
        if out.sfd().is_some() {
            self.check_norm_constant()?;
        }
        Ok(())
    }

    /// Checks the normalization constant of an FP4 output: finite and > 0.
    pub fn check_norm_constant(&self) -> Result<()> {
        if !(self.norm_constant.is_finite() && self.norm_constant > 0.0) {
            return Err(Error::NormConstant { value: self.norm_constant });
        }
        Ok(())
    }
}

/// Checks one buffer's element count against the problem.
pub(crate) fn check_len(name: &'static str, got: usize, want: usize, rule: &'static str) -> Result<()> {
    if got != want {
        return Err(Error::BufferLength { name, got, want, rule });
    }
    Ok(())
}

/// Checks a device address for 16-byte alignment.
pub(crate) fn check_align(name: &'static str, addr: u64) -> Result<()> {
    if !addr.is_multiple_of(16) {
        return Err(Error::Misaligned { name, addr });
    }
    Ok(())
}

/// Rules on the operand buffers' lengths (A, SFA, B, SFB), as (name, required bytes, rule).
pub(crate) fn operand_rules(p: &Problem) -> [(&'static str, usize, &'static str); 4] {
    [
        ("A", p.a_bytes(), "L * M * K / 2 packed bytes"),
        ("SFA", p.sfa_bytes(), "L * ceil(M/128)*128 * ceil(K/64)*4 tiled scale bytes"),
        ("B", p.b_bytes(), "L * N * K / 2 packed bytes"),
        ("SFB", p.sfb_bytes(), "L * ceil(N/128)*128 * ceil(K/64)*4 tiled scale bytes"),
    ]
}

/// Checks the four operand lengths against [`operand_rules`].
pub(crate) fn check_operand_lens(p: &Problem, lens: [usize; 4]) -> Result<()> {
    for ((name, want, rule), got) in operand_rules(p).into_iter().zip(lens) {
        check_len(name, got, want, rule)?;
    }
    Ok(())
}

/// The rule on D's length for output `out`, as (name, required elements, rule).
pub(crate) fn d_rule(p: &Problem, out: OutType) -> (&'static str, usize, &'static str) {
    if out.sfd().is_some() {
        ("D", out.d_bytes(p.cd_elems()), "L * M * N / 2 packed bytes")
    } else {
        ("D", p.cd_elems(), "L * M * N elements")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shape_rule_has_its_error() {
        let ok = Problem::new(128, 256, 256);
        ok.validate(OutType::F16, false).unwrap();
        let cases: Vec<(Problem, &str)> = vec![
            (Problem::new(0, 256, 256), "M = 0"),
            (Problem::new(128, 0, 256), "N = 0"),
            (Problem::new(128, 256, 0), "K = 0"),
            (Problem::new(128, 256, 256).batch(0), "L = 0"),
            (Problem::new(1 << 31, 256, 256), "M = 2147483648"),
            (Problem::new(128, 256, 48), "K = 48: must be a multiple of 32"),
            (Problem::new(128, 260, 256), "N = 260: must be a multiple of 8 for f16"),
            (Problem::new(128, 256, 256).scalars(f32::NAN, 0.0), "alpha = NaN"),
            (Problem::new(128, 256, 256).scalars(1.0, f32::INFINITY), "beta = inf"),
            (Problem::new(128, 256, 256).scalars(1.0, 0.5), "beta = 0.5: a nonzero beta needs a C"),
        ];
        for (p, want) in cases {
            let e = p.validate(OutType::F16, false).unwrap_err().to_string();
            assert!(e.contains(want), "{p:?}: got {e:?}, want {want:?}");
        }
        // FP4 output: N % 32 and a usable norm constant.
        let e = Problem::new(128, 272, 256).validate(OutType::Nvfp4, false).unwrap_err().to_string();
        assert!(e.contains("N = 272: must be a multiple of 32 for nvfp4"), "{e}");
        for st in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            let e = Problem::new(128, 256, 256).norm_constant(st).validate(OutType::Nvfp4Ue8m0, false).unwrap_err().to_string();
            assert!(e.contains("norm_constant") && e.contains("finite and greater than 0"), "{e}");
        }
        Problem::new(128, 256, 256).norm_constant(0.0).validate(OutType::F16, false).unwrap(); // unused there
        // f32 output needs N % 4 only; C makes beta fine.
        Problem::new(128, 260, 256).validate(OutType::F32, false).unwrap();
        Problem::new(128, 256, 256).scalars(1.0, 0.5).validate(OutType::Bf16, true).unwrap();
        // Byte counts that overflow.
        let huge = Problem::new(i32::MAX as usize, (i32::MAX - 7) as usize, 1 << 30).batch(i32::MAX as usize);
        assert!(matches!(huge.validate(OutType::F16, false), Err(Error::Dimension { dim: "L", .. })));
    }

    #[test]
    fn buffer_sizes() {
        let p = Problem::new(130, 256, 96).batch(2);
        assert_eq!(p.a_bytes(), 2 * 130 * 48);
        assert_eq!(p.sfa_bytes(), 2 * 256 * 8);
        assert_eq!(p.sfb_bytes(), 2 * 256 * 8);
        assert_eq!(p.cd_elems(), 2 * 130 * 256);
        assert!(check_len("A", 5, 6, "r").unwrap_err().to_string().contains("A: holds 5 elements, the problem needs exactly 6"));
        assert!(check_align("C", 0x1008).unwrap_err().to_string().contains("0x1008"));
        check_align("C", 0x1010).unwrap();
    }
}
