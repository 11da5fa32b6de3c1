//! Compiles only if this crate and candle's cudarc are one cudarc: a candle-style buffer goes
//! into the GEMM as it is.

use std::sync::Arc;

use blockscaled_gemm::{BlockScaledGemm, Nvfp4Tensor, Problem};
use cudarc::driver::{CudaSlice, CudaStream};

/// One GEMM over buffers an engine already holds on its stream.
pub fn linear(stream: &Arc<CudaStream>, x: (&CudaSlice<u8>, &CudaSlice<u8>), w: (&CudaSlice<u8>, &CudaSlice<u8>), w_scale: f32, y: &mut CudaSlice<half::bf16>, (m, n, k): (usize, usize, usize)) -> blockscaled_gemm::Result<()> {
    let gemm = BlockScaledGemm::new(stream.clone())?;
    let x = Nvfp4Tensor::new(x.0.as_view(), x.1.as_view(), (1, m, k), 1.0)?;
    let w = Nvfp4Tensor::new(w.0.as_view(), w.1.as_view(), (1, n, k), w_scale)?;
    gemm.gemm(&Problem::new(m, n, k), &x, &w, y, None)?;
    Ok(())
}
