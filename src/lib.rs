//! NVFP4 block-scaled GEMM for NVIDIA GPUs.
//!
//! - [`BlockScaledGemm`]: the GEMM on a cudarc stream, every argument checked before the FFI
//!   line. Underneath: on B200/GB200 (SM100) CUTLASS's block-scaled kernels (the path of CUTLASS
//!   example 72a/72b); on H100/H200 (SM90) our exact kernels, which decode NVFP4 on chip to FP16
//!   for the tensor cores, with small-M tiles for decode steps and MoE experts (M <= 64: one
//!   launch, the weights streamed once). [`Config`] lists them and [`select_config`] says which a
//!   problem gets.
//! - [`reference`](mod@reference), [`reference_gemm`]: the exact CPU reference every result is compared with.
//! - [`fp4_out`]: FP4 output (CUTLASS example 72b): e2m1 D plus generated scale factors, bit for
//!   bit as CUTLASS's host reference computes them.
//! - [`formats`], [`layout`], [`Nvfp4Matrix`]: NVFP4 values, the 128x4 tiled scale layout, host
//!   tensors, generators and a ModelOpt-style quantizer.
//!
//! Layers, bottom up: `sys` (the launch ABI through bindgen and the cxx bridge, unsafe);
//! `dispatch` (the generated config table and the rule that picks a config and split, pure
//! functions); [`gemm`] (the safe API: validation, planning, the one place that assembles launch
//! arguments); beside them the reference side ([`reference`](mod@reference), [`fp4_out`], [`cutlass_host`],
//! [`compare`]), which never calls the GPU path.
mod clusters;
pub mod compare;
pub mod cutlass_host;
mod dispatch;
mod error;
pub mod formats;
pub mod fp4_out;
pub mod gemm;
pub mod layout;
mod matrix;
mod problem;
pub mod reference;
mod sys;

pub use dispatch::{check_split_k, cluster_reduced, cluster_split, select as select_config, split_k as config_split_k, ClusterCounts, Config, ConfigInfo, Schedule, ANY_CLUSTERS, SM90_MAX_CLUSTER_SPLIT, SM90_MAX_SPLIT_TILES};
pub use error::{Error, Result};
pub use formats::OutputElement;
pub use gemm::{BlockScaledGemm, Nvfp4Operand, Nvfp4Output};
pub use matrix::{reference_gemm, Nvfp4Matrix, SplitMix64};
pub use problem::{OutType, Problem, SfdFormat};
