//! The unsafe bottom layer: the launch ABI as bindgen generates it from
//! `include/blockscaled_gemm/kernel_abi.h` (the one declaration of the launch arguments, status,
//! output and operand kinds and shared limits), and the cxx bridge to the C++ shim, which takes
//! those structs as trivial extern types. Only the layers above (`gemm`, `cutlass_host`) call
//! into it, after validating every argument.

#[allow(dead_code, non_camel_case_types, non_upper_case_globals, non_snake_case, clippy::all)]
mod abi {
    include!(concat!(env!("OUT_DIR"), "/kernel_abi.rs"));
}
mod bridge;

pub(crate) use abi::root::bsg::{GroupedArgs, GroupedListArgs, InKind, KernelArgs, KernelStatus, OutKind, QuantTransform, QuantizeArgs};
pub(crate) use bridge::ffi::*;

/// Split-K through a thread-block cluster: at most this many K ranges (the portable cluster size).
pub(crate) const SM90_MAX_CLUSTER_SPLIT: u32 = abi::root::BSG_SM90_MAX_CLUSTER_SPLIT;
/// Output tiles of an SM90 launch whose split-K goes through global memory.
pub(crate) const SM90_MAX_SPLIT_TILES: usize = abi::root::BSG_SM90_MAX_SPLIT_TILES as usize;
/// `KernelStatus::cutlass_status` values (`cutlass::Status`, and -1 for a kernel not in the build).
pub(crate) const STATUS_NOT_BUILT: i32 = abi::root::BSG_STATUS_NOT_BUILT;
pub(crate) const STATUS_INVALID_PROBLEM: i32 = abi::root::BSG_STATUS_INVALID_PROBLEM as i32;
pub(crate) const STATUS_WORKSPACE_NULL: i32 = abi::root::BSG_STATUS_WORKSPACE_NULL as i32;
/// Bytes of K of one chunk of the prepacked weight layout.
pub(crate) const PREPACK_CHUNK_BYTES: usize = abi::root::BSG_PREPACK_CHUNK_BYTES as usize;
/// Experts of one grouped launch.
pub(crate) const MAX_GROUPS: u32 = abi::root::BSG_MAX_GROUPS;
/// K ranges of one SM90 launch.
pub(crate) const SM90_MAX_SPLIT_K: u32 = abi::root::BSG_SM90_MAX_SPLIT_K;
/// The largest M, N or K of any launch (sizes rounded up to tiles stay in an i32).
pub(crate) const MAX_EXTENT: usize = abi::root::BSG_MAX_EXTENT as usize;
/// The quantizer's largest row count (its row loop counts in an i32) and batch (grid.z).
pub(crate) const QUANT_MAX_ROWS: usize = abi::root::BSG_QUANT_MAX_ROWS as usize;
pub(crate) const QUANT_MAX_BATCH: usize = abi::root::BSG_QUANT_MAX_BATCH as usize;

// The ABI structs cxx passes by value (`bsg::` in C++).
macro_rules! trivial_extern {
    ($($ty:ident = $cxx:literal),* $(,)?) => {$(
        // SAFETY: a plain C struct of integers and floats (bindgen's layout tests hold it to the
        // C++ layout), so moving it by value across cxx is sound.
        unsafe impl cxx::ExternType for $ty {
            type Id = cxx::type_id!($cxx);
            type Kind = cxx::kind::Trivial;
        }
    )*};
}
trivial_extern!(KernelArgs = "bsg::KernelArgs", QuantizeArgs = "bsg::QuantizeArgs", GroupedArgs = "bsg::GroupedArgs", GroupedListArgs = "bsg::GroupedListArgs", KernelStatus = "bsg::KernelStatus");
