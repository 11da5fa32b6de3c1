//! Host-side questions to the compiled CUTLASS kernels, answered without a GPU: the scale-factor
//! layout CUTLASS computes, `can_implement`, and workspace sizes. The tests use these to hold
//! the Rust layout and validator to CUTLASS's own.

use crate::dispatch::Config;
use crate::error::{Error, Result};
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
    let args = bridge::GroupedArgs { rows: dim("T", p.rows)?, n: dim("N", p.n)?, k: dim("K", p.k)?, experts: dim("experts", p.experts)?, ..Default::default() };
    Ok(bridge::can_implement_grouped(config.info().index, out.index(), &args))
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
