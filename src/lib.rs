//! NVFP4 block-scaled GEMM for NVIDIA GPUs: `D = alpha * A·Bᵀ + beta * C`, A and B in NVFP4
//! (e2m1 values, one ue4m3 scale per 16 elements of K, a per-tensor global scale), FP32
//! accumulation, D in f16, bf16, f32 or NVFP4 again.
//!
//! # The two architectures
//! - **Blackwell** (B200, GB200; compute capability 10.0): CUTLASS's block-scaled UMMA kernels,
//!   the path of CUTLASS examples 72a/72b, in 1-SM and 2-SM tile/cluster configs; the
//!   mixture-of-experts GEMM as CUTLASS's pointer-array grouped kernel (example 75). **Not yet
//!   run on hardware:** no SM100 machine has been available to the project, so this path is
//!   compiled (its SASS checked) and its host side tested on the CPU, but no result of it has
//!   been checked on a B200. Check its first results against [`compare::verify`] before relying
//!   on it. f32 output and W4A16 are Hopper only.
//! - **Hopper** (H100, H200; 9.0), which has no FP4 tensor cores: our exact kernels decode NVFP4
//!   on chip to FP16 (exact: every e2m1 value times a ue4m3 scale is an FP16 value) and run
//!   `wgmma` or `mma.sync` with FP32 accumulation; small-M tiles for decode steps and MoE experts
//!   (M <= 32, and to 64 where K ranges are short: one launch, the weights streamed once; else
//!   at 33-64 rows a swapped 64-row tile after a pre-pass, which [`Nvfp4Activations`] saves
//!   where the activations come from [`Quantizer`]). W4A16 ([`w4a16`]): bf16 or f16
//!   activations as they are, the weights decoded into their type (exact as well).
//!
//! [`Config`] lists the kernels ([`Config::is_built`]: those of this build);
//! [`BlockScaledGemm::select_config`] says which one a problem gets on the stream's device, and
//! [`BlockScaledGemm::gemm`] picks it for you.
//!
//! # Requirements
//! An NVIDIA driver for CUDA 13.0 or newer (R580+: the kernels link the CUDA 13.0 runtime
//! statically, which refuses older drivers). With this crate's default cudarc features libcuda is
//! loaded at run time, and cudarc panics where it is missing: call
//! [`BlockScaledGemm::driver_present`] first on machines that may have no driver. Where another
//! crate turns on cudarc's `dynamic-linking` (candle does), libcuda is linked at load time
//! instead, and a program without it does not start. Building needs Python 3 with pip (the
//! pinned nvcc and CUTLASS come from PyPI) or an installed toolkit (`CUDA_HOME`,
//! `CUTLASS_DIR`); see the README.
//!
//! # Operands, layouts and global scales
//! An operand is an [`Nvfp4Tensor`]: (batch, rows, K) packed e2m1 values, row-major with K
//! contiguous (PyTorch `float4_e2m1fn_x2`, element 2i in the low nibble), ue4m3 scales in the
//! 128x4-tiled layout of cuBLAS, CUTLASS and `torch._scaled_mm` ([`layout`] converts from
//! row-major), and a global scale. A is (L, M, K) and B is (L, N, K), so `D = A·Bᵀ` is PyTorch's
//! `a @ b.T` with B as a `Linear` weight stored (out_features, in_features). The GEMM folds both
//! global scales into alpha (`alpha * ga * gb`, f32, left to right), as cuBLASLt and
//! `torch._scaled_mm` take their scales: a checkpoint's `weight_scale_2` or the quantizer's scale
//! cannot be forgotten. [`Nvfp4Matrix::quantize`] quantizes on the host (computed global scale,
//! or ModelOpt's `input_scale` given).
//!
//! # Streams, threads and memory from other libraries
//! A [`BlockScaledGemm`] launches on the one cudarc stream it was made with; every buffer must
//! live on that stream's device (a typed error otherwise). It is `Send + Sync`: calls from several
//! threads are serialized by a lock around its workspace and queue on its stream in that order;
//! for work on several streams at once, make one per stream. The per-thread default stream
//! (`CudaContext::per_thread_stream`, the stream of candle's `Device::new_cuda`) is another stream
//! on each thread: a GEMM made on it serves the thread that made it ([`Error::PerThreadStream`]
//! on others). Device memory that another library
//! owns goes in as a [`ForeignBuffer`] (a raw pointer with a lifetime, no copy):
//!
//! ```no_run
//! use blockscaled_gemm::{BlockScaledGemm, ForeignBuffer, Nvfp4Tensor, Problem};
//! use cudarc::driver::CudaContext;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let stream = CudaContext::new(0)?.new_stream()?;
//! let gemm = BlockScaledGemm::new(stream.clone())?;
//! let (m, n, k) = (16, 4096, 7168);
//! // Addresses and lengths as another library hands them over (here: three cudarc buffers).
//! # let (xv, xs, wv, ws, y) = (stream.alloc_zeros::<u8>(m * k / 2)?, stream.alloc_zeros::<u8>(128 * 448)?, stream.alloc_zeros::<u8>(n * k / 2)?, stream.alloc_zeros::<u8>(n * 448)?, stream.alloc_zeros::<half::bf16>(m * n)?);
//! # use cudarc::driver::DevicePtr;
//! # let (x_ptr, x_sf_ptr, w_ptr, w_sf_ptr, y_ptr) = (xv.device_ptr(&stream).0, xs.device_ptr(&stream).0, wv.device_ptr(&stream).0, ws.device_ptr(&stream).0, y.device_ptr(&stream).0);
//! // SAFETY: each pointer holds the given count of elements on this stream's device, stays
//! // allocated while the buffers live, and its owner orders its work on `stream`.
//! let (x, w, mut out) = unsafe {
//!     (
//!         Nvfp4Tensor::new(ForeignBuffer::<u8>::new(x_ptr, m * k / 2, &stream), ForeignBuffer::<u8>::new(x_sf_ptr, 128 * k / 16, &stream), (1, m, k), 1.0)?,
//!         Nvfp4Tensor::new(ForeignBuffer::<u8>::new(w_ptr, n * k / 2, &stream), ForeignBuffer::<u8>::new(w_sf_ptr, n * k / 16, &stream), (1, n, k), 0.0125)?,
//!         ForeignBuffer::<half::bf16>::new(y_ptr, m * n, &stream),
//!     )
//! };
//! gemm.gemm(&Problem::new(m, n, k), &x, &w, &mut out, None)?;
//! # Ok(()) }
//! ```
//!
//! # CUDA graphs
//! A call does no allocation once the workspace suffices, no host synchronisation and no host
//! read, so decode steps can be captured. Capture on a stream made with `new_stream()` (the
//! legacy default stream cannot be captured), reserve the workspace (or make one eager call per
//! shape) before capturing, and turn cudarc's event tracking off before allocating the buffers
//! the graph uses, as engines do; with it on, a call during capture returns
//! [`Error::CaptureEventTracking`] instead of breaking the capture, and one that needs more
//! workspace returns [`Error::WorkspaceDuringCapture`] instead of allocating.
//!
//! ```no_run
//! use blockscaled_gemm::{BlockScaledGemm, Nvfp4Matrix, Nvfp4Tensor, OutType, Problem};
//! use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
//! use cudarc::driver::CudaContext;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ctx = CudaContext::new(0)?;
//! // SAFETY: this program orders every use of its buffers on the one stream.
//! unsafe { ctx.disable_event_tracking() };
//! let stream = ctx.new_stream()?;
//! let gemm = BlockScaledGemm::new(stream.clone())?;
//! let (m, n, k) = (1, 7168, 16384);
//! let x = Nvfp4Tensor::upload(&Nvfp4Matrix::random_realistic((1, m, k), 1)?, &stream)?;
//! let w = Nvfp4Tensor::upload(&Nvfp4Matrix::random_realistic((1, n, k), 2)?, &stream)?;
//! let mut y = stream.alloc_zeros::<half::bf16>(m * n)?;
//! let p = Problem::new(m, n, k);
//! gemm.reserve_workspace(gemm.workspace_size(&p, OutType::Bf16, None)?)?;
//! stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
//! gemm.gemm(&p, &x, &w, &mut y, None)?;
//! let graph = stream.end_capture(CUgraphInstantiate_flags(0))?.expect("a graph");
//! for _ in 0..3 {
//!     graph.launch()?; // new data copied into x between replays is picked up
//! }
//! stream.synchronize()?;
//! # Ok(()) }
//! ```
//! Graphs must not be replayed after the `BlockScaledGemm` whose calls they captured is dropped
//! (its workspace goes with it).
//!
//! # Modules
//! - [`BlockScaledGemm`]: the GEMM on a cudarc stream, every argument checked before the FFI
//!   line. [`Nvfp4Tensor`], [`ForeignBuffer`], [`Nvfp4Output`]: its device operands.
//! - [`reference`](mod@reference), [`reference_gemm`], [`compare`]: the exact CPU reference
//!   every result is compared with, and the verdict.
//! - [`fp4_out`]: FP4 output (CUTLASS example 72b): e2m1 D plus generated scale factors, bit for
//!   bit as CUTLASS's host reference computes them.
//! - [`formats`], [`layout`], [`Nvfp4Matrix`]: NVFP4 values, the 128x4 tiled scale layout, host
//!   tensors, generators and the ModelOpt-style quantizer; [`Quantizer`] the same quantizer on
//!   the GPU, bit for bit, also fused behind SwiGLU ([`swiglu`]: its arithmetic on the host).
//! - [`w4a16`]: bf16 or f16 activations as they are times NVFP4 weights
//!   ([`BlockScaledGemm::gemm_w4a16`], [`BlockScaledGemm::moe_gemm_w4a16`]; Hopper), exact as the
//!   NVFP4 GEMM, with its exact reference; [`grouped`]: the mixture-of-experts GEMM;
//!   [`checkpoint`]: NVFP4 checkpoints (ModelOpt, compressed-tensors) as operands.
//! - `candle` (feature `candle`, off by default): `Nvfp4Linear`, an NVFP4 linear layer, and
//!   `Nvfp4Experts`, a mixture-of-experts layer's grouped GEMM, on candle's CUDA tensors, their
//!   input bf16 or f16 as it is (W4A16) or quantized on the GPU (`LinearMode`).
//!
//! Layers, bottom up: `sys` (the launch ABI through bindgen and the cxx bridge, unsafe);
//! `dispatch` (the generated config table and the rule that picks a config and split, pure
//! functions); [`gemm`] and `tensor` (the safe API: validation, planning, the one place that
//! assembles launch arguments); beside them the reference side ([`reference`](mod@reference),
//! [`fp4_out`], [`cutlass_host`], [`compare`]), which never calls the GPU path.
#[cfg(feature = "candle")]
pub mod candle;
pub mod checkpoint;
mod clusters;
pub mod compare;
pub mod cutlass_host;
pub mod dispatch;
mod error;
pub mod formats;
pub mod fp4_out;
pub mod gemm;
pub mod grouped;
pub mod grouped_list;
pub mod layout;
mod matrix;
mod problem;
mod quantize;
pub mod reference;
pub mod swiglu;
mod sys;
mod tensor;
pub mod w4a16;

/// The cudarc this crate's API takes (its streams, buffers and `DevicePtr` traits): name it
/// through here to be sure of the same version.
pub use cudarc;
/// The `half` whose `f16` and `bf16` the API takes.
pub use half;

pub use dispatch::{ClusterCounts, Config, ConfigInfo, Schedule, ANY_CLUSTERS, SM90_MAX_CLUSTER_SPLIT, SM90_MAX_SPLIT_TILES};
pub use error::{Error, Result};
pub use formats::OutputElement;
pub use gemm::{BlockScaledGemm, Nvfp4Output};
pub use grouped::{MoeActivations, MoeProblem};
pub use grouped_list::{ListArrays, ListGroup, ListProblem};
pub use matrix::{reference_gemm, HostFloat, Nvfp4Matrix, SplitMix64};
pub use problem::{OutType, Problem, SfdFormat};
pub use quantize::{QuantInput, Quantizer};
pub use layout::WeightLayout;
pub use tensor::{ForeignBuffer, Nvfp4Activations, Nvfp4Tensor};
pub use w4a16::Activation16;

/// The README's code blocks, compiled by `cargo test --doc` so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
