// SM90 grouped host adapter: checks, workspace, TMA descriptors and the launch of the grouped
// (mixture-of-experts) kernel of a stream tile (one persistent launch) or a swapped tile (the
// pre-pass, then one CTA per possible item), and the entry the generated translation units
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
  // W4A16: a is (T, K) 16-bit, sfa unused; the swapped tiles' pre-pass is the dense re-order over
  // all T rows (reorder_a_grouped: no scales to place).
  static constexpr bool kDenseA = !T::Activation::kScaled;
  static constexpr auto kKernel = grouped_kernel<T, OutT, Sched>;

  // The dense layout of the workspace (TileScheduler: decoded activations past the split-K
  // counters, which stay zero for the dense calls) for T rows at split 1.
  static KernelArgs dense_view(const GroupedArgs& a) {
    KernelArgs k{};
    k.m = a.rows, k.n = a.n, k.k = a.k, k.l = 1, k.split_k = 1;
    return k;
  }
  // The swapped tiles: their pre-pass stores the walk over the experts past the decoded (or
  // re-ordered) activations.
  static size_t walk_offset(const GroupedArgs& a) { return (TileScheduler<T>::workspace_size(dense_view(a), a.rows) + 255) / 256 * 256; }
  static size_t workspace_size(const GroupedArgs& a) { return T::kPreA ? walk_offset(a) + GroupedWalk::bytes(a.experts) : 0; }
  static constexpr bool kFp4Out = !std::is_void_v<typename OutputInfo<OutT>::Sf>;

  static bool can_implement(const GroupedArgs& a) {
    if (a.rows < 1 || a.n < 1 || a.k < 1 || a.k % 32 != 0 || a.experts < 1 || a.experts > Sched::kMaxGroups) return false;
    if (a.rows > BSG_MAX_EXTENT || a.n > BSG_MAX_EXTENT || a.k > BSG_MAX_EXTENT) return false;
    if (!is_weight_layout(a.b_layout) || (a.zero_uncovered != 0 && a.zero_uncovered != 1)) return false;
    if (a.n % OutputInfo<OutT>::kNMultiple != 0) return false;
    if (kFp4Out && (a.sfd == 0 || !fp4_norm_constant_ok(a.norm_constant))) return false;
    // Items (the swapped tiles' grid: every possible one) and padded scale rows are int on the
    // device.
    return Sched::max_items(a) <= INT_MAX && int64_t(a.rows) + 127 * int64_t(a.experts) <= INT_MAX;
  }

  // Every check comes before the launch, so a refused call leaves memory as it was.
  static KernelStatus run(const GroupedArgs& a) {
    if (!can_implement(a)) return {BSG_STATUS_INVALID_PROBLEM, 0, 0};
    if (workspace_size(a) > a.workspace_bytes) return {BSG_STATUS_WORKSPACE_NULL, 0, uint64_t(workspace_size(a))};
    const auto kernel = kKernel;
    const auto stream = reinterpret_cast<cudaStream_t>(a.stream);
    static SmemLimitOnce smem_limit;
    if (const cudaError_t e = smem_limit.ensure(a.device_id, [kernel] {
          cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, grouped_smem<T, Sched>());
          if constexpr (T::kPreA) {
            if (e == cudaSuccess) e = kDenseA ? reserve_pre_pass_smem(reorder_a_grouped<T>) : reserve_pre_pass_smem(predecode_a_grouped<T>);
          }
          return e;
        });
        e != cudaSuccess)
      return {int32_t(cutlass::Status::kErrorInternal), int32_t(e), 0};
    uint8_t* const pre = reinterpret_cast<uint8_t*>(a.workspace) + (T::kPreA ? TileScheduler<T>::pre_a_offset(dense_view(a)) : 0);
    const int64_t k_pad = TileScheduler<T>::k_pad(dense_view(a));
    typename Sched::Args args{};
    using G = Gemm<T, OutT>;
    if (!G::encode_a(&args.map_a, reinterpret_cast<const void*>(a.a), pre, a.k, a.rows, 1) ||
        !G::encode_b(&args.map_b, reinterpret_cast<const void*>(a.b), a.k, a.n, a.experts, T::kBN, a.b_layout == int32_t(WeightLayout::Prepacked)))
      return {int32_t(cutlass::Status::kErrorInternal), 0, 0};
    GroupedParams& gp = args.gp;
    gp.base = Params{a.rows, a.n, a.k, 1, 1,
                     reinterpret_cast<const uint8_t*>(a.a), reinterpret_cast<const uint8_t*>(a.sfa),
                     reinterpret_cast<const uint8_t*>(a.b), reinterpret_cast<const uint8_t*>(a.sfb),
                     reinterpret_cast<const void*>(a.d), reinterpret_cast<void*>(a.d), a.alpha, 0.f,
                     nullptr, nullptr, kFp4Out ? reinterpret_cast<uint8_t*>(a.sfd) : nullptr, a.norm_constant,
                     a.b_layout == int32_t(WeightLayout::Prepacked)};
    gp.offsets = reinterpret_cast<const int32_t*>(a.offsets);
    gp.expert_alpha = reinterpret_cast<const float*>(a.expert_alpha);
    gp.experts = a.experts;
    // Rows of D in 16-byte units (every row is a whole number of them: OutputInfo::kNMultiple).
    gp.d_row_units = a.zero_uncovered ? (kFp4Out ? int64_t(a.n) / 2 : int64_t(a.n) * int64_t(sizeof(OutT))) / 16 : 0;
    gp.walk = T::kPreA ? reinterpret_cast<GroupedWalk*>(reinterpret_cast<uint8_t*>(a.workspace) + walk_offset(a)) : nullptr;
    if constexpr (T::kPreA) {
      const cudaError_t e = kDenseA ? launch_pre_pass<reorder_a_grouped<T>>(int64_t(a.rows) * (k_pad / kBK) * 8, a.sm_count, stream, gp,
                                                                            static_cast<const uint16_t*>(reinterpret_cast<const void*>(a.a)),
                                                                            reinterpret_cast<uint4*>(pre))
                                    : launch_pre_pass<predecode_a_grouped<T>>(int64_t(a.rows) * (k_pad / kBK) * 2, a.sm_count, stream, gp,
                                                      reinterpret_cast<uint4*>(pre));
      if (e != cudaSuccess) return {int32_t(cutlass::Status::kErrorInternal), int32_t(e), 0};
    }
    // For the items of any routing.
    const int64_t grid = grouped_grid<T>(Sched::max_items(a), a.sm_count);
    const KernelLaunch launch(dim3(unsigned(grid)), grouped_threads<T, Sched>(), 1, grouped_smem<T, Sched>(), stream, true);
    const cudaError_t e = launch_kernel<kKernel>(launch, args);
    return {int32_t(e == cudaSuccess ? cutlass::Status::kSuccess : cutlass::Status::kErrorInternal), int32_t(e), 0};
  }

  static GroupedEntry entry() { return GroupedEntry{&run, &can_implement, &workspace_size, nullptr}; }
};

}  // namespace bsg::sm90

// W4A16 (cpp/configs.def's BSG_W4A16 configs that BSG_GROUPED lists too): dense activations of
// type act_type.
#define BSG_SM90_GROUPED_W4A16_KERNEL(fn, tm, tn, out_type, schedule, act_type)                                         \
  bsg::GroupedEntry fn() {                                                                                              \
    return bsg::sm90::GroupedGemm<bsg::sm90::Tile<tm, tn, bsg::sm90::schedule, bsg::sm90::ActDense<act_type>>,            \
                                  typename bsg::sm90::OutType<out_type>::type>::entry();                                \
  }

#define BSG_SM90_GROUPED_KERNEL(fn, tm, tn, out_type, schedule)                                                                       \
  bsg::GroupedEntry fn() {                                                                                                              \
    return bsg::sm90::GroupedGemm<bsg::sm90::Tile<tm, tn, bsg::sm90::schedule>, typename bsg::sm90::OutType<out_type>::type>::entry(); \
  }
