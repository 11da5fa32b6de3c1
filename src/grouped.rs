//! Grouped GEMM for mixture-of-experts layers, in the form an engine holds after routing
//! ([`BlockScaledGemm::moe_gemm`]): the activations of all experts stacked by expert, a device
//! array of expert offsets, the experts' weights stacked as one (E, N, K) tensor, per-expert
//! scales on the device, one launch. The offsets are read by the kernel, never by the host, so
//! a forward pass whose routing is decided on the GPU can be captured in a CUDA graph.
//!
//! Layouts (those of vLLM's `cutlass_fp4_group_mm` and its `scaled_fp4_experts_quant`):
//! - A: packed e2m1 (T, K/2), expert e's rows `offsets[e]..offsets[e + 1]`.
//! - A's scales: the 128x4 tiled layout over rows where expert e's rows start at
//!   `sum over j < e of ceil(rows_j / 128) * 128` (each expert padded to 128 rows), in a buffer of
//!   [`MoeProblem::sfa_bytes`], room for every routing. [`moe_scales`] builds it on the host.
//! - B: an [`Nvfp4Tensor`] of shape (E, N, K): expert e is batch e, scales tiled per batch.
//! - D: (T, N) row-major; row r belongs to the expert whose range holds it.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice};

use crate::dispatch::{self, Config};
use crate::error::{check_len, checked_product, product, within, Error, Result};
use crate::formats::{OutputElement, PackedFp4, ScaleByte};
use crate::gemm::{check_devices, resolve_config, status_result, BlockScaledGemm, Nvfp4Output, Table, SUPPORTED_GROUPED};
use crate::layout::{padded_sf_cols, sf_bytes, sf_cols, sf_offset, SF_VEC};
use crate::matrix::Nvfp4Matrix;
use crate::problem::{check_align, check_align_to, folded_alpha, setters, OutType, Problem};
use crate::sys;
use crate::tensor::Nvfp4Tensor;

/// Experts of one grouped launch, at most.
pub const MAX_EXPERTS: usize = sys::MAX_GROUPS as usize;

/// A mixture-of-experts GEMM: for every expert e,
/// `D[rows of e] = alpha * expert_scales[e] * dec(A[rows of e]) dec(B[e])ᵀ`, where `rows` (T)
/// activation rows are stacked by expert and all experts share N and K.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeProblem {
    /// T: stacked activation rows (tokens times top-k); 0 launches nothing.
    pub rows: usize,
    /// Output columns (each expert's weight rows).
    pub n: usize,
    /// Reduction length.
    pub k: usize,
    /// E: experts (1 to [`MAX_EXPERTS`]).
    pub experts: usize,
    /// Common factor of every expert's output.
    pub alpha: f32,
    /// FP4 output only: the normalization constant of the generated scale factors (as
    /// [`Problem::norm_constant`]).
    pub norm_constant: f32,
    /// Whether D's rows no expert covers (before the first offset and from the last, as the
    /// kernels read the offsets) are written as zeros (FP4 output: their packed values) or left
    /// as they were (false, the default: a D shared with other calls keeps their rows). Hopper
    /// writes them in the grouped launch (the stream tiles' kernel, the swapped tiles' pre-pass:
    /// no launch more); Blackwell zeroes all of D ahead of CUTLASS's kernel.
    pub zero_uncovered: bool,
}

impl MoeProblem {
    /// T stacked rows, N, K and E experts, alpha 1.
    pub const fn new(rows: usize, n: usize, k: usize, experts: usize) -> Self {
        MoeProblem { rows, n, k, experts, alpha: 1.0, norm_constant: 1.0, zero_uncovered: false }
    }
    setters! {
        /// With alpha.
        alpha: alpha: f32;
        /// With the FP4 output's normalization constant.
        norm_constant: norm_constant: f32;
        /// With D's rows no expert covers written as zeros (true) or left as they were.
        zero_uncovered: zero_uncovered: bool;
    }
    /// Bytes of the FP4 output's scale factors: the MoE layout over (T, N/16), as A's scales
    /// over (T, K/16), [`moe_sfa_bytes`]`(T, N, E)`.
    pub const fn sfd_bytes(&self) -> usize {
        moe_sfa_bytes(self.rows, self.n, self.experts)
    }

    /// Rows of A's scale layout, room for any routing: [`moe_sfa_rows`].
    pub const fn sfa_rows(&self) -> usize {
        moe_sfa_rows(self.rows, self.experts)
    }
    /// Bytes of A's scales: [`moe_sfa_bytes`].
    pub const fn sfa_bytes(&self) -> usize {
        moe_sfa_bytes(self.rows, self.k, self.experts)
    }
    /// Bytes of A: T * K / 2.
    pub const fn a_bytes(&self) -> usize {
        self.rows.saturating_mul(self.k) / 2
    }
    /// Bytes of B: E * N * K / 2.
    pub const fn b_bytes(&self) -> usize {
        self.experts.saturating_mul(self.n).saturating_mul(self.k) / 2
    }
    /// Bytes of B's scales: E batches of the tiled layout over (N, K/16).
    pub const fn sfb_bytes(&self) -> usize {
        sf_bytes((self.experts, self.n, self.k))
    }
    /// Elements of D: T * N.
    pub const fn d_elems(&self) -> usize {
        self.rows.saturating_mul(self.n)
    }

    /// The shape rules: those of [`Problem::validate`] for the stacked GEMM (T x N x K; FP4
    /// output: N % 32 and the normalization constant) and for B as a batch of E, at most
    /// [`MAX_EXPERTS`] experts, and the kernel's 32-bit counts (padded scale rows, work items) in
    /// range.
    pub fn validate(&self, out: OutType) -> Result<()> {
        if self.experts == 0 || self.experts > MAX_EXPERTS {
            return Err(Error::Dimension { dim: "experts", value: self.experts, max: MAX_EXPERTS });
        }
        // The dense rules name the stacked rows M: say T (E is checked above, so never L there).
        let moe_names = |e: Error| match e {
            Error::Dimension { dim: "M", value, max } => Error::Dimension { dim: "T", value, max },
            e => e,
        };
        Problem::new(self.rows.max(1), self.n, self.k).scalars(self.alpha, 0.0).norm_constant(self.norm_constant).validate(out, false).map_err(moe_names)?;
        Problem::new(1, self.n, self.k).batch(self.experts).validate(out, false).map_err(moe_names)?;
        let dims = || format!("T = {}, N = {}, E = {}", self.rows, self.n, self.experts);
        let sf_rows = product(&[self.experts, 127]) + self.rows as u128;
        let items = (self.rows.div_ceil(8) as u128 + self.experts as u128) * self.n.div_ceil(128) as u128;
        within(i32::MAX as u128, "the grouped kernel counts them in 32-bit signed integers", dims, [("padded scale rows", "T + 127 * E", sf_rows), ("work items", "(ceil(T/8) + E) * ceil(N/128)", items)])
    }
}

impl MoeProblem {
    /// SM100's limit beyond [`Self::validate`]: CuTe's scale-factor layouts, one per expert, hold
    /// int32 strides, so A's scales over T rows, B's over N rows and (FP4 output) D's over T rows
    /// of N / 16 must each span fewer than 2^31 bytes (`ceil(rows / 128) * ceil(K / 64) * 512`,
    /// N in K's place for D's).
    pub fn check_sm100(&self, out: OutType) -> Result<()> {
        let sfd = out.sfd().map(|_| ("D's scale factors per expert (T rows at most, N / 16 columns)", self.rows, self.n));
        let spans = [("A's scales per expert (T rows at most)", self.rows, self.k), ("B's scales per expert", self.n, self.k)].into_iter().chain(sfd)
            .map(|(what, rows, k)| (what, "ceil(rows / 128) * ceil(K / 64) * 512", rows.div_ceil(128) as u128 * k.div_ceil(64) as u128 * 512));
        within(i32::MAX as u128, "CUTLASS's SM100 scale layouts hold 32-bit strides", || format!("T = {}, N = {}, K = {}", self.rows, self.n, self.k), spans)
    }
}

/// Rows of the MoE scale layout for `rows` stacked rows over `experts` experts, room for any
/// routing: each expert's rows padded to 128 take at most `T + 127 E` rows, so
/// `floor((T + 127 E) / 128) * 128` (saturating).
pub const fn moe_sfa_rows(rows: usize, experts: usize) -> usize {
    rows.saturating_add(experts.saturating_mul(127)) / 128 * 128
}

/// The first rows of the MoE scale layout that hold every expert's blocks whatever the routing
/// of `rows` stacked rows over `experts` experts: only experts with rows have blocks, at most
/// `min(E, T)` of them, so `floor((T + 127 min(E, T)) / 128) * 128` (saturating), at most
/// [`moe_sfa_rows`]. The rows [`crate::Quantizer::quantize_moe_into`] zeroes before it writes
/// the experts' rows (and the memset ahead of Blackwell's `moe_gemm_fp4`); past them no grouped
/// GEMM reads, and the buffer is left as it was.
pub const fn moe_sfa_used_rows(rows: usize, experts: usize) -> usize {
    moe_sfa_rows(rows, if experts < rows { experts } else { rows })
}

/// Bytes of the MoE scale layout: [`moe_sfa_rows`] times K/16 padded to 4 (saturating).
pub const fn moe_sfa_bytes(rows: usize, k: usize, experts: usize) -> usize {
    moe_sfa_rows(rows, experts).saturating_mul(padded_sf_cols(sf_cols(k)))
}

/// Stacked activations of a mixture-of-experts layer on the device: packed e2m1 values (T, K/2),
/// their scales in the MoE layout of this module (each expert's rows padded to 128;
/// [`MoeProblem::sfa_bytes`] bytes) and the per-tensor global scale.
///
/// One pair of buffers sized for the largest T serves every step by prefix, as a decode loop
/// whose token count changes needs (and a CUDA graph per T captures): for T rows over E experts
/// [`crate::Quantizer::quantize_moe_into`] takes the first `T * K / 2` bytes of the values and
/// the first [`moe_sfa_bytes`]`(T, K, E)` bytes of the scales (writing the values and the
/// scales' first [`moe_sfa_used_rows`] rows, all that the GEMM reads), and the GEMM the same;
/// pass views of that length (`values.slice(..t * k / 2)`, `scales.slice(..moe_sfa_bytes(t, k,
/// e))`), with the global scale given to the quantizer.
#[derive(Debug)]
pub struct MoeActivations<V = CudaSlice<u8>, S = CudaSlice<u8>> {
    values: V,
    scales: S,
    rows: usize,
    k: usize,
    global_scale: f32,
}

impl<V, S> MoeActivations<V, S> {
    /// Activations of shape (T, K) over device buffers (`u8` or `float4::F4E2M1x2` values, `u8`
    /// or `float8::F8E4M3` scales): K a positive multiple of 16, `values` exactly `T * K / 2`
    /// bytes, `scales` at least the MoE layout's size for one expert
    /// ([`moe_sfa_bytes`]`(T, K, 1)`; the size for E experts, which the activations do not know,
    /// is checked against the problem by [`BlockScaledGemm::moe_gemm`]). T may be 0.
    /// `global_scale`: finite and positive.
    pub fn new<TV: PackedFp4, TS: ScaleByte>(values: V, scales: S, (rows, k): (usize, usize), global_scale: f32) -> Result<Self>
    where
        V: DeviceSlice<TV>, S: DeviceSlice<TS>,
    {
        if k == 0 {
            return Err(Error::Dimension { dim: "K", value: k, max: usize::MAX });
        }
        if !k.is_multiple_of(SF_VEC) {
            return Err(Error::KMultiple { k, multiple: SF_VEC, why: "one scale per 16 elements of K" });
        }
        crate::matrix::check_global_scale(global_scale)?;
        let values_want = checked_product("A", "T * K / 2 packed bytes", &[("T", rows), ("K / 2", k / 2)])?;
        check_len("A", values.len(), values_want, "T * K / 2 packed bytes")?;
        let sf_min = moe_sfa_bytes(rows, k, 1);
        if scales.len() < sf_min {
            return Err(Error::InvalidData { what: "SFA", detail: format!("holds {} elements where at least {sf_min} are needed (the MoE layout for one expert, floor((T + 127) / 128) * 128 * ceil(K/64)*4 scale bytes; E experts take floor((T + 127 E) / 128) * 128 rows)", scales.len()) });
        }
        Ok(MoeActivations { values, scales, rows, k, global_scale })
    }
    /// (T, K).
    pub fn shape(&self) -> (usize, usize) {
        (self.rows, self.k)
    }
    /// The global scale the GEMM folds into alpha.
    pub fn global_scale(&self) -> f32 {
        self.global_scale
    }
    /// The packed values.
    pub fn values(&self) -> &V {
        &self.values
    }
    /// The scales in the MoE layout.
    pub fn scales(&self) -> &S {
        &self.scales
    }
    /// The buffers back, e.g. to quantize the next step's activations into them.
    pub fn into_parts(self) -> (V, S) {
        (self.values, self.scales)
    }
}

/// The lengths both grouped GEMMs check besides A's: B and its scales, the offsets, the expert
/// scales and D.
pub(crate) fn check_moe_lens<VB: DevicePtr<TV>, SB: DevicePtr<TS>, TV, TS>(p: &MoeProblem, b: &Nvfp4Tensor<VB, SB>, offsets: usize, expert_scales: usize) -> Result<()> {
    for (name, got, want, rule) in [
        ("B", b.standard_values_len(), p.b_bytes(), "E * N * K / 2 packed bytes"),
        ("SFB", b.scales().len(), p.sfb_bytes(), "E * ceil(N/128)*128 * ceil(K/64)*4 tiled scale bytes"),
        ("offsets", offsets, p.experts + 1, "E + 1 expert offsets"),
        ("expert_scales", expert_scales, p.experts, "one per expert"),
    ] {
        check_len(name, got, want, rule)?;
    }
    Ok(())
}

/// The checks of the NVFP4 grouped calls before D's: `p` for `out`, A's and B's shapes and
/// lengths, then [`check_moe_lens`].
fn check_moe_operands<VA: DevicePtr<TV>, SA: DevicePtr<TS>, VB: DevicePtr<TV>, SB: DevicePtr<TS>, TV, TS>(p: &MoeProblem, out: OutType, a: &MoeActivations<VA, SA>, b: &Nvfp4Tensor<VB, SB>, offsets: usize, expert_scales: usize) -> Result<()> {
    p.validate(out)?;
    if a.shape() != (p.rows, p.k) {
        return Err(Error::OperandShape { name: "A", got: (1, a.rows, a.k), want: (1, p.rows, p.k) });
    }
    if b.shape() != (p.experts, p.n, p.k) {
        return Err(Error::OperandShape { name: "B", got: b.shape(), want: (p.experts, p.n, p.k) });
    }
    check_len("A", a.values.len(), p.a_bytes(), "T * K / 2 packed bytes")?;
    check_len("SFA", a.scales.len(), p.sfa_bytes(), "floor((T + 127 E) / 128) * 128 * ceil(K/64)*4 scale bytes (each expert padded to 128 rows)")?;
    check_moe_lens(p, b, offsets, expert_scales)
}

/// The launch arguments' sizes of a validated problem.
pub(crate) fn grouped_args(p: &MoeProblem) -> sys::GroupedArgs {
    sys::GroupedArgs { rows: p.rows as i32, n: p.n as i32, k: p.k as i32, experts: p.experts as i32, norm_constant: p.norm_constant, zero_uncovered: p.zero_uncovered as i32, ..Default::default() }
}

/// Expert offsets (E + 1 entries, 0 to T) of rows stacked by expert, `counts[e]` rows each.
pub fn expert_offsets(counts: &[usize]) -> Result<Vec<i32>> {
    let mut out = Vec::with_capacity(counts.len() + 1);
    let mut at = 0usize;
    out.push(0);
    for (e, &c) in counts.iter().enumerate() {
        at = at.checked_add(c).filter(|&t| t <= i32::MAX as usize).ok_or_else(|| Error::InvalidData { what: "counts", detail: format!("{c} rows at expert {e} bring the total past {} (after {at}): the rows must add up to at most i32::MAX", i32::MAX) })?;
        out.push(at as i32);
    }
    Ok(out)
}

/// A's scales in the MoE layout, on the host: the scales of the stacked activations `x` (one
/// batch of T rows), expert e's rows moved to start at a multiple of 128 as the grouped kernel
/// reads them, padding zero; [`MoeProblem::sfa_bytes`] bytes for `experts = offsets.len() - 1`.
/// `offsets` must be non-decreasing from 0 to T.
pub fn moe_scales(x: &Nvfp4Matrix, offsets: &[i32]) -> Result<Vec<u8>> {
    check_offsets(offsets, x.rows())?;
    if x.batch() != 1 {
        return Err(Error::InvalidData { what: "x", detail: format!("batch {}: the stacked activations are one batch of T rows", x.batch()) });
    }
    let p = MoeProblem::new(x.rows(), 32, x.k(), offsets.len() - 1);
    let (sp, cols) = (padded_sf_cols(sf_cols(x.k())), sf_cols(x.k()));
    // Room for every routing ((T + 127 E) rows): far more than x for few rows and many experts,
    // so fallible.
    let mut out = crate::error::try_zeros::<u8>("the MoE scales", p.sfa_bytes())?;
    let starts = moe_scale_starts(offsets)?;
    for e in 0..p.experts {
        let r0 = offsets[e] as usize;
        for r in r0..offsets[e + 1] as usize {
            for s in 0..cols {
                out[sf_offset(starts[e] + r - r0, s, sp)] = x.scale(0, r, s);
            }
        }
    }
    Ok(out)
}

/// Where each expert's scales start in the MoE layout, in scale rows, and where the last one's
/// blocks end: E + 1 entries, expert e's rows rounded up to 128 after expert e - 1's. Times
/// `layout::padded_sf_cols(K / 16)` they are byte offsets, and each expert's part is the tiled
/// layout of its own rows (an `Nvfp4Tensor` of (1, rows, K) over it needs no copy). `offsets` as
/// [`check_offsets`] wants them.
pub fn moe_scale_starts(offsets: &[i32]) -> Result<Vec<usize>> {
    check_offsets(offsets, offsets.last().map_or(0, |&t| t.max(0) as usize))?;
    let mut starts = vec![0usize];
    for w in offsets.windows(2) {
        let rows = (w[1] - w[0]) as usize;
        starts.push(starts.last().expect("one entry at least") + rows.div_ceil(128) * 128);
    }
    Ok(starts)
}

/// That `offsets` are E + 1 non-decreasing values from 0 to `rows` (the host-side check of
/// offsets the caller holds; the kernel's reading of other values is documented on
/// [`BlockScaledGemm::moe_gemm`]).
pub fn check_offsets(offsets: &[i32], rows: usize) -> Result<()> {
    let bad = |detail: String| Err(Error::InvalidData { what: "offsets", detail });
    if offsets.len() < 2 || offsets.len() > MAX_EXPERTS + 1 {
        return bad(format!("{} entries: E + 1 with E from 1 to {MAX_EXPERTS}", offsets.len()));
    }
    if offsets[0] != 0 || *offsets.last().expect("two or more") as i64 != rows as i64 {
        return bad(format!("run from {} to {}: they must run from 0 to T = {rows}", offsets[0], offsets[offsets.len() - 1]));
    }
    if let Some(e) = offsets.windows(2).position(|w| w[1] < w[0]) {
        return bad(format!("offsets[{}] = {} is below offsets[{e}] = {}: they must not decrease", e + 1, offsets[e + 1], offsets[e]));
    }
    Ok(())
}

/// The exact result of [`BlockScaledGemm::moe_gemm`] on the host: expert by expert, the
/// reference GEMM of its rows of `x` (one batch of T rows) and batch e of `w` (E, N, K), with
/// alpha `(alpha * gx * gw) * expert_scales[e]` rounded as the kernel rounds it.
pub fn reference_moe<T: OutputElement>(x: &Nvfp4Matrix, w: &Nvfp4Matrix, offsets: &[i32], expert_scales: &[f32], alpha: f32) -> Result<Vec<T>> {
    check_offsets(offsets, x.rows())?;
    let experts = offsets.len() - 1;
    if w.batch() != experts || expert_scales.len() != experts || w.k() != x.k() {
        return Err(Error::InvalidData { what: "w", detail: format!("(E, N, K) = ({}, {}, {}) with {} expert scales, for {experts} experts of K = {}: w must hold one batch per expert of x's K, with one expert scale each", w.batch(), w.rows(), w.k(), expert_scales.len(), x.k()) });
    }
    let folded = folded_alpha(alpha, x.global_scale().unwrap_or(1.0), w.global_scale().unwrap_or(1.0))?;
    let n = w.rows();
    let len = crate::error::checked_product("the reference's output", "T * N elements", &[("T", x.rows()), ("N", n)])?;
    let mut out = crate::error::try_filled("the reference's output", len, T::from_f64(0.0))?;
    for e in 0..experts {
        let (r0, r1) = (offsets[e] as usize, offsets[e + 1] as usize);
        if r0 == r1 {
            continue;
        }
        let rows: Vec<usize> = (r0..r1).collect();
        let a = x.select_rows(&rows)?.without_global_scale();
        let we = w.batch_slice(e)?.without_global_scale();
        let d: Vec<T> = crate::matrix::reference_gemm(&a, &we, folded * expert_scales[e], 0.0, None)?;
        out[r0 * n..r1 * n].copy_from_slice(&d);
    }
    Ok(out)
}

impl BlockScaledGemm {
    /// The config [`Self::moe_gemm`] runs for `p` with output `out` when none is forced (see
    /// there), or the error it would give.
    pub fn select_grouped_config(&self, p: &MoeProblem, out: OutType) -> Result<Config> {
        self.grouped_config(p, out, None, SUPPORTED_GROUPED, |c, o| c.is_built_grouped(o))
    }

    /// The config a grouped call on `p` runs: `forced` once checked against this device and the
    /// build (`built`: the grouped kernels of the call's kind), else the rule's over the configs
    /// `built` allows (see [`Self::select_grouped_config`]).
    pub(crate) fn grouped_config(&self, p: &MoeProblem, out: OutType, forced: Option<Config>, supported: &'static str, built: impl Fn(Config, OutType) -> bool) -> Result<Config> {
        if forced.is_none() {
            p.validate(out)?;
        }
        let config = resolve_config(&self.device(), out, forced, supported, &built, |arch| {
            if arch == 100 {
                p.check_sm100(out)?;
            }
            Ok(dispatch::select_grouped(arch, p.rows, p.experts, p.k, out, |c| built(c, out)))
        })?;
        if forced.is_some() && config.info().arch == 100 {
            p.check_sm100(out)?;
        }
        Ok(config)
    }

    /// The launch of a grouped call whose own checks have passed (shape, lengths, config): B,
    /// the offsets and the expert scales' addresses with their guards, alignment, and the kernel
    /// of `table` (NVFP4, or W4A16 with activations of the given kind) for output `out` with A at
    /// `a` (and its scales at `sfa`, 0 for W4A16) and D at `d` (and its scale factors at `sfd`
    /// for FP4 output, else 0); the caller holds A's and D's guards. T = 0 launches nothing.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch_grouped<VB, SB, O, ES, TV, TS>(&self, p: &MoeProblem, config: Config, table: Table, out: OutType, (a, sfa): (u64, u64), alpha: f32, b: &Nvfp4Tensor<VB, SB>, offsets: &O, expert_scales: &ES, (pd, psfd): (u64, u64), capturing: bool) -> Result<Config>
    where
        VB: DevicePtr<TV>, SB: DevicePtr<TS>, O: DevicePtr<i32>, ES: DevicePtr<f32>,
    {
        crate::gemm::check_weight_layout(config, b.layout())?;
        if p.rows == 0 {
            return Ok(config);
        }
        let (dev, stream) = (self.device(), self.stream());
        let (pb, _gb) = b.values().device_ptr(stream);
        let (psfb, _gsfb) = b.scales().device_ptr(stream);
        let (po, _go) = offsets.device_ptr(stream);
        let (pes, _ges) = expert_scales.device_ptr(stream);
        for (name, addr) in [("A", a), ("SFA", sfa), ("B", pb), ("SFB", psfb), ("D", pd), ("SFD", psfd)] {
            check_align(name, addr)?;
        }
        check_align_to("offsets", po, 4)?;
        check_align_to("expert_scales", pes, 4)?;
        let args = sys::GroupedArgs {
            a, sfa, b: pb, sfb: psfb, d: pd, sfd: psfd, offsets: po, expert_alpha: pes, alpha,
            stream: stream.cu_stream() as u64, device_id: dev.ordinal as i32, sm_count: dev.sm_count as i32, b_layout: b.layout().abi(),
            ..grouped_args(p)
        };
        let status = self.launch_with_workspace(capturing, |workspace, workspace_bytes| {
            let args = sys::GroupedArgs { workspace, workspace_bytes, ..args };
            // SAFETY: every address is a live device allocation of the checked length on this
            // stream's device, 16-byte aligned where the kernel loads in 16 bytes (4 for the
            // offsets and expert scales, read one at a time); the guards
            // above (and the caller's for A) and the workspace lock live until the launch is
            // queued. The kernel clamps the offsets it reads (see moe_gemm) and launches nothing
            // when the workspace is short.
            match table {
                Table::Nvfp4 => unsafe { sys::launch_grouped(config.info().index, out.index(), &args) },
                Table::W4a16(input) => unsafe { sys::launch_w4a16_grouped(config.info().index, input as u32, out.index(), &args) },
            }
        })?;
        status_result(status, config, out, (p.rows, p.n, p.k, p.experts))
    }

    /// The grouped GEMM of a mixture-of-experts layer, in one launch on Hopper; on Blackwell
    /// (f16 or bf16 output) CUTLASS's pointer-array block-scaled kernel, after a one-CTA launch
    /// that builds every expert's arguments from the offsets on the device:
    /// `D[rows of e] = alpha * gA * gB * expert_scales[e] * dec(A[rows of e]) dec(B[e])ᵀ` for
    /// every expert e, with gA and gB the tensors' global scales, in f16, bf16 or f32 (NVFP4:
    /// [`Self::moe_gemm_fp4`]). Per
    /// expert the arithmetic is [`Self::gemm`]'s (FP32 sums of exact products, one rounding),
    /// over the whole K range.
    ///
    /// `offsets`: E + 1 `i32` on the device, read by the kernel only (no host synchronisation;
    /// the call can be captured in a CUDA graph with the routing decided at run time). Valid
    /// offsets run non-decreasing from 0 to T. Others are read as their running maximum clamped
    /// to [0, T]: each expert then covers a possibly empty part of the rows, no two share a row,
    /// rows no expert covers are left as they were (or written as zeros:
    /// [`MoeProblem::zero_uncovered`]), and nothing outside D is written or outside
    /// A, its scales, B or its scales read. [`check_offsets`] checks offsets the host holds.
    /// `expert_scales`: E `f32` on the device (the experts' weight global scales; ones where
    /// there are none), read by the kernel only, so the host cannot check them: a non-finite one
    /// makes its expert's rows of D non-finite (FP4 output: their scale factors too) and touches
    /// nothing else. Experts without rows cost nothing.
    ///
    /// `config`: `None` picks, on SM90, the tile from the mean rows per expert (`ceil(T / min(E,
    /// T))`: a stream tile below 33 rows, the swapped 128x128 tile from there;
    /// [`crate::dispatch::select_grouped`] has the rule), on SM100 the config with grouped
    /// kernels (`Sm100_1Sm_128x128x256`); a forced config must carry a grouped kernel for D's
    /// type (`ConfigInfo::grouped`). The workspace holds the swapped tiles' activations decoded
    /// once (as [`Self::gemm`]'s do), or on SM100 the experts' arguments and CUTLASS's own
    /// workspace: it grows as there, except during capture ([`Self::moe_workspace_size`] says how
    /// much to reserve). Returns the config that ran; T = 0 launches nothing.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_gemm<VA, SA, VB, SB, O, ES, D, TV, TS, TO>(&self, p: &MoeProblem, a: &MoeActivations<VA, SA>, b: &Nvfp4Tensor<VB, SB>, offsets: &O, expert_scales: &ES, d: &mut D, config: Option<Config>) -> Result<Config>
    where
        VA: DevicePtr<TV>, SA: DevicePtr<TS>, VB: DevicePtr<TV>, SB: DevicePtr<TS>, O: DevicePtr<i32>, ES: DevicePtr<f32>, D: DevicePtrMut<TO>,
        TV: PackedFp4, TS: ScaleByte, TO: OutputElement,
    {
        let out = TO::OUT;
        check_moe_operands(p, out, a, b, offsets.len(), expert_scales.len())?;
        check_len("D", d.len(), p.d_elems(), "T * N elements")?;
        let (config, alpha, capturing) = self.moe_prepare(p, out, config, a, b, [("offsets", offsets.stream()), ("expert_scales", expert_scales.stream()), ("D", d.stream())])?;
        let stream = self.stream();
        let (pa, _ga) = a.values.device_ptr(stream);
        let (psfa, _gsfa) = a.scales.device_ptr(stream);
        let (pd, _gd) = d.device_ptr_mut(stream);
        self.launch_grouped(p, config, Table::Nvfp4, out, (pa, psfa), alpha, b, offsets, expert_scales, (pd, 0), capturing)
    }

    /// [`Self::moe_gemm`] with FP4 output: every expert's rows quantized as
    /// [`Self::gemm_fp4`] quantizes them (`out` [`OutType::Nvfp4`] or [`OutType::Nvfp4Ue8m0`],
    /// `p.norm_constant`), D (T, N/2) packed, its scale factors in the MoE layout of A's scales
    /// over (T, N/16) ([`MoeProblem::sfd_bytes`]: each expert's rows from a multiple of 128, their
    /// blocks' padding zeroed; scale rows past the experts' blocks are left as they were on
    /// Hopper; on Blackwell, where a memset precedes the GEMM, the first [`moe_sfa_used_rows`]
    /// are zeroed, the rest left as they were), so with [`OutType::Nvfp4`] (ue4m3 scale factors)
    /// the next grouped GEMM takes (D, SFD) as its [`MoeActivations`] with the same offsets and
    /// the global scale 1 / norm_constant. Per expert, the bits of [`Self::gemm_fp4`] at split 1.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_gemm_fp4<VA, SA, VB, SB, O, ES, DV, DS, TV, TS>(&self, p: &MoeProblem, out: OutType, a: &MoeActivations<VA, SA>, b: &Nvfp4Tensor<VB, SB>, offsets: &O, expert_scales: &ES, d: Nvfp4Output<'_, DV, DS>, config: Option<Config>) -> Result<Config>
    where
        VA: DevicePtr<TV>, SA: DevicePtr<TS>, VB: DevicePtr<TV>, SB: DevicePtr<TS>, O: DevicePtr<i32>, ES: DevicePtr<f32>, DV: DevicePtrMut<TV>, DS: DevicePtrMut<TS>,
        TV: PackedFp4, TS: ScaleByte,
    {
        if out.sfd().is_none() {
            return Err(Error::InvalidData { what: "out", detail: format!("{out}: moe_gemm_fp4 writes the FP4 outputs nvfp4 or nvfp4-ue8m0; use moe_gemm for {out}") });
        }
        check_moe_operands(p, out, a, b, offsets.len(), expert_scales.len())?;
        check_len("D", d.values.len(), p.d_elems() / 2, "T * N / 2 packed bytes")?;
        check_len("SFD", d.scales.len(), p.sfd_bytes(), "floor((T + 127 E) / 128) * 128 * ceil(N/64)*4 scale bytes (each expert padded to 128 rows)")?;
        let (config, alpha, capturing) = self.moe_prepare(p, out, config, a, b, [("offsets", offsets.stream()), ("expert_scales", expert_scales.stream()), ("D", d.values.stream()), ("SFD", d.scales.stream())])?;
        let stream = self.stream();
        let (pa, _ga) = a.values.device_ptr(stream);
        let (psfa, _gsfa) = a.scales.device_ptr(stream);
        let (pd, _gd) = d.values.device_ptr_mut(stream);
        let (psfd, _gsfd) = d.scales.device_ptr_mut(stream);
        self.launch_grouped(p, config, Table::Nvfp4, out, (pa, psfa), alpha, b, offsets, expert_scales, (pd, psfd), capturing)
    }

    /// The steps of the NVFP4 grouped calls between their length checks and their launch: the
    /// config, every buffer on this device (A, B, their scales and `others`), alpha with both
    /// global scales folded, and the capture check.
    fn moe_prepare<'s, VA, SA, VB, SB, TV, TS, const N: usize>(&self, p: &MoeProblem, out: OutType, config: Option<Config>, a: &'s MoeActivations<VA, SA>, b: &'s Nvfp4Tensor<VB, SB>, others: [(&'static str, &'s Arc<CudaStream>); N]) -> Result<(Config, f32, bool)>
    where
        VA: DevicePtr<TV>, SA: DevicePtr<TS>, VB: DevicePtr<TV>, SB: DevicePtr<TS>,
    {
        let config = self.grouped_config(p, out, config, SUPPORTED_GROUPED, |c, o| c.is_built_grouped(o))?;
        let operands = [("A", a.values.stream()), ("SFA", a.scales.stream()), ("B", b.values().stream()), ("SFB", b.scales().stream())];
        check_devices(self.device().ordinal, operands.into_iter().chain(others))?;
        let alpha = folded_alpha(p.alpha, a.global_scale, b.global_scale())?;
        Ok((config, alpha, self.capture_check()?))
    }

    /// Workspace bytes [`Self::moe_gemm`] needs on `p` with output `out` and `config` (or the one
    /// it would choose): the swapped tiles' activations decoded to FP16 (2 * T * K bytes plus
    /// 256 KiB and 12 bytes an expert, the scheduler's sums over the experts, made once a call),
    /// none for the stream tiles; on SM100 the experts' argument arrays (about 200
    /// bytes an expert) and CUTLASS's workspace (its TMA descriptors, per SM). Reserve it
    /// ([`Self::reserve_workspace`]) before capturing a call in a CUDA graph.
    pub fn moe_workspace_size(&self, p: &MoeProblem, out: OutType, config: Option<Config>) -> Result<usize> {
        p.validate(out)?;
        let config = self.grouped_config(p, out, config, SUPPORTED_GROUPED, |c, o| c.is_built_grouped(o))?;
        let dev = self.device();
        let args = sys::GroupedArgs { device_id: dev.ordinal as i32, sm_count: dev.sm_count as i32, ..grouped_args(p) };
        Ok(sys::workspace_size_grouped(config.info().index, out.index(), &args))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_and_their_checks() {
        assert_eq!(expert_offsets(&[3, 0, 5]).unwrap(), vec![0, 3, 3, 8]);
        check_offsets(&[0, 3, 3, 8], 8).unwrap();
        for (o, t, what) in [(vec![0], 0, "1 entries"), (vec![0, 5, 4, 8], 8, "offsets[2] = 4 is below offsets[1] = 5"), (vec![0, 3, 9], 8, "from 0 to 9"), (vec![1, 8], 8, "from 1 to 8")] {
            let e = check_offsets(&o, t).unwrap_err().to_string();
            assert!(e.contains(what), "{e}");
        }
        assert!(check_offsets(&vec![0; MAX_EXPERTS + 2], 0).is_err());
    }

    #[test]
    fn scale_rows_hold_every_routing() {
        // Each expert's rows padded to 128 never need more than sfa_rows, at the worst routing
        // (every expert one row past a multiple of 128) and at random ones.
        let mut rng = crate::SplitMix64::new(7);
        for _ in 0..2000 {
            let experts = 1 + rng.below(300) as usize;
            let counts: Vec<usize> = (0..experts).map(|_| if rng.below(2) == 0 { 0 } else { rng.below(300) as usize }).collect();
            let t: usize = counts.iter().sum();
            let need: usize = counts.iter().map(|c| c.div_ceil(128) * 128).sum();
            assert!(need <= moe_sfa_used_rows(t, experts) && moe_sfa_used_rows(t, experts) <= MoeProblem::new(t, 32, 64, experts).sfa_rows(), "{counts:?}");
        }
        let worst: Vec<usize> = vec![129; 10];
        let need: usize = worst.iter().map(|c| c.div_ceil(128) * 128).sum();
        assert_eq!(need, MoeProblem::new(1290, 32, 64, 10).sfa_rows());
        assert_eq!(need, moe_sfa_used_rows(1290, 10));
        // More experts than rows: every row its own expert reaches the bound, which is far below
        // the buffer's rows (one token of DeepSeek-V3: 8 rows over 256 experts).
        assert_eq!(moe_sfa_used_rows(8, 256), 8 * 128);
        assert_eq!(moe_sfa_rows(8, 256), 32512);
        assert_eq!(moe_sfa_used_rows(0, 256), 0);
    }

    #[test]
    fn moe_scales_place_each_expert_at_a_multiple_of_128() {
        let x = Nvfp4Matrix::random_contest((1, 300, 128), 3).unwrap();
        let offsets = expert_offsets(&[130, 0, 1, 169]).unwrap();
        let s = moe_scales(&x, &offsets).unwrap();
        let p = MoeProblem::new(300, 32, 128, 4);
        assert_eq!(s.len(), p.sfa_bytes());
        let sp = padded_sf_cols(sf_cols(128));
        // Expert 0 at row 0, expert 2 at 256 (130 rows pad to 256, expert 1 is empty), expert 3 at 384.
        for (r, at) in [(0, 0), (129, 129), (130, 256), (131, 384), (299, 384 + 168)] {
            for c in 0..sf_cols(128) {
                assert_eq!(s[sf_offset(at, c, sp)], x.scale(0, r, c), "row {r}");
            }
        }
        assert_eq!(s[sf_offset(130, 0, sp)], 0, "padding is zero");
        assert_eq!(moe_scale_starts(&offsets).unwrap(), vec![0, 256, 256, 384, 640]);
        assert!(moe_scale_starts(&[0, 5, 3]).is_err());
    }

    #[test]
    fn validate_names_each_rule() {
        let ok = MoeProblem::new(64, 4096, 7168, 256);
        ok.validate(OutType::Bf16).unwrap();
        MoeProblem::new(0, 4096, 7168, 256).validate(OutType::F32).unwrap();
        assert!(matches!(MoeProblem::new(64, 4096, 7168, 0).validate(OutType::F16), Err(Error::Dimension { dim: "experts", .. })));
        assert!(matches!(MoeProblem::new(64, 4096, 7168, MAX_EXPERTS + 1).validate(OutType::F16), Err(Error::Dimension { dim: "experts", .. })));
        MoeProblem::new(64, 4096, 7168, 8).norm_constant(64.0).validate(OutType::Nvfp4).unwrap();
        assert!(matches!(MoeProblem::new(64, 4112, 7168, 8).validate(OutType::Nvfp4), Err(Error::NMultiple { multiple: 32, .. })));
        assert!(MoeProblem::new(64, 4096, 7168, 8).norm_constant(f32::NAN).validate(OutType::Nvfp4).is_err());
        assert!(matches!(MoeProblem::new(64, 4096, 7000, 8).validate(OutType::F16), Err(Error::KMultiple { .. })));
        assert!(matches!(MoeProblem::new(64, 4100, 7168, 8).validate(OutType::F16), Err(Error::NMultiple { .. })));
        let e = MoeProblem::new(Problem::MAX_EXTENT, 4096, 64, 8).validate(OutType::F16).unwrap_err();
        assert!(matches!(e, Error::SizeLimit { what: "padded scale rows", .. }), "{e}");
        let e = MoeProblem::new(1 << 22, 1 << 20, 64, 8).validate(OutType::F16).unwrap_err();
        assert!(matches!(e, Error::SizeLimit { what: "work items", .. }), "{e}");
        assert!(matches!(MoeProblem::new(64, 4096, 7168, 8).alpha(f32::NAN).validate(OutType::F16), Err(Error::NonFiniteScalar { .. })));
    }

    #[test]
    fn kernels_accept_what_validate_accepts() {
        // The C++ adapters' own checks (host-side, nothing launched) agree with validate on the
        // edges of its limits.
        let problems = [MoeProblem::new(1, 32, 32, 1), MoeProblem::new(64, 4096, 7168, 256), MoeProblem::new(5000, 768, 2048, MAX_EXPERTS), MoeProblem::new(Problem::MAX_EXTENT - 127 * 64, 128, 64, 64)];
        for c in Config::ALL.iter().copied() {
            for &out in c.info().grouped {
                if !c.is_built(out) {
                    continue;
                }
                for p in problems {
                    assert!(p.validate(out).is_ok(), "{p:?}");
                    let ok = c.info().arch != 100 || p.check_sm100(out).is_ok();
                    assert_eq!(crate::cutlass_host::can_implement_grouped(c, out, &p).unwrap(), ok, "{c} {out} {p:?}");
                }
                if c.info().arch == 100 {
                    // At the SM100 limit, and just past it (A's scales over T rows).
                    let rows = (i32::MAX as usize / 512 / 112) * 128;
                    let p = MoeProblem::new(rows, 128, 7168, 8);
                    assert!(p.check_sm100(out).is_ok() && crate::cutlass_host::can_implement_grouped(c, out, &p).unwrap(), "{c} {p:?}");
                    let p = MoeProblem::new(rows + 1, 128, 7168, 8);
                    assert!(p.check_sm100(out).is_err() && !crate::cutlass_host::can_implement_grouped(c, out, &p).unwrap(), "{c} {p:?}");
                    // D's scale factors over T rows and N / 16 columns (FP4 output), K small.
                    let p = MoeProblem::new(rows + 1, 7168, 64, 8);
                    let ok = out.sfd().is_none();
                    assert_eq!(p.check_sm100(out).is_ok(), ok, "{c} {out} {p:?}");
                    assert_eq!(crate::cutlass_host::can_implement_grouped(c, out, &p).unwrap(), ok, "{c} {out} {p:?}");
                }
            }
        }
    }

    #[test]
    fn reference_is_the_per_expert_gemm() {
        let x = Nvfp4Matrix::random_contest((1, 40, 128), 11).unwrap();
        let w = Nvfp4Matrix::random_contest((3, 64, 128), 12).unwrap();
        let offsets = expert_offsets(&[17, 0, 23]).unwrap();
        let scales = [0.5f32, 3.0, 0.25];
        let d: Vec<f32> = reference_moe(&x, &w, &offsets, &scales, 0.75).unwrap();
        for (e, r0, r1) in [(0usize, 0usize, 17usize), (2, 17, 40)] {
            let rows: Vec<usize> = (r0..r1).collect();
            let want: Vec<f32> = crate::matrix::reference_gemm(&x.select_rows(&rows).unwrap(), &w.batch_slice(e).unwrap(), 0.75 * scales[e], 0.0, None).unwrap();
            assert_eq!(&d[r0 * 64..r1 * 64], &want[..]);
        }
    }
}
