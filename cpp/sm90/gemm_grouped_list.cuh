// SM90 grouped host adapter, list form (GroupedListArgs): checks, workspace, the descriptor
// templates, and the two launches: the list prologue (the groups' descriptors made on the device,
// and for the swapped tiles their activations decoded), then the grouped kernel of the tile over
// the list scheduler. Nothing of the groups is read on the host, so a call can be captured.
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>

#include "blockscaled_gemm/kernel_abi.h"
#include "common/launch.h"
#include "sm90/gemm.cuh"
#include "sm90/kernel_grouped.cuh"
#include "sm90/tile_scheduler_list.cuh"

namespace bsg::sm90 {

template <class T, class OutT>
struct GroupedListGemm {
  using Sched = ListTileScheduler<T>;
  static constexpr auto kKernel = grouped_kernel<T, OutT, Sched>;
  static constexpr bool kFp4Out = !std::is_void_v<typename OutputInfo<OutT>::Sf>;

  static size_t workspace_size(const GroupedListArgs& a) { return Sched::workspace_size(a); }

  static bool can_implement(const GroupedListArgs& a) {
    if (a.groups < 1 || a.groups > Sched::kMaxGroups || a.max_m < 0 || a.max_n < 1 || a.max_k < 32 || a.max_k % 32 != 0) return false;
    // The device rounds sizes up to tile multiples in int: the dense GEMM's extent limit.
    if (a.max_m > BSG_MAX_EXTENT || a.max_n > BSG_MAX_EXTENT || a.max_k > BSG_MAX_EXTENT) return false;
    if (a.max_rows < 0 || a.max_rows > INT_MAX) return false;
    if (!is_weight_layout(a.b_layout)) return false;
    if (!a.problems || !a.a || !a.sfa || !a.b || !a.sfb || !a.d || (a.beta != 0.f && !a.c)) return false;
    if (kFp4Out && (a.sfd == 0 || !fp4_norm_constant_ok(a.norm_constant))) return false;
    // The descriptors are written past the split-K counters (256 KiB): they need 64-byte
    // alignment (cudaMalloc gives 256).
    if (a.workspace % 128 != 0) return false;
    return Sched::max_items(a) <= INT_MAX;
  }

  // Every check comes before the first launch, so a refused call leaves memory as it was.
  static KernelStatus run(const GroupedListArgs& a) {
    if (!can_implement(a)) return {BSG_STATUS_INVALID_PROBLEM, 0, 0};
    if (workspace_size(a) > a.workspace_bytes) return {BSG_STATUS_WORKSPACE_NULL, 0, uint64_t(workspace_size(a))};
    // No group can have a tile (max_m 0): nothing to launch.
    if (Sched::max_items(a) == 0) return {int32_t(cutlass::Status::kSuccess), 0, 0};
    const auto kernel = kKernel;
    const auto prologue = list_prologue<T>;
    const auto stream = reinterpret_cast<cudaStream_t>(a.stream);
    static SmemLimitOnce smem_limit;
    if (const cudaError_t e = smem_limit.ensure(a.device_id, [kernel, prologue] {
          cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, grouped_smem<T, Sched>());
          return e == cudaSuccess ? reserve_pre_pass_smem(prologue) : e;
        });
        e != cudaSuccess)
      return {int32_t(cutlass::Status::kErrorInternal), int32_t(e), 0};
    uint8_t* const ws = reinterpret_cast<uint8_t*>(a.workspace);
    ListParams lp{};
    lp.problems = reinterpret_cast<const int32_t*>(a.problems);
    lp.a = reinterpret_cast<const uint64_t*>(a.a);
    lp.sfa = reinterpret_cast<const uint64_t*>(a.sfa);
    lp.b = reinterpret_cast<const uint64_t*>(a.b);
    lp.sfb = reinterpret_cast<const uint64_t*>(a.sfb);
    lp.c = a.beta != 0.f ? reinterpret_cast<const uint64_t*>(a.c) : nullptr;
    lp.d = reinterpret_cast<const uint64_t*>(a.d);
    lp.sfd = kFp4Out ? reinterpret_cast<const uint64_t*>(a.sfd) : nullptr;
    lp.alphas = reinterpret_cast<const float*>(a.alphas);
    lp.alpha = a.alpha, lp.beta = a.beta, lp.norm_constant = kFp4Out ? a.norm_constant : 0.f;
    lp.groups = a.groups, lp.max_m = a.max_m, lp.max_n = a.max_n, lp.max_k = a.max_k;
    lp.n_multiple = OutputInfo<OutT>::kNMultiple;
    lp.max_rows = a.max_rows;
    lp.maps = reinterpret_cast<CUtensorMap*>(ws + Sched::maps_offset(a));
    lp.walk = T::kPreA ? reinterpret_cast<ListWalk*>(ws + Sched::walk_offset(a)) : nullptr;
    lp.pre = T::kPreA ? ws + Sched::pre_offset(a) : nullptr;
    lp.pre_pitch = Sched::k_pad(a) * 2;
    lp.b_chunked = a.b_layout == int32_t(WeightLayout::Prepacked);
    // Templates: the element type, box and swizzle of each operand as the tile reads it, over
    // placeholder sizes (the prologue replaces address, sizes and row stride per group).
    using G = Gemm<T, OutT>;
    CUtensorMap tmpl_a, tmpl_b;
    if (!G::encode_a(&tmpl_a, ws, ws, a.max_k, T::kBM, 1) || !G::encode_b(&tmpl_b, ws, a.max_k, T::kBN, 1, T::kBN, lp.b_chunked))
      return {int32_t(cutlass::Status::kErrorInternal), 0, 0};
    const int64_t items = T::kPreA ? std::max<int64_t>(a.groups, a.max_rows * (Sched::k_pad(a) / kBK) * 2) : a.groups;
    if (const cudaError_t e = launch_pre_pass<list_prologue<T>>(items, a.sm_count, stream, lp, tmpl_a, tmpl_b); e != cudaSuccess)
      return {int32_t(cutlass::Status::kErrorInternal), int32_t(e), 0};
    // For the items the bounds allow.
    const int64_t grid = grouped_grid<T>(Sched::max_items(a), a.sm_count);
    const KernelLaunch launch(dim3(unsigned(grid)), grouped_threads<T, Sched>(), 1, grouped_smem<T, Sched>(), stream, true);
    const cudaError_t e = launch_kernel<kKernel>(launch, typename Sched::Args{lp});
    return {int32_t(e == cudaSuccess ? cutlass::Status::kSuccess : cutlass::Status::kErrorInternal), int32_t(e), 0};
  }

  static GroupedListEntry entry() { return GroupedListEntry{&run, &can_implement, &workspace_size, nullptr}; }
};

}  // namespace bsg::sm90

#define BSG_SM90_GROUPED_LIST_KERNEL(fn, tm, tn, out_type, schedule)                                                                     \
  bsg::GroupedListEntry fn() {                                                                                                          \
    return bsg::sm90::GroupedListGemm<bsg::sm90::Tile<tm, tn, bsg::sm90::schedule>, typename bsg::sm90::OutType<out_type>::type>::entry(); \
  }
