//! Host-side questions to the compiled CUTLASS kernels, answered without a GPU: the scale-factor
//! layout CUTLASS computes, `can_implement`, and workspace sizes. The tests use these to hold
//! the Rust layout and validator to CUTLASS's own.

use crate::dispatch::Config;
use crate::error::{Error, Result};
use crate::sys::{self as bridge, KernelArgs};
use crate::problem::{check_len, check_operand_lens, OutType, Problem, SfdFormat};

fn args(p: &Problem) -> KernelArgs {
    // Aligned, never dereferenced: these calls only inspect shapes and layouts.
    let x = 1 << 20;
    KernelArgs { a: x, sfa: x, b: x, sfb: x, c: x, d: x, sfd: x, norm_constant_ptr: x, sm_count: 1, ..p.launch_args() }
}

fn built(config: Config, out: OutType) -> Result<()> {
    if !config.is_built(out) {
        return Err(Error::NotBuilt { config, out });
    }
    Ok(())
}

/// The host arguments of a query about `config` with `out` output on `p` in `split_k` ranges
/// (a split the config can reduce in a cluster is taken to be, as `split_global` 0 says).
fn split_args(config: Config, out: OutType, p: &Problem, split_k: u32) -> Result<KernelArgs> {
    built(config, out)?;
    p.check_dims(i32::MAX as usize)?;
    let split_k = i32::try_from(split_k).map_err(|_| Error::InvalidData { what: "split_k", detail: format!("{split_k}: above i32::MAX") })?;
    Ok(KernelArgs { split_k, ..args(p) })
}

/// CUTLASS `GemmUniversalAdapter::can_implement` for `config` with `out` output on `p`
/// (host arguments built as the launch builds them).
pub fn can_implement(config: Config, out: OutType, p: &Problem) -> Result<bool> {
    can_implement_split_k(config, out, p, 1)
}

/// [`can_implement`] with `split_k` K ranges (the SM90 kernels' split-K; CUTLASS's SM100
/// kernels take 1).
pub fn can_implement_split_k(config: Config, out: OutType, p: &Problem, split_k: u32) -> Result<bool> {
    Ok(bridge::can_implement(config.info().index, out.index(), &split_args(config, out, p, split_k)?))
}

/// The grouped kernel's own check (`GroupedGemm::can_implement`) of `config` with `out` output
/// on `p`: the tests hold [`crate::MoeProblem::validate`] to it.
pub fn can_implement_grouped(config: Config, out: OutType, p: &crate::grouped::MoeProblem) -> Result<bool> {
    if !config.is_built_grouped(out) {
        return Err(Error::NotBuilt { config, out });
    }
    let dim = |dim: &'static str, v: usize| i32::try_from(v).map_err(|_| Error::Dimension { dim, value: v, max: i32::MAX as usize });
    // SFD at a stand-in address, never dereferenced (FP4 outputs require one).
    let args = bridge::GroupedArgs { rows: dim("T", p.rows)?, n: dim("N", p.n)?, k: dim("K", p.k)?, experts: dim("experts", p.experts)?, sfd: 1 << 20, norm_constant: p.norm_constant, ..Default::default() };
    Ok(bridge::can_implement_grouped(config.info().index, out.index(), &args))
}

/// The list-form grouped kernel's own check (`GroupedListGemm::can_implement`) of `config` with
/// `out` output on the bounds `p` (stand-in array addresses, never dereferenced): the tests hold
/// [`crate::grouped_list::ListProblem::validate`] to it. False where this build lacks the kernel.
pub fn can_implement_grouped_list(config: Config, out: OutType, p: &crate::grouped_list::ListProblem) -> bool {
    let dim = |v: usize| i32::try_from(v).unwrap_or(i32::MAX);
    let args = bridge::GroupedListArgs {
        groups: dim(p.groups), max_m: dim(p.max_m), max_n: dim(p.max_n), max_k: dim(p.max_k), max_rows: p.max_rows as i64,
        problems: 1 << 20, a: 1 << 20, sfa: 1 << 20, b: 1 << 20, sfb: 1 << 20, d: 1 << 20, c: 1 << 20, sfd: 1 << 20,
        alpha: p.alpha, beta: p.beta, norm_constant: p.norm_constant, ..Default::default()
    };
    bridge::can_implement_grouped_list(config.info().index, out.index(), &args)
}

/// What a grouped kernel that builds per-expert arguments (SM100's pointer-array GEMM) gives
/// one expert, as its builder computes it (run on the host): byte offsets are from the bases of
/// the stacked operands (A, B, their scales, D).
#[derive(Clone, Debug, PartialEq)]
pub struct GroupDescription {
    /// The expert's problem: rows, N, K.
    pub shape: [usize; 3],
    /// Byte offsets of the expert's A, B, SFA, SFB and D from those operands' bases.
    pub a: u64,
    /// See `a`.
    pub b: u64,
    /// See `a`.
    pub sfa: u64,
    /// See `a`.
    pub sfb: u64,
    /// See `a`.
    pub d: u64,
    /// The expert's alpha (the call's alpha times its expert scale).
    pub alpha: f32,
    /// Leading dimensions in elements: A's and B's rows (K), D's rows (N).
    pub ld: [usize; 3],
    /// Byte offset from SFA's base of the scale of every (scale column, row) of the expert's A,
    /// row fastest.
    pub sfa_offsets: Vec<u64>,
    /// The same for B (N rows).
    pub sfb_offsets: Vec<u64>,
    /// FP4 output: byte offset of the expert's scale factors from SFD's base, and of each of its
    /// generated scale factors ((N/16 column, row), row fastest); 0 and empty otherwise.
    pub sfd: u64,
    /// See `sfd`.
    pub sfd_offsets: Vec<u64>,
}

/// The per-expert arguments the grouped kernel of `config` with `out` output builds for expert
/// `expert` of `p`, given the offsets and expert scales the device would hold (`None`: ones).
/// `Ok(None)` for kernels that build none (SM90: they read the offsets themselves).
pub fn describe_grouped(config: Config, out: OutType, p: &crate::grouped::MoeProblem, offsets: &[i32], expert_scales: Option<&[f32]>, expert: usize) -> Result<Option<GroupDescription>> {
    if !config.is_built_grouped(out) {
        return Err(Error::NotBuilt { config, out });
    }
    p.validate(out)?;
    check_len("offsets", offsets.len(), p.experts + 1, "E + 1 expert offsets")?;
    if let Some(s) = expert_scales {
        check_len("expert_scales", s.len(), p.experts, "one per expert")?;
    }
    if expert >= p.experts {
        return Err(Error::InvalidData { what: "expert", detail: format!("{expert}: the problem has {} experts", p.experts) });
    }
    // Bases far apart, never dereferenced: the answer is read back relative to them.
    const BASE: [u64; 6] = [1 << 40, 2 << 40, 3 << 40, 4 << 40, 5 << 40, 6 << 40];
    let args = bridge::GroupedArgs {
        a: BASE[0], b: BASE[1], sfa: BASE[2], sfb: BASE[3], d: BASE[4], sfd: if out.sfd().is_some() { BASE[5] } else { 0 },
        offsets: offsets.as_ptr() as u64, expert_alpha: expert_scales.map_or(0, |s| s.as_ptr() as u64),
        alpha: p.alpha, sm_count: 1,
        ..crate::grouped::grouped_args(p)
    };
    let call = |values: &mut [i64]| {
        // SAFETY: offsets and expert_scales are host slices of the lengths checked above; the
        // builder reads nothing else.
        unsafe { bridge::describe_grouped(config.info().index, out.index(), &args, expert as i32, values) }
    };
    let need = call(&mut []);
    if need == -3 {
        return Ok(None);
    }
    if need < 13 {
        return Err(Error::InvalidData { what: "describe_grouped", detail: format!("the shim answered {need}") });
    }
    let mut v = vec![0i64; need as usize];
    let got = call(&mut v);
    if got != need {
        return Err(Error::InvalidData { what: "describe_grouped", detail: format!("the shim answered {got}, then {need}") });
    }
    let rel = |x: i64, base: u64| (x as u64).wrapping_sub(base);
    let m = v[0] as usize;
    let sf_cols = p.k / 16;
    let (sfa, sfb) = (rel(v[5], BASE[2]), rel(v[6], BASE[3]));
    let fp4 = out.sfd().is_some();
    let head = 13;
    let sfb_end = head + (m + p.n) * sf_cols;
    Ok(Some(GroupDescription {
        shape: [m, v[1] as usize, v[2] as usize],
        a: rel(v[3], BASE[0]), b: rel(v[4], BASE[1]), sfa, sfb, d: rel(v[7], BASE[4]),
        alpha: f32::from_bits(v[8] as u32),
        ld: [v[9] as usize, v[10] as usize, v[11] as usize],
        sfa_offsets: v[head..head + m * sf_cols].iter().map(|&x| rel(x, BASE[2])).collect(),
        sfb_offsets: v[head + m * sf_cols..sfb_end].iter().map(|&x| rel(x, BASE[3])).collect(),
        sfd: if fp4 { rel(v[12], BASE[5]) } else { 0 },
        sfd_offsets: v[sfb_end..].iter().map(|&x| rel(x, BASE[5])).collect(),
    }))
}

/// Workspace bytes the kernel of `config` with `out` output asks for on `p` with `split_k` K
/// ranges, summed through global memory where `split_global` even if the config could use a
/// cluster (the launch's choice: [`crate::dispatch::cluster_split`]). SM90 kernels: a
/// global-memory split-K reduction's counters and partials (none for one range or a split
/// reduced through a cluster), and the swapped tiles' decoded activations.
pub fn workspace_size(config: Config, out: OutType, p: &Problem, split_k: u32, split_global: bool) -> Result<usize> {
    let args = KernelArgs { split_global: split_global as i32, ..split_args(config, out, p, split_k)? };
    Ok(bridge::workspace_size(config.info().index, out.index(), &args))
}

/// Byte offsets CUTLASS's `Sm1xxBlockScaledConfig::tile_atom_to_shape_SFA/SFB` layout gives for
/// every (batch, scale column, row) of operand A (`operand_b == false`) or B, in that nesting
/// order (row fastest), and the layout's cosize (bytes of the buffer).
pub fn sf_offsets(config: Config, p: &Problem, operand_b: bool) -> Result<(Vec<i64>, i64)> {
    let out = *config.info().outputs.first().ok_or(Error::NotBuilt { config, out: OutType::F16 })?;
    built(config, out)?;
    p.check_dims(i32::MAX as usize)?;
    let rows = if operand_b { p.n } else { p.m };
    let mut offsets = vec![0i64; rows * (p.k / 16) * p.l];
    let cosize = bridge::sf_offsets(config.info().index, out.index(), p.m as i32, p.n as i32, p.k as i32, p.l as i32, operand_b, &mut offsets);
    if cosize < 0 {
        return Err(Error::InvalidData { what: "sf_offsets", detail: format!("the shim answered {cosize}") });
    }
    Ok((offsets, cosize))
}

/// CUTLASS's host reference for FP4 output, as example 72b checks its kernel:
/// `cutlass::reference::host::Gemm3x` with `SfStrategy::SfDGen` on the raw buffers (layouts as
/// the kernels take them; C, f32, read only when beta != 0). Returns D, (L, M, N/2) packed
/// bytes, and SFD, `p.sfd_bytes()` bytes (padding zero). Single-threaded and slow: for tests.
#[allow(clippy::too_many_arguments)]
pub fn reference_fp4(p: &Problem, a: &[u8], sfa: &[u8], b: &[u8], sfb: &[u8], c: Option<&[f32]>, format: SfdFormat) -> Result<(Vec<u8>, Vec<u8>)> {
    p.validate(OutType::Nvfp4, c.is_some())?;
    check_operand_lens(p, [a.len(), sfa.len(), b.len(), sfb.len()])?;
    crate::reference::check_c(p, c.map(<[f32]>::len))?;
    let cosize = bridge::host_sfd_cosize(p.m as i32, p.n as i32, p.l as i32);
    if cosize < 0 || cosize as usize > p.sfd_bytes() {
        return Err(Error::InvalidData { what: "SFD layout", detail: format!("CUTLASS's SFD layout spans {cosize} bytes, the buffer {}", p.sfd_bytes()) });
    }
    let c = c.filter(|_| p.beta != 0.0).unwrap_or(&[]);
    let mut d = vec![0u8; p.cd_elems() / 2];
    let mut sfd = vec![0u8; p.sfd_bytes()];
    let ue8m0 = format == SfdFormat::Ue8m0;
    bridge::host_gemm_fp4(p.m as i32, p.n as i32, p.k as i32, p.l as i32, a, sfa, b, sfb, c, p.alpha, p.beta, p.norm_constant, ue8m0, &mut d, &mut sfd);
    Ok((d, sfd))
}

/// Bytes CUTLASS's `Sm1xxBlockScaledOutputConfig<16>::tile_atom_to_shape_SFD` layout spans for
/// (M, N, L) (its cosize without the zero strides).
pub fn sfd_cosize(m: usize, n: usize, l: usize) -> Result<usize> {
    Problem::new(m, n, 32).batch(l).check_dims(i32::MAX as usize)?;
    Ok(bridge::host_sfd_cosize(m as i32, n as i32, l as i32) as usize)
}

/// A conversion of CUTLASS's host code from f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostConversion {
    /// `NumericConverter<float_e2m1_t, float>` (the low nibble).
    E2m1,
    /// `static_cast<float_ue4m3_t>`.
    Ue4m3,
    /// `static_cast<float_ue8m0_t>`.
    Ue8m0,
}

/// Converts every value with CUTLASS's host conversion `kind`.
pub fn convert(kind: HostConversion, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; x.len()];
    bridge::host_convert(kind as i32, x, &mut out);
    out
}
