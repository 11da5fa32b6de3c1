//! W4A16: dense f16 or bf16 activations times NVFP4 weights, `D = alpha * gB * A dec(B)ᵀ
//! (+ beta * C)`, exact as the NVFP4 x NVFP4 GEMM is: on Hopper every decoded weight (e2m1 times
//! ue4m3, at most 6 significant bits) is exact in the activations' type, every product of two
//! such numbers exact in FP32, and the K sum is FP32 ([`crate::reference::w4a16_dots`] is the
//! exact CPU reference, [`crate::compare::verify_w4a16`] the verdict).

use cudarc::driver::{DevicePtr, DevicePtrMut};

use crate::dispatch::Config;
use crate::error::{check_len, product, Error, Result};
use crate::formats::{OutputElement, PackedFp4, ScaleByte};
use crate::gemm::{check_devices, choose_config, BlockScaledGemm, DeviceFacts, Table};
use crate::layout::WeightLayout;
use crate::grouped::{check_moe_lens, grouped_args, MoeProblem};
use crate::problem::{folded_alpha, OutType, Problem};
use crate::quantize::QuantInput;
use crate::sys::{self, KernelArgs};
use crate::tensor::Nvfp4Tensor;

/// Activation element types of the W4A16 GEMM: `half::f16` and `half::bf16`.
pub trait Activation16: QuantInput + OutputElement + cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits {}
impl Activation16 for half::f16 {}
impl Activation16 for half::bf16 {}

/// The devices the W4A16 GEMM runs on, for messages.
pub const SUPPORTED_W4A16: &str = "compute capability 9.0 (H100, H200: sm_90a) for W4A16 (on 10.0, quantize the activations (Quantizer) and call gemm)";

/// Buffer lengths of one W4A16 launch, in elements of each buffer's own type.
#[derive(Clone, Copy, Debug)]
pub struct W4a16Lens {
    /// A: 16-bit activations.
    pub a: usize,
    /// B values (bytes).
    pub b: usize,
    /// SFB (bytes).
    pub sfb: usize,
    /// C, when given.
    pub c: Option<usize>,
    /// D.
    pub d: usize,
}

impl W4a16Lens {
    /// The lengths a problem needs (with a C when `has_c`).
    pub fn for_problem(p: &Problem, has_c: bool) -> Self {
        W4a16Lens { a: p.a_elems(), b: p.b_bytes(), sfb: p.sfb_bytes(), c: has_c.then_some(p.cd_elems()), d: p.cd_elems() }
    }
}

/// Everything checked before a W4A16 launch that does not need device pointers: the problem's
/// rules (those of [`Problem::validate`], f16/bf16/f32 output, A's 2 * L * M * K bytes within the
/// kernels' 64-bit offsets), every buffer's length, the config's architecture and that this build
/// holds its W4A16 kernel. Returns the config to run. Pure: the tests call it with any device.
pub fn plan_w4a16(p: &Problem, out: OutType, lens: &W4a16Lens, device: &DeviceFacts, forced: Option<Config>, built: impl Fn(Config, OutType) -> bool) -> Result<Config> {
    if out.sfd().is_some() {
        return Err(Error::InvalidData { what: "out", detail: format!("{out}: the W4A16 GEMM writes f16, bf16 or f32") });
    }
    p.validate(out, lens.c.is_some())?;
    check_a16_bytes(p.m, p.k, p.l)?;
    check_len("A", lens.a, p.a_elems(), "L * M * K activations")?;
    check_len("B", lens.b, p.b_bytes(), "L * N * K / 2 packed bytes")?;
    check_len("SFB", lens.sfb, p.sfb_bytes(), "L * ceil(N/128)*128 * ceil(K/64)*4 tiled scale bytes")?;
    if let Some(c) = lens.c {
        check_len("C", c, p.cd_elems(), "L * M * N elements, like D")?;
    }
    check_len("D", lens.d, p.cd_elems(), "L * M * N elements")?;
    choose_config(p, out, device, forced, SUPPORTED_W4A16, built)
}

impl BlockScaledGemm {
    /// W4A16 GEMM: `D = alpha * gB * A dec(B)ᵀ`, A dense f16 or bf16 (L, M, K) row-major (a
    /// PyTorch activation), B an NVFP4 weight (L, N, K) with its global scale gB folded into
    /// alpha, FP32 accumulation, D in f16, bf16 or f32. On Hopper the weights are decoded on chip
    /// to A's type (exactly) and the activations read as they are; the tiles and the split-K
    /// rule are [`Self::gemm`]'s (stream tiles up to M = 32 and, where their K ranges are short, to
    /// 64; else the swapped tiles, which
    /// re-order A once per call into the workspace: about 2 * L * M * K bytes, exactly
    /// [`Self::w4a16_workspace_size`]). Capturable
    /// like [`Self::gemm`]. SM100 has no W4A16 kernel here: [`Error::UnsupportedDevice`] (quantize
    /// the activations with [`crate::Quantizer`] and call [`Self::gemm`] there).
    ///
    /// ```no_run
    /// use blockscaled_gemm::{BlockScaledGemm, Nvfp4Matrix, Nvfp4Tensor, Problem};
    /// use cudarc::driver::CudaContext;
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let stream = CudaContext::new(0)?.new_stream()?;
    /// let (m, n, k) = (16, 4096, 7168);
    /// let w: Vec<f32> = (0..n * k).map(|i| ((i % 97) as f32 - 48.0) / 64.0).collect();
    /// let w = Nvfp4Tensor::upload(&Nvfp4Matrix::quantize(&w, (1, n, k), None)?, &stream)?;
    /// let x = stream.clone_htod(&vec![half::bf16::from_f32(0.5); m * k])?;
    /// let mut y = stream.alloc_zeros::<half::bf16>(m * n)?;
    /// let gemm = BlockScaledGemm::new(stream.clone())?;
    /// gemm.gemm_w4a16(&Problem::new(m, n, k), &x, &w, &mut y, None)?;
    /// # Ok(()) }
    /// ```
    pub fn gemm_w4a16<A, VB, SB, D, TA, TV, TS, TO>(&self, p: &Problem, a: &A, b: &Nvfp4Tensor<VB, SB>, d: &mut D, config: Option<Config>) -> Result<Config>
    where
        A: DevicePtr<TA>, VB: DevicePtr<TV>, SB: DevicePtr<TS>, D: DevicePtrMut<TO>,
        TA: Activation16, TV: PackedFp4, TS: ScaleByte, TO: OutputElement,
    {
        self.run_w4a16::<_, _, _, cudarc::driver::CudaSlice<TO>, _, _, _, _, _>(p, a, b, None, d, config)
    }

    /// [`Self::gemm_w4a16`] with `+ beta * C`, C with D's type and shape.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_w4a16_with_c<A, VB, SB, C, D, TA, TV, TS, TO>(&self, p: &Problem, a: &A, b: &Nvfp4Tensor<VB, SB>, c: &C, d: &mut D, config: Option<Config>) -> Result<Config>
    where
        A: DevicePtr<TA>, VB: DevicePtr<TV>, SB: DevicePtr<TS>, C: DevicePtr<TO>, D: DevicePtrMut<TO>,
        TA: Activation16, TV: PackedFp4, TS: ScaleByte, TO: OutputElement,
    {
        self.run_w4a16(p, a, b, Some(c), d, config)
    }

    /// The config [`Self::gemm_w4a16`] runs for `p` with output `out` and weights in the standard
    /// layout, or the error it would give.
    pub fn select_w4a16_config(&self, p: &Problem, out: OutType) -> Result<Config> {
        self.select_w4a16_config_for(p, out, WeightLayout::Standard)
    }

    /// [`Self::select_w4a16_config`] for weights in `layout`.
    pub fn select_w4a16_config_for(&self, p: &Problem, out: OutType, layout: WeightLayout) -> Result<Config> {
        let config = plan_w4a16(p, out, &W4a16Lens::for_problem(p, p.beta != 0.0), &self.device(), None, |c, o| c.is_built_w4a16(o))?;
        Ok(self.for_weights(config, None, layout, p, out, |c| c.is_built_w4a16(out)))
    }

    /// Workspace bytes [`Self::gemm_w4a16`] needs on `p` with output `out` and `config` (or the one
    /// it would choose). Reserve it ([`Self::reserve_workspace`]) before capturing a call.
    pub fn w4a16_workspace_size<TA: Activation16>(&self, p: &Problem, out: OutType, config: Option<Config>) -> Result<usize> {
        let config = plan_w4a16(p, out, &W4a16Lens::for_problem(p, p.beta != 0.0), &self.device(), config, |c, o| c.is_built_w4a16(o))?;
        let (split_k, split_global) = self.split_for(config, p, out)?;
        let args = KernelArgs { split_k, split_global, sm_count: self.device().sm_count as i32, ..p.launch_args() };
        Ok(sys::workspace_size_w4a16(config.info().index, TA::KIND as u32, out.index(), &args))
    }

    #[allow(clippy::too_many_arguments)]
    fn run_w4a16<A, VB, SB, C, D, TA, TV, TS, TO>(&self, p: &Problem, a: &A, b: &Nvfp4Tensor<VB, SB>, c: Option<&C>, d: &mut D, forced: Option<Config>) -> Result<Config>
    where
        A: DevicePtr<TA>, VB: DevicePtr<TV>, SB: DevicePtr<TS>, C: DevicePtr<TO>, D: DevicePtrMut<TO>,
        TA: Activation16, TV: PackedFp4, TS: ScaleByte, TO: OutputElement,
    {
        let out = TO::OUT;
        if b.shape() != (p.l, p.n, p.k) {
            return Err(Error::OperandShape { name: "B", got: b.shape(), want: (p.l, p.n, p.k) });
        }
        let lens = W4a16Lens { a: a.len(), b: b.standard_values_len(), sfb: b.scales().len(), c: c.map(|c| c.len()), d: d.len() };
        let config = plan_w4a16(p, out, &lens, &self.device(), forced, |c, o| c.is_built_w4a16(o))?;
        let config = self.for_weights(config, forced, b.layout(), p, out, |c| c.is_built_w4a16(out));
        let mut buffers = vec![("A", a.stream()), ("B", b.values().stream()), ("SFB", b.scales().stream()), ("D", d.stream())];
        buffers.extend(c.map(|c| ("C", c.stream())));
        check_devices(self.device().ordinal, buffers)?;
        let folded = p.scalars(folded_alpha(p.alpha, 1.0, b.global_scale())?, p.beta);
        let capturing = self.capture_check()?;
        let stream = self.stream();
        let (pa, _ga) = a.device_ptr(stream);
        let ([pb, psfb], _gb) = b.ptrs(stream);
        let (pd, _gd) = d.device_ptr_mut(stream);
        let c_ptr = c.map(|c| c.device_ptr(stream));
        // Without C the kernel gets D as its C pointer; beta is 0, so it never reads it.
        let pc = c_ptr.as_ref().map_or(pd, |(p, _)| *p);
        self.launch(&folded, out, Table::W4a16(TA::KIND), config, capturing, KernelArgs { a: pa, b: pb, sfb: psfb, c: pc, d: pd, b_layout: b.layout().abi(), ..folded.launch_args() })
    }
}

impl BlockScaledGemm {
    /// The grouped W4A16 GEMM of a mixture-of-experts layer, in one launch (Hopper):
    /// `D[rows of e] = alpha * gB * expert_scales[e] * A[rows of e] dec(B[e])ᵀ`, A the stacked
    /// f16 or bf16 activations (T, K) as they are, B the experts' NVFP4 weights (E, N, K). The
    /// routing, the offsets' rules, the tiles and the workspace are [`Self::moe_gemm`]'s (its
    /// configs with W4A16 kernels, `ConfigInfo::grouped` and `ConfigInfo::w4a16`); per expert the
    /// result has the bits of [`Self::gemm_w4a16`] at split 1 on its rows.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_gemm_w4a16<A, VB, SB, O, ES, D, TA, TV, TS, TO>(&self, p: &MoeProblem, a: &A, b: &Nvfp4Tensor<VB, SB>, offsets: &O, expert_scales: &ES, d: &mut D, config: Option<Config>) -> Result<Config>
    where
        A: DevicePtr<TA>, VB: DevicePtr<TV>, SB: DevicePtr<TS>, O: DevicePtr<i32>, ES: DevicePtr<f32>, D: DevicePtrMut<TO>,
        TA: Activation16, TV: PackedFp4, TS: ScaleByte, TO: OutputElement,
    {
        let out = TO::OUT;
        p.validate(out)?;
        check_a16_bytes(p.rows, p.k, 1)?;
        if b.shape() != (p.experts, p.n, p.k) {
            return Err(Error::OperandShape { name: "B", got: b.shape(), want: (p.experts, p.n, p.k) });
        }
        check_len("A", a.len(), p.rows * p.k, "T * K activations")?;
        check_moe_lens(p, b, offsets.len(), expert_scales.len())?;
        check_len("D", d.len(), p.d_elems(), "T * N elements")?;
        let config = self.grouped_config(p, out, config, SUPPORTED_W4A16, |c, o| c.is_built_grouped_w4a16(o))?;
        check_devices(self.device().ordinal, [
            ("A", a.stream()), ("B", b.values().stream()), ("SFB", b.scales().stream()),
            ("offsets", offsets.stream()), ("expert_scales", expert_scales.stream()), ("D", d.stream()),
        ])?;
        let alpha = folded_alpha(p.alpha, 1.0, b.global_scale())?;
        let capturing = self.capture_check()?;
        let (pa, _ga) = a.device_ptr(self.stream());
        let (pd, _gd) = d.device_ptr_mut(self.stream());
        self.launch_grouped(p, config, Table::W4a16(TA::KIND), out, (pa, 0), alpha, b, offsets, expert_scales, (pd, 0), capturing)
    }

    /// Workspace bytes [`Self::moe_gemm_w4a16`] needs on `p` with output `out` and `config` (or
    /// the one it would choose): the swapped tiles' re-ordered activations (about 2 * T * K
    /// bytes: K rounded up to 64, after the split-K counters) and 12 bytes an expert (the
    /// scheduler's sums over the experts), none for the stream tiles.
    pub fn moe_w4a16_workspace_size<TA: Activation16>(&self, p: &MoeProblem, out: OutType, config: Option<Config>) -> Result<usize> {
        p.validate(out)?;
        let config = self.grouped_config(p, out, config, SUPPORTED_W4A16, |c, o| c.is_built_grouped_w4a16(o))?;
        Ok(sys::workspace_size_w4a16_grouped(config.info().index, TA::KIND as u32, out.index(), &grouped_args(p)))
    }
}

/// A dense 16-bit A of L x M x K: its 2 * L * M * K bytes within the kernels' 64-bit offsets.
fn check_a16_bytes(m: usize, k: usize, l: usize) -> Result<()> {
    let a_bytes = product(&[l, m, k, 2]);
    if a_bytes > Problem::MAX_BYTES as u128 {
        return Err(Error::SizeLimit { what: "A bytes", rule: "L * M * K * 2", dims: format!("M = {m}, K = {k}, L = {l}"), value: a_bytes, max: Problem::MAX_BYTES as u128, why: "byte counts and offsets are 64-bit signed in the kernels" });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::ANY_CLUSTERS;

    fn hopper() -> DeviceFacts {
        DeviceFacts { ordinal: 0, compute_capability: (9, 0), sm_count: 132, max_clusters: ANY_CLUSTERS }
    }

    #[test]
    fn plan_checks_lengths_outputs_and_devices() {
        let p = Problem::new(16, 4096, 7168);
        let lens = W4a16Lens::for_problem(&p, false);
        let all = |c: Config, o: OutType| c.info().w4a16.contains(&o);
        let c = plan_w4a16(&p, OutType::Bf16, &lens, &hopper(), None, all).unwrap();
        assert_eq!(c, Config::Sm90_Stream_16x64x64, "the dense rule's 64-wide stream tile (64 tiles x 2 ranges)");
        let c = plan_w4a16(&Problem::new(4096, 4096, 7168), OutType::Bf16, &W4a16Lens::for_problem(&Problem::new(4096, 4096, 7168), false), &hopper(), None, all).unwrap();
        assert!(c.info().swapped(), "{c}");
        let e = plan_w4a16(&p, OutType::Bf16, &W4a16Lens { a: lens.a / 2, ..lens }, &hopper(), None, all).unwrap_err();
        assert!(matches!(e, Error::BufferLength { name: "A", .. }), "{e}");
        let e = plan_w4a16(&p, OutType::Bf16, &W4a16Lens { sfb: 0, ..lens }, &hopper(), None, all).unwrap_err();
        assert!(matches!(e, Error::BufferLength { name: "SFB", .. }), "{e}");
        let e = plan_w4a16(&p, OutType::Nvfp4, &lens, &hopper(), None, all).unwrap_err();
        assert!(matches!(e, Error::InvalidData { what: "out", .. }), "{e}");
        let blackwell = DeviceFacts { compute_capability: (10, 0), ..hopper() };
        let e = plan_w4a16(&p, OutType::Bf16, &lens, &blackwell, None, all).unwrap_err();
        assert!(matches!(e, Error::UnsupportedDevice { supported: SUPPORTED_W4A16, .. }), "{e}");
        // A config without W4A16 kernels, forced.
        let e = plan_w4a16(&p, OutType::Bf16, &lens, &hopper(), Some(Config::Sm90_128x64x64), all).unwrap_err();
        assert!(matches!(e, Error::NotBuilt { .. }), "{e}");
        let e = plan_w4a16(&Problem::new(16, 4096, 7160), OutType::Bf16, &lens, &hopper(), None, all).unwrap_err();
        assert!(matches!(e, Error::KMultiple { .. }), "{e}");
        // A's bytes past i64::MAX while every NVFP4 count fits.
        let huge = Problem::new(1 << 30, 16, 1 << 30).batch(4);
        let e = plan_w4a16(&huge, OutType::F32, &W4a16Lens::for_problem(&huge, false), &hopper(), None, all).unwrap_err();
        assert!(matches!(e, Error::SizeLimit { what: "A bytes", .. }), "{e}");
    }

    #[test]
    fn every_w4a16_config_is_a_stream_or_swapped_hopper_tile() {
        for c in Config::ALL {
            if !c.info().w4a16.is_empty() {
                assert!(c.info().arch == 90 && (c.info().streams() || c.info().swapped()), "{c}");
            }
        }
    }
}
