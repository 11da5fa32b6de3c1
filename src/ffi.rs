//! The unsafe bottom layer: the cxx bridge to the C++ shim. Only `gemm.rs` and the host-side
//! CUTLASS queries in `cutlass.rs` call it, after validating every argument.

#[cxx::bridge(namespace = "bsg")]
pub(crate) mod bridge {
    /// One launch; device pointers and the stream as integers (cudarc's `CUdeviceptr`).
    #[derive(Debug, Clone, Copy, Default)]
    struct LaunchArgs {
        m: i32,
        n: i32,
        k: i32,
        l: i32,
        a: u64,
        sfa: u64,
        b: u64,
        sfb: u64,
        c: u64,
        d: u64,
        alpha: f32,
        beta: f32,
        workspace: u64,
        workspace_bytes: usize,
        stream: u64,
        device_id: i32,
        sm_count: i32,
        split_k: i32,
        /// FP4 output: generated scale factors, and the device address of the norm constant.
        sfd: u64,
        norm_constant: u64,
    }

    /// `cutlass::Status` (-1: kernel not in this build) and `cudaError_t` as integers.
    #[derive(Debug, Clone, Copy)]
    struct LaunchStatus {
        cutlass_status: i32,
        cuda_error: i32,
    }

    unsafe extern "C++" {
        include!("blockscaled-gemm/cpp/bridge.h");

        fn kernel_built(config: u32, out: u32) -> bool;
        fn can_implement(config: u32, out: u32, args: &LaunchArgs) -> bool;
        fn workspace_size(config: u32, out: u32, args: &LaunchArgs) -> usize;
        /// # Safety
        /// Every pointer in `args` must be valid for the problem on the stream's device.
        unsafe fn launch(config: u32, out: u32, args: &LaunchArgs) -> LaunchStatus;
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
