//! Grouped GEMM in list form (CUTLASS's grouped GEMM): G independent NVFP4 GEMMs, each with its
//! own A, B, scales, optional C, D, alpha and sizes (M, N, K), in one launch after a prologue
//! that makes every group's TMA descriptors on the device (SM90), or after a builder that makes
//! every group's arguments for CUTLASS's pointer-array kernel (SM100: f16, bf16 and FP4 output;
//! compiled and host-tested, not yet run on silicon). Two ways in:
//! - [`BlockScaledGemm::grouped_list`] / [`BlockScaledGemm::grouped_list_fp4`]: the groups as
//!   tensors the host checks one by one; their addresses and sizes are uploaded per call (so the
//!   call is not capturable).
//! - [`BlockScaledGemm::grouped_list_raw`] (`unsafe`): the sizes and addresses already in device
//!   arrays ([`ListArrays`]), read by the kernels only: capturable, and the sizes may be computed
//!   on the GPU. The host knows bounds ([`ListProblem`]); a group whose device sizes break them is
//!   skipped (nothing of it is read or written).
//!
//! Per group the arithmetic is [`BlockScaledGemm::gemm`]'s at L = 1 and split 1 (FP32 sums of
//! exact products over the whole K range, one rounding): the same bits as a `gemm` call on that
//! group with the same tile. Layouts are those of `gemm` at L = 1.

use cudarc::driver::{DevicePtr, DevicePtrMut, SyncOnDrop};

use crate::dispatch::{self, Config};
use crate::error::{check_len, product, within, Error, Result};
use crate::formats::{OutputElement, PackedFp4, ScaleByte};
use crate::gemm::{check_devices, check_weight_layout, resolve_config, status_result, BlockScaledGemm, Nvfp4Output};
use crate::grouped::MAX_EXPERTS;
use crate::problem::{check_align, folded_alpha, setters, OutType, Problem};
use crate::layout::WeightLayout;
use crate::sys;
use crate::tensor::Nvfp4Tensor;

/// The GPUs the list-form grouped GEMM runs on, for messages.
pub const SUPPORTED_GROUPED_LIST: &str = "compute capability 9.0 (H100, H200: sm_90a; f16, bf16, f32, nvfp4 or nvfp4-ue8m0 output) or 10.0 (B200, GB200: sm_100a; f16, bf16, nvfp4 or nvfp4-ue8m0 output) for the list-form grouped GEMM";

/// What the host knows of a list-form call: the group count and bounds on every group's sizes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ListProblem {
    /// G: groups (1 to [`MAX_EXPERTS`]).
    pub groups: usize,
    /// Bounds on every group's M, N and K. A group's M may be 0 in the device arrays of
    /// [`BlockScaledGemm::grouped_list_raw`] (it is skipped); the safe forms take groups of at
    /// least one row, so leave out a group with none (a group is only its place in the list).
    pub max_m: usize,
    /// See `max_m`.
    pub max_n: usize,
    /// See `max_m`.
    pub max_k: usize,
    /// Bound on the sum of the groups' M. The swapped tiles decode every group's activations into
    /// the workspace, whose size follows this, and skip the groups whose rows would pass it; the
    /// stream tiles do not use it (they read and write every group as its sizes say).
    pub max_rows: usize,
    /// Common factor of every group's output (times the group's own alpha).
    pub alpha: f32,
    /// Factor of C (0: no C).
    pub beta: f32,
    /// FP4 output only: the normalization constant of the generated scale factors.
    pub norm_constant: f32,
    /// The layout of every group's B values (Hopper only for [`WeightLayout::Prepacked`]).
    pub weight_layout: WeightLayout,
}

impl ListProblem {
    /// G groups within (max_m, max_n, max_k); max_rows G * max_m, alpha 1, beta 0.
    pub const fn new(groups: usize, max_m: usize, max_n: usize, max_k: usize) -> Self {
        ListProblem { groups, max_m, max_n, max_k, max_rows: groups.saturating_mul(max_m), alpha: 1.0, beta: 0.0, norm_constant: 1.0, weight_layout: WeightLayout::Standard }
    }
    setters! {
        /// With a bound on the sum of the groups' M.
        max_rows: max_rows: usize;
        /// With alpha and beta.
        scalars: alpha, beta: f32;
        /// With the FP4 output's normalization constant.
        norm_constant: norm_constant: f32;
        /// With every group's B values in this layout.
        weight_layout: weight_layout: WeightLayout;
    }

    /// The rules: 1 to [`MAX_EXPERTS`] groups; the bounds as one GEMM of `gemm` (K a multiple of
    /// 32, N of the output's multiple, finite scalars, a C where beta is nonzero, the FP4 norm
    /// constant); the kernels' 32-bit counts in range.
    pub fn validate(&self, out: OutType, has_c: bool) -> Result<()> {
        if self.groups == 0 || self.groups > MAX_EXPERTS {
            return Err(Error::Dimension { dim: "groups", value: self.groups, max: MAX_EXPERTS });
        }
        Problem::new(self.max_m.max(1), self.max_n, self.max_k).scalars(self.alpha, self.beta).norm_constant(self.norm_constant).validate(out, has_c)?;
        let dims = || format!("G = {}, max M = {}, max N = {}, sum of M at most {}", self.groups, self.max_m, self.max_n, self.max_rows);
        let items = product(&[self.groups, self.max_m.div_ceil(8), self.max_n.div_ceil(128)]);
        within(i32::MAX as u128, "the grouped kernel counts them in 32-bit signed integers", dims, [("rows", "the bound on the sum of M", self.max_rows as u128), ("work items", "G * ceil(max M / 8) * ceil(max N / 128)", items)])
    }
}

/// A list-form call's device arrays (G entries each; `problems` 3G: M, N, K per group). The
/// address arrays hold device addresses (`u64`) of the groups' operands in `gemm`'s layouts at
/// L = 1: A (M, K/2) and B (N, K/2) packed (B in [`ListProblem::weight_layout`]: prepacked, it
/// holds ceil(K/256) * N * 128 bytes, [`crate::layout::prepacked_bytes`]), their scales tiled over
/// (M, K/16) and (N, K/16), C and D (M, N) row-major (FP4 output: C f32, D (M, N/2) packed, SFD
/// tiled over (M, N/16)). Each array is any device buffer (`CudaSlice`, `CudaView`, a
/// [`crate::ForeignBuffer`] of an engine's arena).
#[derive(Clone, Copy)]
pub struct ListArrays<'a> {
    /// i32 \[G\]\[3\]: M, N, K.
    pub problems: &'a dyn DevicePtr<i32>,
    /// A's packed values.
    pub a: &'a dyn DevicePtr<u64>,
    /// A's scales.
    pub sfa: &'a dyn DevicePtr<u64>,
    /// B's packed values.
    pub b: &'a dyn DevicePtr<u64>,
    /// B's scales.
    pub sfb: &'a dyn DevicePtr<u64>,
    /// D.
    pub d: &'a dyn DevicePtr<u64>,
    /// C, where beta is nonzero.
    pub c: Option<&'a dyn DevicePtr<u64>>,
    /// FP4 output: the generated scale factors.
    pub sfd: Option<&'a dyn DevicePtr<u64>>,
    /// Per-group factors of alpha (ones where absent), read by the kernel only: a non-finite one
    /// makes its group's D non-finite (FP4 output: its scale factors too) and touches nothing
    /// else.
    pub alphas: Option<&'a dyn DevicePtr<f32>>,
}

impl std::fmt::Debug for ListArrays<'_> {
    /// The arrays' lengths (their addresses are the stream's to give).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListArrays")
            .field("problems", &self.problems.len())
            .field("a", &self.a.len())
            .field("sfa", &self.sfa.len())
            .field("b", &self.b.len())
            .field("sfb", &self.sfb.len())
            .field("d", &self.d.len())
            .field("c", &self.c.map(|c| c.len()))
            .field("sfd", &self.sfd.map(|c| c.len()))
            .field("alphas", &self.alphas.map(|c| c.len()))
            .finish()
    }
}

/// One group of [`BlockScaledGemm::grouped_list`]: `d = alpha * gA * gB * dec(a) dec(b)ᵀ`
/// with a (1, M, K), b (1, N, K) and d M * N elements.
pub struct ListGroup<'a, VA, SA, VB, SB, D> {
    /// The activations, (1, M, K).
    pub a: &'a Nvfp4Tensor<VA, SA>,
    /// The weights, (1, N, K).
    pub b: &'a Nvfp4Tensor<VB, SB>,
    /// The output, M * N elements (FP4: an [`Nvfp4Output`] of M * N / 2 bytes and
    /// `Problem::new(m, n, k).sfd_bytes()` scale factors).
    pub d: D,
    /// The group's factor (the global scales of a and b are folded in).
    pub alpha: f32,
}

/// The host-built arrays of the safe calls, before upload.
struct HostArrays {
    problems: Vec<i32>,
    ptrs: [Vec<u64>; 6], // a, sfa, b, sfb, d, sfd
    alphas: Vec<f32>,
    bounds: ListProblem,
}

impl HostArrays {
    fn new(groups: usize) -> Self {
        HostArrays { problems: Vec::with_capacity(3 * groups), ptrs: Default::default(), alphas: Vec::with_capacity(groups), bounds: ListProblem::new(groups, 0, 0, 0).max_rows(0) }
    }
    /// Group g's checks and entries: shapes, alpha, devices, alignment of every address.
    #[allow(clippy::too_many_arguments)]
    fn push<'g, VA, SA, VB, SB, TV, TS>(&mut self, gemm: &'g BlockScaledGemm, guards: &mut Vec<SyncOnDrop<'g>>, g: usize, a: &'g Nvfp4Tensor<VA, SA>, b: &'g Nvfp4Tensor<VB, SB>, alpha: f32, (d, sfd): (u64, u64), d_len: usize, out: OutType) -> Result<()>
    where
        VA: DevicePtr<TV>, SA: DevicePtr<TS>, VB: DevicePtr<TV>, SB: DevicePtr<TS>,
    {
        let ((la, m, k), (lb, n, kb)) = (a.shape(), b.shape());
        if la != 1 || lb != 1 || kb != k {
            return Err(Error::InvalidData { what: "groups", detail: format!("group {g}: A is {:?} and B {:?}: each must be (1, rows, K) with one K", a.shape(), b.shape()) });
        }
        a.require_activation_layout()?;
        if g == 0 {
            self.bounds.weight_layout = b.layout();
        } else if b.layout() != self.bounds.weight_layout {
            return Err(Error::Layout { name: "B", layout: b.layout(), rule: "every group's B in one layout (the first group's)" });
        }
        let group = Problem::new(m, n, k);
        group.validate(out, false)?;
        // SM100's builder skips a group whose scales span 2^31 bytes or more: refused here
        // instead, so a call that returns Ok wrote every group.
        if gemm.device().arch() == Some(100) {
            group.check_sm100_scales(out)?;
        }
        let want = if out.sfd().is_some() { m * n / 2 } else { m * n };
        check_len("D", d_len, want, "M * N of the group (FP4: M * N / 2 bytes)")?;
        let alpha = folded_alpha(alpha, a.global_scale(), b.global_scale())?;
        let stream = gemm.stream();
        check_devices(gemm.device().ordinal, [("A", a.values().stream()), ("SFA", a.scales().stream()), ("B", b.values().stream()), ("SFB", b.scales().stream())])?;
        let [(pa, ga), (psfa, gsfa), (pb, gb), (psfb, gsfb)] = [a.values().device_ptr(stream), a.scales().device_ptr(stream), b.values().device_ptr(stream), b.scales().device_ptr(stream)];
        guards.extend([ga, gsfa, gb, gsfb]);
        for (i, (name, addr)) in [("A", pa), ("SFA", psfa), ("B", pb), ("SFB", psfb), ("D", d), ("SFD", sfd)].into_iter().enumerate() {
            check_align(name, addr)?;
            self.ptrs[i].push(addr);
        }
        self.problems.extend([m as i32, n as i32, k as i32]);
        self.alphas.push(alpha);
        let bd = &mut self.bounds;
        (bd.max_m, bd.max_n, bd.max_k, bd.max_rows) = (bd.max_m.max(m), bd.max_n.max(n), bd.max_k.max(k), bd.max_rows + m);
        Ok(())
    }
}

impl BlockScaledGemm {
    /// The config a list-form call on `p` with output `out` runs when none is forced: on SM90 the
    /// rule of [`Self::select_grouped_config`] with the mean rows a group from the bounds,
    /// `ceil(max_rows / min(groups, max_rows))`: below 33 a stream tile (about the fewest rows
    /// that hold it, short-K stages where K is short: the thresholds of
    /// [`crate::dispatch::select_grouped`]), else the swapped 128x128 tile. Errors as the call would.
    pub fn select_list_config(&self, p: &ListProblem, out: OutType) -> Result<Config> {
        p.validate(out, p.beta != 0.0)?;
        self.list_config(p, out, None)
    }

    fn list_config(&self, p: &ListProblem, out: OutType, forced: Option<Config>) -> Result<Config> {
        let built = |c: Config, o: OutType| c.is_built_grouped_list(o);
        let config = resolve_config(&self.device(), out, forced, SUPPORTED_GROUPED_LIST, &built, |arch| Ok(dispatch::select_grouped_list(arch, p.max_rows, p.groups, p.max_k, out, |c| built(c, out))))?;
        check_weight_layout(config, p.weight_layout)?;
        Ok(config)
    }

    fn list_args(&self, p: &ListProblem) -> sys::GroupedListArgs {
        let dev = self.device();
        sys::GroupedListArgs {
            groups: p.groups as i32, max_m: p.max_m as i32, max_n: p.max_n as i32, max_k: p.max_k as i32, max_rows: p.max_rows as i64,
            alpha: p.alpha, beta: p.beta, norm_constant: p.norm_constant,
            stream: self.stream().cu_stream() as u64, device_id: dev.ordinal as i32, sm_count: dev.sm_count as i32,
            b_layout: p.weight_layout.abi(),
            ..Default::default()
        }
    }

    /// Workspace bytes a list-form call on `p` with output `out` and `config` (or the one it
    /// would choose) needs. SM90: past the 256 KiB that split-K's counters keep at the start of
    /// every workspace (left as they are), 256 bytes a group (its TMA descriptors) and, for the
    /// swapped tiles, 8 bytes a group more (the scheduler's sums over the groups, made once a
    /// call) and the activations decoded to FP16, 2 * max_rows * max_k bytes (max_k rounded up
    /// to 64). SM100: the groups' argument arrays and CUTLASS's own workspace. Reserve it
    /// ([`Self::reserve_workspace`]) before capturing.
    pub fn grouped_list_workspace_size(&self, p: &ListProblem, out: OutType, config: Option<Config>) -> Result<usize> {
        p.validate(out, p.beta != 0.0)?;
        let config = self.list_config(p, out, config)?;
        Ok(sys::workspace_size_grouped_list(config.info().index, out.index(), &self.list_args(p)))
    }

    /// The list-form grouped GEMM over device arrays: for every group g with sizes
    /// (M, N, K) = `problems[3g..3g + 3]`, `D_g = alpha * alphas[g] * dec(A_g) dec(B_g)ᵀ +
    /// beta * C_g` in `out` (FP4 output: D packed and its scale factors generated as
    /// [`Self::gemm_fp4`] does, `p.norm_constant`). One prologue launch (SM90: the groups' TMA
    /// descriptors made on the device, and for the swapped tiles the activations decoded; SM100:
    /// the groups' arguments built, the padding of FP4 output's scale-factor tiles zeroed) and one
    /// GEMM launch; nothing is read back, so the call can be captured in a CUDA graph (reserve
    /// [`Self::grouped_list_workspace_size`] first). The global scales of the operands are not
    /// known here: fold them into `alphas`.
    ///
    /// The device checks each group and skips (reads and writes nothing of) one whose M is not in
    /// [0, max_m], N not in [1, max_n] or not a multiple of the output's multiple, K not in
    /// [32, max_k] or not a multiple of 32, an address null or not 16-byte aligned, or (the swapped tiles)
    /// whose M added to the M of the valid groups before it exceeds `p.max_rows`. On SM100 each
    /// of a group's scale buffers must also span fewer than 2^31 bytes
    /// ([`Problem::check_sm100`]); `max_rows` is not used there.
    ///
    /// # Safety
    /// For every group the device accepts, each address in the arrays must be a live device
    /// allocation on this GEMM's device holding the group's operand in the layout of
    /// [`ListArrays`] (B in `p.weight_layout`: the prepacked layout is longer than N * K/2 where
    /// K is not a multiple of 256), and D (and SFD) must not overlap another group's outputs or
    /// any input.
    pub unsafe fn grouped_list_raw(&self, p: &ListProblem, out: OutType, arrays: &ListArrays<'_>, config: Option<Config>) -> Result<Config> {
        p.validate(out, arrays.c.is_some())?;
        let config = self.list_config(p, out, config)?;
        let g = p.groups;
        check_len("problems", arrays.problems.len(), 3 * g, "3 * groups i32 (M, N, K per group)")?;
        for (name, arr) in [("a", arrays.a), ("sfa", arrays.sfa), ("b", arrays.b), ("sfb", arrays.sfb), ("d", arrays.d)].into_iter().chain(arrays.c.map(|c| ("c", c))).chain(arrays.sfd.map(|s| ("sfd", s))) {
            check_len(name, arr.len(), g, "one address per group")?;
        }
        if let Some(al) = arrays.alphas {
            check_len("alphas", al.len(), g, "one factor per group")?;
        }
        if out.sfd().is_some() != arrays.sfd.is_some() {
            return Err(Error::InvalidData { what: "sfd", detail: format!("{out} output: the scale-factor addresses are {}", if out.sfd().is_some() { "required" } else { "only for FP4 output" }) });
        }
        let streams = [("problems", arrays.problems.stream()), ("a", arrays.a.stream()), ("sfa", arrays.sfa.stream()), ("b", arrays.b.stream()), ("sfb", arrays.sfb.stream()), ("d", arrays.d.stream())];
        check_devices(self.device().ordinal, streams.into_iter().chain(arrays.c.map(|c| ("c", c.stream()))).chain(arrays.sfd.map(|s| ("sfd", s.stream()))).chain(arrays.alphas.map(|s| ("alphas", s.stream()))))?;
        let capturing = self.capture_check()?;
        let stream = self.stream();
        let (pp, _g0) = arrays.problems.device_ptr(stream);
        let (pa, _g1) = arrays.a.device_ptr(stream);
        let (psfa, _g2) = arrays.sfa.device_ptr(stream);
        let (pb, _g3) = arrays.b.device_ptr(stream);
        let (psfb, _g4) = arrays.sfb.device_ptr(stream);
        let (pd, _g5) = arrays.d.device_ptr(stream);
        let c = arrays.c.map(|c| c.device_ptr(stream));
        let sfd = arrays.sfd.map(|s| s.device_ptr(stream));
        let alphas = arrays.alphas.map(|s| s.device_ptr(stream));
        let args = sys::GroupedListArgs {
            problems: pp, a: pa, sfa: psfa, b: pb, sfb: psfb, d: pd,
            c: c.as_ref().map_or(0, |x| x.0), sfd: sfd.as_ref().map_or(0, |x| x.0), alphas: alphas.as_ref().map_or(0, |x| x.0),
            ..self.list_args(p)
        };
        let status = self.launch_with_workspace(capturing, |workspace, workspace_bytes| {
            let args = sys::GroupedListArgs { workspace, workspace_bytes, ..args };
            // SAFETY: the arrays are live allocations of the checked lengths on this device,
            // their guards held until the launch is queued; the addresses they hold are the
            // caller's promise (see # Safety). The kernel launches nothing when the workspace is
            // short.
            unsafe { sys::launch_grouped_list(config.info().index, out.index(), &args) }
        })?;
        status_result(status, config, out, (p.max_m, p.max_n, p.max_k, p.groups))
    }

    /// The list-form grouped GEMM over tensors the host checks: for every group,
    /// `d = alpha * gA * gB * dec(a) dec(b)ᵀ` in f16, bf16 or f32 (FP4: [`Self::grouped_list_fp4`]),
    /// the same bits as [`Self::gemm`] on the group at split 1 with the same tile. The groups'
    /// sizes and addresses are uploaded to the device for the call (about 70 bytes a group), so it
    /// cannot be captured in a CUDA graph ([`Error::NotCapturable`], returned before any buffer is
    /// touched): for that, upload them once and call [`Self::grouped_list_raw`]. On SM100 a group
    /// whose scale buffers span 2^31 bytes or more is refused ([`Error::SizeLimit`]). Returns the
    /// config that ran.
    pub fn grouped_list<VA, SA, VB, SB, D, TV, TS, TO>(&self, groups: &mut [ListGroup<'_, VA, SA, VB, SB, &mut D>], config: Option<Config>) -> Result<Config>
    where
        VA: DevicePtr<TV>, SA: DevicePtr<TS>, VB: DevicePtr<TV>, SB: DevicePtr<TS>, D: DevicePtrMut<TO>,
        TV: PackedFp4, TS: ScaleByte, TO: OutputElement,
    {
        let out = TO::OUT;
        self.refuse_capture()?;
        let mut host = HostArrays::new(groups.len());
        let mut guards = Vec::with_capacity(5 * groups.len());
        for (g, x) in groups.iter_mut().enumerate() {
            check_devices(self.device().ordinal, [("D", x.d.stream())])?;
            let len = x.d.len();
            let (pd, gd) = x.d.device_ptr_mut(self.stream());
            guards.push(gd);
            host.push(self, &mut guards, g, x.a, x.b, x.alpha, (pd, 0), len, out)?;
        }
        self.list_from_host(host, out, 1.0, config)
    }

    /// [`Self::grouped_list`] with FP4 output (`out` [`OutType::Nvfp4`] or
    /// [`OutType::Nvfp4Ue8m0`]): each group's D and scale factors as [`Self::gemm_fp4`] writes
    /// them with `norm_constant`.
    #[allow(clippy::type_complexity)]
    pub fn grouped_list_fp4<VA, SA, VB, SB, DV, DS, TV, TS>(&self, out: OutType, norm_constant: f32, groups: &mut [ListGroup<'_, VA, SA, VB, SB, Nvfp4Output<'_, DV, DS>>], config: Option<Config>) -> Result<Config>
    where
        VA: DevicePtr<TV>, SA: DevicePtr<TS>, VB: DevicePtr<TV>, SB: DevicePtr<TS>, DV: DevicePtrMut<TV>, DS: DevicePtrMut<TS>,
        TV: PackedFp4, TS: ScaleByte,
    {
        if out.sfd().is_none() {
            return Err(Error::InvalidData { what: "out", detail: format!("{out}: grouped_list_fp4 writes the FP4 outputs nvfp4 or nvfp4-ue8m0; use grouped_list for {out}") });
        }
        self.refuse_capture()?;
        let mut host = HostArrays::new(groups.len());
        let mut guards = Vec::with_capacity(6 * groups.len());
        for (g, x) in groups.iter_mut().enumerate() {
            let (m, n, k) = (x.a.shape().1, x.b.shape().1, x.a.shape().2);
            check_devices(self.device().ordinal, [("D", x.d.values.stream()), ("SFD", x.d.scales.stream())])?;
            let (len, sfd_len) = (x.d.values.len(), x.d.scales.len());
            let (pd, gd) = x.d.values.device_ptr_mut(self.stream());
            let (psfd, gs) = x.d.scales.device_ptr_mut(self.stream());
            guards.extend([gd, gs]);
            // The group's shapes first (push), so that a bad shape is named rather than an SFD
            // length derived from it; nothing launches before the loop ends.
            host.push(self, &mut guards, g, x.a, x.b, x.alpha, (pd, psfd), len, out)?;
            check_len("SFD", sfd_len, Problem::new(m, n, k).sfd_bytes(), "the tiled layout over (M, N/16) of the group")?;
        }
        self.list_from_host(host, out, norm_constant, config)
    }

    /// The safe calls refuse capture before they take any buffer's guard: with cudarc's event
    /// tracking on, a guard makes the capturing stream wait on an event recorded outside the
    /// capture, which invalidates it.
    fn refuse_capture(&self) -> Result<()> {
        if self.capture_check()? {
            return Err(Error::NotCapturable { call: "BlockScaledGemm::grouped_list", why: "it uploads the groups' sizes and addresses", fix: "upload them once and capture BlockScaledGemm::grouped_list_raw" });
        }
        Ok(())
    }

    /// The safe calls' upload and launch.
    fn list_from_host(&self, host: HostArrays, out: OutType, norm_constant: f32, config: Option<Config>) -> Result<Config> {
        let p = host.bounds.norm_constant(norm_constant);
        p.validate(out, false)?;
        let stream = self.stream();
        let problems = stream.clone_htod(&host.problems)?;
        let [a, sfa, b, sfb, d, sfd] = host.ptrs.each_ref().map(|v| stream.clone_htod(v));
        let (a, sfa, b, sfb, d, sfd) = (a?, sfa?, b?, sfb?, d?, sfd?);
        let alphas = stream.clone_htod(&host.alphas)?;
        let arrays = ListArrays { problems: &problems, a: &a, sfa: &sfa, b: &b, sfb: &sfb, d: &d, c: None, sfd: out.sfd().map(|_| &sfd as &dyn DevicePtr<u64>), alphas: Some(&alphas) };
        // SAFETY: every address was taken from a checked tensor or output of this device, of the
        // lengths the group's sizes need, under guards the callers hold until this returns.
        unsafe { self.grouped_list_raw(&p, out, &arrays, config) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_names_each_rule() {
        let ok = ListProblem::new(8, 256, 4096, 7168);
        ok.validate(OutType::Bf16, false).unwrap();
        assert_eq!(ok.max_rows, 2048);
        ListProblem::new(8, 0, 4096, 7168).validate(OutType::F16, false).unwrap();
        assert!(matches!(ListProblem::new(0, 8, 4096, 7168).validate(OutType::F16, false), Err(Error::Dimension { dim: "groups", .. })));
        assert!(matches!(ListProblem::new(MAX_EXPERTS + 1, 8, 4096, 7168).validate(OutType::F16, false), Err(Error::Dimension { dim: "groups", .. })));
        assert!(matches!(ListProblem::new(2, 8, 4096, 7000).validate(OutType::F16, false), Err(Error::KMultiple { .. })));
        assert!(matches!(ListProblem::new(2, 8, 4100, 7168).validate(OutType::F16, false), Err(Error::NMultiple { .. })));
        assert!(matches!(ListProblem::new(2, 8, 4112, 7168).validate(OutType::Nvfp4, false), Err(Error::NMultiple { multiple: 32, .. })));
        assert!(ListProblem::new(2, 8, 4096, 7168).norm_constant(0.0).validate(OutType::Nvfp4, false).is_err());
        assert!(matches!(ListProblem::new(2, 8, 4096, 7168).scalars(1.0, 0.5).validate(OutType::F16, false), Err(Error::BetaWithoutC { .. })));
        ListProblem::new(2, 8, 4096, 7168).scalars(1.0, 0.5).validate(OutType::F16, true).unwrap();
        assert!(matches!(ListProblem::new(2, 8, 4096, 7168).scalars(f32::NAN, 0.0).validate(OutType::F16, false), Err(Error::NonFiniteScalar { .. })));
        let e = ListProblem::new(1024, 1 << 22, 1 << 16, 64).validate(OutType::F16, false).unwrap_err();
        assert!(matches!(e, Error::SizeLimit { what: "rows", .. }), "{e}");
        let e = ListProblem::new(1024, 1 << 20, 1 << 16, 64).max_rows(1 << 20).validate(OutType::F16, false).unwrap_err();
        assert!(matches!(e, Error::SizeLimit { what: "work items", .. }), "{e}");
    }

    #[test]
    fn kernels_accept_what_validate_accepts() {
        // The C++ adapters' checks (host-side, nothing launched) agree with validate at the edges.
        let problems = [ListProblem::new(1, 1, 32, 32), ListProblem::new(8, 256, 4096, 7168), ListProblem::new(MAX_EXPERTS, 64, 2048, 768).max_rows(5000), ListProblem::new(3, 0, 64, 64).max_rows(0)];
        for c in Config::ALL.iter().copied() {
            for &out in c.info().grouped_list {
                if !c.is_built(out) {
                    continue;
                }
                for p in problems {
                    let p = p.norm_constant(2.0);
                    assert!(p.validate(out, false).is_ok(), "{p:?}");
                    assert!(crate::cutlass_host::can_implement_grouped_list(c, out, &p), "{c} {out} {p:?}");
                }
                // Past the extent validate allows, the kernel refuses too.
                for p in [ListProblem::new(1, Problem::MAX_EXTENT + 1, 32, 32), ListProblem::new(1, 1, Problem::MAX_EXTENT + 1 + 15, 32)] {
                    assert!(p.validate(out, false).is_err(), "{p:?}");
                    assert!(!crate::cutlass_host::can_implement_grouped_list(c, out, &p), "{c} {out} {p:?}");
                }
            }
        }
    }
}
