//! Host-side questions to the compiled CUTLASS kernels, answered without a GPU: the scale-factor
//! layout CUTLASS computes, `can_implement`, and workspace sizes. The tests use these to hold
//! the Rust layout and validator to CUTLASS's own.

use crate::config::Config;
use crate::error::{Error, Result};
use crate::ffi::bridge;
use crate::problem::{OutType, Problem};

fn args(p: &Problem) -> bridge::LaunchArgs {
    bridge::LaunchArgs {
        m: p.m as i32,
        n: p.n as i32,
        k: p.k as i32,
        l: p.l as i32,
        // Aligned, never dereferenced: these calls only inspect shapes and layouts.
        a: 1 << 20,
        sfa: 1 << 20,
        b: 1 << 20,
        sfb: 1 << 20,
        c: 1 << 20,
        d: 1 << 20,
        alpha: p.alpha,
        beta: p.beta,
        workspace: 0,
        workspace_bytes: 0,
        stream: 0,
        device_id: 0,
        sm_count: 1,
        split_k: 1,
    }
}

fn built(config: Config, out: OutType) -> Result<()> {
    if !config.is_built(out) {
        return Err(Error::NotBuilt { config, out });
    }
    Ok(())
}

/// CUTLASS `GemmUniversalAdapter::can_implement` for `config` with `out` output on `p`
/// (host arguments built as the launch builds them).
pub fn can_implement(config: Config, out: OutType, p: &Problem) -> Result<bool> {
    built(config, out)?;
    p.check_dims(i32::MAX as usize)?;
    Ok(bridge::can_implement(config.info().index, out.index(), &args(p)))
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
