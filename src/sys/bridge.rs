//! The cxx bridge to the C++ shim (`cpp/host/bridge.cpp`): kernel launches through the table
//! build.rs generates, and the host-side queries the tests use.

#[cxx::bridge(namespace = "bsg")]
pub(crate) mod ffi {
    unsafe extern "C++" {
        include!("blockscaled-gemm/cpp/host/bridge.h");

        type KernelArgs = crate::sys::KernelArgs;
        type KernelStatus = crate::sys::KernelStatus;
        type QuantizeArgs = crate::sys::QuantizeArgs;
        type GroupedArgs = crate::sys::GroupedArgs;
        type GroupedListArgs = crate::sys::GroupedListArgs;

        /// The one call a GEMM makes: checks, the workspace it needs, and the launches.
        /// `cutlass_status` -1: the kernel is not in this build.
        ///
        /// # Safety
        /// Every address in `args` must be valid for the problem on the stream's device.
        unsafe fn launch(config: u32, out: u32, args: &KernelArgs) -> KernelStatus;
        /// The NVFP4 quantizer (cpp/quant/): the amax pass when asked, then the quantizer.
        ///
        /// # Safety
        /// Every address in `args` must be valid for the shape on the stream's device.
        unsafe fn quantize(args: &QuantizeArgs) -> KernelStatus;
        /// Row-major scales (batch, rows, cols) at `src` to the 128x4 tiled layout at `dst`
        /// (padding zeroed), on `stream`.
        ///
        /// # Safety
        /// `src` must hold batch * rows * cols bytes and `dst` the tiled layout's bytes, on the
        /// stream's device.
        unsafe fn tile_scales(src: u64, dst: u64, rows: i32, cols: i32, batch: i32, stream: u64) -> KernelStatus;
        /// Packed e2m1 values (batch, rows, K) between the standard layout at `src` and the
        /// prepacked one (`BSG_PREPACK_CHUNK_BYTES`) at `dst` (`unpack`: the other way), on
        /// `stream`; the prepacked layout's bytes past K are written as zeros.
        ///
        /// # Safety
        /// Both buffers must hold their layout's bytes for the shape, 16-byte aligned, on the
        /// stream's device; K a multiple of 32.
        #[allow(clippy::too_many_arguments)]
        unsafe fn prepack_values(src: u64, dst: u64, rows: i32, k: i32, batch: i32, unpack: bool, stream: u64) -> KernelStatus;
        /// The grouped (mixture-of-experts) launch of a config's grouped kernel for output `out`.
        /// `cutlass_status` -1: not in this build.
        ///
        /// # Safety
        /// Every address in `args` must be valid for the problem on the stream's device.
        unsafe fn launch_grouped(config: u32, out: u32, args: &GroupedArgs) -> KernelStatus;
        fn can_implement_grouped(config: u32, out: u32, args: &GroupedArgs) -> bool;
        fn workspace_size_grouped(config: u32, out: u32, args: &GroupedArgs) -> usize;
        /// The per-expert arguments the grouped kernel would build for expert `expert`, computed
        /// on the host and flattened into `values` (`GroupedEntry::describe`): the count of
        /// values, written only when `values` holds them all; -1 refused, -2 not built, -3 a
        /// kernel that builds none.
        ///
        /// # Safety
        /// `args.offsets` must be the host address of `args.experts + 1` int32 and
        /// `args.expert_alpha` 0 or that of `args.experts` f32; nothing else is dereferenced.
        unsafe fn describe_grouped(config: u32, out: u32, args: &GroupedArgs, expert: i32, values: &mut [i64]) -> i64;
        /// The list-form grouped launch (the groups' sizes and addresses in device arrays) of a
        /// config's list kernel for output `out`. `cutlass_status` -1: not in this build.
        ///
        /// # Safety
        /// Every address in `args`, and every address the arrays hold for a group whose sizes the
        /// kernel accepts, must be valid for those sizes on the stream's device.
        unsafe fn launch_grouped_list(config: u32, out: u32, args: &GroupedListArgs) -> KernelStatus;
        fn can_implement_grouped_list(config: u32, out: u32, args: &GroupedListArgs) -> bool;
        fn workspace_size_grouped_list(config: u32, out: u32, args: &GroupedListArgs) -> usize;
        /// [`describe_grouped`] for the list form: group `group`'s built arguments.
        ///
        /// # Safety
        /// `args.problems` must be the host address of `3 * args.groups` int32, each address
        /// array's field (`a`, `sfa`, `b`, `sfb`, `d`; `c` where beta is nonzero; `sfd` for FP4
        /// output) that of `args.groups` u64, and `args.alphas` 0 or that of `args.groups` f32;
        /// nothing else is dereferenced.
        unsafe fn describe_grouped_list(config: u32, out: u32, args: &GroupedListArgs, group: i32, values: &mut [i64]) -> i64;
        /// A config's W4A16 kernel (activations of InKind `input`, 16-bit, in `args.a`; `args.sfa`
        /// unused) for output `out`. `cutlass_status` -1: not in this build.
        ///
        /// # Safety
        /// Every address in `args` must be valid for the problem on the stream's device.
        unsafe fn launch_w4a16(config: u32, input: u32, out: u32, args: &KernelArgs) -> KernelStatus;
        fn workspace_size_w4a16(config: u32, input: u32, out: u32, args: &KernelArgs) -> usize;
        /// The grouped form: `args.a` holds T x K 16-bit activations, `args.sfa` is unused.
        ///
        /// # Safety
        /// Every address in `args` must be valid for the problem on the stream's device.
        unsafe fn launch_w4a16_grouped(config: u32, input: u32, out: u32, args: &GroupedArgs) -> KernelStatus;
        fn workspace_size_w4a16_grouped(config: u32, input: u32, out: u32, args: &GroupedArgs) -> usize;
        /// Host-only queries (no device is touched): `can_implement` and the workspace bytes.
        fn can_implement(config: u32, out: u32, args: &KernelArgs) -> bool;
        fn workspace_size(config: u32, out: u32, args: &KernelArgs) -> usize;
        #[allow(clippy::too_many_arguments)]
        fn sf_offsets(config: u32, out: u32, m: i32, n: i32, k: i32, l: i32, operand_b: bool, offsets: &mut [i64]) -> i64;
        /// CUTLASS's host reference `Gemm3x` with `SfStrategy::SfDGen` (example 72b's check).
        #[allow(clippy::too_many_arguments)]
        fn host_gemm_fp4(m: i32, n: i32, k: i32, l: i32, a: &[u8], sfa: &[u8], b: &[u8], sfb: &[u8], c: &[f32], alpha: f32, beta: f32, norm_constant: f32, sfd_ue8m0: bool, d: &mut [u8], sfd: &mut [u8]);
        fn host_sfd_cosize(m: i32, n: i32, l: i32) -> i64;
        /// CUTLASS's host conversions from f32: 0 e2m1, 1 ue4m3, 2 ue8m0.
        fn host_convert(kind: i32, x: &[f32], out: &mut [u8]);
        fn cutlass_status_name(code: i32) -> String;
        fn cuda_error_name(code: i32) -> String;
    }
}
