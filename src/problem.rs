//! Problem shapes, output types and the validation every launch passes before any FFI call.

use crate::error::{check_len, product, within, Error, Result};
use crate::layout;

/// Builder methods of the problem types that set fields of one type: `name: a, b: type;` gives
/// `pub const fn name(self, a: type, b: type) -> Self`, with the docs written before it.
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident: $($field:ident),+: $ty:ty;)*) => {$(
        $(#[$doc])*
        pub const fn $name(mut self, $($field: $ty),+) -> Self {
            $(self.$field = $field;)+
            self
        }
    )*};
}
pub(crate) use setters;

/// One buffer's byte count for a size check: what, its rule, the count, and the dimensions it
/// comes from (written only for an error).
type ByteCount = (&'static str, &'static str, u128, fn(&Problem) -> String);

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
    /// Bytes of D for `elems` elements (FP4: two per byte), saturating at `usize::MAX`.
    pub const fn d_bytes(self, elems: usize) -> usize {
        (elems / 8).saturating_mul(self.bits()).saturating_add(elems % 8 * self.bits() / 8)
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
    /// Scale of the product; the GEMM entry points multiply it by both operands' global scales
    /// ([`crate::Nvfp4Tensor::global_scale`]).
    pub alpha: f32,
    /// Scale of C.
    pub beta: f32,
    /// FP4 outputs only: the normalization constant of CUTLASS example 72b (SFD is
    /// `max|D| * norm_constant / 6` per 16 outputs, see [`crate::fp4_out`]); finite and > 0.
    pub norm_constant: f32,
}

impl Problem {
    /// The launch arguments the problem fixes (shape and scalars); the caller sets the rest.
    /// Valid only for a problem that passed [`Problem::validate`]'s size limits (32-bit fields).
    pub(crate) fn launch_args(&self) -> crate::sys::KernelArgs {
        crate::sys::KernelArgs {
            m: self.m as i32, n: self.n as i32, k: self.k as i32, l: self.l as i32, alpha: self.alpha, beta: self.beta,
            split_k: 1, norm_constant: self.norm_constant, ..Default::default()
        }
    }
    /// A problem with alpha = 1, beta = 0, L = 1.
    pub const fn new(m: usize, n: usize, k: usize) -> Self {
        Problem { m, n, k, l: 1, alpha: 1.0, beta: 0.0, norm_constant: 1.0 }
    }
    setters! {
        /// Sets the normalization constant of an FP4 output.
        norm_constant: norm_constant: f32;
        /// Sets the batch count.
        batch: l: usize;
        /// Sets alpha and beta.
        scalars: alpha, beta: f32;
    }
    /// This problem with the operands' global scales folded into alpha (`alpha * ga * gb` left to
    /// right in f32, 1 for an operand without one), as the GEMM entry points and
    /// [`crate::reference_gemm`] fold them: for calling the reference functions, which take alpha
    /// as given. An error where the fold overflows, or underflows to 0 from a nonzero alpha.
    pub fn fold_global_scales(self, ga: Option<f32>, gb: Option<f32>) -> Result<Self> {
        Ok(Problem { alpha: folded_alpha(self.alpha, ga.unwrap_or(1.0), gb.unwrap_or(1.0))?, ..self })
    }
    /// Packed bytes of A: `L * M * K / 2`. Like every count below it saturates at `usize::MAX`
    /// where the exact count does not fit (no buffer is that long, so a length check against it
    /// fails instead of passing a wrapped count); [`Self::validate`] rejects such problems.
    pub const fn a_bytes(&self) -> usize {
        half_of_product(self.l, self.m, self.k)
    }
    /// Elements of a dense (L, M, K) A (W4A16 activations): `L * M * K`.
    pub const fn a_elems(&self) -> usize {
        self.l.saturating_mul(self.m).saturating_mul(self.k)
    }
    /// Packed bytes of B: `L * N * K / 2`.
    pub const fn b_bytes(&self) -> usize {
        half_of_product(self.l, self.n, self.k)
    }
    /// Bytes of SFA in the tiled layout.
    pub const fn sfa_bytes(&self) -> usize {
        layout::sf_bytes((self.l, self.m, self.k))
    }
    /// Bytes of SFB in the tiled layout.
    pub const fn sfb_bytes(&self) -> usize {
        layout::sf_bytes((self.l, self.n, self.k))
    }
    /// Elements of C and D: `L * M * N`.
    pub const fn cd_elems(&self) -> usize {
        self.l.saturating_mul(self.m).saturating_mul(self.n)
    }
    /// Bytes of the generated scale factors of an FP4 output (tiled over (M, N/16)).
    pub const fn sfd_bytes(&self) -> usize {
        layout::sf_bytes((self.l, self.m, self.n))
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

    /// The largest M, N or K the kernels take: they round each up to a multiple of their tile
    /// (at most 256) in 32-bit signed integers, so `ceil(x / 256) * 256` must fit in an i32.
    pub const MAX_EXTENT: usize = crate::sys::MAX_EXTENT;
    /// The most output tiles of 64 x 64 (the smallest tile extent either way round) over all
    /// batches: the kernels count tiles and size their grids in 32-bit signed integers.
    pub const MAX_TILES: usize = i32::MAX as usize;
    /// The largest byte count of any buffer: the kernels' strides and offsets are 64-bit signed.
    pub const MAX_BYTES: usize = i64::MAX as usize;

    /// Checks the shape rules every kernel shares: dimensions in 1..=i32::MAX, M, N and K at most
    /// [`Self::MAX_EXTENT`], at most [`Self::MAX_TILES`] output tiles, every buffer (A, B, their
    /// tiled scales, C, D and for FP4 output SFD) at most [`Self::MAX_BYTES`], K % 32 == 0
    /// (16-byte rows of packed A and B), N a multiple of 16 bytes of output, finite alpha and
    /// beta, and for FP4 output a finite, positive norm constant. `has_c` says whether a C
    /// matrix is given. Every count the crate derives from a validated problem fits in `usize`.
    pub fn validate(&self, out: OutType, has_c: bool) -> Result<()> {
        self.check_dims(i32::MAX as usize)?;
        if !self.k.is_multiple_of(32) {
            return Err(Error::KMultiple { k: self.k, multiple: 32, why: "rows of packed A and B must be whole 16-byte units" });
        }
        if !self.n.is_multiple_of(out.n_multiple()) {
            return Err(Error::NMultiple { n: self.n, multiple: out.n_multiple(), out });
        }
        self.check_index_limits()?;
        // For FP4 outputs C is f32 and D half a byte: C is the larger.
        let cd_elem_bytes = if out.sfd().is_some() { 4 } else { out.bits() / 8 };
        self.check_counts(cd_elem_bytes, out.sfd().is_some(), Self::MAX_BYTES, "byte counts and offsets are 64-bit signed in the kernels")?;
        self.check_scalars()?;
        if self.beta != 0.0 && !has_c {
            return Err(Error::BetaWithoutC { beta: self.beta });
        }
        if out.sfd().is_some() {
            self.check_norm_constant()?;
        }
        Ok(())
    }

    /// The limits of the kernels' 32-bit index arithmetic: [`Self::MAX_EXTENT`] and
    /// [`Self::MAX_TILES`]. Assumes dimensions of at most i32::MAX ([`Self::check_dims`]).
    fn check_index_limits(&self) -> Result<()> {
        const WHY: &str = "the kernels round M, N and K up to tile multiples in 32-bit signed integers";
        for (what, rule, dim, value) in [("M rounded up", "ceil(M/256)*256", "M", self.m), ("N rounded up", "ceil(N/256)*256", "N", self.n), ("K rounded up", "ceil(K/256)*256", "K", self.k)] {
            if value > Self::MAX_EXTENT {
                return Err(Error::SizeLimit { what, rule, dims: format!("{dim} = {value}"), value: value.div_ceil(256) as u128 * 256, max: i32::MAX as u128, why: WHY });
            }
        }
        self.check_tile_count((64, 64), "output tiles", "ceil(M/64) * ceil(N/64) * L", String::new)
    }

    /// At most [`Self::MAX_TILES`] tiles of `tile` (rows of M, columns of N) over the problem,
    /// else a `SizeLimit` with `what`, `rule` and the dimensions (and `note()` after them: made
    /// only for the error, as every call checks this).
    fn check_tile_count(&self, (tile_m, tile_n): (usize, usize), what: &'static str, rule: &'static str, note: impl Fn() -> String) -> Result<()> {
        let tiles = product(&[self.m.div_ceil(tile_m), self.n.div_ceil(tile_n), self.l]);
        within(Self::MAX_TILES as u128, "the kernels count tiles and size their grids in 32-bit signed integers", || format!("M = {}, N = {}, L = {}{}", self.m, self.n, self.l, note()), [(what, rule, tiles)])
    }

    /// Every buffer's byte count with how it is computed and from what (the dimensions written
    /// only for an error, as every call checks the counts): A, B, SFA, SFB, C and D with
    /// `cd_elem_bytes` bytes per element, and with `sfd` the FP4 output's scale factors (0
    /// without).
    fn counts(&self, cd_elem_bytes: usize, sfd: bool) -> [ByteCount; 6] {
        let (m, n, k, l) = (self.m, self.n, self.k, self.l);
        let sf = |rows: usize, cols: usize| product(&[l, layout::padded_rows(rows), layout::padded_sf_cols(layout::sf_cols(cols))]);
        let mk = |p: &Problem| format!("M = {}, K = {}, L = {}", p.m, p.k, p.l);
        let nk = |p: &Problem| format!("N = {}, K = {}, L = {}", p.n, p.k, p.l);
        let mn = |p: &Problem| format!("M = {}, N = {}, L = {}", p.m, p.n, p.l);
        [
            ("A bytes", "L * M * K / 2", product(&[l, m, k]) / 2, mk),
            ("B bytes", "L * N * K / 2", product(&[l, n, k]) / 2, nk),
            ("SFA bytes", "L * ceil(M/128)*128 * ceil(K/64)*4", sf(m, k), mk),
            ("SFB bytes", "L * ceil(N/128)*128 * ceil(K/64)*4", sf(n, k), nk),
            ("C and D bytes", "L * M * N * bytes per element", product(&[l, m, n, cd_elem_bytes]), mn),
            ("SFD bytes", "L * ceil(M/128)*128 * ceil(N/64)*4", if sfd { sf(m, n) } else { 0 }, mn),
        ]
    }

    /// Checks that every buffer's byte count is at most `max` ([`Self::counts`]). `why` names the
    /// limit in the error.
    pub(crate) fn check_counts(&self, cd_elem_bytes: usize, sfd: bool, max: usize, why: &'static str) -> Result<()> {
        for (what, rule, value, dims) in self.counts(cd_elem_bytes, sfd) {
            if value > max as u128 {
                return Err(Error::SizeLimit { what, rule, dims: dims(self), value, max: max as u128, why });
            }
        }
        Ok(())
    }

    /// The SM90 kernels' tile count for a config's tile (tile_m rows of M by tile_n of N): at most
    /// [`Self::MAX_TILES`]. [`Self::validate`] bounds the count of 64 x 64 tiles; a tile of fewer
    /// rows (the stream tiles' 8) can count up to 4 times as many.
    pub(crate) fn check_tiles(&self, tile_m: usize, tile_n: usize) -> Result<()> {
        self.check_tile_count((tile_m, tile_n), "output tiles of the config", "ceil(M / tile M) * ceil(N / tile N) * L", || format!(", tile {tile_m} x {tile_n}"))
    }

    /// The SM90 swapped tiles' pre-pass output in the workspace, (L, M rounded up to the tile's
    /// `tile_m` rows, K rounded up to 64) 16-bit values: at most [`Self::MAX_BYTES`]. Up to 4 times
    /// A's bytes (more where M is short of a tile), so [`Self::validate`]'s bound on A does not
    /// hold it, and the kernels size the workspace in 64-bit unsigned arithmetic, which would wrap.
    pub(crate) fn check_pre_pass(&self, tile_m: usize) -> Result<()> {
        let (m_pad, k_pad) = (self.m.div_ceil(tile_m) * tile_m, self.k.div_ceil(64) * 64);
        let decoded = [("decoded A bytes", "L * ceil(M / tile M)*tile M * ceil(K/64)*64 * 2", product(&[self.l, m_pad, k_pad, 2]))];
        within(Self::MAX_BYTES as u128, "the swapped tiles' pre-pass decodes A into the workspace, sized in 64-bit arithmetic", || format!("M = {}, K = {}, L = {}, tile {tile_m} rows", self.m, self.k, self.l), decoded)
    }

    /// SM100's limits beyond [`Self::validate`]: CUTLASS builds its scale-factor layouts from
    /// 32-bit extents, so SFA, SFB and (FP4 output) SFD must each span at most `i32::MAX` bytes;
    /// with L > 1 its batch strides (M * K, N * K and M * N elements) are products of two `int`s,
    /// so each must be at most `i32::MAX`; and its launch grid holds the N tiles (of 64 at the
    /// narrowest) and L in y and z, at most 65535 each.
    pub fn check_sm100(&self, out: OutType) -> Result<()> {
        self.check_sm100_scales(out)?;
        if self.l > 1 {
            // CUTLASS's make_cute_packed_stride sets a batch's stride to `int64_t(rows * cols)`,
            // the product taken in `int`: from 2^31 it wraps, and batch 1 onwards is addressed at
            // that wrapped offset. One batch gets stride 0.
            let (m, n, k) = (self.m, self.n, self.k);
            let strides = [("A batch stride", "M * K elements", product(&[m, k])), ("B batch stride", "N * K elements", product(&[n, k])), ("C and D batch stride", "M * N elements", product(&[m, n]))];
            within(i32::MAX as u128, "CUTLASS's SM100 batched strides are products of 32-bit ints (L > 1)", || format!("M = {m}, N = {n}, K = {k}, L = {}", self.l), strides)?;
        }
        // CUTLASS's SM100 scheduler launches the tiles along N in the grid's y and L in z (at most
        // 65535 each); the narrowest config's tiles are 64 wide (a wider config refuses more).
        let grid = [("N tiles of 64", "ceil(N / 64)", self.n.div_ceil(64) as u128), ("L", "L", self.l as u128)];
        within(65535, "CUTLASS's SM100 launch grid holds them in y and z", || format!("N = {}, L = {}", self.n, self.l), grid)
    }

    /// The scale-factor part of [`Self::check_sm100`] (SM100's grouped kernels check each group
    /// by it too).
    pub(crate) fn check_sm100_scales(&self, out: OutType) -> Result<()> {
        for (what, rule, value, dims) in self.counts(0, out.sfd().is_some()) {
            if what.starts_with("SF") && value > i32::MAX as u128 {
                return Err(Error::SizeLimit { what, rule, dims: dims(self), value, max: i32::MAX as u128, why: "CUTLASS's SM100 scale layouts hold 32-bit strides" });
            }
        }
        Ok(())
    }

    /// Checks that alpha and beta are finite (what [`Self::validate`] refuses as
    /// [`Error::NonFiniteScalar`]).
    pub(crate) fn check_scalars(&self) -> Result<()> {
        for (name, value) in [("alpha", self.alpha), ("beta", self.beta)] {
            if !value.is_finite() {
                return Err(Error::NonFiniteScalar { name, value });
            }
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

/// Checks C against the problem: its length when given, and that beta != 0 has one.
pub(crate) fn check_c(p: &Problem, c_len: Option<usize>) -> Result<()> {
    if let Some(len) = c_len {
        check_len("C", len, p.cd_elems(), "L * M * N elements")?;
    }
    if p.beta != 0.0 && c_len.is_none() {
        return Err(Error::BetaWithoutC { beta: p.beta });
    }
    Ok(())
}

/// Checks a device address for 16-byte alignment.
pub(crate) fn check_align(name: &'static str, addr: u64) -> Result<()> {
    check_align_to(name, addr, 16)
}

/// Checks a device address for `align`-byte alignment.
pub(crate) fn check_align_to(name: &'static str, addr: u64, align: u64) -> Result<()> {
    if !addr.is_multiple_of(align) {
        return Err(Error::Misaligned { name, addr, align });
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

/// `a * b * c / 2`, saturating at `usize::MAX` where it does not fit (the packed bytes of a
/// 4-bit (a, b, c) tensor).
const fn half_of_product(a: usize, b: usize, c: usize) -> usize {
    let n = (a as u128).saturating_mul(b as u128).saturating_mul(c as u128) / 2;
    if n > usize::MAX as u128 { usize::MAX } else { n as usize }
}

/// The rule on D's length for output `out`, as (name, required elements, rule).
pub(crate) fn d_rule(p: &Problem, out: OutType) -> (&'static str, usize, &'static str) {
    if out.sfd().is_some() {
        ("D", half_of_product(p.l, p.m, p.n), "L * M * N / 2 packed bytes")
    } else {
        ("D", p.cd_elems(), "L * M * N elements")
    }
}

/// alpha with both operands' global scales folded in, `alpha * ga * gb` left to right in f32 (the
/// reference folds them the same way, so results stay bit-identical); an error where that
/// overflows, or underflows to 0 from a nonzero alpha.
pub(crate) fn folded_alpha(alpha: f32, ga: f32, gb: f32) -> Result<f32> {
    let folded = alpha * ga * gb;
    if !folded.is_finite() || (folded == 0.0 && alpha != 0.0) {
        return Err(Error::InvalidData { what: "alpha", detail: format!("alpha {alpha} times the global scales {ga} (A) and {gb} (B) is {folded}: must be finite, and nonzero where alpha is") });
    }
    Ok(folded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folding_is_left_to_right_and_checked() {
        assert_eq!(folded_alpha(0.75, 3.0e-3, 7.0e-4).unwrap(), 0.75f32 * 3.0e-3f32 * 7.0e-4f32);
        assert_eq!(folded_alpha(1.0, 1.0, 1.0).unwrap(), 1.0);
        assert_eq!(folded_alpha(0.0, 1e-30, 1e-30).unwrap(), 0.0);
        assert!(folded_alpha(1.0, 1e-30, 1e-30).unwrap_err().to_string().contains("is 0"));
        let e = folded_alpha(1e30, 1e10, 1.0).unwrap_err().to_string();
        assert!(e.contains("must be finite") && e.contains("is inf"), "{e}");
        // The public form on a problem: a missing scale is 1, beta and the rest stay.
        let p = Problem::new(3, 32, 64).scalars(0.75, 0.5).fold_global_scales(Some(3.0e-3), None).unwrap();
        assert_eq!((p.alpha, p.beta, p.m), (0.75f32 * 3.0e-3f32 * 1.0, 0.5, 3));
        assert!(Problem::new(3, 32, 64).fold_global_scales(Some(1e-30), Some(1e-30)).unwrap_err().to_string().contains("is 0"));
    }

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
    }

    /// SM100's scale spans: at most i32::MAX bytes each, SFD counted only for FP4 output.
    #[test]
    fn sm100_scale_spans_are_bounded() {
        // K = 64: four scale columns, so SFA is 4 * ceil(M/128)*128 bytes.
        Problem::new((1 << 29) - 128, 64, 64).check_sm100(OutType::F16).unwrap();
        let e = Problem::new(1 << 29, 64, 64).check_sm100(OutType::F16).unwrap_err();
        assert!(matches!(e, Error::SizeLimit { what: "SFA bytes", value, max: 2147483647, .. } if value == 1 << 31), "{e}");
        assert!(e.to_string().contains("SM100"), "{e}");
        // N = 2048: 128 generated scale columns; only FP4 output has them.
        Problem::new(1 << 24, 2048, 64).check_sm100(OutType::F16).unwrap();
        let e = Problem::new(1 << 24, 2048, 64).check_sm100(OutType::Nvfp4).unwrap_err();
        assert!(matches!(e, Error::SizeLimit { what: "SFD bytes", value, .. } if value == 1 << 31), "{e}");
        let e = Problem::new(64, 1 << 29, 64).check_sm100(OutType::Bf16).unwrap_err();
        assert!(matches!(e, Error::SizeLimit { what: "SFB bytes", .. }), "{e}");
    }

    /// SM100's launch grid holds the N tiles of 64 in y and L in z: at most 65535 each, the first
    /// over named with its value and the dimensions.
    #[test]
    fn sm100_grid_holds_n_tiles_and_l_in_16_bits() {
        Problem::new(128, 64 * 65535, 64).check_sm100(OutType::F16).unwrap();
        let e = Problem::new(128, 64 * 65535 + 1, 64).check_sm100(OutType::F16).unwrap_err();
        assert!(matches!(e, Error::SizeLimit { what: "N tiles of 64", value: 65536, max: 65535, .. }), "{e}");
        assert!(e.to_string().contains(&format!("N = {}, L = 1", 64 * 65535 + 1)), "{e}");
        Problem::new(128, 128, 64).batch(65535).check_sm100(OutType::F16).unwrap();
        let e = Problem::new(128, 128, 64).batch(65536).check_sm100(OutType::F16).unwrap_err();
        assert!(matches!(e, Error::SizeLimit { what: "L", value: 65536, max: 65535, .. }), "{e}");
    }

    /// SM100 batch strides (CUTLASS's `int` products M*K, N*K, M*N) wrap from 2^31 with L > 1:
    /// refused there, at the edge, with each stride named; one batch and just below are taken.
    #[test]
    fn sm100_batch_strides_fit_in_i32() {
        for (p, what) in [
            (Problem::new(1 << 16, 64, 1 << 15), "A batch stride"),
            (Problem::new(64, 1 << 16, 1 << 15), "B batch stride"),
            (Problem::new(1 << 15, 1 << 16, 64), "C and D batch stride"),
        ] {
            p.batch(1).check_sm100(OutType::F16).unwrap();
            for out in [OutType::F16, OutType::Nvfp4] {
                let e = p.batch(2).check_sm100(out).unwrap_err();
                assert!(matches!(e, Error::SizeLimit { what: w, value, max: 2147483647, .. } if w == what && value == 1 << 31), "{e}");
                assert!(e.to_string().contains("L = 2") && e.to_string().contains("SM100"), "{e}");
            }
        }
        Problem::new((1 << 15) - 1, 1 << 16, 64).batch(2).check_sm100(OutType::F16).unwrap();
        Problem::new(1 << 16, 64, (1 << 15) - 32).batch(2).check_sm100(OutType::F16).unwrap();
    }

    /// Sizes at the kernels' 32-bit limits and byte counts beyond 64 bits: typed errors that
    /// name the count, its rule and the limit, never a panic or a wrapped count.
    #[test]
    fn sizes_beyond_the_limits_are_typed_errors() {
        // N rounded up to 256 leaves i32 (issue 25, finding 1): the kernels' n + 255 wraps.
        let e = Problem::new(1, 2147483584, 32).validate(OutType::F16, false).unwrap_err();
        assert!(matches!(e, Error::SizeLimit { what: "N rounded up", value: 2147483648, max: 2147483647, .. }), "{e}");
        assert!(e.to_string().contains("N = 2147483584") && e.to_string().contains("32-bit"), "{e}");
        Problem::new(1, Problem::MAX_EXTENT, 32).validate(OutType::F16, false).unwrap();
        let e = Problem::new(Problem::MAX_EXTENT + 8, 8, 32).validate(OutType::F16, false).unwrap_err();
        assert!(matches!(e, Error::SizeLimit { what: "M rounded up", .. }), "{e}");
        // K = 2^31 - 32, as in finding 5: K + 63 wraps in the kernels' k-tile count.
        let e = Problem::new(1, 4, 2147483616).batch(1 << 30).validate(OutType::F32, false).unwrap_err();
        assert!(matches!(e, Error::SizeLimit { what: "K rounded up", .. }), "{e}");
        // At the largest K, L = 2^30: A, B, C and D fit 64 bits, the padded SFA does not.
        let p = Problem::new(1, 4, Problem::MAX_EXTENT).batch(1 << 30);
        let e = p.validate(OutType::F32, false).unwrap_err();
        assert!(matches!(e, Error::SizeLimit { what: "SFA bytes", value, .. } if value == (1u128 << 30) * 128 * (Problem::MAX_EXTENT as u128 / 16)), "{e}");
        assert!(e.to_string().contains("L * ceil(M/128)*128 * ceil(K/64)*4") && e.to_string().contains("L = 1073741824"), "{e}");
        // The counts saturate instead of wrapping, so no length check can pass against them.
        assert_eq!(Problem::new(1, 4, Problem::MAX_EXTENT).batch(i32::MAX as usize).sfa_bytes(), usize::MAX);
        // A alone beyond 64 bits.
        let e = Problem::new(64, 64, Problem::MAX_EXTENT - 32 * 7).batch(i32::MAX as usize).validate(OutType::F16, false).unwrap_err();
        assert!(matches!(e, Error::SizeLimit { what: "A bytes", .. }), "{e}");
        // Tiles: 2^17 x 2^17 outputs are 2^22 tiles of 64 x 64 per batch; 2^10 batches are 2^32.
        let e = Problem::new(1 << 17, 1 << 17, 32).batch(1 << 10).validate(OutType::F16, false).unwrap_err();
        assert!(matches!(e, Error::SizeLimit { what: "output tiles", value, .. } if value == 1 << 32), "{e}");
        Problem::new(1 << 17, 1 << 17, 32).batch(511).validate(OutType::F16, false).unwrap();
        // Every count of a validated problem is exact.
        let p = Problem::new(Problem::MAX_EXTENT, 64, 64).batch(2);
        p.validate(OutType::F32, false).unwrap();
        assert_eq!(p.a_bytes(), 2 * Problem::MAX_EXTENT * 32);
        assert_eq!(p.sfa_bytes(), 2 * Problem::MAX_EXTENT.div_ceil(128) * 128 * 4);
        assert_eq!(OutType::Nvfp4.d_bytes(usize::MAX), usize::MAX / 8 * 4 + 3);
        assert_eq!(OutType::F32.d_bytes(usize::MAX), usize::MAX);
    }

    #[test]
    fn buffer_sizes() {
        let p = Problem::new(130, 256, 96).batch(2);
        assert_eq!(p.a_bytes(), 2 * 130 * 48);
        assert_eq!(p.sfa_bytes(), 2 * 256 * 8);
        assert_eq!(p.sfb_bytes(), 2 * 256 * 8);
        assert_eq!(p.cd_elems(), 2 * 130 * 256);
        // Counts that do not fit saturate, after the halving too.
        let huge = Problem::new(1 << 33, 1 << 33, 1 << 32);
        assert_eq!((huge.a_bytes(), huge.b_bytes(), d_rule(&huge, OutType::Nvfp4).1), (usize::MAX, usize::MAX, usize::MAX));
        assert_eq!(Problem::new(1 << 40, 16, 1 << 24).a_bytes(), 1 << 63, "2^64 elements, 2^63 bytes");
        assert!(check_len("A", 5, 6, "r").unwrap_err().to_string().contains("A: holds 5 elements where exactly 6 are needed"));
        assert!(check_align("C", 0x1008).unwrap_err().to_string().contains("0x1008 is not 16-byte aligned"));
        check_align("C", 0x1010).unwrap();
        assert_eq!(check_align_to("offsets", 0x1002, 4).unwrap_err().to_string(), "offsets: device address 0x1002 is not 4-byte aligned");
        check_align_to("offsets", 0x1004, 4).unwrap();
    }
}
