// The SM90 GEMM kernel: wires the parts together. One CTA per (output tile, K range) of the tile
// scheduler; warp roles and the main loop come from the tile's schedule, then the split-K
// reduction and the epilogue of the output type.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "common/instrument.cuh"
#include "common/ptx.cuh"
#include "sm90/dispatch_policy.cuh"
#include "sm90/epilogue.cuh"
#include "sm90/epilogue_fp4.cuh"
#include "sm90/mainloop_smem_decode.cuh"
#include "sm90/mainloop_swapped.cuh"
#include "sm90/raw_pipeline.cuh"
#include "sm90/split_k.cuh"
#include "sm90/tile_scheduler.cuh"

namespace bsg::sm90 {

// Reduce: ReduceGlobal (also for split_k = 1) or ReduceCluster, separate instantiations so
// neither carries the other's code.
template <class T, class OutT, class Reduce>
__global__ void __launch_bounds__(T::kLaunchThreads, T::kMinBlocks)
    gemm_kernel(const __grid_constant__ Params p, const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b) {
  using Mainloop = CollectiveMainloop<T>;
  uint8_t* smem = aligned_smem();
  half_t* decA = reinterpret_cast<half_t*>(smem);
  half_t* decB = reinterpret_cast<half_t*>(smem + T::kDecA);
  uint8_t* raw = smem + T::kDecA + T::kDecB;
  const int tid = threadIdx.x;
  stamp(0);

  const TileWork w = TileScheduler<T>::work(p);
  const RawPipeline<T> pipe = start_pipeline<T>(p, w, raw, decA, &map_a, &map_b, tid);
  if constexpr (Mainloop::kProducerWarpgroup) {
    // Exited threads do not hold up later CTA or cluster barriers.
    if (tid >= kThreads) {
      Mainloop::produce(pipe, w, tid, p.weights_early ? kL2PrefetchStages<Reduce> : -1);
      return;
    }
    Mainloop::consumer_start();
  } else if (tid == 0) {
    Mainloop::prologue(pipe, w);
  }

  typename T::TiledMma mma;
  Tensor acc = partition_fragment_C(mma, typename T::MmaShape{});
  clear(acc);
  if constexpr (Mainloop::kProducerWarpgroup) Mainloop::run(pipe, w, raw, decA, mma, acc, tid);
  else Mainloop::run(pipe, w, raw, decA, decB, mma, acc, tid);

  stamp(2);
  // The next kernel, if launched programmatically (the next call's pre-pass), may be scheduled.
  griddep_launch_dependents();
  if constexpr (std::is_same_v<Reduce, ReduceGlobal> && (BSG_SM90_ABLATE & 8) == 0) {
    if (p.split_k > 1 && !SplitKGlobal<T>::reduce(p, w, acc, tid)) return;
  }
  float* tile_s = EpilogueTile<T>::stage(mma, acc, smem, tid);
  Epilogue<T, OutT, Reduce>::run(p, w, tile_s, tid);
  stamp(3);
}

}  // namespace bsg::sm90
