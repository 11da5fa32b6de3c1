// Host side: a kernel launch configuration with the attributes the SM90 kernels use.
#pragma once

#include <cuda_runtime_api.h>

namespace bsg {

// The grid with, for cluster_y > 1, clusters of cluster_y CTAs along y; with `pdl` the kernel may
// be scheduled while the stream's previous kernel still runs (once that one's CTAs have all
// passed griddepcontrol.launch_dependents) and waits for it at griddepcontrol.wait.
// Not copyable: cfg points at attr.
struct KernelLaunch {
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[2];
  KernelLaunch(dim3 grid, int threads, int cluster_y, size_t smem, cudaStream_t stream, bool pdl = false) {
    cfg.gridDim = grid;
    cfg.blockDim = dim3(unsigned(threads));
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    if (cluster_y > 1) {
      attr[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
      attr[cfg.numAttrs].val.clusterDim.x = 1;
      attr[cfg.numAttrs].val.clusterDim.y = unsigned(cluster_y);
      attr[cfg.numAttrs].val.clusterDim.z = 1;
      ++cfg.numAttrs;
    }
    if (pdl) {
      attr[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[cfg.numAttrs].val.programmaticStreamSerializationAllowed = 1;
      ++cfg.numAttrs;
    }
  }
  KernelLaunch(const KernelLaunch&) = delete;
  KernelLaunch& operator=(const KernelLaunch&) = delete;
};

}  // namespace bsg
