//! NVFP4 block-scaled GEMM for NVIDIA GPUs.
pub mod compare;
mod error;
pub mod formats;
pub mod layout;
mod matrix;
mod problem;
pub mod reference;

pub use error::{Error, Result};
pub use formats::OutputElement;
pub use matrix::{reference_gemm, Nvfp4Matrix, SplitMix64};
pub use problem::{OutType, Problem};
/// Placeholder until the config table lands.
pub type Config = u32;
