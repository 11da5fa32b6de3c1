// SM90 grouped host adapter: checks, TMA descriptors and the one launch of the grouped
// (mixture-of-experts) kernel of a stream tile, and the entry the generated translation units
// export (cpp/configs.def's BSG_GROUPED lines).
#pragma once

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>

#include "blockscaled_gemm/kernel_abi.h"
#include "common/launch.h"
#include "sm90/gemm.cuh"
#include "sm90/kernel_grouped.cuh"
#include "sm90/tile_scheduler_grouped.cuh"

namespace bsg::sm90 {

template <class T, class OutT>
struct GroupedGemm {
  using Sched = GroupedTileScheduler<T>;
  static_assert(std::is_void_v<typename OutputInfo<OutT>::Sf>, "grouped: f16, bf16 and f32 outputs");

  static bool can_implement(const GroupedArgs& a) {
    if (a.rows < 1 || a.n < 1 || a.k < 1 || a.k % 32 != 0 || a.experts < 1 || a.experts > Sched::kMaxGroups) return false;
    if (a.n % OutputInfo<OutT>::kNMultiple != 0) return false;
    // Items and padded scale rows are int on the device.
    return Sched::max_items(a) <= INT_MAX && int64_t(a.rows) + 127 * int64_t(a.experts) <= INT_MAX;
  }

  // Every check comes before the launch, so a refused call leaves memory as it was.
  static KernelStatus run(const GroupedArgs& a) {
    if (!can_implement(a)) return {BSG_STATUS_INVALID_PROBLEM, 0, 0};
    const auto kernel = &grouped_stream_kernel<T, OutT>;
    static std::atomic<uint64_t> configured{0};  // devices whose shared-memory limit is raised
    const uint64_t bit = uint64_t(1) << (a.device_id & 63);
    if (!(configured.load() & bit)) {
      if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmem); e != cudaSuccess)
        return {int32_t(cutlass::Status::kErrorInternal), int32_t(e), 0};
      configured.fetch_or(bit);
    }
    CUtensorMap map_a, map_b;
    using G = Gemm<T, OutT>;
    if (!G::encode(&map_a, reinterpret_cast<const void*>(a.a), a.k / 2, a.rows, 1, T::kBM) ||
        !G::encode(&map_b, reinterpret_cast<const void*>(a.b), a.k / 2, a.n, a.experts, T::kBN))
      return {int32_t(cutlass::Status::kErrorInternal), 0, 0};
    GroupedParams gp{};
    gp.base = Params{a.rows, a.n, a.k, 1, 1,
                     reinterpret_cast<const uint8_t*>(a.a), reinterpret_cast<const uint8_t*>(a.sfa),
                     reinterpret_cast<const uint8_t*>(a.b), reinterpret_cast<const uint8_t*>(a.sfb),
                     reinterpret_cast<const void*>(a.d), reinterpret_cast<void*>(a.d), a.alpha, 0.f,
                     nullptr, nullptr, nullptr, 0.f};
    gp.offsets = reinterpret_cast<const int32_t*>(a.offsets);
    gp.expert_alpha = reinterpret_cast<const float*>(a.expert_alpha);
    gp.experts = a.experts;
    // One persistent CTA per SM (the stream tiles' shared memory holds one), fewer where even the
    // largest routing has fewer items.
    const int64_t grid = std::max<int64_t>(1, std::min<int64_t>(a.sm_count, Sched::max_items(a)));
    const KernelLaunch launch(dim3(unsigned(grid)), T::kLaunchThreads, 1, T::kSmem, reinterpret_cast<cudaStream_t>(a.stream), true);
    const cudaError_t e = cudaLaunchKernelEx(&launch.cfg, kernel, gp, map_a, map_b);
    return {int32_t(e == cudaSuccess ? cutlass::Status::kSuccess : cutlass::Status::kErrorInternal), int32_t(e), 0};
  }

  static GroupedEntry entry() { return GroupedEntry{&run, &can_implement}; }
};

}  // namespace bsg::sm90

#define BSG_SM90_GROUPED_KERNEL(fn, tm, tn, out_type, schedule)                                                                       \
  bsg::GroupedEntry fn() {                                                                                                              \
    return bsg::sm90::GroupedGemm<bsg::sm90::Tile<tm, tn, bsg::sm90::schedule>, typename bsg::sm90::OutType<out_type>::type>::entry(); \
  }
