//! Device-side NVFP4 tensors: [`Nvfp4Tensor`] (values, tiled scales, shape and the per-tensor
//! global scale, which the GEMM folds into alpha), [`Nvfp4Activations`] (a quantizer's output
//! with its FP16 decode) and [`ForeignBuffer`] (device memory another library owns, passed
//! without a copy).

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, DeviceSlice, SyncOnDrop};

use crate::error::{check_len, Error, Result};
use crate::formats::{PackedFp4, ScaleByte};
use crate::layout::{prepacked_bytes, sf_batch_bytes, WeightLayout};
use crate::matrix::{check_global_scale, check_lens, check_quantizer_dims, check_shape, Nvfp4Matrix};
use crate::sys;

/// An NVFP4 tensor of shape (batch, rows, K) on the device: packed e2m1 values (two per byte, K
/// contiguous, element 2i in the low nibble; `u8` or `float4::F4E2M1x2`), ue4m3 block scales
/// (`u8` or `float8::F8E4M3`) in the 128x4 tiled layout of [`crate::layout`], and the per-tensor
/// global scale: element (l, r, k) is `e2m1 * scale * global_scale`.
///
/// The storage is any cudarc device buffer: an owned [`CudaSlice`] (see [`Self::upload`]), a
/// borrowed `CudaView` of memory the caller already holds, or a [`ForeignBuffer`] over a raw
/// device pointer. The GEMM entry points multiply alpha by both operands' global scales, so a
/// checkpoint's `weight_scale_2` or a quantizer's scale cannot be forgotten.
///
/// ```no_run
/// use blockscaled_gemm::{Nvfp4Matrix, Nvfp4Tensor};
/// use cudarc::driver::CudaContext;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let stream = CudaContext::new(0)?.new_stream()?;
/// // Quantize on the host (the global scale is computed, or pass Some(scale)), then upload.
/// let x: Vec<half::bf16> = (0..2 * 64 * 256).map(|i| half::bf16::from_f32((i % 97) as f32 - 48.0)).collect();
/// let w = Nvfp4Tensor::upload(&Nvfp4Matrix::quantize(&x, (2, 64, 256), None)?, &stream)?;
/// assert_eq!(w.shape(), (2, 64, 256));
/// // Borrow buffers the engine already holds: no copy; the global scale must be given.
/// let (values, scales) = (stream.alloc_zeros::<u8>(2 * 64 * 128)?, stream.alloc_zeros::<u8>(2 * 128 * 16)?);
/// let borrowed = Nvfp4Tensor::new(values.as_view(), scales.as_view(), (2, 64, 256), 1.0)?;
/// # let _ = borrowed; Ok(()) }
/// ```
#[derive(Debug)]
pub struct Nvfp4Tensor<V = CudaSlice<u8>, S = CudaSlice<u8>> {
    values: V,
    scales: S,
    batch: usize,
    rows: usize,
    k: usize,
    global_scale: f32,
    // The values' layout; their length was checked against it on construction.
    layout: WeightLayout,
}

impl<V, S> Nvfp4Tensor<V, S> {
    /// A tensor over device buffers: `values` holds `batch * rows * k / 2` packed bytes and
    /// `scales` `batch * layout::sf_batch_bytes(rows, k)` tiled bytes; `global_scale` is finite and
    /// positive (1.0 where the data has none). K must be a multiple of 16 (one scale per 16
    /// values); the GEMM adds its own rules (K a multiple of 32, N a multiple of 32 for FP4 outputs:
    /// `Problem::validate`).
    pub fn new<TV: PackedFp4, TS: ScaleByte>(values: V, scales: S, shape: (usize, usize, usize), global_scale: f32) -> Result<Self>
    where
        V: DeviceSlice<TV>, S: DeviceSlice<TS>,
    {
        Self::with_layout(values, scales, shape, global_scale, WeightLayout::Standard)
    }

    /// A weight tensor whose values are already in the prepacked layout ([`crate::layout`]:
    /// `batch * ceil(K/256) * rows * 128` bytes, zero past K), e.g. saved from
    /// [`Self::prepack`]; scales and global scale as for [`Self::new`]. Only B operands take it,
    /// on Hopper (SM90).
    pub fn new_prepacked<TV: PackedFp4, TS: ScaleByte>(values: V, scales: S, shape: (usize, usize, usize), global_scale: f32) -> Result<Self>
    where
        V: DeviceSlice<TV>, S: DeviceSlice<TS>,
    {
        Self::with_layout(values, scales, shape, global_scale, WeightLayout::Prepacked)
    }

    fn with_layout<TV, TS>(values: V, scales: S, shape: (usize, usize, usize), global_scale: f32, layout: WeightLayout) -> Result<Self>
    where
        V: DeviceSlice<TV>, S: DeviceSlice<TS>,
    {
        let (batch, rows, k) = shape;
        check_shape(rows, k, batch)?;
        check_global_scale(global_scale)?;
        if layout == WeightLayout::Prepacked {
            check_len("values", values.len(), prepacked_bytes((batch, rows, k)), "batch * ceil(K/256) * rows * 128 prepacked bytes")?;
        }
        let standard_len = if layout == WeightLayout::Standard { values.len() } else { batch * rows * k / 2 };
        check_lens(("values", standard_len), scales.len(), shape)?;
        Ok(Nvfp4Tensor { values, scales, batch, rows, k, global_scale, layout })
    }

    /// The values' layout.
    pub fn layout(&self) -> WeightLayout {
        self.layout
    }

    /// The values' length as the standard layout would have it (what the GEMMs check against
    /// the problem; a prepacked tensor's own length was checked against its layout when made).
    pub(crate) fn standard_values_len<TV>(&self) -> usize
    where
        V: DeviceSlice<TV>,
    {
        match self.layout {
            WeightLayout::Standard => self.values.len(),
            WeightLayout::Prepacked => self.batch * self.rows * self.k / 2,
        }
    }

    /// An A operand (activations) takes the standard layout only: the typed error otherwise.
    pub(crate) fn require_activation_layout(&self) -> Result<()> {
        match self.layout {
            WeightLayout::Standard => Ok(()),
            layout => Err(Error::Layout { name: "A", layout, rule: "activations are K-major rows (prepacked values are a weight layout)" }),
        }
    }

    /// A copy of the tensor with its values re-laid on the GPU into the prepacked layout
    /// ([`crate::layout`]) and its scales copied as they are, new buffers in `stream`'s order;
    /// `self` is left as it was (drop it once the copy is made: the peak is both). Prepacked
    /// weights stream in whole blocks through the Hopper kernels and give the standard layout's
    /// bits wherever the FP32 sums are exact (a split GEMM's K ranges then start at whole TMA
    /// boxes of B, 128 or 256 values). A one-time transform at load time: it allocates, so it is
    /// refused during CUDA graph capture. K must be a multiple of 32.
    ///
    /// ```no_run
    /// use blockscaled_gemm::{Nvfp4Matrix, Nvfp4Tensor, WeightLayout};
    /// use cudarc::driver::CudaContext;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let stream = CudaContext::new(0)?.new_stream()?;
    /// let w = Nvfp4Tensor::upload(&Nvfp4Matrix::random_contest((1, 4096, 7168), 7)?, &stream)?;
    /// let packed = w.prepack(&stream)?;
    /// drop(w);
    /// assert_eq!(packed.layout(), WeightLayout::Prepacked);
    /// // Every GEMM entry takes it as B; unpack() gives the standard layout back.
    /// let back = packed.unpack(&stream)?;
    /// # let _ = back; Ok(()) }
    /// ```
    pub fn prepack<TV: PackedFp4 + DeviceRepr, TS: ScaleByte + DeviceRepr>(&self, stream: &Arc<CudaStream>) -> Result<Nvfp4Tensor<CudaSlice<TV>, CudaSlice<TS>>>
    where
        V: DevicePtr<TV>, S: DevicePtr<TS>,
    {
        self.relayout(WeightLayout::Prepacked, stream)
    }

    /// A copy in the standard layout (the inverse of [`Self::prepack`]), as that one is made.
    pub fn unpack<TV: PackedFp4 + DeviceRepr, TS: ScaleByte + DeviceRepr>(&self, stream: &Arc<CudaStream>) -> Result<Nvfp4Tensor<CudaSlice<TV>, CudaSlice<TS>>>
    where
        V: DevicePtr<TV>, S: DevicePtr<TS>,
    {
        self.relayout(WeightLayout::Standard, stream)
    }

    fn relayout<TV: PackedFp4 + DeviceRepr, TS: ScaleByte + DeviceRepr>(&self, to: WeightLayout, stream: &Arc<CudaStream>) -> Result<Nvfp4Tensor<CudaSlice<TV>, CudaSlice<TS>>>
    where
        V: DevicePtr<TV>, S: DevicePtr<TS>,
    {
        let (batch, rows, k) = self.shape();
        if self.layout == to {
            return Err(Error::Layout { name: "values", layout: self.layout, rule: "already in that layout" });
        }
        if !k.is_multiple_of(32) {
            return Err(Error::KMultiple { k, multiple: 32, why: "prepacked values move in 16-byte units" });
        }
        for (dim, value) in [("rows", rows), ("K", k), ("batch", batch)] {
            if value > i32::MAX as usize {
                return Err(Error::Dimension { dim, value, max: i32::MAX as usize });
            }
        }
        let out_len = match to {
            WeightLayout::Prepacked => prepacked_bytes((batch, rows, k)),
            WeightLayout::Standard => batch * rows * k / 2,
        };
        crate::gemm::check_devices(stream.context().ordinal(), [("values", self.values.stream()), ("scales", self.scales.stream())])?;
        if crate::gemm::capture_check(stream)? {
            return Err(Error::NotCapturable { call: "Nvfp4Tensor::prepack", why: "it allocates the new values", fix: "prepack when loading the weights, before capturing" });
        }
        // SAFETY: the kernel below writes every byte (the prepacked padding as zeros) before any read.
        let mut out = unsafe { stream.alloc::<TV>(out_len) }?;
        {
            let (src, _gs) = self.values.device_ptr(stream);
            let (dst, _gd) = out.device_ptr_mut(stream);
            crate::problem::check_align("values", src)?;
            // SAFETY: src holds the shape's bytes in the current layout (checked when the tensor
            // was made) and dst those of the other (one byte an element), 16-byte aligned (cudarc
            // allocations are 256), on this stream's device; K is a multiple of 32; the guards
            // live until the launch is queued.
            let st = unsafe { sys::prepack_values(src, dst, rows as i32, k as i32, batch as i32, to == WeightLayout::Standard, stream.cu_stream() as u64) };
            if st.cuda_error != 0 {
                return Err(Error::CudaRuntime { code: st.cuda_error, name: sys::cuda_error_name(st.cuda_error) });
            }
        }
        let scales = stream.clone_dtod(&self.scales)?;
        Ok(Nvfp4Tensor { values: out, scales, batch, rows, k, global_scale: self.global_scale, layout: to })
    }

    /// (batch, rows, K): rows are M of an A operand, N of a B operand.
    pub fn shape(&self) -> (usize, usize, usize) {
        (self.batch, self.rows, self.k)
    }
    /// The per-tensor global scale the GEMM folds into alpha.
    pub fn global_scale(&self) -> f32 {
        self.global_scale
    }
    /// The packed values, in [`Self::layout`] (prepacked values passed to [`Self::new`] would be
    /// read as the standard layout: use [`Self::new_prepacked`]).
    pub fn values(&self) -> &V {
        &self.values
    }
    /// The tiled scales.
    pub fn scales(&self) -> &S {
        &self.scales
    }
    /// The buffers back, values (in [`Self::layout`]) then scales.
    pub fn into_parts(self) -> (V, S) {
        (self.values, self.scales)
    }

    /// Device addresses of values and scales, with the guards that order them on `stream`.
    pub(crate) fn ptrs<'s, TV, TS>(&'s self, stream: &'s CudaStream) -> ([u64; 2], [SyncOnDrop<'s>; 2])
    where
        V: DevicePtr<TV>, S: DevicePtr<TS>,
    {
        let (v, gv) = self.values.device_ptr(stream);
        let (s, gs) = self.scales.device_ptr(stream);
        ([v, s], [gv, gs])
    }
}

impl Nvfp4Tensor {
    /// Copies a host matrix to the device on `stream` (its global scale, or 1.0 where it has
    /// none, comes along).
    pub fn upload(m: &Nvfp4Matrix, stream: &Arc<CudaStream>) -> Result<Self> {
        let (values, scales) = (stream.clone_htod(m.data())?, stream.clone_htod(m.scales())?);
        Nvfp4Tensor::new(values, scales, (m.batch(), m.rows(), m.k()), m.global_scale().unwrap_or(1.0))
    }

    /// A tensor from packed values and **row-major** ue4m3 block scales `(batch, rows, K/16)`, as
    /// checkpoints store them, both already on the device: the scales are re-tiled into the 128x4
    /// layout on the GPU, into a new buffer (padding zeroed), in `stream`'s order; `row_major` is
    /// only read, `values` taken as they are (a `CudaSlice`, a view or a [`ForeignBuffer`]: a
    /// buffer given by value is dropped when the call fails, so pass a view to keep it). Scale
    /// bytes are moved, not checked (a NaN scale stays NaN: [`crate::checkpoint`] checks them on
    /// the host). It allocates, so it is refused during CUDA graph capture
    /// ([`Error::NotCapturable`]): convert at load time, or tile into memory of your own with
    /// [`Self::tile_scales_into`].
    pub fn from_row_major_scales<V: DeviceSlice<u8>, S: DevicePtr<u8>>(values: V, row_major: &S, shape: (usize, usize, usize), global_scale: f32, stream: &Arc<CudaStream>) -> Result<Nvfp4Tensor<V>> {
        let (batch, rows, k) = shape;
        check_tiling(row_major, shape)?;
        check_global_scale(global_scale)?;
        // check_tiling bounds every count below: the products fit.
        check_len("values", values.len(), batch * rows * k / 2, "batch * rows * K / 2 packed bytes")?;
        crate::gemm::check_devices(stream.context().ordinal(), [("values", values.stream()), ("scales", row_major.stream())])?;
        if crate::gemm::capture_check(stream)? {
            return Err(Error::NotCapturable { call: "Nvfp4Tensor::from_row_major_scales", why: "it allocates the tiled scales", fix: "convert when loading the weights, before capturing, or tile into your own buffer (Nvfp4Tensor::tile_scales_into)" });
        }
        // SAFETY: every byte is written by tile_scales_into (padding included) before any read;
        // on its error the buffer is dropped unread.
        let mut tiled = unsafe { stream.alloc::<u8>(batch * sf_batch_bytes(rows, k)) }?;
        Self::tile_scales_into(row_major, &mut tiled, shape, stream)?;
        Nvfp4Tensor::new(values, tiled, shape, global_scale)
    }

    /// Row-major ue4m3 block scales `(batch, rows, K/16)` (as checkpoints store them) re-tiled
    /// on the GPU into `tiled`, a buffer of the caller's (an engine's arena: a view or a
    /// [`ForeignBuffer`]) of exactly `batch * layout::sf_batch_bytes(rows, k)` bytes, padding
    /// zeroed, in `stream`'s order (make the tensor with [`Self::new`] over it). One launch, no
    /// allocation: it can be captured. Bytes are moved, not checked (as [`Self::from_row_major_scales`]).
    pub fn tile_scales_into<S: DevicePtr<u8>, D: DevicePtrMut<u8>>(row_major: &S, tiled: &mut D, shape: (usize, usize, usize), stream: &Arc<CudaStream>) -> Result<()> {
        let (batch, rows, k) = shape;
        check_tiling(row_major, shape)?;
        check_len("tiled", tiled.len(), batch * sf_batch_bytes(rows, k), "batch * ceil(rows/128)*128 * ceil(K/64)*4 tiled bytes")?;
        crate::gemm::check_devices(stream.context().ordinal(), [("scales", row_major.stream()), ("tiled", tiled.stream())])?;
        crate::gemm::capture_check(stream)?;
        let (src, _gs) = row_major.device_ptr(stream);
        let (dst, _gd) = tiled.device_ptr_mut(stream);
        crate::problem::check_align_to("tiled", dst, 4)?; // the kernel stores 32-bit words (the GEMMs want 16)
        // SAFETY: src holds batch * rows * K/16 bytes (read bytewise) and dst, 4-byte aligned,
        // the tiled layout's bytes on this stream's device (checked above); the guards live until
        // the launch is queued.
        let st = unsafe { sys::tile_scales(src, dst, rows as i32, (k / 16) as i32, batch as i32, stream.cu_stream() as u64) };
        if st.cuda_error != 0 {
            return Err(Error::CudaRuntime { code: st.cuda_error, name: sys::cuda_error_name(st.cuda_error) });
        }
        Ok(())
    }
}

/// The rules of the scale tiling's launch: a valid shape, each count within its 32-bit
/// arguments, and `row_major` holding `batch * rows * K/16` bytes.
fn check_tiling<S: DevicePtr<u8>>(row_major: &S, (batch, rows, k): (usize, usize, usize)) -> Result<()> {
    check_shape(rows, k, batch)?;
    for (dim, value) in [("rows", rows), ("K / 16", k / 16), ("batch", batch)] {
        if value > i32::MAX as usize {
            return Err(Error::Dimension { dim, value, max: i32::MAX as usize });
        }
    }
    check_len("scales", row_major.len(), batch * rows * (k / 16), "batch * rows * K/16 row-major scale bytes")
}

/// NVFP4 activations with their decode beside them: the codes and tiled scales of an
/// [`Nvfp4Tensor`], and the codes times their scales as FP16 in the order Hopper's configs of
/// [`Schedule::SwappedRegisterDecode`](crate::Schedule::SwappedRegisterDecode) read activations
/// (the rule's pick from 33 rows for most shapes: [`crate::BlockScaledGemm::select_config`] says).
/// [`crate::Quantizer::quantize_decoded_into`] writes all three in one launch, and
/// [`crate::BlockScaledGemm::gemm_decoded`] hands the decode to those configs, which otherwise
/// decode the activations again in a pre-pass launch before the GEMM (bench/DESIGN.md §3).
/// The buffers are written together, by the quantizer only, so the decode cannot disagree with
/// the codes: both paths give the same bits.
///
/// The decode takes `2 * batch * Self::decoded_rows(rows) * K` bytes (K rounded up to 64), four
/// times the codes: it pays where the GEMM runs one of those configs. Other configs (the stream
/// tiles, to 32 rows; `Sm90_128x128x64` and `Sm90_128x64x64`), and every SM100 kernel, read the
/// codes and scales, as from [`Self::tensor`]: there the decode is written for nothing.
///
/// ```no_run
/// use blockscaled_gemm::{BlockScaledGemm, Nvfp4Activations, Nvfp4Matrix, Nvfp4Tensor, Problem, Quantizer};
/// use cudarc::driver::CudaContext;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let stream = CudaContext::new(0)?.new_stream()?;
/// let (m, n, k) = (64, 4096, 7168);
/// let x = stream.clone_htod(&vec![half::bf16::from_f32(0.5); m * k])?; // activations on the GPU
/// let w = Nvfp4Tensor::upload(&Nvfp4Matrix::random_realistic((1, n, k), 1)?, &stream)?;
/// let mut xq = Nvfp4Activations::new(&stream, (1, m, k))?; // allocated once, reused every step
/// let mut y = stream.alloc_zeros::<half::bf16>(m * n)?;
/// let (quantizer, gemm) = (Quantizer::new(stream.clone()), BlockScaledGemm::new(stream.clone())?);
/// // Each step: two launches, both capturable in a CUDA graph.
/// quantizer.quantize_decoded_into(&x, 0.5 / 2688.0, &mut xq)?;
/// gemm.gemm_decoded(&Problem::new(m, n, k), &xq, &w, &mut y, None)?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Nvfp4Activations {
    tensor: Nvfp4Tensor,
    decoded: CudaSlice<u16>,
}

impl Nvfp4Activations {
    /// Zeroed buffers for (batch, rows, K) activations on `stream`'s device (global scale 1
    /// until quantized into). It allocates, so it is refused during CUDA graph capture.
    pub fn new(stream: &Arc<CudaStream>, shape: (usize, usize, usize)) -> Result<Self> {
        let (batch, rows, k) = shape;
        check_quantizer_dims(shape)?;
        if crate::gemm::capture_check(stream)? {
            return Err(Error::NotCapturable { call: "Nvfp4Activations::new", why: "it allocates its buffers", fix: "allocate before capturing; quantize_decoded_into is capturable" });
        }
        let (decoded_rows, k_pad) = (Self::decoded_rows(rows), k.div_ceil(64) * 64);
        let bytes = crate::error::product(&[batch, decoded_rows, k_pad, 2]);
        if bytes > isize::MAX as u128 {
            let dims = format!("rows = {rows} ({decoded_rows} decoded), K = {k} ({k_pad}), batch = {batch}");
            return Err(Error::SizeLimit { what: "decoded bytes", rule: "batch * decoded rows * K rounded up to 64 * 2", dims, value: bytes, max: isize::MAX as u128, why: "the largest allocation is isize::MAX bytes" });
        }
        let (values, scales) = (stream.alloc_zeros::<u8>(batch * rows * k / 2)?, stream.alloc_zeros::<u8>(batch * sf_batch_bytes(rows, k))?);
        let tensor = Nvfp4Tensor::new(values, scales, shape, 1.0)?;
        Ok(Nvfp4Activations { tensor, decoded: stream.alloc_zeros::<u16>(Self::decoded_len(shape))? })
    }

    /// FP16 values of the decode of (batch, rows, K) activations: batch times
    /// [`Self::decoded_rows`] times K rounded up to 64 (saturating at `usize::MAX`, which no
    /// buffer holds). At batch 1 the decode of fewer rows is a prefix of that of more
    /// ([`crate::BlockScaledGemm::gemm_decoded_parts`]).
    pub fn decoded_len((batch, rows, k): (usize, usize, usize)) -> usize {
        batch.saturating_mul(Self::decoded_rows(rows)).saturating_mul(k.div_ceil(64).saturating_mul(64))
    }

    /// Rows a batch of the decode holds for `rows` activation rows: rounded up to 64 up to 64
    /// rows, to 128 up to 128, to 256 beyond: the rows of the tiles the rule takes there, so
    /// that their TMA boxes stay inside the buffer (a taller tile forced at fewer rows reads
    /// zeros past it through TMA's fill, with the same bits, which can be slower:
    /// bench/DESIGN.md §3). The padding rows are zeros. Saturates at `usize::MAX` for counts no
    /// buffer can hold.
    pub fn decoded_rows(rows: usize) -> usize {
        match rows {
            0..=64 => rows.div_ceil(64) * 64,
            65..=128 => 128,
            _ => rows.div_ceil(256).saturating_mul(256),
        }
    }

    /// The kernel arguments of a decode at `ptr` (its address, if a call has one) for `rows`
    /// activation rows: (address, [`Self::decoded_rows`]), or (0, 0) for none.
    pub(crate) fn launch_arg(ptr: Option<u64>, rows: usize) -> (u64, i32) {
        ptr.map_or((0, 0), |p| (p, Self::decoded_rows(rows) as i32))
    }

    /// The codes and scales, with the global scale of the last quantization.
    pub fn tensor(&self) -> &Nvfp4Tensor {
        &self.tensor
    }

    /// (batch, rows, K).
    pub fn shape(&self) -> (usize, usize, usize) {
        self.tensor.shape()
    }

    /// The decode, FP16 bits: (batch, [`Self::decoded_rows`], K rounded up to 64), each row's
    /// 64-K block `b` as eight 16-byte chunks, chunk `2 s + h` holding for each scale group `c`
    /// of the block (16 values) the values `16 c + 4 s + h` and `16 c + 4 s + h + 2`; zeros past
    /// the rows and past K. Read-only: the quantizer is its only writer.
    pub fn decoded(&self) -> &CudaSlice<u16> {
        &self.decoded
    }

    /// The three buffers to write, and the global scale to set once the launch is queued.
    pub(crate) fn parts_mut(&mut self) -> (&mut CudaSlice<u8>, &mut CudaSlice<u8>, &mut CudaSlice<u16>, &mut f32) {
        let t = &mut self.tensor;
        (&mut t.values, &mut t.scales, &mut self.decoded, &mut t.global_scale)
    }
}

/// Device memory another library owns (a PyTorch or candle tensor, an engine's arena), given to
/// this crate as a raw device pointer without a copy. It implements cudarc's `DevicePtr` and
/// `DevicePtrMut`, so it goes wherever a `CudaSlice` does ([`Nvfp4Tensor::new`], the output of
/// [`crate::BlockScaledGemm::gemm`]). The lifetime ties it to whatever keeps the memory alive.
///
/// No events are recorded or waited on, whatever stream a call runs on: the owner orders its own
/// work against every call the buffer is passed to (on that call's stream).
///
/// ```no_run
/// use blockscaled_gemm::ForeignBuffer;
/// use cudarc::driver::{CudaContext, DevicePtr};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let stream = CudaContext::new(0)?.new_stream()?;
/// let owner = stream.alloc_zeros::<half::f16>(4096)?; // stands for another library's tensor
/// let (addr, _guard) = owner.device_ptr(&stream);
/// // SAFETY: `owner` holds 4096 f16 on this stream's device and outlives `d`.
/// let d = unsafe { ForeignBuffer::<half::f16>::new(addr, 4096, &stream) };
/// # let _ = d; Ok(()) }
/// ```
#[derive(Debug)]
pub struct ForeignBuffer<'a, T> {
    ptr: CUdeviceptr,
    len: usize,
    stream: Arc<CudaStream>,
    _owner: PhantomData<&'a mut [T]>,
}

impl<T> ForeignBuffer<'_, T> {
    /// `len` elements of `T` at device address `ptr`.
    ///
    /// # Safety
    /// `ptr` must point to at least `len * size_of::<T>()` bytes of device memory of `stream`'s
    /// device (the device the calls check it against), allocated for as long as the buffer and
    /// any work queued with it live (the lifetime is the caller's choice and is not checked), and
    /// every other use of that memory must be ordered against each call the buffer is passed to,
    /// on that call's stream (the same stream, or events).
    pub unsafe fn new(ptr: u64, len: usize, stream: &Arc<CudaStream>) -> Self {
        ForeignBuffer { ptr, len, stream: stream.clone(), _owner: PhantomData }
    }
}

impl<T> DeviceSlice<T> for ForeignBuffer<'_, T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

impl<T> DevicePtr<T> for ForeignBuffer<'_, T> {
    fn device_ptr<'a>(&'a self, _stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Record(None))
    }
}

impl<T> DevicePtrMut<T> for ForeignBuffer<'_, T> {
    fn device_ptr_mut<'a>(&'a mut self, _stream: &'a CudaStream) -> (CUdeviceptr, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Record(None))
    }
}

#[cfg(test)]
mod tests {
    use super::Nvfp4Activations;

    /// The decode's rows a batch cover the rows of every tile that reads it (64, 128 or 256) from
    /// the activation rows, and no more than the next such multiple.
    #[test]
    fn decoded_rows_cover_the_tiles() {
        let cases = [(0, 0), (1, 64), (33, 64), (64, 64), (65, 128), (128, 128), (129, 256), (256, 256), (257, 512), (300, 512), (8192, 8192)];
        for (rows, want) in cases {
            assert_eq!(Nvfp4Activations::decoded_rows(rows), want, "{rows} rows");
        }
        for rows in 1..2000 {
            let r = Nvfp4Activations::decoded_rows(rows);
            assert!(r >= rows && r.is_multiple_of(64) && (rows <= 128 || r.is_multiple_of(256)) && r - rows < 256, "{rows} rows: {r}");
        }
        // Near usize::MAX: the multiple of 256 where it exists, else saturated.
        for (rows, want) in [(usize::MAX - 300, usize::MAX - 255), (usize::MAX - 100, usize::MAX), (usize::MAX, usize::MAX)] {
            assert_eq!(Nvfp4Activations::decoded_rows(rows), want, "{rows} rows");
        }
    }

    /// The decode's length grows with the rows (so, at batch 1, fewer rows' decode is a prefix of
    /// more rows'), and saturates where no buffer holds it.
    #[test]
    fn decoded_len_is_a_prefix_and_saturates() {
        let mut last = 0;
        for rows in 1..600 {
            let len = Nvfp4Activations::decoded_len((1, rows, 1056));
            assert!(len >= last && len == Nvfp4Activations::decoded_rows(rows) * 1088, "{rows} rows: {len}");
            last = len;
        }
        assert_eq!(Nvfp4Activations::decoded_len((3, 130, 64)), 3 * 256 * 64);
        assert_eq!(Nvfp4Activations::decoded_len((2, usize::MAX / 2, 64)), usize::MAX);
        assert_eq!(Nvfp4Activations::decoded_len((1, 64, usize::MAX - 3)), usize::MAX);
    }
}
