//! [`Quantizer`]: NVFP4 quantization on the GPU, bit-identical to [`Nvfp4Matrix::quantize`].

use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr};

use crate::error::{check_len, Error, Result};
use crate::gemm::{capture_check, check_devices, launch_status};
use crate::grouped::{moe_sfa_bytes, MAX_EXPERTS};
use crate::layout::sf_batch_bytes;
use crate::matrix::{check_global_scale, check_lens, check_quantizer_dims as check_dims, computed_global_scale, HostFloat};
use crate::problem::{check_align, check_align_to};
use crate::sys::{self, InKind, QuantTransform, QuantizeArgs};
use crate::tensor::{Nvfp4Activations, Nvfp4Tensor};

/// Element types the GPU quantizer reads: f32, `half::f16`, `half::bf16`.
pub trait QuantInput: HostFloat + DeviceRepr {
    #[doc(hidden)]
    const KIND: InKind;
}
impl QuantInput for f32 {
    const KIND: InKind = InKind::F32;
}
impl QuantInput for half::f16 {
    const KIND: InKind = InKind::F16;
}
impl QuantInput for half::bf16 {
    const KIND: InKind = InKind::Bf16;
}

/// Quantizes (batch, rows, K) tensors to NVFP4 on the GPU, on one cudarc stream: codes and
/// ue4m3 scales written straight into the 128x4 tiled layout (padding zeroed), by the rules of
/// [`Nvfp4Matrix::quantize`](crate::Nvfp4Matrix::quantize), bit for bit on finite data. Inputs
/// are not checked on the device; with a given global scale NaN does not raise its block's scale
/// and encodes as +6 (0x7), or 0 in a block whose scale is 0, and ±Inf gives its block the scale
/// 448 and codes ±6 (the CPU quantizer refuses both;
/// [`Nvfp4Matrix::quantize_unchecked`](crate::Nvfp4Matrix::quantize_unchecked) follows these rules).
///
/// With a given global scale (ModelOpt's `input_scale` for activations) a call is one launch, and
/// [`Self::quantize_into`] allocates nothing and can be captured in a CUDA graph; with a computed
/// one an amax pass runs first and the scale is read back to the host (the tensor carries it to
/// the GEMM), which synchronizes the stream.
///
/// Stream ordering: the next operation on the stream sees the outputs complete. A next kernel
/// launched with `cudaLaunchAttributeProgrammaticStreamSerialization` may start while the
/// quantizer runs (it allows that from its start, so this crate's GEMM behind it is scheduled
/// early) and must call `cudaGridDependencySynchronize()` (PTX `griddepcontrol.wait`) before it
/// reads the outputs or writes the input, as such kernels do by contract and this crate's do.
///
/// ```no_run
/// use blockscaled_gemm::{BlockScaledGemm, Nvfp4Matrix, Nvfp4Tensor, Problem, Quantizer};
/// use cudarc::driver::CudaContext;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let stream = CudaContext::new(0)?.new_stream()?;
/// let (m, n, k) = (16, 4096, 7168);
/// let x = stream.clone_htod(&vec![half::bf16::from_f32(0.5); m * k])?; // activations on the GPU
/// let w = Nvfp4Tensor::upload(&Nvfp4Matrix::random_realistic((1, n, k), 1)?, &stream)?;
/// let xq = Quantizer::new(stream.clone()).quantize(&x, (1, m, k), Some(0.5 / 2688.0))?;
/// let mut y = stream.alloc_zeros::<half::bf16>(m * n)?;
/// BlockScaledGemm::new(stream.clone())?.gemm(&Problem::new(m, n, k), &xq, &w, &mut y, None)?;
/// # Ok(()) }
/// ```
pub struct Quantizer {
    stream: Arc<CudaStream>,
    /// The device's compute capability, read at the first launch.
    cc: OnceLock<(i32, i32)>,
}

impl Quantizer {
    /// A quantizer that launches on `stream`. On a device this build has no kernels for
    /// (`BSG_ARCHS`; compute capability 9.0 and 10.0 by default) every call returns
    /// [`Error::UnsupportedDevice`] before it writes anything.
    pub fn new(stream: Arc<CudaStream>) -> Self {
        Quantizer { stream, cc: OnceLock::new() }
    }

    /// The stream launches go to.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Quantizes `x` (batch, rows, K) into `codes` (batch * rows * K / 2 bytes) and `scales`
    /// (`batch * layout::sf_batch_bytes(rows, K)` bytes) with the given global scale (finite,
    /// positive). One launch, no allocation, no host synchronisation: capturable.
    pub fn quantize_into<T, X, C, S>(&self, x: &X, shape: (usize, usize, usize), global_scale: f32, codes: &mut C, scales: &mut S) -> Result<()>
    where
        T: QuantInput, X: DevicePtr<T>, C: DevicePtrMut<u8>, S: DevicePtrMut<u8>,
    {
        self.dense_into(x, shape, global_scale, codes, scales, QuantTransform::None, None::<&mut CudaSlice<u16>>)
    }

    /// [`Self::quantize_decoded_into`] into buffers of the caller's rather than an
    /// [`Nvfp4Activations`]: the codes and scales of [`Self::quantize_into`] for `shape`, and
    /// beside them their decode (exactly [`Nvfp4Activations::decoded_len`]`(shape)` FP16 values,
    /// its padding rows written as zeros), which
    /// [`crate::BlockScaledGemm::gemm_decoded_parts`] reads. At batch 1, buffers sized for the
    /// largest batch serve every row count by prefix (that function's example). One launch,
    /// capturable.
    pub fn quantize_decoded_parts_into<T, X, C, S, DD>(&self, x: &X, shape: (usize, usize, usize), global_scale: f32, codes: &mut C, scales: &mut S, decoded: &mut DD) -> Result<()>
    where
        T: QuantInput, X: DevicePtr<T>, C: DevicePtrMut<u8>, S: DevicePtrMut<u8>, DD: DevicePtrMut<u16>,
    {
        self.dense_into(x, shape, global_scale, codes, scales, QuantTransform::None, Some(decoded))
    }

    /// Quantizes the SwiGLU of `x` (batch, rows, 2K), whose rows hold the gate projection in
    /// their first K values and the up projection in their last K (the two halves of a fused
    /// gate-up GEMM's output): `silu(gate) * up`, rounded to T as an unfused `silu_and_mul`
    /// would store it, then quantized as [`Self::quantize_into`] quantizes a (batch, rows, K)
    /// tensor (`shape` is that output's), with the given global scale. Bit for bit the CPU
    /// quantizer of [`crate::swiglu::swiglu_rows`] (the SwiGLU arithmetic is
    /// [`crate::swiglu`]'s, the same on host and device). One launch, capturable; the
    /// intermediate never reaches memory. The global scale must be given (an activation scale
    /// from calibration, as a checkpoint's `input_scale`); there is no computed-scale form.
    ///
    /// An MLP's down projection fed straight from its gate-up projection's output:
    ///
    /// ```no_run
    /// use blockscaled_gemm::{BlockScaledGemm, Nvfp4Matrix, Nvfp4Tensor, Problem, Quantizer};
    /// use cudarc::driver::CudaContext;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let stream = CudaContext::new(0)?.new_stream()?;
    /// let (m, inter, hidden) = (16, 2048, 7168);
    /// // The gate-up GEMM's bf16 output, (m, 2 * inter): gate in the first half of each row.
    /// let gate_up = stream.clone_htod(&vec![half::bf16::from_f32(0.5); m * 2 * inter])?;
    /// let g = 4.0 / 2688.0; // the down projection's input scale
    /// let mut codes = stream.alloc_zeros::<u8>(m * inter / 2)?;
    /// let mut scales = stream.alloc_zeros::<u8>(blockscaled_gemm::layout::sf_bytes((1, m, inter)))?;
    /// Quantizer::new(stream.clone()).quantize_swiglu_into(&gate_up, (1, m, inter), g, &mut codes, &mut scales)?;
    /// let h = Nvfp4Tensor::new(codes.as_view(), scales.as_view(), (1, m, inter), g)?;
    /// let down = Nvfp4Tensor::upload(&Nvfp4Matrix::random_realistic((1, hidden, inter), 1)?, &stream)?;
    /// let mut y = stream.alloc_zeros::<half::bf16>(m * hidden)?;
    /// BlockScaledGemm::new(stream.clone())?.gemm(&Problem::new(m, hidden, inter), &h, &down, &mut y, None)?;
    /// # Ok(()) }
    /// ```
    pub fn quantize_swiglu_into<T, X, C, S>(&self, x: &X, shape: (usize, usize, usize), global_scale: f32, codes: &mut C, scales: &mut S) -> Result<()>
    where
        T: QuantInput, X: DevicePtr<T>, C: DevicePtrMut<u8>, S: DevicePtrMut<u8>,
    {
        self.dense_into(x, shape, global_scale, codes, scales, QuantTransform::SwigluHalves, None::<&mut CudaSlice<u16>>)
    }

    /// The dense quantizer; `decoded`: also the decode of [`Nvfp4Activations`] (its layout, for
    /// `shape`).
    #[allow(clippy::too_many_arguments)]
    fn dense_into<T, X, C, S, DD>(&self, x: &X, shape: (usize, usize, usize), global_scale: f32, codes: &mut C, scales: &mut S, transform: QuantTransform, decoded: Option<&mut DD>) -> Result<()>
    where
        T: QuantInput, X: DevicePtr<T>, C: DevicePtrMut<u8>, S: DevicePtrMut<u8>, DD: DevicePtrMut<u16>,
    {
        check_global_scale(global_scale)?;
        self.check_input(x, shape, transform)?;
        check_lens(("codes", codes.len()), scales.len(), shape)?;
        if let Some(d) = &decoded {
            check_len("decoded", d.len(), Nvfp4Activations::decoded_len(shape), "batch * decoded rows * K rounded up to 64 FP16 values")?;
        }
        let mut buffers = vec![("codes", codes.stream()), ("scales", scales.stream())];
        buffers.extend(decoded.as_ref().map(|d| ("decoded", d.stream())));
        check_devices(self.stream.context().ordinal(), buffers)?;
        capture_check(&self.stream)?;
        let stream = &self.stream;
        let (px, _gx) = x.device_ptr(stream);
        let (pc, _gc) = codes.device_ptr_mut(stream);
        let (ps, _gs) = scales.device_ptr_mut(stream);
        let dec = decoded.map(|d| d.device_ptr_mut(stream));
        let dec_arg = Nvfp4Activations::launch_arg(dec.as_ref().map(|d| d.0), shape.1);
        self.launch_args::<T>(shape, [px, pc, ps], global_scale, 0, (0, 0), transform, dec_arg)
    }

    /// Quantizes `x` (the (batch, rows, K) `out` was made for) into `out` with the given global
    /// scale: the codes and scales of [`Self::quantize_into`], bit for bit, and beside them their
    /// decode, which [`crate::BlockScaledGemm::gemm_decoded`] reads instead of decoding the
    /// activations again before the GEMM ([`Nvfp4Activations`] says where that pays). One
    /// launch, no allocation, no host synchronisation: capturable.
    pub fn quantize_decoded_into<T, X>(&self, x: &X, global_scale: f32, out: &mut Nvfp4Activations) -> Result<()>
    where
        T: QuantInput, X: DevicePtr<T>,
    {
        self.decoded_into(x, global_scale, out, QuantTransform::None)
    }

    /// [`Self::quantize_decoded_into`] of the SwiGLU of `x` (batch, rows, 2K), as
    /// [`Self::quantize_swiglu_into`] forms it (`out`'s shape is the output's).
    pub fn quantize_swiglu_decoded_into<T, X>(&self, x: &X, global_scale: f32, out: &mut Nvfp4Activations) -> Result<()>
    where
        T: QuantInput, X: DevicePtr<T>,
    {
        self.decoded_into(x, global_scale, out, QuantTransform::SwigluHalves)
    }

    fn decoded_into<T, X>(&self, x: &X, global_scale: f32, out: &mut Nvfp4Activations, transform: QuantTransform) -> Result<()>
    where
        T: QuantInput, X: DevicePtr<T>,
    {
        let shape = out.shape();
        let (codes, scales, decoded, g) = out.parts_mut();
        self.dense_into(x, shape, global_scale, codes, scales, transform, Some(decoded))?;
        *g = global_scale;
        Ok(())
    }

    /// Quantizes the stacked activations of a mixture-of-experts layer, `x` (T, K), whose experts'
    /// rows `offsets` gives (E + 1 `i32` on the device, read only by the kernel, as
    /// [`crate::BlockScaledGemm::moe_gemm`] reads them), into `codes` (T * K / 2 bytes) and
    /// `scales` in the grouped GEMM's layout ([`crate::grouped::moe_sfa_bytes`] bytes: each
    /// expert's rows from a multiple of 128, the rest of its 128-row blocks zeroed), with the
    /// given global scale: the A operand of `moe_gemm`. Bit for bit the CPU quantizer of the whole
    /// (1, T, K) tensor, its scales placed by [`crate::grouped::moe_scales`] in the experts'
    /// blocks: each expert with rows gets its 128-row blocks written whole (its rows' scales,
    /// zeros in the padding). Past the last expert's blocks (the buffer's room for other
    /// routings, which no GEMM of these offsets reads) the first
    /// [`crate::grouped::moe_sfa_used_rows`] scale rows are zeroed and the rest of the buffer is
    /// left as it was, as are the codes of rows no expert holds (invalid offsets). A memset of
    /// those rows and one launch, no allocation, no host synchronisation: capturable. T = 0 (no
    /// rows, as [`crate::BlockScaledGemm::moe_gemm`] takes it) checks the arguments and launches
    /// nothing.
    pub fn quantize_moe_into<T, X, O, C, S>(&self, x: &X, (rows, k): (usize, usize), offsets: &O, global_scale: f32, codes: &mut C, scales: &mut S) -> Result<()>
    where
        T: QuantInput, X: DevicePtr<T>, O: DevicePtr<i32>, C: DevicePtrMut<u8>, S: DevicePtrMut<u8>,
    {
        self.moe_into(x, (rows, k), offsets, global_scale, codes, scales, QuantTransform::None)
    }

    /// [`Self::quantize_moe_into`] of the SwiGLU of `x` (T, 2K), as
    /// [`Self::quantize_swiglu_into`] forms it: the input of a mixture-of-experts layer's down
    /// projection, straight from its gate-up projection's output, in the grouped GEMM's layout.
    pub fn quantize_moe_swiglu_into<T, X, O, C, S>(&self, x: &X, (rows, k): (usize, usize), offsets: &O, global_scale: f32, codes: &mut C, scales: &mut S) -> Result<()>
    where
        T: QuantInput, X: DevicePtr<T>, O: DevicePtr<i32>, C: DevicePtrMut<u8>, S: DevicePtrMut<u8>,
    {
        self.moe_into(x, (rows, k), offsets, global_scale, codes, scales, QuantTransform::SwigluHalves)
    }

    #[allow(clippy::too_many_arguments)]
    fn moe_into<T, X, O, C, S>(&self, x: &X, (rows, k): (usize, usize), offsets: &O, global_scale: f32, codes: &mut C, scales: &mut S, transform: QuantTransform) -> Result<()>
    where
        T: QuantInput, X: DevicePtr<T>, O: DevicePtr<i32>, C: DevicePtrMut<u8>, S: DevicePtrMut<u8>,
    {
        check_global_scale(global_scale)?;
        let experts = offsets.len().saturating_sub(1);
        if experts == 0 || experts > MAX_EXPERTS {
            return Err(Error::Dimension { dim: "experts (offsets.len() - 1)", value: experts, max: MAX_EXPERTS });
        }
        if rows == 0 {
            // T = 0, which moe_gemm takes too: K's rules and empty x hold, nothing launches.
            check_dims((1, 1, k))?;
            check_len("x", x.len(), 0, "T * K values (T = 0)")?;
        } else {
            self.check_input(x, (1, rows, k), transform)?;
        }
        // The kernel's shared table counts the padded scale rows in 32-bit signed integers (T
        // itself is bounded by check_input).
        let sf_rows = rows as u128 + 127 * experts as u128;
        crate::error::within(i32::MAX as u128, "the quantizer's shared table counts them in 32-bit signed integers", || format!("T = {rows}, E = {experts}"), [("padded scale rows", "T + 127 * E", sf_rows)])?;
        check_len("codes", codes.len(), rows * k / 2, "T * K / 2 packed bytes")?;
        check_len("scales", scales.len(), moe_sfa_bytes(rows, k, experts), "floor((T + 127 E) / 128) * 128 * ceil(K/64)*4 scale bytes, each expert padded to 128 rows, E = offsets.len() - 1")?;
        check_devices(self.stream.context().ordinal(), [("x", x.stream()), ("codes", codes.stream()), ("scales", scales.stream()), ("offsets", offsets.stream())])?;
        capture_check(&self.stream)?;
        if rows == 0 {
            return self.check_device(); // launch_args checks it where a launch follows
        }
        let stream = &self.stream;
        let (px, _gx) = x.device_ptr(stream);
        let (po, _go) = offsets.device_ptr(stream);
        let (pc, _gc) = codes.device_ptr_mut(stream);
        let (ps, _gs) = scales.device_ptr_mut(stream);
        self.launch_args::<T>((1, rows, k), [px, pc, ps], global_scale, 0, (po, experts as i32), transform, (0, 0))
    }

    /// Quantizes `x` (batch, rows, K) into new device buffers. `Some(scale)`: that global scale,
    /// one launch; `None`: computed from the tensor's amax on the GPU and read back, which
    /// synchronizes the stream (an infinity in `x` leaves no finite scale to compute: an error).
    /// Refused during graph capture, since it allocates: capture [`Self::quantize_into`].
    pub fn quantize<T, X>(&self, x: &X, shape: (usize, usize, usize), global_scale: Option<f32>) -> Result<Nvfp4Tensor>
    where
        T: QuantInput, X: DevicePtr<T>,
    {
        let (batch, rows, k) = shape;
        if let Some(g) = global_scale {
            check_global_scale(g)?;
        }
        self.check_input(x, shape, QuantTransform::None)?;
        let (code_bytes, scale_bytes) = (batch * rows * k / 2, batch * sf_batch_bytes(rows, k));
        if capture_check(&self.stream)? {
            return Err(Error::NotCapturable { call: "Quantizer::quantize", why: "it allocates its outputs, and with a computed global scale reads it back", fix: "capture Quantizer::quantize_into with a given global scale" });
        }
        let stream = &self.stream;
        // SAFETY: every byte is written by the launch below before anyone reads it.
        let (mut codes, mut scales) = unsafe { (stream.alloc::<u8>(code_bytes)?, stream.alloc::<u8>(scale_bytes)?) };
        let (px, _gx) = x.device_ptr(stream);
        let (pc, _gc) = codes.device_ptr_mut(stream);
        let (ps, _gs) = scales.device_ptr_mut(stream);
        let g = match global_scale {
            Some(g) => {
                self.launch::<T>(shape, [px, pc, ps], g, 0)?;
                g
            }
            None => {
                // Its own slot per call, as its outputs: no device state is shared between calls,
                // so calls from several threads (on the per-thread default stream, several
                // streams) cannot meet in it.
                let mut amax = stream.alloc_zeros::<u32>(1)?;
                let pa = amax.device_ptr_mut(stream).0;
                self.launch::<T>(shape, [px, pc, ps], 1.0, pa)?;
                let amax = f32::from_bits(stream.clone_dtoh(&amax)?[0]);
                if amax.is_infinite() {
                    return Err(Error::InvalidData { what: "x", detail: "holds an infinity, which leaves no finite global scale to compute; pass one".into() });
                }
                computed_global_scale(amax)
            }
        };
        drop((_gx, _gc, _gs));
        Nvfp4Tensor::new(codes, scales, shape, g)
    }

    /// The checks on the input every call makes before it computes a size or crosses the FFI
    /// line: the shape rules and the kernel's grid, x's length, x on this quantizer's device
    /// (16-byte alignment is checked at launch).
    /// (With SwiGLU, x holds 2K values a row, within the kernel's int32 K.)
    fn check_input<T, X: DevicePtr<T>>(&self, x: &X, shape: (usize, usize, usize), transform: QuantTransform) -> Result<()> {
        let (batch, rows, k) = shape;
        check_dims(shape)?;
        if transform == QuantTransform::SwigluHalves {
            if k > i32::MAX as usize / 2 {
                return Err(Error::Dimension { dim: "2K (SwiGLU input row)", value: k.saturating_mul(2), max: i32::MAX as usize });
            }
            check_len("x", x.len(), (batch * rows * k).saturating_mul(2), "batch * rows * 2K (gate and up halves; the shape given is the SwiGLU output's, K its width)")?;
        } else {
            check_len("x", x.len(), batch * rows * k, "batch * rows * K")?;
        }
        check_devices(self.stream.context().ordinal(), [("x", x.stream())])
    }

    /// Queues the quantizer: `ptrs` are x, codes and scales; `amax_slot` 0 uses `global_scale`.
    fn launch<T: QuantInput>(&self, shape: (usize, usize, usize), ptrs: [u64; 3], global_scale: f32, amax_slot: u64) -> Result<()> {
        self.launch_args::<T>(shape, ptrs, global_scale, amax_slot, (0, 0), QuantTransform::None, (0, 0))
    }

    /// [`Self::launch`], with `(offsets, experts)` of the MoE layout ((0, 0): the dense one) and
    /// the input's transform (SwiGLU: given global scales only) and `(decoded, decoded_rows)` of
    /// the dense layout's decode ((0, 0): none).
    #[allow(clippy::too_many_arguments)]
    fn launch_args<T: QuantInput>(&self, (batch, rows, k): (usize, usize, usize), ptrs: [u64; 3], global_scale: f32, amax_slot: u64, (offsets, experts): (u64, i32), transform: QuantTransform, (decoded, decoded_rows): (u64, i32)) -> Result<()> {
        for (name, addr) in ["x", "codes", "scales", "decoded"].into_iter().zip(ptrs.into_iter().chain([decoded])) {
            check_align(name, addr)?;
        }
        check_align_to("offsets", offsets, 4)?;
        self.check_device()?;
        let args = QuantizeArgs {
            m: rows as i32, k: k as i32, l: batch as i32, input: T::KIND, x: ptrs[0], codes: ptrs[1], scales: ptrs[2],
            global_scale, amax_slot, offsets, experts, stream: self.stream.cu_stream() as u64, transform, decoded, decoded_rows,
        };
        // SAFETY: the addresses are live device buffers of the checked lengths on this stream's
        // device, 16-byte aligned; the caller holds their guards until this returns.
        launch_status(unsafe { sys::quantize(&args) })
    }

    /// The quantizer's kernels are built for the architectures of `BSG_ARCHS` only; on another
    /// device its launch would fail after the MoE form's memset had zeroed the scales, so the
    /// device is checked first.
    fn check_device(&self) -> Result<()> {
        let cc = match self.cc.get() {
            Some(&cc) => cc,
            None => {
                let cc = self.stream.context().compute_capability()?;
                *self.cc.get_or_init(|| cc)
            }
        };
        if crate::dispatch::built_arch(cc).is_none() {
            return Err(Error::UnsupportedDevice { ordinal: self.stream.context().ordinal(), major: cc.0, minor: cc.1, supported: crate::gemm::SUPPORTED });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matrix::QUANTIZER_MAX_ROWS;

    /// The quantizer's entry point refuses, by itself, what Rust's checks refuse before it: sizes
    /// past its 32-bit counters and argument combinations it has no kernel for. Each case changes
    /// one field of a call within every limit (whose launch is not attempted: its addresses are
    /// not real), and must come back INVALID_PROBLEM with no CUDA call made.
    #[test]
    fn the_quantizer_entry_refuses_what_rust_refuses() {
        let fake = 0x1000u64;
        let base = QuantizeArgs {
            m: 128, k: 64, l: 1, input: InKind::Bf16, x: fake, codes: fake, scales: fake, global_scale: 1.0, amax_slot: 0,
            offsets: 0, experts: 0, stream: 0, transform: QuantTransform::None, decoded: 0, decoded_rows: 0,
        };
        let max_rows = sys::QUANT_MAX_ROWS as i32;
        let cases: Vec<(&str, QuantizeArgs)> = vec![
            ("M = 0", QuantizeArgs { m: 0, ..base }),
            ("M past the limit", QuantizeArgs { m: max_rows + 1, ..base }),
            ("L = 0", QuantizeArgs { l: 0, ..base }),
            ("L past grid.z", QuantizeArgs { l: sys::QUANT_MAX_BATCH as i32 + 1, ..base }),
            ("K = 0", QuantizeArgs { k: 0, ..base }),
            ("K not a multiple of 16", QuantizeArgs { k: 72, ..base }),
            ("K negative", QuantizeArgs { k: -16, ..base }),
            ("SwiGLU 2K past i32", QuantizeArgs { k: (i32::MAX / 2 + 16) / 16 * 16, transform: QuantTransform::SwigluHalves, ..base }),
            ("SwiGLU with a computed scale", QuantizeArgs { transform: QuantTransform::SwigluHalves, amax_slot: fake, ..base }),
            ("null x", QuantizeArgs { x: 0, ..base }),
            ("null codes", QuantizeArgs { codes: 0, ..base }),
            ("null scales", QuantizeArgs { scales: 0, ..base }),
            ("MoE with L = 2", QuantizeArgs { offsets: fake, experts: 8, l: 2, ..base }),
            ("MoE with no experts", QuantizeArgs { offsets: fake, experts: 0, ..base }),
            ("MoE past the experts' limit", QuantizeArgs { offsets: fake, experts: sys::MAX_GROUPS as i32 + 1, ..base }),
            ("decode with the MoE layout", QuantizeArgs { offsets: fake, experts: 8, decoded: fake, decoded_rows: 128, ..base }),
            ("decode with a computed scale", QuantizeArgs { amax_slot: fake, decoded: fake, decoded_rows: 128, ..base }),
            ("decode of fewer rows than M", QuantizeArgs { decoded: fake, decoded_rows: 64, ..base }),
            ("decode past the limit", QuantizeArgs { m: max_rows, decoded: fake, decoded_rows: max_rows + 129, ..base }),
        ];
        for (what, args) in cases {
            // SAFETY: every case is refused before any address is used (what the test checks);
            // nothing is launched or read.
            let st = unsafe { sys::quantize(&args) };
            assert_eq!((st.cutlass_status, st.cuda_error), (sys::STATUS_INVALID_PROBLEM, 0), "{what}: not refused by the entry point");
        }
        // The rows Rust allows (a multiple of 128) are the entry point's, and its decode reaches
        // the limit's decode rows.
        assert!(QUANTIZER_MAX_ROWS.is_multiple_of(128));
        assert_eq!(Nvfp4Activations::decoded_rows(QUANTIZER_MAX_ROWS), QUANTIZER_MAX_ROWS + 128);
    }
}
