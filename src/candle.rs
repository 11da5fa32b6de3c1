//! candle integration (feature `candle`): [`Nvfp4Linear`], an NVFP4 linear layer, and
//! [`Nvfp4Experts`], a mixture-of-experts layer's grouped NVFP4 GEMM, whose inputs and outputs are
//! candle tensors on candle's CUDA device, run on that device's stream.
//!
//! `forward` takes the input (bf16 or f16, `[..., K]`, contiguous, its first element 16-byte
//! aligned), runs `y = x Wᵀ` against the NVFP4 weight and returns `[..., N]` in the input's
//! dtype, with no host synchronisation and no copy of the input or output. How it takes the
//! input is the layer's [`LinearMode`]:
//! - [`LinearMode::Nvfp4`]: quantized on the GPU with the layer's input scale, then the NVFP4 x
//!   NVFP4 GEMM: two launches, the quantizer's and the GEMM's. Where the GEMM runs a swapped tile
//!   (on Hopper, from 33 rows at most shapes: [`BlockScaledGemm::select_config`] says which), the
//!   quantizer also writes the activations' decode, which the GEMM reads instead of a pre-pass
//!   (as [`crate::Quantizer::quantize_decoded_into`] and [`BlockScaledGemm::gemm_decoded`] do).
//!   Runs where [`BlockScaledGemm::gemm`] does (Hopper; Blackwell compiled, not yet run on
//!   hardware).
//! - [`LinearMode::W4a16`]: the input as it is, the weights decoded to its type on chip
//!   ([`BlockScaledGemm::gemm_w4a16`]): one launch (from 33 rows at most shapes, a pre-pass and
//!   the GEMM), no activation quantization error, and no input scale needed. Hopper only.
//!
//! `forward` allocates its output, as candle ops do, so it refuses CUDA-graph capture
//! ([`crate::Error::NotCapturable`]). In `Nvfp4` mode the quantized input goes into buffers the
//! layer keeps for each stream it runs on (K / 2 bytes a row and the scales, in the dense tiled
//! layout or the experts' one; for the dense layer, once a forward runs a swapped tile, the
//! decode too: 2 * K bytes a row, K rounded up to 64, the rows rounded up to 256 past 128),
//! grown when a forward has more rows than they hold to at least
//! twice the rows they held (within the quantizer's row limit), rounded up to 128, so a forward
//! allocates nothing else of its own
//! (the GEMM's workspace grows as for any call). An engine that replays graphs calls
//! [`crate::Quantizer::quantize_into`] (or `quantize_decoded_into`) and [`BlockScaledGemm::gemm`],
//! or [`BlockScaledGemm::gemm_w4a16`], on buffers it allocated before capture, with the layer's
//! [`Nvfp4Linear::weight`]. [`Nvfp4Experts`] does the same for the grouped GEMM
//! ([`BlockScaledGemm::moe_gemm_w4a16`], or [`crate::Quantizer::quantize_moe_into`] and
//! [`BlockScaledGemm::moe_gemm`]), its rows stacked by expert and the expert offsets a candle
//! `i32` tensor on the device, read by the kernels only.
//!
//! candle's `Device::new_cuda` runs on the per-thread default stream, a different stream on each
//! host thread: on such a device the layer keeps one GEMM (and so one workspace) per calling
//! thread (with its activation buffers), each until the layer is dropped, so it can be shared
//! between threads. A workspace
//! holds the swapped tiles' decoded activations where the layer does not (W4A16's re-ordered
//! input, the experts' pre-pass: 2 * rows * K bytes and more, at least 58.7 MB for 4096 rows of
//! K = 7168), and a thread that ends does not give its buffers back: an engine whose
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
//! let w = Nvfp4Matrix::random_realistic((1, n, k), 7)?;
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
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use candle_core::backend::{BackendDevice, BackendStorage};
use candle_core::{bail, CpuStorage, CudaDevice, CudaStorage, CustomOp1, CustomOp2, DType, Layout, Shape, Tensor};
use cudarc::driver::{CudaSlice, CudaView};

use crate::error::{Error, Result};
use crate::gemm::BlockScaledGemm;
use crate::tensor::Nvfp4Activations;
use crate::grouped::{moe_sfa_bytes, MoeActivations, MoeProblem, MAX_EXPERTS};
use crate::matrix::{check_global_scale, check_quantizer_dims, Nvfp4Matrix, QUANTIZER_MAX_ROWS};
use crate::problem::{folded_alpha, OutType, Problem};
use crate::quantize::Quantizer;
use crate::tensor::Nvfp4Tensor;
use crate::w4a16::Activation16;

/// How an [`Nvfp4Linear`] or [`Nvfp4Experts`] takes its bf16 or f16 input.
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

impl LinearMode {
    /// Judges `got`, a layer's output (rows x N) for input `x` (rows x K) in this mode, against
    /// the exact CPU reference of the mode: `factor` times x (quantized with the input scale in
    /// `Nvfp4` mode, as the GPU quantizer does) times `weight` transposed, `weight` (1, N, K) with
    /// its global scale. `factor` is 1 for [`Nvfp4Linear`] and the expert's factor for an
    /// expert's rows of [`Nvfp4Experts`] (with `weight` that expert's, `Nvfp4Matrix::batch_slice`).
    pub fn verify<T: Activation16 + crate::HostFloat>(self, x: &[T], weight: &Nvfp4Matrix, factor: f32, got: &[T]) -> Result<crate::compare::Verdict> {
        let (n, k) = (weight.rows(), weight.k());
        let rows = x.len().checked_div(k).unwrap_or(0);
        match self {
            LinearMode::Nvfp4 { input_scale } => {
                let xq = Nvfp4Matrix::quantize(x, (1, rows, k), Some(input_scale))?;
                crate::compare::verify_matrices(&xq, weight, factor, 0.0, None, got)
            }
            LinearMode::W4a16 => {
                let p = Problem::new(rows, n, k).scalars(factor * weight.global_scale().unwrap_or(1.0), 0.0);
                crate::compare::verify_w4a16(&p, x, weight.data(), weight.scales(), None, got)
            }
        }
    }

    /// The activations' global scale (1 for W4A16), checked.
    fn input_scale(self) -> Result<f32> {
        match self {
            LinearMode::Nvfp4 { input_scale } => check_global_scale(input_scale).map(|()| input_scale),
            LinearMode::W4a16 => Ok(1.0),
        }
    }
}

/// `y = x Wᵀ` with W an NVFP4 weight of shape (N, K) (PyTorch's `Linear` layout), on candle
/// tensors: x quantized to NVFP4 on the GPU with a fixed global scale, or taken as it is (W4A16),
/// as the layer's [`LinearMode`] says.
pub struct Nvfp4Linear {
    // Fields drop in this order: the lanes' GEMMs synchronize their streams (the context, when
    // dropped on another thread) before the weight is freed, so no kernel still reads it. Keep
    // the lanes first.
    lanes: Lanes,
    weight: Nvfp4Tensor,
    mode: LinearMode,
    device: CudaDevice,
}

/// The lanes of a layer: the one every thread uses where the device's stream is its own; else
/// one per calling thread (see the module docs), each as long as the layer lives.
struct Lanes {
    shared: Option<Arc<Lane>>,
    per_thread: Mutex<HashMap<ThreadId, Arc<Lane>>>,
    device: CudaDevice,
}

impl Lanes {
    /// The lanes of a new layer on `device`, with the calling thread's (or the shared) lane.
    fn new(device: &CudaDevice) -> Result<(Self, Arc<Lane>)> {
        let lane = Arc::new(Lane::new(device.cuda_stream())?);
        let (shared, per_thread) = if lane.gemm.per_thread_stream() {
            (None, HashMap::from([(std::thread::current().id(), lane.clone())]))
        } else {
            (Some(lane.clone()), HashMap::new())
        };
        Ok((Lanes { shared, per_thread: Mutex::new(per_thread), device: device.clone() }, lane))
    }

    /// The lane for this thread: the shared one, else this thread's, made on first use.
    fn get(&self) -> Result<Arc<Lane>> {
        if let Some(l) = &self.shared {
            return Ok(l.clone());
        }
        let mut lanes = self.per_thread.lock().unwrap_or_else(|e| e.into_inner());
        let id = std::thread::current().id();
        if let Some(l) = lanes.get(&id) {
            return Ok(l.clone());
        }
        let l = Arc::new(Lane::new(self.device.cuda_stream())?);
        lanes.insert(id, l.clone());
        Ok(l)
    }
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

/// Codes and scales of up to `rows` rows of K; beside them (dense layer, from the first
/// forward whose GEMM reads it) their decode for up to `rows` rows, which the quantizer writes
/// and the swapped tiles read instead of decoding the codes again in a pre-pass.
struct Acts {
    rows: usize,
    codes: CudaSlice<u8>,
    scales: CudaSlice<u8>,
    decoded: Option<CudaSlice<u16>>,
}

impl Lane {
    fn new(stream: Arc<cudarc::driver::CudaStream>) -> Result<Self> {
        Ok(Lane { gemm: BlockScaledGemm::new(stream.clone())?, quantizer: Quantizer::new(stream), acts: Mutex::new(None) })
    }

    /// The buffers in `slot` made to hold `rows` rows, and the (codes, scales) bytes of `rows`
    /// rows, `bytes(r)` giving those of r rows (None past the address space).
    fn reserve<'a>(&self, slot: &'a mut Option<Acts>, rows: usize, k: usize, bytes: impl Fn(usize) -> Option<(usize, usize)>) -> Result<(&'a mut Acts, (usize, usize))> {
        let too_big = || Error::SizeLimit { what: "quantized input bytes", rule: "rows * K / 2 and the scales", dims: format!("rows = {rows}, K = {k}"), value: rows as u128 * k as u128 / 2, max: usize::MAX as u128, why: "address space" };
        // The quantizer's limits, before any buffer grows for a call that would be refused.
        check_quantizer_dims((1, rows, k))?;
        let used = bytes(rows).ok_or_else(too_big)?;
        // Taken out: kept if large enough, else its buffers go first (a free is ordered on the
        // stream after the launches that read them), so a failed allocation leaves the lane
        // empty and the next forward allocates again.
        let acts = match slot.take() {
            Some(acts) if acts.rows >= rows => slot.insert(acts),
            held => {
                // Grown to at least twice the rows held (within the quantizer's limit), in whole
                // 128-row scale tiles, so that batches of varying size settle on one allocation.
                let held_rows = held.map_or(0, |a| a.rows);
                let want = rows.max(held_rows.saturating_mul(2)).min(QUANTIZER_MAX_ROWS).checked_next_multiple_of(128).ok_or_else(too_big)?;
                let (cb, sb) = bytes(want).ok_or_else(too_big)?;
                let stream = self.gemm.stream();
                // Zeroed: the experts' quantizer leaves the codes of rows no expert covers as
                // they are, and the swapped tiles' pre-pass still reads them (their scale 0).
                let (codes, scales) = (stream.alloc_zeros::<u8>(cb)?, stream.alloc_zeros::<u8>(sb)?);
                slot.insert(Acts { rows: want, codes, scales, decoded: None })
            }
        };
        Ok((acts, used))
    }
}

/// Refuses a weight on another GPU than `device`'s, which would fail every forward.
fn check_weight_device(weight: &Nvfp4Tensor, device: &CudaDevice) -> Result<()> {
    let ordinal = device.cuda_stream().context().ordinal();
    crate::gemm::check_devices(ordinal, [("weight values", weight.values().stream()), ("weight scales", weight.scales().stream())])
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
        let input_scale = mode.input_scale()?;
        check_weight_device(&weight, device)?;
        // Every forward folds the scales into alpha as `1 * input_scale * weight scale`: a pair
        // whose product under- or overflows would fail each call, so refuse it here.
        folded_alpha(1.0, input_scale, weight.global_scale())?;
        let (batch, n, k) = weight.shape();
        if batch != 1 {
            return Err(Error::OperandShape { name: "weight", got: (batch, n, k), want: (1, n, k) });
        }
        let (lanes, lane) = Lanes::new(device)?;
        // A device without kernels for the mode, or a weight layout they cannot take (prepacked
        // off Hopper), fails every forward.
        let p = Problem::new(1, n, k);
        match mode {
            LinearMode::W4a16 => lane.gemm.select_w4a16_config_for(&p, OutType::Bf16, weight.layout())?,
            LinearMode::Nvfp4 { .. } => lane.gemm.select_config_for(&p, OutType::Bf16, weight.layout())?,
        };
        Ok(Nvfp4Linear { lanes, weight, mode, device: device.clone() })
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
        let lane = self.lanes.get()?;
        let (_, n, k) = self.weight.shape();
        let p = Problem::new(rows, n, k);
        let stream = lane.gemm.stream();
        let out_len = output_len(rows, n)?;
        match self.mode {
            LinearMode::W4a16 => {
                // SAFETY: the GEMM below writes every element before anyone reads y; on an
                // error y is dropped unread.
                let mut y = unsafe { stream.alloc::<T>(out_len)? };
                lane.gemm.gemm_w4a16(&p, x, &self.weight, &mut y, None)?;
                Ok(y)
            }
            LinearMode::Nvfp4 { input_scale } => {
                // The config the GEMM runs: where it is a swapped tile (from 33 rows, for most
                // shapes), the quantizer also writes the activations' decode, which the GEMM
                // reads instead of launching its pre-pass (the same bits).
                let config = lane.gemm.select_config_for(&p, T::OUT, self.weight.layout())?;
                let mut slot = lane.acts.lock().unwrap_or_else(|e| e.into_inner());
                let bytes = |r: usize| Some((r.checked_mul(k)? / 2, crate::layout::checked_sf_bytes((1, r, k))?));
                let (acts, (cb, sb)) = lane.reserve(&mut slot, rows, k, bytes)?;
                // SAFETY: as above.
                let mut y = unsafe { stream.alloc::<T>(out_len)? };
                let Acts { rows: held, codes, scales, decoded } = acts;
                // Where the GEMM reads it: for the rows the codes hold. A forward of fewer rows
                // uses its start: the quantizer writes every row the GEMM then reads
                // (decoded_rows(rows), the padding rows as zeros), and the GEMM's map stops
                // there. Zeroed only so that no allocation's old bytes stay in it.
                let mut dec = match (config.info().swapped(), decoded) {
                    (false, _) => None,
                    (true, Some(d)) => Some(d),
                    (true, none) => Some(none.insert(stream.alloc_zeros::<u16>(Nvfp4Activations::decoded_len((1, *held, k)))?)),
                }
                .map(|d| d.slice_mut(..Nvfp4Activations::decoded_len((1, rows, k))));
                let (mut c, mut s) = (codes.slice_mut(..cb), scales.slice_mut(..sb));
                match dec.as_mut() {
                    Some(d) => lane.quantizer.quantize_decoded_parts_into(x, (1, rows, k), input_scale, &mut c, &mut s, d)?,
                    None => lane.quantizer.quantize_into(x, (1, rows, k), input_scale, &mut c, &mut s)?,
                }
                let xq = Nvfp4Tensor::new::<u8, u8>(c, s, (1, rows, k), input_scale)?;
                match dec.as_ref() {
                    Some(d) => lane.gemm.gemm_decoded_parts(&p, &xq, d, &self.weight, &mut y, Some(config))?,
                    None => lane.gemm.gemm(&p, &xq, &self.weight, &mut y, Some(config))?,
                };
                Ok(y)
            }
        }
    }
}

/// The grouped GEMM of a mixture-of-experts layer on candle tensors: for every expert e,
/// `y[rows of e] = expert_scales[e] * x[rows of e] W[e]ᵀ`, with W the experts' NVFP4 weights
/// (E, N, K) and the rows of x stacked by expert as an `i32` offsets tensor on the device says,
/// x quantized to NVFP4 on the GPU or taken as it is (W4A16), as the layer's [`LinearMode`] says.
/// One grouped GEMM for all experts (with its pre-pass from 33 rows an expert on average, as
/// [`BlockScaledGemm::moe_gemm`] runs), which also zeroes the rows no expert covers
/// ([`MoeProblem::zero_uncovered`]: on Hopper in the same launch, on Blackwell by a memset of
/// the output ahead of it), after, in `Nvfp4` mode, the quantizer; no host synchronisation.
///
/// ```no_run
/// use blockscaled_gemm::candle::{LinearMode, Nvfp4Experts};
/// use blockscaled_gemm::Nvfp4Matrix;
/// use candle_core::{DType, Device, Tensor};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let device = Device::new_cuda(0)?;
/// let cuda = device.as_cuda_device()?;
/// let (experts, n, k) = (8, 2048, 7168);
/// // A checkpoint's experts (here: random; `Checkpoint::experts` gives both parts, and
/// // `experts_to_device` the weights on the device for `Nvfp4Experts::new`).
/// let w = Nvfp4Matrix::random_realistic((experts, n, k), 7)?;
/// let layer = Nvfp4Experts::from_matrix(&w, &[1.0; 8], LinearMode::W4a16, cuda)?;
/// // 40 routed rows, stacked by expert (the router's output): expert e has rows offsets[e]..offsets[e + 1].
/// let x = Tensor::randn(0f32, 1.0, (40, k), &device)?.to_dtype(DType::BF16)?;
/// let offsets = Tensor::new(&[0i32, 5, 5, 12, 20, 21, 30, 38, 40], &device)?;
/// let y = layer.forward(&x, &offsets)?;
/// assert_eq!(y.dims(), &[40, n]);
/// # Ok(()) }
/// ```
pub struct Nvfp4Experts {
    // Lanes first, as in Nvfp4Linear: their drop synchronizes before the weights are freed.
    lanes: Lanes,
    weight: Nvfp4Tensor,
    expert_scales: CudaSlice<f32>,
    mode: LinearMode,
    device: CudaDevice,
}

impl Nvfp4Experts {
    /// A layer over the experts' weights already on `device` (`(E, N, K)`, E from 1 to
    /// [`MAX_EXPERTS`], standard or, on Hopper, prepacked; their own global scale folded into
    /// alpha) and each expert's factor `expert_scales` (E of them, finite and positive: a
    /// checkpoint's per-expert weight global scales, as `Checkpoint::experts_to_device` returns
    /// them), taking its input as `mode` says. Refused where the device has no grouped kernel for
    /// the mode (W4A16: Hopper only) or any expert's scale, folded with the others, leaves f32's
    /// range.
    pub fn new(weight: Nvfp4Tensor, expert_scales: &[f32], mode: LinearMode, device: &CudaDevice) -> Result<Self> {
        let input_scale = mode.input_scale()?;
        check_weight_device(&weight, device)?;
        let (experts, n, k) = weight.shape();
        if !(1..=MAX_EXPERTS).contains(&experts) {
            return Err(Error::InvalidData { what: "experts", detail: format!("{experts} (the weight's batch): 1 to {MAX_EXPERTS} wanted") });
        }
        if expert_scales.len() != experts {
            return Err(Error::InvalidData { what: "expert_scales", detail: format!("{} scales for {experts} experts: one each wanted", expert_scales.len()) });
        }
        // As a forward folds them: alpha from the global scales on the host, then each expert's
        // factor on the device. A product out of f32's range would fail or saturate every call.
        let alpha = folded_alpha(1.0, input_scale, weight.global_scale())?;
        for (e, &s) in expert_scales.iter().enumerate() {
            check_global_scale(s).map_err(|_| Error::InvalidData { what: "expert_scales", detail: format!("expert {e}: {s}; finite and positive wanted") })?;
            folded_alpha(alpha, s, 1.0).map_err(|_| Error::InvalidData { what: "expert_scales", detail: format!("expert {e}: {s} times alpha {alpha} (the input and weight global scales) is {}: must be finite and nonzero", alpha * s) })?;
        }
        let (lanes, lane) = Lanes::new(device)?;
        // A device without grouped kernels for the mode, or a weight layout they cannot take
        // (prepacked off Hopper), fails every forward.
        let p = MoeProblem::new(1, n, k, experts);
        match mode {
            LinearMode::W4a16 => {
                lane.gemm.moe_w4a16_workspace_size::<half::bf16>(&p, OutType::Bf16, None)?;
            }
            LinearMode::Nvfp4 { .. } => {
                let config = lane.gemm.select_grouped_config(&p, OutType::Bf16)?;
                crate::gemm::check_weight_layout(config, weight.layout())?;
            }
        }
        let expert_scales = device.cuda_stream().clone_htod(expert_scales)?;
        Ok(Nvfp4Experts { lanes, weight, expert_scales, mode, device: device.clone() })
    }

    /// [`Self::new`] on host weights (`(E, N, K)`, with their global scale where they have one)
    /// uploaded onto `device`'s stream: `Checkpoint::experts` returns both parts.
    pub fn from_matrix(weight: &Nvfp4Matrix, expert_scales: &[f32], mode: LinearMode, device: &CudaDevice) -> Result<Self> {
        Self::new(Nvfp4Tensor::upload(weight, &device.cuda_stream())?, expert_scales, mode, device)
    }

    /// The experts' weights.
    pub fn weight(&self) -> &Nvfp4Tensor {
        &self.weight
    }

    /// How the layer takes its input.
    pub fn mode(&self) -> LinearMode {
        self.mode
    }

    /// `x` (bf16 or f16, `[..., K]`, its rows stacked by expert: T rows in all) through the
    /// experts: `[..., N]` in x's dtype. `offsets`: E + 1 `i32` (a 1-D candle tensor on this
    /// layer's device) with expert e's rows `offsets[e]..offsets[e + 1]`, read on the device only,
    /// as [`BlockScaledGemm::moe_gemm`] reads them: valid offsets run non-decreasing from 0 to T;
    /// others are read as their running maximum clamped to [0, T], and rows no expert covers come
    /// out 0. Asynchronous on the device's stream.
    pub fn forward(&self, x: &Tensor, offsets: &Tensor) -> candle_core::Result<Tensor> {
        x.apply_op2_no_bwd(offsets, self)
    }

    /// `x` (`rows` x K) through the experts, into a new buffer, as the mode says.
    fn run<T: Activation16>(&self, x: &CudaView<'_, T>, offsets: &CudaView<'_, i32>, rows: usize) -> Result<CudaSlice<T>> {
        let lane = self.lanes.get()?;
        let (experts, n, k) = self.weight.shape();
        // The GEMM writes every row: the experts' and, as zeros, those no expert covers.
        let p = MoeProblem::new(rows, n, k, experts).zero_uncovered(true);
        // SAFETY: every element is written by the GEMM (above) before the tensor is handed out;
        // on an error the buffer is dropped unread. T = 0 has no elements.
        let mut y = unsafe { lane.gemm.stream().alloc::<T>(output_len(rows, n)?)? };
        match self.mode {
            LinearMode::W4a16 => {
                lane.gemm.moe_gemm_w4a16(&p, x, &self.weight, offsets, &self.expert_scales, &mut y, None)?;
            }
            LinearMode::Nvfp4 { input_scale } => {
                let mut slot = lane.acts.lock().unwrap_or_else(|e| e.into_inner());
                let bytes = |r: usize| Some((r.checked_mul(k)? / 2, Some(moe_sfa_bytes(r, k, experts)).filter(|&b| b != usize::MAX)?));
                let (Acts { codes, scales, .. }, (cb, sb)) = lane.reserve(&mut slot, rows, k, bytes)?;
                lane.quantizer.quantize_moe_into(x, (rows, k), offsets, input_scale, &mut codes.slice_mut(..cb), &mut scales.slice_mut(..sb))?;
                let a = MoeActivations::new(codes.slice(..cb), scales.slice(..sb), (rows, k), input_scale)?;
                lane.gemm.moe_gemm(&p, &a, &self.weight, offsets, &self.expert_scales, &mut y, None)?;
            }
        }
        Ok(y)
    }
}

/// The checks every forward makes of its `[..., K]` input before anything runs: contiguous, its
/// last dimension K, on the layer's candle device, bf16 or f16; then that the stream does not
/// capture (a forward allocates its output). Returns the input's element range, its rows and the
/// output's dims (`[..., N]`).
fn check_input(who: &str, call: &'static str, mode: LinearMode, storage: &CudaStorage, layout: &Layout, (n, k): (usize, usize), device: &CudaDevice) -> candle_core::Result<(Range<usize>, usize, Vec<usize>)> {
    let Some((start, end)) = layout.contiguous_offsets() else {
        bail!("{who}: the input must be contiguous (call .contiguous() first)");
    };
    let dims = layout.dims();
    match dims.last() {
        Some(&last) if last == k => {}
        Some(&last) => bail!("{who}: the input's last dimension is {last}, the weight's K is {k}"),
        None => bail!("{who}: the input is a scalar; [..., K] with K = {k} wanted"),
    }
    check_same_device(who, "input", storage, device)?;
    let dtype = storage.dtype();
    if !matches!(dtype, DType::BF16 | DType::F16) {
        bail!("{who}: input dtype {dtype:?}; bf16 or f16 wanted");
    }
    // Every forward allocates its output (an empty batch too), and may grow the lane's buffers.
    if crate::gemm::capture_check(&device.cuda_stream()).map_err(candle_core::Error::wrap)? {
        let e = match mode {
            LinearMode::Nvfp4 { .. } => Error::NotCapturable { call, why: "it allocates its output, and its activation buffers as they grow", fix: "capture the Quantizer's and BlockScaledGemm's calls on buffers allocated before capture" },
            LinearMode::W4a16 => Error::NotCapturable { call, why: "it allocates its output", fix: "capture BlockScaledGemm's W4A16 call on buffers allocated before capture" },
        };
        return Err(candle_core::Error::wrap(e));
    }
    let mut out = dims.to_vec();
    *out.last_mut().expect("checked above") = n;
    Ok((start..end, (end - start) / k, out))
}

/// Elements of a `rows` x N output, or the error naming the product that does not fit.
fn output_len(rows: usize, n: usize) -> Result<usize> {
    rows.checked_mul(n).ok_or_else(|| Error::SizeLimit { what: "output elements", rule: "rows * N", dims: format!("rows = {rows}, N = {n}"), value: rows as u128 * n as u128, max: usize::MAX as u128, why: "address space" })
}

/// The same candle device, not only the same GPU: candle keeps its devices apart, and a buffer of
/// another may live on a stream not ordered against the layer's.
fn check_same_device(who: &str, what: &str, storage: &CudaStorage, device: &CudaDevice) -> candle_core::Result<()> {
    if !storage.device().same_device(device) {
        bail!("{who}: the {what} is on another candle CudaDevice than the layer's (candle keeps devices apart, even on one GPU, and their streams need not be ordered: {what} {:?}, layer {:?}); use the layer's device", storage.device().location(), device.location());
    }
    Ok(())
}

/// The refusal of a CPU tensor, naming the mode's exact CPU reference.
fn cpu_refusal(who: &str, mode: LinearMode) -> candle_core::Error {
    let reference = match mode {
        LinearMode::Nvfp4 { .. } => "blockscaled_gemm::reference_gemm",
        LinearMode::W4a16 => "blockscaled_gemm::reference::w4a16_dots",
    };
    candle_core::Error::Msg(format!("{who} runs on CUDA devices only (the exact CPU reference is {reference})"))
}

/// `run(view)` on elements `range` of a candle buffer of T, wrapped as a new candle buffer.
fn run_on<T: Activation16 + candle_core::cuda::CudaDType>(x: &CudaStorage, range: Range<usize>, device: &CudaDevice, run: impl FnOnce(&CudaView<'_, T>) -> Result<CudaSlice<T>>) -> candle_core::Result<CudaStorage> {
    let y = run(&x.as_cuda_slice::<T>()?.slice(range)).map_err(candle_core::Error::wrap)?;
    Ok(CudaStorage::wrap_cuda_slice(y, device.clone()))
}

impl CustomOp1 for Nvfp4Linear {
    fn name(&self) -> &'static str {
        "nvfp4-linear"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        Err(cpu_refusal("Nvfp4Linear", self.mode))
    }

    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let (_, n, k) = self.weight.shape();
        let (range, rows, out) = check_input("Nvfp4Linear", "Nvfp4Linear::forward", self.mode, storage, layout, (n, k), &self.device)?;
        let y = match storage.dtype() {
            dtype if rows == 0 => self.device.zeros_impl(&Shape::from_dims(&out), dtype)?, // an empty batch
            DType::BF16 => run_on::<half::bf16>(storage, range, &self.device, |x| self.run(x, rows))?,
            _ => run_on::<half::f16>(storage, range, &self.device, |x| self.run(x, rows))?,
        };
        Ok((y, Shape::from_dims(&out)))
    }
}

impl CustomOp2 for Nvfp4Experts {
    fn name(&self) -> &'static str {
        "nvfp4-experts"
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        Err(cpu_refusal("Nvfp4Experts", self.mode))
    }

    fn cuda_fwd(&self, storage: &CudaStorage, layout: &Layout, offsets: &CudaStorage, offsets_layout: &Layout) -> candle_core::Result<(CudaStorage, Shape)> {
        let (experts, n, k) = self.weight.shape();
        let who = "Nvfp4Experts";
        // The offsets first: a forward whose routing is wrong is refused whatever its input.
        if offsets.dtype() != DType::I32 {
            bail!("{who}: offsets dtype {:?}; i32 wanted", offsets.dtype());
        }
        if offsets_layout.dims() != [experts + 1] {
            bail!("{who}: offsets of shape {:?}; [E + 1] = [{}] wanted (E = {experts} experts)", offsets_layout.dims(), experts + 1);
        }
        let Some((o_start, o_end)) = offsets_layout.contiguous_offsets() else {
            bail!("{who}: the offsets must be contiguous (call .contiguous() first)");
        };
        check_same_device(who, "offsets", offsets, &self.device)?;
        let (range, rows, out) = check_input(who, "Nvfp4Experts::forward", self.mode, storage, layout, (n, k), &self.device)?;
        let o = offsets.as_cuda_slice::<i32>()?.slice(o_start..o_end);
        let y = match storage.dtype() {
            dtype if rows == 0 => self.device.zeros_impl(&Shape::from_dims(&out), dtype)?, // an empty batch
            DType::BF16 => run_on::<half::bf16>(storage, range, &self.device, |x| self.run(x, &o, rows))?,
            _ => run_on::<half::f16>(storage, range, &self.device, |x| self.run(x, &o, rows))?,
        };
        Ok((y, Shape::from_dims(&out)))
    }
}
