// Host side: a kernel launch configuration with the attributes the SM90 kernels use.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <utility>

namespace bsg {

// Raises kernels' dynamic shared-memory limit (cudaFuncSetAttribute) once per CUDA context: the
// attribute lives in the context, so a primary-context reset drops it and the next launch would
// fail. Remembers, per device ordinal, the unique ID of the context it configured (cuCtxGetId,
// through the runtime's driver entry points: nothing links libcuda); where the ID cannot be had it
// sets the attributes on every call. One object per set of kernels (a function-local static).
class SmemLimitOnce {
 public:
  // `set` applies the attributes in the current context and returns the first error.
  template <class Set>
  cudaError_t ensure(int device, Set set) {
    unsigned long long id = 0;
    const bool known = context_id(id);
    std::atomic<unsigned long long>& slot = done_[device & 63];
    if (known && slot.load(std::memory_order_acquire) == id + 1) return cudaSuccess;
    const cudaError_t e = set();
    if (e == cudaSuccess && known) slot.store(id + 1, std::memory_order_release);
    return e;
  }

 private:
  static bool context_id(unsigned long long& id) {
    using GetCurrent = CUresult (*)(CUcontext*);
    using GetId = CUresult (*)(CUcontext, unsigned long long*);
    static const auto fns = [] {
      void* cur = nullptr;
      void* gid = nullptr;
      cudaDriverEntryPointQueryResult q1, q2;
      const bool ok = cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &cur, 4000, cudaEnableDefault, &q1) == cudaSuccess &&
                      q1 == cudaDriverEntryPointSuccess &&
                      cudaGetDriverEntryPointByVersion("cuCtxGetId", &gid, 12000, cudaEnableDefault, &q2) == cudaSuccess &&
                      q2 == cudaDriverEntryPointSuccess;
      return ok ? std::pair<GetCurrent, GetId>(reinterpret_cast<GetCurrent>(cur), reinterpret_cast<GetId>(gid))
                : std::pair<GetCurrent, GetId>(nullptr, nullptr);
    }();
    CUcontext ctx = nullptr;
    return fns.first && fns.first(&ctx) == CUDA_SUCCESS && ctx && fns.second(ctx, &id) == CUDA_SUCCESS;
  }

  std::atomic<unsigned long long> done_[64] = {};
};

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
