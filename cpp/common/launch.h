// Host side: a kernel launch configuration with the attributes the SM90 kernels use.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstring>
#include <tuple>
#include <type_traits>
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

namespace detail {
using LaunchKernelEx = CUresult (*)(const CUlaunchConfig*, CUfunction, void**, void**);

// The driver's cuLaunchKernelEx through the runtime's entry points (nothing links libcuda);
// null where the driver has none.
inline LaunchKernelEx driver_launch() {
  static const LaunchKernelEx fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q;
    const bool ok = cudaGetDriverEntryPointByVersion("cuLaunchKernelEx", &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
                    q == cudaDriverEntryPointSuccess;
    return ok ? reinterpret_cast<LaunchKernelEx>(p) : nullptr;
  }();
  return fn;
}

template <class... Params, class... Args>
cudaError_t launch_driver(LaunchKernelEx drv, cudaKernel_t handle, const KernelLaunch& l, void (*)(Params...), Args&&... args) {
  // The arguments converted to the kernel's parameter types, as cudaLaunchKernelEx does.
  std::tuple<std::remove_cv_t<std::remove_reference_t<Params>>...> vals(std::forward<Args>(args)...);
  void* ptrs[sizeof...(Params) > 0 ? sizeof...(Params) : 1];
  std::apply([&ptrs](auto&... v) {
    int i = 0;
    ((ptrs[i++] = static_cast<void*>(&v)), ...);
  }, vals);
  CUlaunchConfig cfg{};
  cfg.gridDimX = l.cfg.gridDim.x;
  cfg.gridDimY = l.cfg.gridDim.y;
  cfg.gridDimZ = l.cfg.gridDim.z;
  cfg.blockDimX = l.cfg.blockDim.x;
  cfg.blockDimY = l.cfg.blockDim.y;
  cfg.blockDimZ = l.cfg.blockDim.z;
  cfg.sharedMemBytes = unsigned(l.cfg.dynamicSmemBytes);
  cfg.hStream = static_cast<CUstream>(l.cfg.stream);
  // The runtime's launch attributes are the driver's under other names: the same ids and a
  // 64-byte value union of the same layout.
  static_assert(int(cudaLaunchAttributeClusterDimension) == int(CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) &&
                    int(cudaLaunchAttributeProgrammaticStreamSerialization) == int(CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION),
                "runtime and driver launch attribute ids");
  static_assert(sizeof(cudaLaunchAttributeValue) == sizeof(CUlaunchAttributeValue), "runtime and driver launch attribute values");
  constexpr unsigned kMaxAttrs = sizeof(KernelLaunch::attr) / sizeof(KernelLaunch::attr[0]);
  CUlaunchAttribute attr[kMaxAttrs];
  if (l.cfg.numAttrs > kMaxAttrs) return cudaErrorInvalidValue;
  for (unsigned i = 0; i < l.cfg.numAttrs; ++i) {
    attr[i].id = static_cast<CUlaunchAttributeID>(l.cfg.attrs[i].id);
    std::memcpy(&attr[i].value, &l.cfg.attrs[i].val, sizeof(attr[i].value));
  }
  cfg.attrs = attr;
  cfg.numAttrs = l.cfg.numAttrs;
  // The runtime's error codes equal the driver's for every code a launch returns but
  // CUDA_ERROR_KEY_ROTATION (916), which the runtime has no name for.
  return static_cast<cudaError_t>(drv(&cfg, reinterpret_cast<CUfunction>(handle), ptrs, nullptr));
}
}  // namespace detail

// Launches `Kernel` with the configuration `l`. Through the driver's cuLaunchKernelEx with the
// kernel's context-independent handle (launched in the stream's context, which the caller has
// made current and where the adapters set its shared-memory limit), which costs the host less
// than cudaLaunchKernelEx (bench/DESIGN.md §9); through cudaLaunchKernelEx where the driver entry
// point or the handle cannot be had. The same kernel either way.
template <auto Kernel, class... Args>
cudaError_t launch_kernel(const KernelLaunch& l, Args&&... args) {
  static const cudaKernel_t handle = [] {
    cudaKernel_t k = nullptr;
    return cudaGetKernel(&k, Kernel) == cudaSuccess ? k : nullptr;
  }();
  const detail::LaunchKernelEx drv = detail::driver_launch();
  if (drv && handle) return detail::launch_driver(drv, handle, l, Kernel, std::forward<Args>(args)...);
  return cudaLaunchKernelEx(&l.cfg, Kernel, std::forward<Args>(args)...);
}

}  // namespace bsg
