//! `BlockScaledGemm`: the safe API over the kernels. Every argument is checked here, before the
//! FFI line; device buffers come in through cudarc's `DevicePtr`/`DevicePtrMut` and their guards
//! are held until the launch is queued.

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use crate::config::{self, Config};
use crate::error::{Error, Result};
use crate::ffi::bridge;
use crate::formats::{OutputElement, PackedFp4, ScaleByte};
use crate::problem::{buffer_rules, check_align, check_len, OutType, Problem};

/// One NVFP4 operand on the device: packed e2m1 values (`u8` or `float4::F4E2M1x2`, two per
/// byte, K contiguous) and its ue4m3 scales (`u8` or `float8::F8E4M3`) in the tiled layout.
pub struct Nvfp4Operand<'a, V, S> {
    /// Packed values, (L, rows, K/2) bytes.
    pub values: &'a V,
    /// Tiled scales, `layout::sf_bytes(rows, K, L)` bytes.
    pub scales: &'a S,
}

impl<'a, V, S> Nvfp4Operand<'a, V, S> {
    /// Pairs values with their scales.
    pub fn new(values: &'a V, scales: &'a S) -> Self {
        Nvfp4Operand { values, scales }
    }
}

/// The GPUs this crate's kernels run on, for messages.
pub const SUPPORTED: &str = "compute capability 10.0 (B200, GB200: sm_100a) and 9.0 (H100, H200: sm_90a)";

/// The facts of a device that choose and check a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceFacts {
    /// Device ordinal.
    pub ordinal: usize,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Multiprocessor count.
    pub sm_count: usize,
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
    /// D.
    pub d: usize,
}

impl BufferLens {
    /// The lengths a problem needs (with a C when `has_c`).
    pub fn for_problem(p: &Problem, has_c: bool) -> Self {
        BufferLens { a: p.a_bytes(), sfa: p.sfa_bytes(), b: p.b_bytes(), sfb: p.sfb_bytes(), c: has_c.then_some(p.cd_elems()), d: p.cd_elems() }
    }
}

/// Everything checked before a launch that does not need device pointers: the problem's shape
/// rules, every buffer length, the config's architecture against the device, and that the
/// kernel is in this build. Returns the config to run. Pure: the tests call it with any device.
pub fn plan(p: &Problem, out: OutType, lens: &BufferLens, device: &DeviceFacts, forced: Option<Config>, built: impl Fn(Config, OutType) -> bool) -> Result<Config> {
    p.validate(out, lens.c.is_some())?;
    let [a, sfa, b, sfb, d] = buffer_rules(p);
    for ((name, want, rule), got) in [(a, lens.a), (sfa, lens.sfa), (b, lens.b), (sfb, lens.sfb), (d, lens.d)] {
        check_len(name, got, want, rule)?;
    }
    if let Some(c) = lens.c {
        check_len("C", c, p.cd_elems(), "L * M * N elements, like D")?;
    }
    let (major, minor) = device.compute_capability;
    let config = match forced {
        Some(c) => {
            if c.compute_capability() != device.compute_capability {
                return Err(Error::ArchMismatch { config: c, need: c.arch_label(), ordinal: device.ordinal, major, minor });
            }
            c
        }
        None => {
            let unsupported = || Error::UnsupportedDevice { ordinal: device.ordinal, major, minor, supported: SUPPORTED };
            let arch = device.arch().ok_or_else(unsupported)?;
            config::select(arch, p, device.sm_count, |c| built(c, out)).ok_or_else(unsupported)?
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
/// accumulation, and D in f16, bf16 or f32.
///
/// It is `Send + Sync`: the workspace sits behind a mutex held from allocation until the launch
/// is queued, and every launch goes to the one stream, which orders workspace reuse.
///
/// ```no_run
/// use blockscaled_gemm::{BlockScaledGemm, Nvfp4Matrix, Nvfp4Operand, Problem};
/// use cudarc::driver::CudaContext;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let stream = CudaContext::new(0)?.default_stream();
/// let (m, n, k) = (128, 256, 512);
/// let a = Nvfp4Matrix::random_contest(m, k, 1, 1)?;
/// let b = Nvfp4Matrix::random_contest(n, k, 1, 2)?;
/// let (a_v, a_s) = (stream.clone_htod(a.data())?, stream.clone_htod(a.scales())?);
/// let (b_v, b_s) = (stream.clone_htod(b.data())?, stream.clone_htod(b.scales())?);
/// let mut d = stream.alloc_zeros::<half::f16>(m * n)?;
///
/// let gemm = BlockScaledGemm::new(stream.clone())?;
/// gemm.gemm(&Problem::new(m, n, k), Nvfp4Operand::new(&a_v, &a_s), Nvfp4Operand::new(&b_v, &b_s), &mut d, None)?;
/// let d_host = stream.clone_dtoh(&d)?;
/// let want: Vec<half::f16> = blockscaled_gemm::reference_gemm(&a, &b, 1.0, 0.0, None)?;
/// assert!(blockscaled_gemm::compare::compare(&d_host, &want, 1e-3, 1e-3).passed());
/// # Ok(()) }
/// ```
pub struct BlockScaledGemm {
    stream: Arc<CudaStream>,
    device: DeviceFacts,
    workspace: Mutex<Option<CudaSlice<u8>>>,
    split_k: Option<u32>,
}

impl BlockScaledGemm {
    /// A GEMM that launches on `stream`. Fails with [`Error::NoDriver`] where libcuda is absent.
    pub fn new(stream: Arc<CudaStream>) -> Result<Self> {
        let ctx = stream.context();
        let cc = ctx.compute_capability()?;
        let sm_count = ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let device = DeviceFacts { ordinal: ctx.ordinal(), compute_capability: cc, sm_count: sm_count.max(1) as usize };
        Ok(BlockScaledGemm { stream, device, workspace: Mutex::new(None), split_k: None })
    }

    /// Forces the number of K ranges of the SM90 kernels (`None`: the heuristic of
    /// [`crate::config_split_k`]). Values above the problem's k-tiles (K / 64) are refused by
    /// [`Self::gemm`]; SM100 configs ignore it (CUTLASS schedules them).
    pub fn with_split_k(mut self, split_k: Option<u32>) -> Self {
        self.split_k = split_k;
        self
    }

    /// Whether libcuda can be loaded here; check before any other call on a machine that may
    /// have no NVIDIA driver (cudarc panics there).
    pub fn driver_present() -> bool {
        // SAFETY: only tries to load the library.
        unsafe { cudarc::driver::sys::is_culib_present() }
    }

    /// The device's facts.
    pub fn device(&self) -> DeviceFacts {
        self.device
    }

    /// The stream launches go to.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The config [`Self::gemm`] would run for `p` with output `out`, or the error it would give.
    pub fn select_config(&self, p: &Problem, out: OutType) -> Result<Config> {
        let lens = BufferLens::for_problem(p, p.beta != 0.0);
        plan(p, out, &lens, &self.device, None, |c, o| c.is_built(o))
    }

    /// `D = alpha * A Bᵀ` (beta must be 0). `config`: `None` chooses from the shape table.
    /// Returns the config that ran. Asynchronous: synchronize the stream to read D.
    pub fn gemm<VA, SA, VB, SB, D, TV, TS, TO>(&self, p: &Problem, a: Nvfp4Operand<'_, VA, SA>, b: Nvfp4Operand<'_, VB, SB>, d: &mut D, config: Option<Config>) -> Result<Config>
    where
        VA: DevicePtr<TV>, SA: DevicePtr<TS>, VB: DevicePtr<TV>, SB: DevicePtr<TS>, D: DevicePtrMut<TO>,
        TV: PackedFp4, TS: ScaleByte, TO: OutputElement,
    {
        self.run::<_, _, _, _, CudaSlice<TO>, _, _, _, _>(p, a, b, None, d, config)
    }

    /// `D = alpha * A Bᵀ + beta * C`, C with D's type and shape.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_with_c<VA, SA, VB, SB, C, D, TV, TS, TO>(&self, p: &Problem, a: Nvfp4Operand<'_, VA, SA>, b: Nvfp4Operand<'_, VB, SB>, c: &C, d: &mut D, config: Option<Config>) -> Result<Config>
    where
        VA: DevicePtr<TV>, SA: DevicePtr<TS>, VB: DevicePtr<TV>, SB: DevicePtr<TS>, C: DevicePtr<TO>, D: DevicePtrMut<TO>,
        TV: PackedFp4, TS: ScaleByte, TO: OutputElement,
    {
        self.run(p, a, b, Some(c), d, config)
    }

    fn split_k_for(&self, config: Config, p: &Problem) -> Result<u32> {
        if config.info().arch != 90 {
            return Ok(1);
        }
        let k_tiles = p.k.div_ceil(config.info().tile[2] as usize);
        match self.split_k {
            None => Ok(config::split_k(config, p, self.device.sm_count)),
            Some(s) if s >= 1 && s as usize <= k_tiles && s <= 65535 => Ok(s),
            Some(s) => Err(Error::InvalidData { what: "split_k", detail: format!("{s}: must be in 1..={} (K / 64 rounded up, at most 65535)", k_tiles.min(65535)) }),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn run<VA, SA, VB, SB, C, D, TV, TS, TO>(&self, p: &Problem, a: Nvfp4Operand<'_, VA, SA>, b: Nvfp4Operand<'_, VB, SB>, c: Option<&C>, d: &mut D, forced: Option<Config>) -> Result<Config>
    where
        VA: DevicePtr<TV>, SA: DevicePtr<TS>, VB: DevicePtr<TV>, SB: DevicePtr<TS>, C: DevicePtr<TO>, D: DevicePtrMut<TO>,
        TV: PackedFp4, TS: ScaleByte, TO: OutputElement,
    {
        let out = TO::OUT;
        let lens = BufferLens { a: a.values.len(), sfa: a.scales.len(), b: b.values.len(), sfb: b.scales.len(), c: c.map(|c| c.len()), d: d.len() };
        let config = plan(p, out, &lens, &self.device, forced, |c, o| c.is_built(o))?;
        let ordinal = self.device.ordinal;
        let on_device = |name: &'static str, s: &Arc<CudaStream>| {
            let buffer_device = s.context().ordinal();
            if buffer_device != ordinal {
                return Err(Error::WrongDevice { name, buffer_device, gemm_device: ordinal });
            }
            Ok(())
        };
        on_device("A", a.values.stream())?;
        on_device("SFA", a.scales.stream())?;
        on_device("B", b.values.stream())?;
        on_device("SFB", b.scales.stream())?;
        on_device("D", d.stream())?;
        if let Some(c) = c {
            on_device("C", c.stream())?;
        }

        let stream = &self.stream;
        let (pa, _ga) = a.values.device_ptr(stream);
        let (psfa, _gsfa) = a.scales.device_ptr(stream);
        let (pb, _gb) = b.values.device_ptr(stream);
        let (psfb, _gsfb) = b.scales.device_ptr(stream);
        let (pd, _gd) = d.device_ptr_mut(stream);
        let c_ptr = c.map(|c| c.device_ptr(stream));
        // Without C the kernel gets D as its C pointer; beta is 0, so it never reads it.
        let pc = c_ptr.as_ref().map_or(pd, |(p, _)| *p);
        for (name, addr) in [("A", pa), ("SFA", psfa), ("B", pb), ("SFB", psfb), ("C", pc), ("D", pd)] {
            check_align(name, addr)?;
        }
        let mut args = bridge::LaunchArgs {
            m: p.m as i32, n: p.n as i32, k: p.k as i32, l: p.l as i32,
            a: pa, sfa: psfa, b: pb, sfb: psfb, c: pc, d: pd,
            alpha: p.alpha, beta: p.beta,
            workspace: 0, workspace_bytes: 0,
            stream: stream.cu_stream() as u64,
            device_id: ordinal as i32, sm_count: self.device.sm_count as i32,
            split_k: self.split_k_for(config, p)? as i32,
        };
        let (index, out_index) = (config.info().index, out.index());
        if !bridge::can_implement(index, out_index, &args) {
            return Err(Error::CannotImplement { config, m: p.m, n: p.n, k: p.k, l: p.l });
        }
        let need = bridge::workspace_size(index, out_index, &args);
        let mut ws = self.workspace.lock().unwrap_or_else(|e| e.into_inner());
        if need > 0 && ws.as_ref().is_none_or(|w| w.len() < need) {
            *ws = Some(stream.alloc_zeros::<u8>(need)?);
        }
        let ws_guard = ws.as_mut().filter(|_| need > 0).map(|w| w.device_ptr_mut(stream));
        if let Some((ptr, _)) = &ws_guard {
            args.workspace = *ptr;
            args.workspace_bytes = need;
        }
        stream.context().bind_to_thread()?;
        // SAFETY: every pointer is a live device allocation of the checked length on this
        // stream's device, 16-byte aligned, and its guard lives until after the launch is queued.
        let status = unsafe { bridge::launch(index, out_index, &args) };
        drop(ws_guard);
        if status.cutlass_status != 0 {
            return Err(Error::Cutlass { code: status.cutlass_status, name: bridge::cutlass_status_name(status.cutlass_status) });
        }
        if status.cuda_error != 0 {
            return Err(Error::CudaRuntime { code: status.cuda_error, name: bridge::cuda_error_name(status.cuda_error) });
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lens(p: &Problem) -> BufferLens {
        BufferLens::for_problem(p, false)
    }
    const B200: DeviceFacts = DeviceFacts { ordinal: 0, compute_capability: (10, 0), sm_count: 148 };
    const H100: DeviceFacts = DeviceFacts { ordinal: 1, compute_capability: (9, 0), sm_count: 132 };

    #[test]
    fn plan_checks_every_buffer_and_the_device() {
        let p = Problem::new(256, 512, 1024);
        let all = |_, _| true;
        assert_eq!(plan(&p, OutType::F16, &lens(&p), &B200, None, all).unwrap(), config::select(100, &p, 148, |_| true).unwrap());
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
        // Not built.
        let e = plan(&p, OutType::F16, &lens(&p), &B200, Some(Config::Sm100_1Sm_128x128x256), |_, _| false).unwrap_err().to_string();
        assert!(e.contains("is not compiled into this build"), "{e}");
        // Shape rules come first.
        let q = Problem::new(256, 512, 1000);
        assert!(plan(&q, OutType::F16, &lens(&q), &B200, None, all).unwrap_err().to_string().contains("K = 1000"));
    }

    #[test]
    fn send_and_sync() {
        fn is<T: Send + Sync>() {}
        is::<BlockScaledGemm>();
    }
}
