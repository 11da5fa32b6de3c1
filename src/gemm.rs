//! `BlockScaledGemm`: the safe API over the kernels. Every argument is checked here, before the
//! FFI line; device buffers come in through cudarc's `DevicePtr`/`DevicePtrMut` and their guards
//! are held until the launch is queued.

use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{CUdeviceptr, CUresult, CUstreamCaptureMode, CUstreamCaptureStatus};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use crate::dispatch::{self, Config};
use crate::layout::WeightLayout;
use crate::error::{check_len, Error, Result};
use crate::sys::{self, KernelArgs};
use crate::formats::{OutputElement, PackedFp4, ScaleByte};
use crate::problem::{check_align, check_operand_lens, d_rule, OutType, Problem};
use crate::problem::folded_alpha;
use crate::tensor::{Nvfp4Activations, Nvfp4Tensor};

/// An FP4 output on the device: packed e2m1 values (`u8` or `float4::F4E2M1x2`, (L, M, N/2)
/// bytes) and the scale factors the GEMM generates (`p.sfd_bytes()` bytes, the 128x4 tiled
/// layout over (M, N/16)). With ue4m3 scales ([`OutType::Nvfp4`]) the pair is, as it stands, the
/// A operand of a next GEMM with K = N and global scale `1 / norm_constant`:
/// `Nvfp4Tensor::new(values.as_view(), scales.as_view(), (l, m, n), 1.0 / norm_constant)`.
pub struct Nvfp4Output<'a, V, S> {
    /// Packed values.
    pub values: &'a mut V,
    /// Generated scale factors; the padding is written with zeros. On SM100 a memset queued ahead
    /// of the GEMM writes those zeros, so a launch CUTLASS then rejects (a cluster the device
    /// cannot schedule, say) returns its error with the padding already zeroed: the one write a
    /// failed call can leave.
    pub scales: &'a mut S,
}

impl<'a, V, S> Nvfp4Output<'a, V, S> {
    /// Pairs values with their scale factors.
    pub fn new(values: &'a mut V, scales: &'a mut S) -> Self {
        Nvfp4Output { values, scales }
    }
}

/// The GPUs this crate's kernels run on, for messages.
pub const SUPPORTED: &str = "compute capability 10.0 (B200, GB200: sm_100a) and 9.0 (H100, H200: sm_90a)";
/// The GPUs the grouped GEMM runs on, for messages.
pub const SUPPORTED_GROUPED: &str = "compute capability 9.0 (H100, H200: sm_90a; f16, bf16, f32, nvfp4 or nvfp4-ue8m0 output) or 10.0 (B200, GB200: sm_100a; f16, bf16, nvfp4 or nvfp4-ue8m0 output) for the grouped GEMM";

/// The facts of a device that choose and check a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceFacts {
    /// Device ordinal.
    pub ordinal: usize,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Multiprocessor count.
    pub sm_count: usize,
    /// Clusters of 2 to [`crate::SM90_MAX_CLUSTER_SPLIT`] thread blocks, one block per SM, the
    /// device runs at once (asked of the driver on Hopper; [`crate::ANY_CLUSTERS`] elsewhere or
    /// where it cannot answer): the SM90 heuristic keeps split-K clusters within one wave.
    pub max_clusters: crate::dispatch::ClusterCounts,
}

impl DeviceFacts {
    /// The table architecture that runs on this device (100 for CC 10.0), if any.
    pub fn arch(&self) -> Option<u32> {
        Config::ALL.iter().find(|c| c.compute_capability() == self.compute_capability).map(|c| c.info().arch)
    }
}

/// Buffer lengths of one launch, in elements of each buffer's own type.
#[derive(Clone, Copy, Debug)]
pub struct BufferLens {
    /// A values (bytes).
    pub a: usize,
    /// SFA (bytes).
    pub sfa: usize,
    /// B values (bytes).
    pub b: usize,
    /// SFB (bytes).
    pub sfb: usize,
    /// C, when given.
    pub c: Option<usize>,
    /// D (bytes for FP4 outputs).
    pub d: usize,
    /// SFD (bytes), for FP4 outputs.
    pub sfd: Option<usize>,
}

impl BufferLens {
    /// The lengths a problem with output `out` needs (with a C when `has_c`).
    pub fn for_problem(p: &Problem, out: OutType, has_c: bool) -> Self {
        let d = if out.sfd().is_some() { out.d_bytes(p.cd_elems()) } else { p.cd_elems() };
        BufferLens { a: p.a_bytes(), sfa: p.sfa_bytes(), b: p.b_bytes(), sfb: p.sfb_bytes(), c: has_c.then_some(p.cd_elems()), d, sfd: out.sfd().map(|_| p.sfd_bytes()) }
    }
}

/// Everything checked before a launch that does not need device pointers: the problem's shape
/// rules, every buffer length, the config's architecture against the device, and that the
/// kernel is in this build. Returns the config to run. Pure: the tests call it with any device.
pub fn plan(p: &Problem, out: OutType, lens: &BufferLens, device: &DeviceFacts, forced: Option<Config>, built: impl Fn(Config, OutType) -> bool) -> Result<Config> {
    p.validate(out, lens.c.is_some())?;
    check_operand_lens(p, [lens.a, lens.sfa, lens.b, lens.sfb])?;
    let (name, want, rule) = d_rule(p, out);
    check_len(name, lens.d, want, rule)?;
    if let Some(c) = lens.c {
        check_len("C", c, p.cd_elems(), if out.sfd().is_some() { "L * M * N f32 values" } else { "L * M * N elements, like D" })?;
    }
    match (out.sfd(), lens.sfd) {
        (Some(_), Some(got)) => check_len("SFD", got, p.sfd_bytes(), "L * ceil(M/128)*128 * ceil(N/64)*4 tiled scale bytes")?,
        (Some(_), None) => check_len("SFD", 0, p.sfd_bytes(), "FP4 output needs its scale-factor buffer")?,
        _ => {}
    }
    choose_config(p, out, device, forced, SUPPORTED, built)
}

/// The config a dense call runs once its problem and buffers are checked: `forced` checked against
/// the device's architecture, else the rule's ([`dispatch::select`]) among the configs `built`
/// allows (`supported` names the devices in the error where none runs here); then that `built`
/// holds it for `out`.
pub(crate) fn choose_config(p: &Problem, out: OutType, device: &DeviceFacts, forced: Option<Config>, supported: &'static str, built: impl Fn(Config, OutType) -> bool) -> Result<Config> {
    let config = resolve_config(device, out, forced, supported, &built, |arch| Ok(dispatch::select(arch, p, out, device.sm_count, &device.max_clusters, |c| built(c, out))))?;
    let info = config.info();
    match info.arch {
        100 => p.check_sm100(out)?,
        _ => p.check_tiles(info.tile[0] as usize, info.tile[1] as usize)?,
    }
    if info.swapped() {
        p.check_pre_pass(info.tile[0] as usize)?;
    }
    Ok(config)
}

/// Prepacked weights run on the SM90 kernels only (CUTLASS's SM100 kernels take K-major B): the
/// typed error for B in `layout` elsewhere.
pub(crate) fn check_weight_layout(config: Config, layout: WeightLayout) -> Result<()> {
    if config.info().arch == 90 || layout == WeightLayout::Standard {
        return Ok(());
    }
    Err(Error::Layout { name: "B", layout, rule: "prepacked weights run on Hopper (SM90) only; use Nvfp4Tensor::unpack for this device" })
}

/// The steps every call's config goes through: `forced` must match the device's architecture,
/// else `rule` picks for the device's architecture (None: no kernel runs here, named by
/// `supported`); then `built` must hold the config for `out`.
pub(crate) fn resolve_config(device: &DeviceFacts, out: OutType, forced: Option<Config>, supported: &'static str, built: &dyn Fn(Config, OutType) -> bool, rule: impl FnOnce(u32) -> Result<Option<Config>>) -> Result<Config> {
    let (major, minor) = device.compute_capability;
    let unsupported = || Error::UnsupportedDevice { ordinal: device.ordinal, major, minor, supported };
    let config = match forced {
        Some(c) => {
            if c.compute_capability() != device.compute_capability {
                return Err(Error::ArchMismatch { config: c, need: c.arch_label(), ordinal: device.ordinal, major, minor });
            }
            c
        }
        None => {
            let arch = device.arch().ok_or_else(unsupported)?;
            match rule(arch)? {
                Some(c) => c,
                // The architecture has kernels of this form, none for this output: say which rule.
                None => {
                    let here = |o: OutType| Config::ALL.iter().any(|&c| c.info().arch == arch && built(c, o));
                    if !here(out) && OutType::ALL.into_iter().any(here) {
                        return Err(Error::OutputUnsupported { out, ordinal: device.ordinal, major, minor });
                    }
                    return Err(unsupported());
                }
            }
        }
    };
    if !built(config, out) {
        return Err(Error::NotBuilt { config, out });
    }
    Ok(config)
}

/// NVFP4 x NVFP4 block-scaled GEMM on one CUDA stream:
/// `D = alpha * dec(A) dec(B)ᵀ + beta * C`, with A (L, M, K) and B (L, N, K) both K-major
/// (PyTorch `a @ b.T`), scales per 16 elements of K in the 128x4 tiled layout, FP32
/// accumulation, and D in f16, bf16 or f32 (or NVFP4: [`Self::gemm_fp4`]). f32 output is
/// Hopper's only. On Blackwell the kernels are CUTLASS's, compiled and host-tested but not yet run
/// on a B200 (no SM100 machine has been available): check first results with
/// [`crate::compare::verify`].
///
/// It is `Send + Sync`: the workspace sits behind a mutex held until the launch is queued, and
/// every launch goes to the one stream, which orders workspace reuse. The per-thread default
/// stream (`CudaContext::per_thread_stream`, candle's) is another stream on each host thread, so a
/// GEMM made on it serves the thread that made it and refuses the others
/// ([`Error::PerThreadStream`]): make one per thread there.
///
/// Stream ordering: every launch goes to the stream as usual, so the next operation on it sees D
/// complete. On Hopper the kernel also allows programmatic dependent launch: a next kernel that
/// was itself launched with `cudaLaunchAttributeProgrammaticStreamSerialization` may start before
/// this GEMM ends, and must call `cudaGridDependencySynchronize()` (PTX `griddepcontrol.wait`)
/// before it reads D, as such kernels do by contract. (This crate's own pre-pass does, and so
/// overlaps the previous call's tail.) The GEMM is itself launched that way, and reads no operand
/// before the kernel queued ahead of the call has completed: the kernels that sum K ranges in a
/// cluster only ask their first weight tiles into L2 meanwhile, which cannot return data older
/// than that kernel's writes.
///
/// Workspace: device memory the kernels use besides their operands. On Hopper it holds split-K
/// partials where a split goes through global memory, and for the swapped configs
/// (`Sm90_128x256x64`, `Sm90_256x128x64`, `Sm90_Swapped_128x128x64`, `Sm90_Swapped_64x128x64`,
/// `Sm90_Swapped_64x256x64`: the picks from 33 rows for most shapes, so reserve before capturing
/// those too)
/// the activations decoded once per call to FP16: 2 * L * M * K bytes, M rounded up to the
/// tile's rows, plus 256 KiB (4.3 MB at M = 128, K = 16384; 128 MiB at 8192^3), except where
/// the quantizer wrote them ([`Self::gemm_decoded`]).
/// [`Self::workspace_size`] tells a call's need ([`Self::workspace_size_decoded`] a decoded
/// call's), [`Self::reserve_workspace`] allocates ahead,
/// [`Self::set_workspace_limit`] bounds it. A call
/// grows it when needed, except during CUDA graph capture, where it returns
/// [`Error::WorkspaceDuringCapture`] instead of allocating. Memory it grew out of is kept until
/// the `BlockScaledGemm` is dropped (a captured graph may still use it) or
/// [`Self::release_workspace`] is called.
///
/// CUDA graphs: a call does no allocation (once the workspace suffices), no host
/// synchronisation and no host-to-device copy, so it can be captured; every value (alpha, beta,
/// the FP4 norm constant) is captured by value. Capture needs a stream other than the legacy
/// default stream, and cudarc's event tracking off for the buffers the graph uses
/// (`CudaContext::disable_event_tracking()` before allocating them): its waits on events recorded
/// before the capture would break it, so a call during capture with tracking on returns
/// [`Error::CaptureEventTracking`] before touching the stream. Graphs must not be replayed after
/// the `BlockScaledGemm` whose calls they captured is dropped.
///
/// ```no_run
/// use blockscaled_gemm::{BlockScaledGemm, Nvfp4Matrix, Nvfp4Tensor, Problem};
/// use cudarc::driver::CudaContext;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let stream = CudaContext::new(0)?.new_stream()?;
/// let (m, n, k) = (128, 256, 512);
/// let a = Nvfp4Matrix::random_contest((1, m, k), 1)?;
/// let b = Nvfp4Matrix::random_contest((1, n, k), 2)?;
/// let (a_dev, b_dev) = (Nvfp4Tensor::upload(&a, &stream)?, Nvfp4Tensor::upload(&b, &stream)?);
/// let mut d = stream.alloc_zeros::<half::f16>(m * n)?;
///
/// let gemm = BlockScaledGemm::new(stream.clone())?;
/// gemm.gemm(&Problem::new(m, n, k), &a_dev, &b_dev, &mut d, None)?;
/// let d_host = stream.clone_dtoh(&d)?;
/// // Against the exact CPU reference: each element exact or within the FP32 accumulation bound.
/// assert!(blockscaled_gemm::compare::verify_matrices(&a, &b, 1.0, 0.0, None, &d_host)?.passed());
/// # Ok(()) }
/// ```
pub struct BlockScaledGemm {
    stream: Arc<CudaStream>,
    device: DeviceFacts,
    scratch: Mutex<Scratch>,
    split_k: Option<u32>,
    /// The thread that made it, where its stream is the per-thread default stream.
    owner: Option<std::thread::ThreadId>,
}

/// cudarc's handle of the per-thread default stream (`cudaStreamPerThread`).
const PER_THREAD_STREAM: usize = 0x2;

/// Device memory this crate allocates itself, with the driver directly: no cudarc event
/// tracking, so using it never waits on events (which capture would reject).
struct DeviceBuffer {
    ptr: CUdeviceptr,
    bytes: usize,
}

/// Device memory the launches share, held under one lock until the launch is queued; the one
/// stream orders its reuse.
#[derive(Default)]
struct Scratch {
    /// Zeroed when allocated, never by a launch: the SM90 kernel's split-K counters live at its
    /// start and each launch leaves them zero.
    workspace: Option<DeviceBuffer>,
    /// Buffers the workspace grew out of: a captured graph may still use them.
    retired: Vec<DeviceBuffer>,
    limit: Option<usize>,
    /// SM100 FP4 output: CUTLASS's epilogue reads the norm constant through a pointer; each call
    /// writes its value here in stream order (a memset node when captured).
    norm_slot: Option<DeviceBuffer>,
}

impl BlockScaledGemm {
    /// A GEMM that launches on `stream` (so libcuda is loaded: see [`Self::driver_present`]).
    pub fn new(stream: Arc<CudaStream>) -> Result<Self> {
        let ctx = stream.context();
        let cc = ctx.compute_capability()?;
        let sm_count = ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        // A failed query leaves the heuristic as it was before it knew of cluster limits (a
        // possible second wave of clusters costs time, never correctness).
        let max_clusters = if cc.0 == 9 { crate::clusters::max_clusters(ctx).unwrap_or(dispatch::ANY_CLUSTERS) } else { dispatch::ANY_CLUSTERS };
        let device = DeviceFacts { ordinal: ctx.ordinal(), compute_capability: cc, sm_count: sm_count.max(1) as usize, max_clusters };
        let owner = (stream.cu_stream() as usize == PER_THREAD_STREAM).then(|| std::thread::current().id());
        Ok(BlockScaledGemm { stream, device, scratch: Mutex::new(Scratch::default()), split_k: None, owner })
    }

    /// Forces the number of K ranges of the SM90 kernels (`None`: the heuristic of
    /// [`crate::dispatch::split_k`]). [`Self::gemm`] refuses values the rules of
    /// [`crate::dispatch::check_split_k`] exclude; SM100 configs ignore it (CUTLASS schedules them).
    pub fn with_split_k(mut self, split_k: Option<u32>) -> Self {
        self.split_k = split_k;
        self
    }

    /// Whether libcuda can be loaded here; check before any other call on a machine that may
    /// have no NVIDIA driver (cudarc panics there).
    pub fn driver_present() -> bool {
        // The driver library as its installers name it; asked directly, since cudarc's own
        // `is_culib_present` exists only where cudarc loads libcuda at run time (not with the
        // `dynamic-linking` another crate of the tree may turn on).
        ["libcuda.so.1", "libcuda.so", "nvcuda.dll"].into_iter().any(|name| {
            // SAFETY: loading libcuda runs no initialisers that depend on our state.
            unsafe { libloading::Library::new(name) }.is_ok()
        })
    }

    /// The device's facts.
    pub fn device(&self) -> DeviceFacts {
        self.device
    }

    /// The stream launches go to.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The config [`Self::gemm`] would run for `p` with output `out` and weights in the standard
    /// layout, or the error it would give.
    pub fn select_config(&self, p: &Problem, out: OutType) -> Result<Config> {
        self.select_config_for(p, out, WeightLayout::Standard)
    }

    /// [`Self::select_config`] for weights in `layout` (prepacked weights run some shapes in
    /// other stages: [`crate::dispatch::for_weights`]).
    pub fn select_config_for(&self, p: &Problem, out: OutType, layout: WeightLayout) -> Result<Config> {
        let lens = BufferLens::for_problem(p, out, p.beta != 0.0);
        let config = plan(p, out, &lens, &self.device, None, |c, o| c.is_built(o))?;
        check_weight_layout(config, layout)?;
        Ok(self.for_weights(config, None, layout, p, out, |c| c.is_built(out)))
    }

    /// The rule's pick adjusted for the weights' layout ([`dispatch::for_weights`]); a forced
    /// config as it is.
    pub(crate) fn for_weights(&self, config: Config, forced: Option<Config>, layout: WeightLayout, p: &Problem, out: OutType, available: impl Fn(Config) -> bool) -> Config {
        match forced {
            Some(c) => c,
            None => dispatch::for_weights(config, layout, p, out, self.device.sm_count, &self.device.max_clusters, available),
        }
    }

    /// `D = alpha * A Bᵀ` (beta must be 0). `config`: `None` takes the rule's pick
    /// ([`Self::select_config`]).
    /// Returns the config that ran. Asynchronous: synchronize the stream to read D.
    pub fn gemm<VA, SA, VB, SB, D, TV, TS, TO>(&self, p: &Problem, a: &Nvfp4Tensor<VA, SA>, b: &Nvfp4Tensor<VB, SB>, d: &mut D, config: Option<Config>) -> Result<Config>
    where
        VA: DevicePtr<TV>, SA: DevicePtr<TS>, VB: DevicePtr<TV>, SB: DevicePtr<TS>, D: DevicePtrMut<TO>,
        TV: PackedFp4, TS: ScaleByte, TO: OutputElement,
    {
        self.run(p, a, None::<&CudaSlice<u16>>, b, None::<&CudaSlice<TO>>, d, config)
    }

    /// `D = alpha * A Bᵀ + beta * C`, C with D's type and shape.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_with_c<VA, SA, VB, SB, C, D, TV, TS, TO>(&self, p: &Problem, a: &Nvfp4Tensor<VA, SA>, b: &Nvfp4Tensor<VB, SB>, c: &C, d: &mut D, config: Option<Config>) -> Result<Config>
    where
        VA: DevicePtr<TV>, SA: DevicePtr<TS>, VB: DevicePtr<TV>, SB: DevicePtr<TS>, C: DevicePtr<TO>, D: DevicePtrMut<TO>,
        TV: PackedFp4, TS: ScaleByte, TO: OutputElement,
    {
        self.run(p, a, None::<&CudaSlice<u16>>, b, Some(c), d, config)
    }

    /// FP4 output (CUTLASS example 72b): `D = quantize(alpha * A Bᵀ)` in e2m1 with scale factors
    /// generated per 16 outputs along N, ue4m3 for [`OutType::Nvfp4`] or ue8m0 for
    /// [`OutType::Nvfp4Ue8m0`], scaled by `p.norm_constant` ([`crate::fp4_out`] has the exact
    /// arithmetic). N must be a multiple of 32; beta must be 0 (see [`Self::gemm_fp4_with_c`]).
    /// Choose the norm constant from a bound on |D|: with ue4m3 scales ([`OutType::Nvfp4`]),
    /// which saturate at 448, and e2m1 codes, which saturate at 6, outputs above
    /// `6 * 448 / norm_constant` in magnitude (2688 at the default 1.0) are clipped to that bound,
    /// as CUTLASS's epilogue and reference do, without an error.
    ///
    /// Two layers, the first writing NVFP4 that the second reads as it is:
    ///
    /// ```no_run
    /// use blockscaled_gemm::{BlockScaledGemm, Nvfp4Matrix, Nvfp4Output, Nvfp4Tensor, OutType, Problem};
    /// use cudarc::driver::CudaContext;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let stream = CudaContext::new(0)?.new_stream()?;
    /// let gemm = BlockScaledGemm::new(stream.clone())?;
    /// let (m, n, k, n2) = (128, 4096, 7168, 2048);
    /// let x = Nvfp4Tensor::upload(&Nvfp4Matrix::random_contest((1, m, k), 1)?, &stream)?;
    /// let w1 = Nvfp4Tensor::upload(&Nvfp4Matrix::random_contest((1, n, k), 2)?, &stream)?;
    /// let w2 = Nvfp4Tensor::upload(&Nvfp4Matrix::random_contest((1, n2, n), 3)?, &stream)?;
    /// // st = 6 * 448 / (a bound on |D|) keeps SFD inside ue4m3: these operands give |D| of
    /// // standard deviation about 2,500 (7168 products of 30), at most about 13,000 here.
    /// let st = 6.0 * 448.0 / 16384.0;
    /// let p = Problem::new(m, n, k).norm_constant(st);
    /// let mut h = stream.alloc_zeros::<u8>(m * n / 2)?; // e2m1 codes
    /// let mut h_sf = stream.alloc_zeros::<u8>(p.sfd_bytes())?; // generated scale factors
    /// gemm.gemm_fp4(&p, OutType::Nvfp4, &x, &w1, Nvfp4Output::new(&mut h, &mut h_sf), None)?;
    /// // The next layer reads (h, h_sf) as they are, K = n; its global scale is 1 / st.
    /// let h = Nvfp4Tensor::new(h.as_view(), h_sf.as_view(), (1, m, n), 1.0 / st)?;
    /// let mut y = stream.alloc_zeros::<half::bf16>(m * n2)?;
    /// gemm.gemm(&Problem::new(m, n2, n), &h, &w2, &mut y, None)?;
    /// # Ok(()) }
    /// ```
    pub fn gemm_fp4<VA, SA, VB, SB, DV, DS, TV, TS>(&self, p: &Problem, out: OutType, a: &Nvfp4Tensor<VA, SA>, b: &Nvfp4Tensor<VB, SB>, d: Nvfp4Output<'_, DV, DS>, config: Option<Config>) -> Result<Config>
    where
        VA: DevicePtr<TV>, SA: DevicePtr<TS>, VB: DevicePtr<TV>, SB: DevicePtr<TS>, DV: DevicePtrMut<TV>, DS: DevicePtrMut<TS>,
        TV: PackedFp4, TS: ScaleByte,
    {
        self.run_fp4(p, out, a, None, b, None::<&CudaSlice<f32>>, d, config)
    }

    /// [`Self::gemm_fp4`] with `+ beta * C` before the quantization, C in f32 (L, M, N).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_fp4_with_c<VA, SA, VB, SB, C, DV, DS, TV, TS>(&self, p: &Problem, out: OutType, a: &Nvfp4Tensor<VA, SA>, b: &Nvfp4Tensor<VB, SB>, c: &C, d: Nvfp4Output<'_, DV, DS>, config: Option<Config>) -> Result<Config>
    where
        VA: DevicePtr<TV>, SA: DevicePtr<TS>, VB: DevicePtr<TV>, SB: DevicePtr<TS>, C: DevicePtr<f32>, DV: DevicePtrMut<TV>, DS: DevicePtrMut<TS>,
        TV: PackedFp4, TS: ScaleByte,
    {
        self.run_fp4(p, out, a, None, b, Some(c), d, config)
    }

    /// [`Self::gemm`] with the activations as [`crate::Quantizer::quantize_decoded_into`] left
    /// them: configs of [`crate::Schedule::SwappedRegisterDecode`] read their decode instead of
    /// launching a pre-pass that decodes them again (and need no workspace for it); every other
    /// config reads the codes and scales. The same bits as [`Self::gemm`] on
    /// [`Nvfp4Activations::tensor`] with the same config. The kernel before this call may be any
    /// kernel: the GEMM loads nothing before it has completed.
    pub fn gemm_decoded<VB, SB, D, TV, TS, TO>(&self, p: &Problem, a: &Nvfp4Activations, b: &Nvfp4Tensor<VB, SB>, d: &mut D, config: Option<Config>) -> Result<Config>
    where
        VB: DevicePtr<TV>, SB: DevicePtr<TS>, D: DevicePtrMut<TO>,
        TV: PackedFp4, TS: ScaleByte, TO: OutputElement,
    {
        self.run(p, a.tensor(), Some(a.decoded()), b, None::<&CudaSlice<TO>>, d, config)
    }

    /// [`Self::gemm_decoded`] on activations kept in buffers of the caller's rather than an
    /// [`Nvfp4Activations`]: `a` the codes and scales, and `decoded` exactly the decode that
    /// [`crate::Quantizer::quantize_decoded_parts_into`] wrote beside them for `p`'s shape
    /// ([`Nvfp4Activations::decoded_len`] FP16 values). The same bits as [`Self::gemm`] on `a`.
    ///
    /// At batch 1 one set of buffers sized for the largest batch serves every row count by
    /// prefix, as a serving loop whose batch changes each step needs: the codes, tiled scales and
    /// decode of `rows` rows are the first `rows * K / 2` bytes, [`crate::layout::sf_bytes`]`((1,
    /// rows, K))` bytes and [`Nvfp4Activations::decoded_len`]`((1, rows, K))` values of those of more
    /// rows (the quantizer writes the decode's padding rows, so what a larger step left further on
    /// is never read).
    ///
    /// ```no_run
    /// use blockscaled_gemm::{BlockScaledGemm, Nvfp4Activations, Nvfp4Matrix, Nvfp4Tensor, Problem, Quantizer};
    /// use blockscaled_gemm::layout::sf_bytes;
    /// use cudarc::driver::CudaContext;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let stream = CudaContext::new(0)?.new_stream()?;
    /// let (max_rows, n, k) = (256, 4096, 7168);
    /// let w = Nvfp4Tensor::upload(&Nvfp4Matrix::random_realistic((1, n, k), 1)?, &stream)?;
    /// // Made once, for the largest batch.
    /// let mut codes = stream.alloc_zeros::<u8>(max_rows * k / 2)?;
    /// let mut scales = stream.alloc_zeros::<u8>(sf_bytes((1, max_rows, k)))?;
    /// let mut decoded = stream.alloc_zeros::<u16>(Nvfp4Activations::decoded_len((1, max_rows, k)))?;
    /// let mut y = stream.alloc_zeros::<half::bf16>(max_rows * n)?;
    /// let (quantizer, gemm) = (Quantizer::new(stream.clone()), BlockScaledGemm::new(stream.clone())?);
    /// let g = 4.0 / 2688.0; // the layer's input scale
    /// for rows in [3, 96, 256, 40] {
    ///     let x = stream.clone_htod(&vec![half::bf16::from_f32(0.5); rows * k])?; // this step's input
    ///     let (cb, sb, db) = (rows * k / 2, sf_bytes((1, rows, k)), Nvfp4Activations::decoded_len((1, rows, k)));
    ///     let (mut c, mut s, mut d) = (codes.slice_mut(..cb), scales.slice_mut(..sb), decoded.slice_mut(..db));
    ///     quantizer.quantize_decoded_parts_into(&x, (1, rows, k), g, &mut c, &mut s, &mut d)?;
    ///     let a = Nvfp4Tensor::new(c, s, (1, rows, k), g)?;
    ///     gemm.gemm_decoded_parts(&Problem::new(rows, n, k), &a, &d, &w, &mut y.slice_mut(..rows * n), None)?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn gemm_decoded_parts<VA, SA, DA, VB, SB, D, TV, TS, TO>(&self, p: &Problem, a: &Nvfp4Tensor<VA, SA>, decoded: &DA, b: &Nvfp4Tensor<VB, SB>, d: &mut D, config: Option<Config>) -> Result<Config>
    where
        VA: DevicePtr<TV>, SA: DevicePtr<TS>, DA: DevicePtr<u16>, VB: DevicePtr<TV>, SB: DevicePtr<TS>, D: DevicePtrMut<TO>,
        TV: PackedFp4, TS: ScaleByte, TO: OutputElement,
    {
        self.run(p, a, Some(decoded), b, None::<&CudaSlice<TO>>, d, config)
    }

    /// [`Self::gemm_with_c`] with the activations of [`Self::gemm_decoded`].
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_decoded_with_c<VB, SB, C, D, TV, TS, TO>(&self, p: &Problem, a: &Nvfp4Activations, b: &Nvfp4Tensor<VB, SB>, c: &C, d: &mut D, config: Option<Config>) -> Result<Config>
    where
        VB: DevicePtr<TV>, SB: DevicePtr<TS>, C: DevicePtr<TO>, D: DevicePtrMut<TO>,
        TV: PackedFp4, TS: ScaleByte, TO: OutputElement,
    {
        self.run(p, a.tensor(), Some(a.decoded()), b, Some(c), d, config)
    }

    /// [`Self::gemm_fp4`] with the activations of [`Self::gemm_decoded`].
    pub fn gemm_fp4_decoded<VB, SB, DV, DS, TV, TS>(&self, p: &Problem, out: OutType, a: &Nvfp4Activations, b: &Nvfp4Tensor<VB, SB>, d: Nvfp4Output<'_, DV, DS>, config: Option<Config>) -> Result<Config>
    where
        VB: DevicePtr<TV>, SB: DevicePtr<TS>, DV: DevicePtrMut<TV>, DS: DevicePtrMut<TS>,
        TV: PackedFp4, TS: ScaleByte,
    {
        self.run_fp4(p, out, a.tensor(), Some(a.decoded()), b, None::<&CudaSlice<f32>>, d, config)
    }

    /// [`Self::gemm_fp4_with_c`] with the activations of [`Self::gemm_decoded`].
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_fp4_decoded_with_c<VB, SB, C, DV, DS, TV, TS>(&self, p: &Problem, out: OutType, a: &Nvfp4Activations, b: &Nvfp4Tensor<VB, SB>, c: &C, d: Nvfp4Output<'_, DV, DS>, config: Option<Config>) -> Result<Config>
    where
        VB: DevicePtr<TV>, SB: DevicePtr<TS>, C: DevicePtr<f32>, DV: DevicePtrMut<TV>, DS: DevicePtrMut<TS>,
        TV: PackedFp4, TS: ScaleByte,
    {
        self.run_fp4(p, out, a.tensor(), Some(a.decoded()), b, Some(c), d, config)
    }

    /// The launch's K ranges (the rule's, or the forced count once checked) and whether their sum
    /// goes through global memory (`split_global`: clusters that would not all fit at once), as
    /// the launch arguments carry them.
    pub(crate) fn split_for(&self, config: Config, p: &Problem, out: OutType) -> Result<(i32, i32)> {
        let split = match self.split_k {
            None => dispatch::split_k(config, p, out, self.device.sm_count, &self.device.max_clusters),
            Some(s) => dispatch::check_split_k(config, p, s)?,
        };
        Ok((split as i32, !dispatch::cluster_split(config, p, split, &self.device.max_clusters) as i32))
    }

    /// Validates the problem against the operands' shapes and every buffer's length, picks the
    /// config (`forced` or the heuristic's) and checks that every buffer lives on this GEMM's
    /// device. Returns the config and the problem with both global scales folded into alpha. `d` lists D's
    /// buffers as (name, length, stream): the values, then for FP4 outputs the scale factors.
    #[allow(clippy::too_many_arguments)]
    fn plan_checked<VA, SA, VB, SB, C, DA, TA, TSA, TV, TS, TC>(&self, p: &Problem, out: OutType, a: (&Nvfp4Tensor<VA, SA>, Option<&DA>), b: &Nvfp4Tensor<VB, SB>, c: Option<&C>, d: &[(&'static str, usize, &Arc<CudaStream>)], forced: Option<Config>) -> Result<(Config, Problem)>
    where
        VA: DevicePtr<TA>, SA: DevicePtr<TSA>, VB: DevicePtr<TV>, SB: DevicePtr<TS>, C: DevicePtr<TC>, DA: DevicePtr<u16>,
    {
        let (a, decoded) = a;
        for (name, t, rows) in [("A", a.shape(), p.m), ("B", b.shape(), p.n)] {
            if t != (p.l, rows, p.k) {
                return Err(Error::OperandShape { name, got: t, want: (p.l, rows, p.k) });
            }
        }
        if let Some(x) = decoded {
            check_len("decoded A", x.len(), Nvfp4Activations::decoded_len((p.l, p.m, p.k)), "L * decoded rows * K rounded up to 64 FP16 values")?;
        }
        a.require_activation_layout()?;
        let lens = BufferLens { a: a.values().len(), sfa: a.scales().len(), b: b.standard_values_len(), sfb: b.scales().len(), c: c.map(|c| c.len()), d: d[0].1, sfd: d.get(1).map(|s| s.1) };
        let config = plan(p, out, &lens, &self.device, forced, |c, o| c.is_built(o))?;
        let config = self.for_weights(config, forced, b.layout(), p, out, |c| c.is_built(out));
        check_weight_layout(config, b.layout())?;
        let mut buffers = vec![("A", a.values().stream()), ("SFA", a.scales().stream()), ("B", b.values().stream()), ("SFB", b.scales().stream())];
        buffers.extend(d.iter().map(|&(name, _, s)| (name, s)));
        buffers.extend(c.map(|c| ("C", c.stream())));
        buffers.extend(decoded.map(|x| ("decoded A", x.stream())));
        check_devices(self.device.ordinal, buffers)?;
        Ok((config, p.scalars(folded_alpha(p.alpha, a.global_scale(), b.global_scale())?, p.beta)))
    }

    #[allow(clippy::too_many_arguments)]
    fn run<VA, SA, VB, SB, C, D, DA, TA, TSA, TV, TS, TO>(&self, p: &Problem, a: &Nvfp4Tensor<VA, SA>, decoded: Option<&DA>, b: &Nvfp4Tensor<VB, SB>, c: Option<&C>, d: &mut D, forced: Option<Config>) -> Result<Config>
    where
        VA: DevicePtr<TA>, SA: DevicePtr<TSA>, VB: DevicePtr<TV>, SB: DevicePtr<TS>, C: DevicePtr<TO>, D: DevicePtrMut<TO>, DA: DevicePtr<u16>,
        TV: PackedFp4, TS: ScaleByte, TO: OutputElement,
    {
        let out = TO::OUT;
        let (config, folded) = self.plan_checked(p, out, (a, decoded), b, c, &[("D", d.len(), d.stream())], forced)?;
        let p = &folded;
        let capturing = self.capture_check()?;
        let stream = &self.stream;
        let (([pa, psfa], _ga), ([pb, psfb], _gb)) = (a.ptrs(stream), b.ptrs(stream));
        let (pd, _gd) = d.device_ptr_mut(stream);
        let c_ptr = c.map(|c| c.device_ptr(stream));
        // Without C the kernel gets D as its C pointer; beta is 0, so it never reads it.
        let pc = c_ptr.as_ref().map_or(pd, |(p, _)| *p);
        let dec = decoded.map(|x| x.device_ptr(stream));
        let (pre_a, pre_a_rows) = Nvfp4Activations::launch_arg(dec.as_ref().map(|d| d.0), p.m);
        self.launch(p, out, Table::Nvfp4, config, capturing, KernelArgs { a: pa, sfa: psfa, b: pb, sfb: psfb, c: pc, d: pd, b_layout: b.layout().abi(), pre_a, pre_a_rows, ..p.launch_args() })
    }

    #[allow(clippy::too_many_arguments)]
    fn run_fp4<VA, SA, VB, SB, C, DV, DS, TA, TSA, TV, TS>(&self, p: &Problem, out: OutType, a: &Nvfp4Tensor<VA, SA>, decoded: Option<&CudaSlice<u16>>, b: &Nvfp4Tensor<VB, SB>, c: Option<&C>, d: Nvfp4Output<'_, DV, DS>, forced: Option<Config>) -> Result<Config>
    where
        VA: DevicePtr<TA>, SA: DevicePtr<TSA>, VB: DevicePtr<TV>, SB: DevicePtr<TS>, C: DevicePtr<f32>, DV: DevicePtrMut<TV>, DS: DevicePtrMut<TS>,
        TV: PackedFp4, TS: ScaleByte,
    {
        if out.sfd().is_none() {
            return Err(Error::InvalidData { what: "out", detail: format!("{out}: gemm_fp4 writes the FP4 outputs nvfp4 or nvfp4-ue8m0; use gemm for {out}") });
        }
        let (config, folded) = self.plan_checked(p, out, (a, decoded), b, c, &[("D", d.values.len(), d.values.stream()), ("SFD", d.scales.len(), d.scales.stream())], forced)?;
        let p = &folded;
        let capturing = self.capture_check()?;
        let stream = &self.stream;
        let (([pa, psfa], _ga), ([pb, psfb], _gb)) = (a.ptrs(stream), b.ptrs(stream));
        let (pd, _gd) = d.values.device_ptr_mut(stream);
        let (psfd, _gsfd) = d.scales.device_ptr_mut(stream);
        let c_ptr = c.map(|c| c.device_ptr(stream));
        let pc = c_ptr.as_ref().map_or(pd, |(p, _)| *p);
        let dec = decoded.map(|x| x.device_ptr(stream));
        let (pre_a, pre_a_rows) = Nvfp4Activations::launch_arg(dec.as_ref().map(|d| d.0), p.m);
        self.launch(p, out, Table::Nvfp4, config, capturing, KernelArgs { a: pa, sfa: psfa, b: pb, sfb: psfb, c: pc, d: pd, sfd: psfd, b_layout: b.layout().abi(), pre_a, pre_a_rows, ..p.launch_args() })
    }

    /// The thread check of [`Error::PerThreadStream`], then [`capture_check`]: every call that
    /// touches the workspace or queues work starts here.
    pub(crate) fn capture_check(&self) -> Result<bool> {
        self.thread_check()?;
        capture_check(&self.stream)
    }

    /// Whether this GEMM runs on the per-thread default stream (then on its creating thread
    /// only: [`Error::PerThreadStream`]).
    #[cfg(feature = "candle")]
    pub(crate) fn per_thread_stream(&self) -> bool {
        self.owner.is_some()
    }

    fn thread_check(&self) -> Result<()> {
        match self.owner {
            Some(owner) if owner != std::thread::current().id() => Err(Error::PerThreadStream),
            _ => Ok(()),
        }
    }

    /// Checks alignment, fills in the stream, device and workspace, and crosses the FFI line once
    /// to check and queue the kernel; grows the workspace and tries again when the kernel asks for
    /// more (never during capture). `args` holds the problem and the buffers' addresses (SFD 0
    /// unless FP4); the caller holds every buffer's guard across this call.
    pub(crate) fn launch(&self, p: &Problem, out: OutType, table: Table, config: Config, capturing: bool, mut args: KernelArgs) -> Result<Config> {
        let stream = &self.stream;
        // The decode (0 where none is given) is a TMA base as well: a view of a caller's buffer
        // may start anywhere.
        for (name, addr) in [("A", args.a), ("SFA", args.sfa), ("B", args.b), ("SFB", args.sfb), ("C", args.c), ("D", args.d), ("SFD", args.sfd), ("decoded A", args.pre_a)] {
            if !(name == "SFD" && out.sfd().is_none()) {
                check_align(name, addr)?;
            }
        }
        args.stream = stream.cu_stream() as u64;
        args.device_id = self.device.ordinal as i32;
        args.sm_count = self.device.sm_count as i32;
        (args.split_k, args.split_global) = self.split_for(config, p, out)?;
        let chunks = crate::layout::prepack_chunks(p.k);
        if args.b_layout == WeightLayout::Prepacked.abi() && args.split_k as usize > chunks {
            return Err(Error::InvalidData { what: "split_k", detail: format!("{}: with prepacked weights at most {chunks} (one K range per 256 values of K)", args.split_k) });
        }
        if out.sfd().is_some() && p.sfd_bytes() != p.l * p.m * (p.n / 16) {
            // CUTLASS's SM100 epilogue leaves the padding of the SFD tiles unwritten; that launch
            // zeroes it (once every check has passed) so the buffer can feed the next GEMM.
            args.sfd_bytes = p.sfd_bytes() as u64;
        }
        let (index, out_index) = (config.info().index, out.index());
        let mut guard = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let scratch = &mut *guard;
        if out.sfd().is_some() && config.info().arch == 100 {
            // During capture, a workspace too small is refused before the memset below, which
            // would otherwise stay in the caller's graph as a node of a call that failed.
            if capturing {
                let have = scratch.workspace.as_ref().map_or(0, |w| w.bytes);
                let need = sys::workspace_size(index, out_index, &args);
                if need > have {
                    return Err(Error::WorkspaceDuringCapture { need, have });
                }
            }
            let slot = scratch.norm_slot(stream, capturing)?;
            // SAFETY: the slot is our own live 4-byte allocation; the memset is queued on the
            // stream ahead of the kernel that reads it.
            unsafe { cudarc::driver::sys::cuMemsetD32Async(slot, p.norm_constant.to_bits(), 1, stream.cu_stream()) }.result()?;
            args.norm_constant_ptr = slot;
        }
        let status = scratch.launch(stream, capturing, |workspace, workspace_bytes| {
            // SAFETY: every address is a live device allocation of the checked length on this
            // stream's device, 16-byte aligned; the caller's guards and our lock live until the
            // launch is queued. The kernel checks the workspace it is given against its need and
            // launches nothing when it is short.
            let args = KernelArgs { workspace, workspace_bytes, ..args };
            match table {
                Table::Nvfp4 => unsafe { sys::launch(index, out_index, &args) },
                // SAFETY: as above; A holds L * M * K 16-bit activations of `input`.
                Table::W4a16(input) => unsafe { sys::launch_w4a16(index, input as u32, out_index, &args) },
            }
        })?;
        status_result(status, config, out, (p.m, p.n, p.k, p.l))
    }

    /// [`Scratch::launch`] under the lock, for launches that need nothing else of it.
    pub(crate) fn launch_with_workspace(&self, capturing: bool, launch: impl FnMut(u64, u64) -> sys::KernelStatus) -> Result<sys::KernelStatus> {
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        scratch.launch(&self.stream, capturing, launch)
    }

    /// Workspace bytes a call of [`Self::gemm`] (or [`Self::gemm_fp4`] with output `out`) on `p`
    /// needs, with `config` or the one the heuristic picks. The launch (config and split-K)
    /// depends on `out`, so ask with the output type of the calls to capture. A host-side query:
    /// nothing runs on the device.
    pub fn workspace_size(&self, p: &Problem, out: OutType, config: Option<Config>) -> Result<usize> {
        self.workspace_for(p, out, config, false)
    }

    /// Workspace bytes a call of [`Self::gemm_decoded`] (or its FP4, `_with_c` and `_parts`
    /// forms) on `p` needs: [`Self::workspace_size`]'s less the pre-pass's decoded activations,
    /// which the quantizer wrote instead (the split-K sums' room only). Ask this one before
    /// capturing decoded calls, so as not to reserve `2 * L * M * K` bytes for nothing.
    pub fn workspace_size_decoded(&self, p: &Problem, out: OutType, config: Option<Config>) -> Result<usize> {
        self.workspace_for(p, out, config, true)
    }

    fn workspace_for(&self, p: &Problem, out: OutType, config: Option<Config>, decoded: bool) -> Result<usize> {
        let lens = BufferLens::for_problem(p, out, p.beta != 0.0);
        let config = plan(p, out, &lens, &self.device, config, |c, o| c.is_built(o))?;
        let (split_k, split_global) = self.split_for(config, p, out)?;
        // The adapters size the workspace without the pre-pass's output where a decode is given
        // (its address is not read by the query; any non-zero one stands for it).
        let (pre_a, pre_a_rows) = if decoded { Nvfp4Activations::launch_arg(Some(1), p.m) } else { (0, 0) };
        let args = KernelArgs { split_k, split_global, sm_count: self.device.sm_count as i32, pre_a, pre_a_rows, ..p.launch_args() };
        Ok(sys::workspace_size(config.info().index, out.index(), &args))
    }

    /// Makes the workspace at least `bytes` (allocated and zeroed now, on this stream): calls that
    /// need at most this then allocate nothing, so they can be captured in a CUDA graph. On SM100
    /// it also allocates the 4-byte slot from which FP4 outputs read their norm constant.
    pub fn reserve_workspace(&self, bytes: usize) -> Result<()> {
        let capturing = self.capture_check()?;
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        if self.device.arch() == Some(100) && !capturing {
            scratch.norm_slot(&self.stream, false)?;
        }
        if scratch.workspace.as_ref().is_some_and(|w| w.bytes >= bytes) {
            return Ok(());
        }
        if capturing {
            let have = scratch.workspace.as_ref().map_or(0, |w| w.bytes);
            return Err(Error::WorkspaceDuringCapture { need: bytes, have });
        }
        scratch.grow(&self.stream, bytes)
    }

    /// Bytes of the current workspace.
    pub fn workspace_bytes(&self) -> usize {
        self.scratch.lock().unwrap_or_else(|e| e.into_inner()).workspace.as_ref().map_or(0, |w| w.bytes)
    }

    /// Bounds the workspace: a call that would grow it beyond `limit` bytes returns
    /// [`Error::WorkspaceLimit`] instead (`None`: no bound). The limit applies to each new
    /// workspace buffer, not to the sum held with the buffers it grew out of (kept for graphs
    /// captured earlier: [`Self::release_workspace`] frees them), and a limit below the current
    /// workspace frees nothing.
    pub fn set_workspace_limit(&self, limit: Option<usize>) {
        self.scratch.lock().unwrap_or_else(|e| e.into_inner()).limit = limit;
    }

    /// Frees the workspace and every buffer it grew out of, after waiting for the stream; the
    /// next call allocates again.
    ///
    /// # Safety
    /// No CUDA graph that captured a call of this `BlockScaledGemm` may be launched afterwards:
    /// it would use the freed memory.
    ///
    /// During a capture on this stream it returns [`Error::NotCapturable`] and leaves the
    /// workspace and the capture as they are (waiting for the stream would end the capture).
    pub unsafe fn release_workspace(&self) -> Result<()> {
        if self.capture_check()? {
            return Err(Error::NotCapturable { call: "BlockScaledGemm::release_workspace", why: "it waits for the stream and frees memory", fix: "release the workspace after the capture ends" });
        }
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        self.stream.synchronize()?;
        scratch.retired.clear();
        scratch.workspace = None;
        Ok(())
    }
}

/// Binds the stream's context to this thread and says whether the stream is capturing a graph;
/// during capture with cudarc's event tracking on, the typed error that names the fix (before any
/// buffer's guard would wait on an event recorded outside the capture and invalidate it).
pub(crate) fn capture_check(stream: &CudaStream) -> Result<bool> {
    let ctx = stream.context();
    ctx.bind_to_thread()?;
    let capturing = stream.capture_status()? != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    if capturing && ctx.is_managing_stream_synchronization() {
        return Err(Error::CaptureEventTracking);
    }
    Ok(capturing)
}

/// That every buffer, named with the stream it belongs to, lives on device `device`.
pub(crate) fn check_devices<'a>(device: usize, buffers: impl IntoIterator<Item = (&'static str, &'a Arc<CudaStream>)>) -> Result<()> {
    for (name, s) in buffers {
        let buffer_device = s.context().ordinal();
        if buffer_device != device {
            return Err(Error::WrongDevice { name, buffer_device, gemm_device: device });
        }
    }
    Ok(())
}

/// The kernel table a launch looks its config up in: NVFP4 x NVFP4, or W4A16 with activations
/// of the given type.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Table {
    Nvfp4,
    W4a16(sys::InKind),
}

/// Statuses the launch path tells apart (the launch ABI's, checked against `cutlass::Status`).
const NOT_BUILT: i32 = sys::STATUS_NOT_BUILT;
const INVALID_PROBLEM: i32 = sys::STATUS_INVALID_PROBLEM;
const WORKSPACE_NULL: i32 = sys::STATUS_WORKSPACE_NULL;

impl DeviceBuffer {
    /// `bytes` of device memory, zeroed in stream order. Refused during capture.
    fn zeroed(stream: &CudaStream, bytes: usize, capturing: bool) -> Result<DeviceBuffer> {
        if capturing {
            return Err(Error::WorkspaceDuringCapture { need: bytes, have: 0 });
        }
        stream.context().bind_to_thread()?;
        // SAFETY: a plain allocation of the current context; freed in Drop after the stream
        // that uses it has drained.
        let ptr = relaxed_capture(|| unsafe { cudarc::driver::result::malloc_sync(bytes.max(1)) })?;
        let buf = DeviceBuffer { ptr, bytes };
        // SAFETY: ptr holds `bytes` bytes; the memset is ordered before any launch on the stream.
        unsafe { cudarc::driver::result::memset_d8_async(ptr, 0, bytes, stream.cu_stream()) }?;
        Ok(buf)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by malloc_sync; the owner drains its stream before dropping.
        let _ = relaxed_capture(|| unsafe { cudarc::driver::result::free_sync(self.ptr) });
    }
}

/// Runs `f` (an allocation or a free of the workspace, never while this GEMM's own stream
/// captures) with this thread's stream-capture mode relaxed: while another stream of the
/// process captures in global mode (another library's graph, say), CUDA would otherwise refuse
/// the allocation and invalidate that capture.
fn relaxed_capture<T>(f: impl FnOnce() -> T) -> T {
    let mut mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: exchanges this thread's mode for relaxed, and below back for the one it had.
    let swapped = unsafe { cudarc::driver::sys::cuThreadExchangeStreamCaptureMode(&mut mode) } == CUresult::CUDA_SUCCESS;
    let out = f();
    if swapped {
        // SAFETY: as above; `mode` holds the thread's previous mode.
        let _ = unsafe { cudarc::driver::sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
    }
    out
}

/// The typed outcome of a kernel's status (after any workspace retry): `config`'s launch of a
/// problem (M, N, K, L) with output `out`.
pub(crate) fn status_result(status: sys::KernelStatus, config: Config, out: OutType, (m, n, k, l): (usize, usize, usize, usize)) -> Result<Config> {
    match status.cutlass_status {
        NOT_BUILT => Err(Error::NotBuilt { config, out }),
        INVALID_PROBLEM => Err(Error::CannotImplement { config, m, n, k, l }),
        _ => launch_status(status).map(|()| config),
    }
}

/// A launch's errors: a CUDA error the adapter reports beside CUTLASS's status (the SM90
/// adapters return kErrorInternal with it) is the more telling of the two, so it comes first.
pub(crate) fn launch_status(status: sys::KernelStatus) -> Result<()> {
    if status.cuda_error != 0 {
        return Err(Error::CudaRuntime { code: status.cuda_error, name: sys::cuda_error_name(status.cuda_error) });
    }
    match status.cutlass_status {
        0 => Ok(()),
        code => Err(Error::Cutlass { code, name: sys::cutlass_status_name(code) }),
    }
}

impl Scratch {
    /// The SM100 FP4 norm-constant slot, allocated on first use (never during capture:
    /// [`Error::WorkspaceDuringCapture`]).
    fn norm_slot(&mut self, stream: &CudaStream, capturing: bool) -> Result<u64> {
        if self.norm_slot.is_none() {
            self.norm_slot = Some(DeviceBuffer::zeroed(stream, 4, capturing)?);
        }
        Ok(self.norm_slot.as_ref().expect("allocated above").ptr)
    }

    /// Calls `launch` with the workspace (address, bytes; 0, 0 where none is allocated) until the
    /// kernel no longer reports it short: grows it then (never during capture, where that is
    /// [`Error::WorkspaceDuringCapture`]) and calls again. Returns the last status.
    fn launch(&mut self, stream: &CudaStream, capturing: bool, mut launch: impl FnMut(u64, u64) -> sys::KernelStatus) -> Result<sys::KernelStatus> {
        loop {
            let (ptr, bytes) = self.workspace.as_ref().map_or((0, 0), |w| (w.ptr, w.bytes as u64));
            let status = launch(ptr, bytes);
            if status.cutlass_status == WORKSPACE_NULL && status.workspace_needed > bytes {
                let need = status.workspace_needed as usize;
                if capturing {
                    return Err(Error::WorkspaceDuringCapture { need, have: bytes as usize });
                }
                self.grow(stream, need)?;
                continue;
            }
            return Ok(status);
        }
    }

    /// A workspace of at least `need` bytes; the old one is kept (a captured graph may use it).
    fn grow(&mut self, stream: &CudaStream, need: usize) -> Result<()> {
        if let Some(limit) = self.limit {
            if need > limit {
                return Err(Error::WorkspaceLimit { need, limit });
            }
        }
        let buf = DeviceBuffer::zeroed(stream, need, false)?;
        if let Some(old) = self.workspace.replace(buf) {
            self.retired.push(old);
        }
        Ok(())
    }
}

impl Drop for BlockScaledGemm {
    fn drop(&mut self) {
        // Our buffers are freed once the stream no longer uses them; dropped on another thread, a
        // GEMM on the per-thread default stream waits for the whole device (that handle would name
        // this thread's stream).
        let _ = if self.thread_check().is_ok() { self.stream.synchronize() } else { self.stream.context().synchronize() };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lens(p: &Problem) -> BufferLens {
        BufferLens::for_problem(p, OutType::F16, false)
    }
    const B200: DeviceFacts = DeviceFacts { ordinal: 0, compute_capability: (10, 0), sm_count: 148, max_clusters: dispatch::ANY_CLUSTERS };
    const H100: DeviceFacts = DeviceFacts { ordinal: 1, compute_capability: (9, 0), sm_count: 132, max_clusters: [66, 39, 30, 22, 17, 15, 15] };

    #[test]
    fn status_names_the_cuda_error_beside_cutlass_internal() {
        let c = Config::Sm90_Swapped_64x128x64;
        let st = |cutlass_status, cuda_error| sys::KernelStatus { cutlass_status, cuda_error, workspace_needed: 0 };
        let shape = (64, 4096, 7168, 1);
        assert_eq!(status_result(st(0, 0), c, OutType::F16, shape).unwrap(), c);
        // kErrorInternal (7) with cudaErrorNoKernelImageForDevice (209): the CUDA error is named.
        let e = status_result(st(7, 209), c, OutType::F16, shape).unwrap_err();
        assert!(matches!(e, Error::CudaRuntime { code: 209, .. }), "{e}");
        let e = status_result(st(7, 0), c, OutType::F16, shape).unwrap_err();
        assert!(matches!(e, Error::Cutlass { code: 7, .. }), "{e}");
        assert!(matches!(status_result(st(NOT_BUILT, 0), c, OutType::F16, shape), Err(Error::NotBuilt { .. })));
        assert!(matches!(status_result(st(INVALID_PROBLEM, 0), c, OutType::F16, shape), Err(Error::CannotImplement { .. })));
    }

    #[test]
    fn plan_checks_every_buffer_and_the_device() {
        let p = Problem::new(256, 512, 1024);
        let all = |_, _| true;
        assert_eq!(plan(&p, OutType::F16, &lens(&p), &B200, None, all).unwrap(), dispatch::select(100, &p, OutType::F16, 148, &dispatch::ANY_CLUSTERS, |_| true).unwrap());
        for (i, name) in ["A", "SFA", "B", "SFB", "D"].iter().enumerate() {
            let mut l = lens(&p);
            let f = [&mut l.a, &mut l.sfa, &mut l.b, &mut l.sfb, &mut l.d];
            *f.into_iter().nth(i).unwrap() -= 1;
            let e = plan(&p, OutType::F16, &l, &B200, None, all).unwrap_err().to_string();
            assert!(e.starts_with(&format!("{name}: holds")), "{e}");
        }
        let mut l = lens(&p);
        l.c = Some(5);
        let e = plan(&p, OutType::F16, &l, &B200, None, all).unwrap_err().to_string();
        assert!(e.starts_with("C: holds 5"), "{e}");
        // SM100 config forced on a Hopper: typed refusal naming both sides.
        let e = plan(&p, OutType::F16, &lens(&p), &H100, Some(Config::Sm100_1Sm_128x128x256), all).unwrap_err().to_string();
        assert!(e.contains("needs compute capability 10.0") && e.contains("device 1 is 9.0"), "{e}");
        // Automatic choice on an unsupported device.
        let e = plan(&p, OutType::F16, &lens(&p), &DeviceFacts { compute_capability: (8, 0), ..H100 }, None, all).unwrap_err().to_string();
        assert!(e.contains("no kernel in this build runs on compute capability 8.0"), "{e}");
        // An architecture with kernels, none for this output (f32 on SM100, as cpp/configs.def
        // builds it): the output is named, not the device.
        let f32_lens = BufferLens::for_problem(&p, OutType::F32, false);
        let hopper_f32 = |c: Config, o: OutType| o != OutType::F32 || c.info().arch == 90;
        let e = plan(&p, OutType::F32, &f32_lens, &B200, None, hopper_f32).unwrap_err();
        assert!(matches!(e, Error::OutputUnsupported { out: OutType::F32, major: 10, .. }), "{e}");
        assert!(e.to_string().contains("f32 output runs on Hopper"), "{e}");
        plan(&p, OutType::F32, &f32_lens, &H100, None, hopper_f32).unwrap();
        // Another output left out of a build: named, without the f32 rule.
        let no_bf16 = |_: Config, o: OutType| o != OutType::Bf16;
        let e = plan(&p, OutType::Bf16, &BufferLens::for_problem(&p, OutType::Bf16, false), &H100, None, no_bf16).unwrap_err();
        assert!(matches!(e, Error::OutputUnsupported { out: OutType::Bf16, major: 9, .. }) && !e.to_string().contains("f32"), "{e}");
        // Not built.
        let e = plan(&p, OutType::F16, &lens(&p), &B200, Some(Config::Sm100_1Sm_128x128x256), |_, _| false).unwrap_err().to_string();
        assert!(e.contains("has no kernel for f16 output") && e.contains("BSG_CONFIGS"), "{e}");
        // Shape rules come first.
        let q = Problem::new(256, 512, 1000);
        assert!(plan(&q, OutType::F16, &lens(&q), &B200, None, all).unwrap_err().to_string().contains("K = 1000"));
    }

    #[test]
    fn plan_checks_fp4_buffers() {
        let p = Problem::new(130, 256, 512).batch(2).norm_constant(3.0);
        let all = |_, _| true;
        let ok = BufferLens::for_problem(&p, OutType::Nvfp4, false);
        assert_eq!((ok.d, ok.sfd), (2 * 130 * 256 / 2, Some(2 * 256 * 16)));
        plan(&p, OutType::Nvfp4, &ok, &B200, None, all).unwrap();
        let e = plan(&p, OutType::Nvfp4, &BufferLens { d: ok.d * 2, ..ok }, &B200, None, all).unwrap_err().to_string();
        assert!(e.contains("D: holds") && e.contains("L * M * N / 2 packed bytes"), "{e}");
        let e = plan(&p, OutType::Nvfp4Ue8m0, &BufferLens { sfd: Some(100), ..ok }, &H100, None, all).unwrap_err().to_string();
        assert!(e.starts_with("SFD: holds 100"), "{e}");
        let e = plan(&p, OutType::Nvfp4, &BufferLens { sfd: None, ..ok }, &H100, None, all).unwrap_err().to_string();
        assert!(e.starts_with("SFD: holds 0"), "{e}");
        let e = plan(&p, OutType::Nvfp4, &BufferLens { c: Some(3), ..ok }, &H100, None, all).unwrap_err().to_string();
        assert!(e.contains("f32 values"), "{e}");
        let e = plan(&p.norm_constant(-1.0), OutType::Nvfp4, &ok, &H100, None, all).unwrap_err();
        assert!(matches!(e, Error::NormConstant { value } if value == -1.0), "{e}");
        // Only configs that carry the FP4 epilogue are chosen.
        let c = plan(&p, OutType::Nvfp4, &ok, &B200, None, |c, o| o != OutType::Nvfp4 || c == Config::Sm100_2Sm_256x128x256).unwrap();
        assert_eq!(c, Config::Sm100_2Sm_256x128x256);
    }

    /// The swapped tiles decode A to 16 bits in the workspace: up to 4 times A's bytes (more where
    /// M is short of a tile), which the kernels size in 64-bit unsigned arithmetic. Beyond it
    /// the size wrapped (`workspace_size` answered 256 KiB for 2^64 + 256 KiB); now a SizeLimit.
    #[test]
    fn pre_pass_bytes_beyond_64_bits_are_refused() {
        let all = |_, _| true;
        let swapped = || Config::ALL.iter().copied().filter(|c| c.info().swapped());
        // A is 2^62 bytes, within validate's bounds; decoded it is 2^64 bytes.
        let p = Problem::new(1 << 30, 64, 1 << 30).batch(8);
        p.validate(OutType::F16, false).unwrap();
        let e = plan(&p, OutType::F16, &lens(&p), &H100, None, all).unwrap_err();
        assert!(matches!(e, Error::SizeLimit { what: "decoded A bytes", value, max, .. } if value == 1 << 64 && max == i64::MAX as u128), "{e}");
        for c in swapped() {
            let e = plan(&p, OutType::F16, &lens(&p), &H100, Some(c), all).unwrap_err();
            assert!(matches!(e, Error::SizeLimit { what: "decoded A bytes", .. }), "{c}: {e}");
        }
        plan(&p, OutType::F16, &lens(&p), &H100, Some(Config::Sm90_128x128x64), all).unwrap();
        // One row, padded to the 64-row tile: 2^27 batches of K = 2^30 (A 2^56 bytes).
        let q = Problem::new(1, 64, 1 << 30).batch(1 << 27);
        let e = plan(&q, OutType::F16, &lens(&q), &H100, Some(Config::Sm90_Swapped_64x128x64), all).unwrap_err();
        assert!(matches!(e, Error::SizeLimit { what: "decoded A bytes", value, .. } if value == 1 << 64), "{e}");
        assert!(e.to_string().contains("tile 64 rows"), "{e}");
        // Just within the bound: accepted, and the kernel's own size does not wrap.
        let r = Problem::new(1 << 30, 64, (1 << 30) - 64).batch(4);
        let decoded = 4 * (1usize << 30) * ((1 << 30) - 64) * 2;
        for c in swapped() {
            assert_eq!(plan(&r, OutType::F16, &lens(&r), &H100, Some(c), all).unwrap(), c);
            if c.is_built(OutType::F16) {
                let ws = crate::cutlass_host::workspace_size(c, OutType::F16, &r, 1, false).unwrap();
                assert!(ws >= decoded && ws - decoded < 1 << 20, "{c}: {ws} for {decoded} decoded bytes");
            }
        }
    }

    #[test]
    fn send_and_sync() {
        fn is<T: Send + Sync>() {}
        is::<BlockScaledGemm>();
    }
}
