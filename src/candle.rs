//! candle integration (feature `candle`): [`Nvfp4Linear`], an NVFP4 linear layer whose input and
//! output are candle tensors on candle's CUDA device, run on that device's stream.
//!
//! `forward` takes the input (bf16 or f16, `[..., K]`, contiguous, its first element 16-byte
//! aligned), runs `y = x Wᵀ` against the NVFP4 weight and returns `[..., N]` in the input's
//! dtype, with no host synchronisation and no copy of the input or output. How it takes the
//! input is the layer's [`LinearMode`]:
//! - [`LinearMode::Nvfp4`]: quantized on the GPU with the layer's input scale, then the NVFP4 x
//!   NVFP4 GEMM: the quantizer's launch and the GEMM's (on Hopper, from 33 rows at most shapes, a
//!   pre-pass that decodes the activations and then the GEMM: [`BlockScaledGemm::select_config`]
//!   says which). Runs where [`BlockScaledGemm::gemm`] does (Hopper and Blackwell).
//! - [`LinearMode::W4a16`]: the input as it is, the weights decoded to its type on chip
//!   ([`BlockScaledGemm::gemm_w4a16`]): one launch (from 33 rows at most shapes, a pre-pass and
//!   the GEMM), no activation quantization error, and no input scale needed. Hopper only.
//!
//! `forward` allocates its output, as candle ops do, so it refuses CUDA-graph capture
//! ([`crate::Error::NotCapturable`]). In `Nvfp4` mode the quantized input goes into buffers the
//! layer keeps for each stream it runs on, grown to the largest row count seen (K / 2 bytes a
//! row and the tiled scales, rows rounded up to 128), so a forward allocates nothing else of its
//! own (the GEMM's workspace grows as for any call). An engine that replays graphs calls
//! [`crate::Quantizer::quantize_into`] (or `quantize_decoded_into`) and [`BlockScaledGemm::gemm`],
//! or [`BlockScaledGemm::gemm_w4a16`], on buffers it allocated before capture, with the layer's
//! [`Nvfp4Linear::weight`].
//!
//! candle's `Device::new_cuda` runs on the per-thread default stream, a different stream on each
//! host thread: on such a device the layer keeps one GEMM (and so one workspace) per calling
//! thread (with its activation buffers), each until the layer is dropped, so it can be shared
//! between threads. A workspace
//! holds the swapped tiles' decoded activations (2 * rows * K bytes and more: at least 58.7 MB
//! for 4096 rows of K = 7168), and a thread that ends does not give it back: an engine whose
//! worker threads come and go should use a device with a stream of its own
//! (`Device::new_cuda_with_stream`), where every thread shares one GEMM.
//!
//! ```no_run
//! use blockscaled_gemm::candle::Nvfp4Linear;
//! use blockscaled_gemm::{Nvfp4Matrix, Nvfp4Tensor};
//! use candle_core::{DType, Device, Tensor};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let device = Device::new_cuda(0)?;
//! let (n, k) = (4096, 7168);
//! // A weight as a checkpoint holds it (here: random), and the activations' input scale.
//! let w = Nvfp4Matrix::random_realistic(n, k, 1, 7)?;
//! let layer = Nvfp4Linear::from_matrix(&w, 1.0 / 448.0, device.as_cuda_device()?)?;
//! let x = Tensor::randn(0f32, 1.0, (2, 16, k), &device)?.to_dtype(DType::BF16)?;
//! let y = layer.forward(&x)?;
//! assert_eq!(y.dims(), &[2, 16, n]);
//! // The same weight with the activations kept in bf16 (W4A16, Hopper).
//! let cuda = device.as_cuda_device()?;
//! let w4a16 = Nvfp4Linear::w4a16(Nvfp4Tensor::upload(&w, &cuda.cuda_stream())?, cuda)?;
//! assert_eq!(w4a16.forward(&x)?.dims(), &[2, 16, n]);
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use candle_core::backend::{BackendDevice, BackendStorage};
use candle_core::{bail, CpuStorage, CudaDevice, CudaStorage, CustomOp1, DType, Layout, Shape, Tensor};
use cudarc::driver::{CudaSlice, CudaView};

use crate::error::Result;
use crate::gemm::BlockScaledGemm;
use crate::matrix::{check_global_scale, Nvfp4Matrix};
use crate::problem::{folded_alpha, OutType, Problem};
use crate::quantize::Quantizer;
use crate::tensor::Nvfp4Tensor;
use crate::w4a16::Activation16;

/// How an [`Nvfp4Linear`] takes its bf16 or f16 input.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LinearMode {
    /// Quantized to NVFP4 on the GPU with this global scale (ModelOpt's `input_scale`, in this
    /// crate's convention: `Checkpoint::layer_to_device` returns it so), then the NVFP4 x NVFP4
    /// GEMM, both global scales folded into its alpha.
    Nvfp4 {
        /// The activations' global scale: finite and positive.
        input_scale: f32,
    },
    /// As it is (W4A16): the weights decoded to the input's type on chip, the weight's global
    /// scale folded into alpha; exact against [`crate::reference::w4a16_dots`]. Hopper only.
    W4a16,
}

/// `y = x Wᵀ` with W an NVFP4 weight of shape (N, K) (PyTorch's `Linear` layout), on candle
/// tensors: x quantized to NVFP4 on the GPU with a fixed global scale, or taken as it is (W4A16),
/// as the layer's [`LinearMode`] says.
pub struct Nvfp4Linear {
    // Fields drop in this order: the lanes' GEMMs synchronize their streams (the context, when
    // dropped on another thread) before the weight and the activation buffers are freed, so no
    // kernel still reads them. Keep the lanes first.
    /// The lane every thread uses where the device's stream is its own; else `None` and one lane
    /// per calling thread in `lanes` (see the module docs), each as long as the layer lives.
    shared: Option<Arc<Lane>>,
    lanes: Mutex<HashMap<ThreadId, Arc<Lane>>>,
    weight: Nvfp4Tensor,
    mode: LinearMode,
    device: CudaDevice,
}

/// What a forward on one stream uses: its GEMM (and workspace), quantizer and the quantized
/// input's buffers (in `Nvfp4` mode), kept from one forward to the next.
struct Lane {
    // Before `acts`: its drop synchronizes the stream, so the buffers are freed after the last
    // launch that reads them.
    gemm: BlockScaledGemm,
    quantizer: Quantizer,
    /// None until a forward allocates them, and after a failed growth. A forward holds the lock
    /// from the quantizer's launch to the GEMM's, so another thread on the same stream cannot
    /// overwrite the buffers in between (stream order does the rest).
    acts: Mutex<Option<Acts>>,
}

/// Codes and tiled scales of up to `rows` rows of K.
struct Acts {
    rows: usize,
    codes: CudaSlice<u8>,
    scales: CudaSlice<u8>,
}

impl Lane {
    fn new(stream: std::sync::Arc<cudarc::driver::CudaStream>) -> Result<Self> {
        Ok(Lane { gemm: BlockScaledGemm::new(stream.clone())?, quantizer: Quantizer::new(stream), acts: Mutex::new(None) })
    }
}

impl Nvfp4Linear {
    /// A layer over a weight already on `device` (batch 1: `(1, N, K)`; its buffers on the
    /// device's stream; standard or, on Hopper, prepacked: `Nvfp4Tensor::prepack`) whose input is
    /// quantized with `input_scale` ([`LinearMode::Nvfp4`]): the activations' global scale,
    /// finite and positive, whose product with the weight's global scale (the GEMM's alpha) must
    /// be a nonzero finite f32.
    pub fn new(weight: Nvfp4Tensor, input_scale: f32, device: &CudaDevice) -> Result<Self> {
        Self::with_mode(weight, LinearMode::Nvfp4 { input_scale }, device)
    }

    /// A W4A16 layer ([`LinearMode::W4a16`]) over a weight as [`Self::new`] takes it. Refused
    /// ([`crate::Error::UnsupportedDevice`]) on a device without W4A16 kernels (Blackwell: use
    /// [`Self::new`] there).
    pub fn w4a16(weight: Nvfp4Tensor, device: &CudaDevice) -> Result<Self> {
        Self::with_mode(weight, LinearMode::W4a16, device)
    }

    /// A layer over a weight as [`Self::new`] takes it, taking its input as `mode` says.
    pub fn with_mode(weight: Nvfp4Tensor, mode: LinearMode, device: &CudaDevice) -> Result<Self> {
        let input_scale = match mode {
            LinearMode::Nvfp4 { input_scale } => {
                check_global_scale(input_scale)?;
                input_scale
            }
            LinearMode::W4a16 => 1.0,
        };
        // A weight on another GPU would fail every forward: refused here.
        let ordinal = device.cuda_stream().context().ordinal();
        crate::gemm::check_devices(ordinal, [("weight values", weight.values().stream()), ("weight scales", weight.scales().stream())])?;
        // Every forward folds the scales into alpha as `1 * input_scale * weight scale`: a pair
        // whose product under- or overflows would fail each call, so refuse it here.
        folded_alpha(1.0, input_scale, weight.global_scale())?;
        let (batch, n, k) = weight.shape();
        if batch != 1 {
            return Err(crate::Error::OperandShape { name: "weight", got: (batch, n, k), want: (1, n, k) });
        }
        let lane = Arc::new(Lane::new(device.cuda_stream())?);
        if mode == LinearMode::W4a16 {
            // A device without W4A16 kernels, or a weight they cannot take, fails every forward.
            lane.gemm.select_w4a16_config_for(&Problem::new(1, n, k), OutType::Bf16, weight.layout())?;
        }
        let (shared, lanes) = if lane.gemm.per_thread_stream() {
            (None, HashMap::from([(std::thread::current().id(), lane)]))
        } else {
            (Some(lane), HashMap::new())
        };
        Ok(Nvfp4Linear { weight, mode, device: device.clone(), shared, lanes: Mutex::new(lanes) })
    }

    /// The lane for this thread: the shared one, else this thread's, made on first use.
    fn lane(&self) -> Result<Arc<Lane>> {
        if let Some(l) = &self.shared {
            return Ok(l.clone());
        }
        let mut lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
        let id = std::thread::current().id();
        if let Some(l) = lanes.get(&id) {
            return Ok(l.clone());
        }
        let l = Arc::new(Lane::new(self.device.cuda_stream())?);
        lanes.insert(id, l.clone());
        Ok(l)
    }

    /// [`Self::new`] on a host weight (`(1, N, K)`, with its global scale) uploaded onto `device`'s stream.
    pub fn from_matrix(weight: &Nvfp4Matrix, input_scale: f32, device: &CudaDevice) -> Result<Self> {
        Self::new(Nvfp4Tensor::upload(weight, &device.cuda_stream())?, input_scale, device)
    }

    /// The weight.
    pub fn weight(&self) -> &Nvfp4Tensor {
        &self.weight
    }

    /// How the layer takes its input.
    pub fn mode(&self) -> LinearMode {
        self.mode
    }

    /// `x` (bf16 or f16, `[..., K]`, on this layer's CUDA device) times the weight transposed:
    /// `[..., N]` in x's dtype. Asynchronous on the device's stream, as every candle op.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        x.apply_op1_no_bwd(self)
    }

    /// `x` (`rows` x K) times the weight transposed, into a new buffer, as the mode says.
    fn run<T: Activation16>(&self, x: &CudaView<'_, T>, rows: usize) -> Result<CudaSlice<T>> {
        let lane = self.lane()?;
        match self.mode {
            LinearMode::Nvfp4 { input_scale } => self.run_nvfp4(&lane, x, rows, input_scale),
            LinearMode::W4a16 => {
                let (_, n, k) = self.weight.shape();
                // SAFETY: the GEMM below writes every element before anyone reads y; on an
                // error y is dropped unread.
                let mut y = unsafe { lane.gemm.stream().alloc::<T>(rows * n)? };
                lane.gemm.gemm_w4a16(&Problem::new(rows, n, k), x, &self.weight, &mut y, None)?;
                Ok(y)
            }
        }
    }

    /// Quantizes `x` (`rows` x K) into the lane's buffers and multiplies it with the weight into
    /// a new buffer.
    fn run_nvfp4<T: Activation16>(&self, lane: &Lane, x: &CudaView<'_, T>, rows: usize, input_scale: f32) -> Result<CudaSlice<T>> {
        let (_, n, k) = self.weight.shape();
        let stream = lane.gemm.stream();
        let code_bytes = |r: usize| r.checked_mul(k).map(|e| e / 2);
        let sf = |r: usize| crate::layout::checked_sf_bytes(r, k, 1);
        let too_big = || crate::Error::SizeLimit { what: "quantized input bytes", rule: "rows * K / 2 and the tiled scales", dims: format!("rows = {rows}, K = {k}"), value: rows as u128 * k as u128 / 2, max: usize::MAX as u128, why: "address space" };
        // The quantizer's limits, before any buffer grows for a call that would be refused.
        crate::matrix::check_quantizer_dims((1, rows, k))?;
        let mut slot = lane.acts.lock().unwrap_or_else(|e| e.into_inner());
        // Taken out: kept if large enough, else its buffers go first (a free is ordered on the
        // stream after the launches that read them), so a failed allocation leaves the lane
        // empty and the next forward allocates again.
        let acts = match slot.take() {
            Some(acts) if acts.rows >= rows => slot.insert(acts),
            held => {
                // Grown to at least twice the rows held (within the quantizer's limit), in whole
                // 128-row scale tiles, so that batches of varying size settle on one allocation.
                let held_rows = held.map_or(0, |a| a.rows);
                let want = rows.max(held_rows.saturating_mul(2)).min(crate::matrix::QUANTIZER_MAX_ROWS).checked_next_multiple_of(128).ok_or_else(too_big)?;
                let (cb, sb) = (code_bytes(want).ok_or_else(too_big)?, sf(want).ok_or_else(too_big)?);
                // SAFETY: the quantizer writes every byte a GEMM reads (codes of `rows` rows,
                // their scales with the tiles' padding) before the GEMM in stream order.
                let (codes, scales) = unsafe { (stream.alloc::<u8>(cb)?, stream.alloc::<u8>(sb)?) };
                slot.insert(Acts { rows: want, codes, scales })
            }
        };
        let (cb, sb) = (code_bytes(rows).ok_or_else(too_big)?, sf(rows).ok_or_else(too_big)?);
        let Acts { codes, scales, .. } = acts;
        lane.quantizer.quantize_into(x, (1, rows, k), input_scale, &mut codes.slice_mut(..cb), &mut scales.slice_mut(..sb))?;
        let xq = Nvfp4Tensor::new::<u8, u8>(codes.slice(..cb), scales.slice(..sb), (1, rows, k), input_scale)?;
        // SAFETY: the GEMM below writes every element before anyone reads y; on an error y is
        // dropped unread.
        let mut y = unsafe { stream.alloc::<T>(rows * n)? };
        lane.gemm.gemm(&Problem::new(rows, n, k), &xq, &self.weight, &mut y, None)?;
        Ok(y)
    }
}

impl Nvfp4Linear {
    /// [`Self::run`] on elements `range` of a candle buffer, into a new candle buffer.
    fn run_storage<T>(&self, x: &CudaStorage, range: std::ops::Range<usize>, rows: usize) -> candle_core::Result<CudaStorage>
    where
        T: Activation16 + candle_core::cuda::CudaDType,
    {
        let y = self.run(&x.as_cuda_slice::<T>()?.slice(range), rows).map_err(candle_core::Error::wrap)?;
        Ok(CudaStorage::wrap_cuda_slice(y, self.device.clone()))
    }
}

impl CustomOp1 for Nvfp4Linear {
    fn name(&self) -> &'static str {
        "nvfp4-linear"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let reference = match self.mode {
            LinearMode::Nvfp4 { .. } => "blockscaled_gemm::reference_gemm",
            LinearMode::W4a16 => "blockscaled_gemm::reference::w4a16_dots",
        };
        bail!("Nvfp4Linear runs on CUDA devices only (the exact CPU reference is {reference})")
    }

    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let (_, n, k) = self.weight.shape();
        let Some((start, end)) = layout.contiguous_offsets() else {
            bail!("Nvfp4Linear: the input must be contiguous (call .contiguous() first)");
        };
        let dims = layout.dims();
        match dims.last() {
            Some(&last) if last == k => {}
            Some(&last) => bail!("Nvfp4Linear: the input's last dimension is {last}, the weight's K is {k}"),
            None => bail!("Nvfp4Linear: the input is a scalar; [..., K] with K = {k} wanted"),
        }
        // The same candle device, not only the same GPU: candle keeps its devices apart, and a
        // buffer of another may live on a stream not ordered against the layer's.
        if !storage.device().same_device(&self.device) {
            bail!("Nvfp4Linear: the input is on another candle CudaDevice than the layer's (candle keeps devices apart, even on one GPU, and their streams need not be ordered: input {:?}, layer {:?}); use the layer's device", storage.device().location(), self.device.location());
        }
        let dtype = storage.dtype();
        if !matches!(dtype, DType::BF16 | DType::F16) {
            bail!("Nvfp4Linear: input dtype {dtype:?}; bf16 or f16 wanted");
        }
        let mut out = dims.to_vec();
        *out.last_mut().expect("checked above") = n;
        let rows = (end - start) / k;
        // Every forward allocates its output (an empty batch too), and may grow the lane's buffers.
        if crate::gemm::capture_check(&self.device.cuda_stream()).map_err(candle_core::Error::wrap)? {
            let e = match self.mode {
                LinearMode::Nvfp4 { .. } => crate::Error::NotCapturable { call: "Nvfp4Linear::forward", why: "it allocates its output, and its activation buffers as they grow", fix: "capture Quantizer::quantize_into and BlockScaledGemm::gemm on buffers allocated before capture" },
                LinearMode::W4a16 => crate::Error::NotCapturable { call: "Nvfp4Linear::forward", why: "it allocates its output", fix: "capture BlockScaledGemm::gemm_w4a16 on buffers allocated before capture" },
            };
            return Err(candle_core::Error::wrap(e));
        }
        let y = match dtype {
            _ if rows == 0 => self.device.zeros_impl(&Shape::from_dims(&out), dtype)?, // an empty batch
            DType::BF16 => self.run_storage::<half::bf16>(storage, start..end, rows)?,
            _ => self.run_storage::<half::f16>(storage, start..end, rows)?,
        };
        Ok((y, Shape::from_dims(&out)))
    }
}
