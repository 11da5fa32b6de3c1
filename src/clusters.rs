//! How many thread-block clusters a Hopper GPU runs at once, asked of the driver: the SM90
//! swapped and small-M kernels ([`crate::ConfigInfo::cluster_reduces`]) reduce small splits
//! through one cluster per output tile, and clusters beyond this count would wait for a second
//! wave (H100 SXM: 66 clusters of 2, 39 of
//! 3, 30 of 4, 22 of 5, 17 of 6, 15 of 7, 15 of 8; 132 SMs).
//!
//! The driver answers for a function and a launch configuration; the answer depends only on the
//! cluster size and the blocks an SM holds, so a one-instruction kernel (PTX, loaded by the
//! driver) with more than half an SM's shared memory stands in for the GEMM kernels, which also
//! run one block per SM.

use crate::dispatch::{ClusterCounts, SM90_MAX_CLUSTER_SPLIT};
use cudarc::driver::sys::{self, CUdevice_attribute as Attr};
use cudarc::driver::{CudaContext, DriverError};
use std::ffi::CString;
use std::sync::{Arc, Mutex};

const PROBE: &str = ".version 7.8\n.target sm_90\n.address_size 64\n.visible .entry bsg_cluster_probe() { ret; }\n";

/// Clusters of 2 to `SM90_MAX_CLUSTER_SPLIT` blocks of one block per SM that `ctx`'s device runs
/// at once, asked of the driver once per device and process. Needs compute capability 9.0 or
/// later.
pub(crate) fn max_clusters(ctx: &Arc<CudaContext>) -> Result<ClusterCounts, DriverError> {
    static KNOWN: Mutex<Vec<(usize, ClusterCounts)>> = Mutex::new(Vec::new());
    let ordinal = ctx.ordinal();
    if let Some(&(_, known)) = KNOWN.lock().unwrap_or_else(|e| e.into_inner()).iter().find(|(o, _)| *o == ordinal) {
        return Ok(known);
    }
    let answer = probe(ctx)?;
    KNOWN.lock().unwrap_or_else(|e| e.into_inner()).push((ordinal, answer));
    Ok(answer)
}

fn probe(ctx: &Arc<CudaContext>) -> Result<ClusterCounts, DriverError> {
    ctx.bind_to_thread()?;
    let smem = (ctx.attribute(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)? / 2 + 1)
        .min(ctx.attribute(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?);
    let src = CString::new(PROBE).expect("no NUL in the PTX");
    let mut module = std::ptr::null_mut();
    // SAFETY: a NUL-terminated PTX image and an out-pointer; the context is current.
    unsafe { sys::cuModuleLoadData(&mut module, src.as_ptr().cast()) }.result()?;
    let answer = (|| {
        let mut func = std::ptr::null_mut();
        let name = CString::new("bsg_cluster_probe").expect("no NUL in the name");
        // SAFETY: a loaded module, a NUL-terminated name, an out-pointer.
        unsafe { sys::cuModuleGetFunction(&mut func, module, name.as_ptr()) }.result()?;
        // SAFETY: a valid function handle; the size is within the device's opt-in limit.
        unsafe { sys::cuFuncSetAttribute(func, sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem) }.result()?;
        let mut out: ClusterCounts = [0; SM90_MAX_CLUSTER_SPLIT as usize - 1];
        for (i, size) in (2u32..=SM90_MAX_CLUSTER_SPLIT).enumerate() {
            // SAFETY: zero is a valid bit pattern for this plain C union.
            let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
            attr.value.clusterDim.x = 1;
            attr.value.clusterDim.y = size;
            attr.value.clusterDim.z = 1;
            let config = sys::CUlaunchConfig {
                gridDimX: 1,
                gridDimY: size,
                gridDimZ: 1,
                blockDimX: 256,
                blockDimY: 1,
                blockDimZ: 1,
                sharedMemBytes: smem as u32,
                hStream: std::ptr::null_mut(),
                attrs: &mut attr,
                numAttrs: 1,
            };
            let mut n = 0;
            // SAFETY: valid function and configuration, an out-pointer.
            unsafe { sys::cuOccupancyMaxActiveClusters(&mut n, func, &config) }.result()?;
            out[i] = n.max(0) as usize;
        }
        Ok(out)
    })();
    // SAFETY: the module loaded above; nothing of it is used after this.
    let unloaded = unsafe { sys::cuModuleUnload(module) }.result();
    let out = answer?;
    unloaded?;
    Ok(out)
}
