//! Host-side questions to the compiled CUTLASS kernels, answered without a GPU: the scale-factor
//! layout CUTLASS computes, `can_implement`, and workspace sizes. The tests use these to hold
//! the Rust layout and validator to CUTLASS's own.

use crate::dispatch::Config;
use crate::error::{check_len, checked_product, try_collect, try_zeros, Error, Result};
use crate::sys::{self as bridge, KernelArgs};
use crate::problem::{check_operand_lens, OutType, Problem, SfdFormat};

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
    let args = bridge::GroupedArgs { rows: dim("T", p.rows)?, n: dim("N", p.n)?, k: dim("K", p.k)?, experts: dim("experts", p.experts)?, sfd: 1 << 20, norm_constant: p.norm_constant, zero_uncovered: p.zero_uncovered as i32, ..Default::default() };
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

/// What a grouped kernel that builds per-group arguments (SM100's pointer-array GEMM) gives one
/// group, as its builder computes it (run on the host): byte offsets are from the bases the
/// caller gave (the stacked operands of the MoE form; stand-ins of the list form).
#[derive(Clone, Debug, PartialEq)]
pub struct GroupDescription {
    /// The group's problem: rows, N, K (rows 0 for a group the list form refuses).
    pub shape: [usize; 3],
    /// Byte offsets of the group's A, B, SFA, SFB and D from those operands' bases.
    pub a: u64,
    /// See `a`.
    pub b: u64,
    /// See `a`.
    pub sfa: u64,
    /// See `a`.
    pub sfb: u64,
    /// See `a`.
    pub d: u64,
    /// The group's alpha (the call's alpha times its own factor).
    pub alpha: f32,
    /// Leading dimensions in elements: A's and B's rows (K), D's rows (N).
    pub ld: [usize; 3],
    /// Byte offset from SFA's base of the scale of every (scale column, row) of the group's A,
    /// row fastest.
    pub sfa_offsets: Vec<u64>,
    /// The same for B (N rows).
    pub sfb_offsets: Vec<u64>,
    /// FP4 output: byte offset of the group's scale factors from SFD's base, and of each of its
    /// generated scale factors ((N/16 column, row), row fastest); 0 and empty otherwise.
    pub sfd: u64,
    /// See `sfd`.
    pub sfd_offsets: Vec<u64>,
    /// The list form with beta: byte offset of the group's C from C's base and C's leading
    /// dimension (N); `None` without C.
    pub c: Option<(u64, usize)>,
}

/// The values the shim's describe flattens, read back against the bases (A, B, SFA, SFB, D,
/// SFD, C) the call used. The offset lists take about as much host memory as `v` again: an
/// [`Error::HostMemory`] where the host cannot give it.
fn read_description(v: &[i64], base: [u64; 7], fp4: bool) -> Result<GroupDescription> {
    let rel = |x: i64, base: u64| (x as u64).wrapping_sub(base);
    let (m, n, k) = (v[0] as usize, v[1] as usize, v[2] as usize);
    let sf_cols = k / 16;
    const HEAD: usize = 15;
    let sfb_end = HEAD + (m + n) * sf_cols;
    let offsets = |what: &'static str, part: &[i64], base: u64| try_collect(what, part.len(), part.iter().map(|&x| rel(x, base)));
    Ok(GroupDescription {
        shape: [m, n, k],
        a: rel(v[3], base[0]), b: rel(v[4], base[1]), sfa: rel(v[5], base[2]), sfb: rel(v[6], base[3]), d: rel(v[7], base[4]),
        alpha: f32::from_bits(v[8] as u32),
        ld: [v[9] as usize, v[10] as usize, v[11] as usize],
        sfa_offsets: offsets("the group's SFA offsets", &v[HEAD..HEAD + m * sf_cols], base[2])?,
        sfb_offsets: offsets("the group's SFB offsets", &v[HEAD + m * sf_cols..sfb_end], base[3])?,
        sfd: if fp4 { rel(v[12], base[5]) } else { 0 },
        sfd_offsets: offsets("the group's SFD offsets", &v[sfb_end..], base[5])?,
        c: (v[13] != 0).then(|| (rel(v[13], base[6]), v[14] as usize)),
    })
}

/// Calls a shim describe twice (for the count, then the values); `None` for a kernel that
/// builds no arguments (-3).
fn describe_values(what: &'static str, call: impl Fn(&mut [i64]) -> i64) -> Result<Option<Vec<i64>>> {
    let need = call(&mut []);
    if need == -3 {
        return Ok(None);
    }
    if need < 15 {
        return Err(Error::InvalidData { what, detail: format!("the shim answered {need}") });
    }
    // Up to about 3 * 2^31 values within the SM100 limits: fallible, as the caller chose the size.
    let mut v = try_zeros::<i64>(what, need as usize)?;
    let got = call(&mut v);
    if got != need {
        return Err(Error::InvalidData { what, detail: format!("the shim answered {got}, then {need}") });
    }
    Ok(Some(v))
}

// Bases far apart, never dereferenced: the answers are read back relative to them.
const BASE: [u64; 7] = [1 << 40, 2 << 40, 3 << 40, 4 << 40, 5 << 40, 6 << 40, 7 << 40];

/// The per-expert arguments the grouped kernel of `config` with `out` output builds for expert
/// `expert` of `p`, given the offsets and expert scales the device would hold (`None`: ones).
/// `Ok(None)` for kernels that build none (SM90: they read the offsets themselves).
pub fn describe_grouped(config: Config, out: OutType, p: &crate::grouped::MoeProblem, offsets: &[i32], expert_scales: Option<&[f32]>, expert: usize) -> Result<Option<GroupDescription>> {
    if !config.is_built_grouped(out) {
        return Err(Error::NotBuilt { config, out });
    }
    p.validate(out)?;
    if config.info().arch == 100 {
        // The kernel's own check refuses these: its typed error rather than the shim's -1.
        p.check_sm100(out)?;
    }
    check_len("offsets", offsets.len(), p.experts + 1, "E + 1 expert offsets")?;
    if let Some(s) = expert_scales {
        check_len("expert_scales", s.len(), p.experts, "one per expert")?;
    }
    if expert >= p.experts {
        return Err(Error::InvalidData { what: "expert", detail: format!("{expert}: the problem has {} experts", p.experts) });
    }
    let args = bridge::GroupedArgs {
        a: BASE[0], b: BASE[1], sfa: BASE[2], sfb: BASE[3], d: BASE[4], sfd: if out.sfd().is_some() { BASE[5] } else { 0 },
        offsets: offsets.as_ptr() as u64, expert_alpha: expert_scales.map_or(0, |s| s.as_ptr() as u64),
        alpha: p.alpha, sm_count: 1,
        ..crate::grouped::grouped_args(p)
    };
    // SAFETY: offsets and expert_scales are host slices of the lengths checked above; the
    // builder reads nothing else.
    let v = describe_values("describe_grouped", |values| unsafe { bridge::describe_grouped(config.info().index, out.index(), &args, expert as i32, values) })?;
    v.map(|v| read_description(&v, BASE, out.sfd().is_some())).transpose()
}

/// One list-form group as the host would place it on the device, for [`describe_grouped_list`]:
/// its sizes (M, N, K) and the byte offsets of its operands from the stand-in bases the answer
/// is read against (`None`: a null address; offsets not a multiple of 16 give misaligned ones).
#[derive(Clone, Copy, Debug)]
pub struct ListGroupAt {
    /// M, N, K, as the device's `problems` array holds them.
    pub mnk: [i32; 3],
    /// Offsets of A, B, SFA, SFB, D, SFD and C (the order of [`GroupDescription`]'s bases),
    /// each below 2^40; `None`: a null address.
    pub at: [Option<u64>; 7],
    /// The group's factor of alpha.
    pub alpha: f32,
}

/// The arguments the list-form kernel of `config` with `out` output builds for group `group` of
/// `groups` (sizes and addresses as the device arrays would hold them), under the bounds of `p`.
/// `Ok(None)` for kernels that build none (SM90: the prologue makes descriptors instead).
pub fn describe_grouped_list(config: Config, out: OutType, p: &crate::grouped_list::ListProblem, groups: &[ListGroupAt], group: usize) -> Result<Option<GroupDescription>> {
    if !config.is_built_grouped_list(out) {
        return Err(Error::NotBuilt { config, out });
    }
    p.validate(out, p.beta != 0.0)?;
    check_len("groups", groups.len(), p.groups, "one per group of the problem")?;
    if group >= p.groups {
        return Err(Error::InvalidData { what: "group", detail: format!("{group}: the problem has {} groups", p.groups) });
    }
    let problems: Vec<i32> = groups.iter().flat_map(|g| g.mnk).collect();
    // Each operand's addresses are its base plus the offset, the bases SPACING apart, so that
    // every address reads back as the offset it was made from.
    const SPACING: u64 = 1 << 40;
    let addr = |i: usize| -> Result<Vec<u64>> {
        groups
            .iter()
            .enumerate()
            .map(|(g, grp)| match grp.at[i] {
                None => Ok(0),
                Some(x) if x < SPACING => Ok(BASE[i] + x),
                Some(x) => Err(Error::InvalidData { what: "at", detail: format!("group {g}, address {i}: offset {x}; at most 2^40 - 1 (each operand's addresses are made 2^40 apart)") }),
            })
            .collect()
    };
    let arrays: Vec<Vec<u64>> = (0..7).map(addr).collect::<Result<_>>()?;
    let alphas: Vec<f32> = groups.iter().map(|g| g.alpha).collect();
    let dim = |v: usize| i32::try_from(v).unwrap_or(i32::MAX);
    let args = bridge::GroupedListArgs {
        groups: dim(p.groups), max_m: dim(p.max_m), max_n: dim(p.max_n), max_k: dim(p.max_k), max_rows: p.max_rows as i64,
        problems: problems.as_ptr() as u64,
        a: arrays[0].as_ptr() as u64, b: arrays[1].as_ptr() as u64, sfa: arrays[2].as_ptr() as u64, sfb: arrays[3].as_ptr() as u64,
        d: arrays[4].as_ptr() as u64, sfd: if out.sfd().is_some() { arrays[5].as_ptr() as u64 } else { 0 },
        c: if p.beta != 0.0 { arrays[6].as_ptr() as u64 } else { 0 },
        alphas: alphas.as_ptr() as u64, alpha: p.alpha, beta: p.beta, norm_constant: p.norm_constant, sm_count: 1,
        ..Default::default()
    };
    // SAFETY: problems holds 3G int32, each address array and alphas G entries, all host
    // vectors alive across the calls; the builder reads nothing else.
    let v = describe_values("describe_grouped_list", |values| unsafe { bridge::describe_grouped_list(config.info().index, out.index(), &args, group as i32, values) })?;
    v.map(|v| read_description(&v, BASE, out.sfd().is_some())).transpose()
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
    // The layout's C++ rounds the rows up in 32-bit signed integers.
    p.check_dims(Problem::MAX_EXTENT)?;
    let rows = if operand_b { p.n } else { p.m };
    let count = checked_product("SF offsets", "rows * K / 16 * L", &[("rows", rows), ("K / 16", p.k / 16), ("L", p.l)])?;
    let mut offsets: Vec<i64> = try_zeros("SF offsets", count)?;
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
    crate::problem::check_c(p, c.map(<[f32]>::len))?;
    let cosize = bridge::host_sfd_cosize(p.m as i32, p.n as i32, p.l as i32);
    if cosize < 0 || cosize as usize > p.sfd_bytes() {
        return Err(Error::InvalidData { what: "SFD layout", detail: format!("CUTLASS's SFD layout spans {cosize} bytes, the buffer {}", p.sfd_bytes()) });
    }
    let c = c.filter(|_| p.beta != 0.0).unwrap_or(&[]);
    let mut d = try_zeros::<u8>("D", p.cd_elems() / 2)?;
    let mut sfd = try_zeros::<u8>("SFD", p.sfd_bytes())?;
    let ue8m0 = format == SfdFormat::Ue8m0;
    bridge::host_gemm_fp4(p.m as i32, p.n as i32, p.k as i32, p.l as i32, a, sfa, b, sfb, c, p.alpha, p.beta, p.norm_constant, ue8m0, &mut d, &mut sfd);
    Ok((d, sfd))
}

/// Bytes CUTLASS's `Sm1xxBlockScaledOutputConfig<16>::tile_atom_to_shape_SFD` layout spans for
/// (M, N, L) (its cosize without the zero strides).
pub fn sfd_cosize(m: usize, n: usize, l: usize) -> Result<usize> {
    Problem::new(m, n, 32).batch(l).check_dims(i32::MAX as usize)?;
    let cosize = bridge::host_sfd_cosize(m as i32, n as i32, l as i32);
    usize::try_from(cosize).map_err(|_| Error::InvalidData { what: "SFD layout", detail: format!("the shim answered {cosize} for M = {m}, N = {n}, L = {l}") })
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
