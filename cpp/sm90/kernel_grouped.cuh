// The SM90 grouped (mixture-of-experts) kernel: the small-M parts of kernel_stream.cuh (producer
// warp, stream main loop, warp-row sum, epilogue) run once per work item of the grouped tile
// scheduler, by persistent CTAs. Each item covers an expert's whole K range (no split-K), so no
// reduction runs and the tile's sums are the per-group GEMM's own.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/ptx.cuh"
#include "cutlass/arch/barrier.h"
#include "sm90/dispatch_policy.cuh"
#include "sm90/epilogue.cuh"
#include "sm90/kernel_stream.cuh"
#include "sm90/mainloop_stream.cuh"
#include "sm90/raw_pipeline.cuh"
#include "sm90/tile_scheduler_grouped.cuh"

namespace bsg::sm90 {

template <class T, class OutT>
__global__ void __launch_bounds__(T::kLaunchThreads, 1)
    grouped_stream_kernel(const __grid_constant__ GroupedParams gp, const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b) {
  using Mainloop = CollectiveMainloop<T>;
  using Sched = GroupedTileScheduler<T>;
  __shared__ typename Sched::Shared sched;
  uint8_t* smem = aligned_smem();
  const int tid = threadIdx.x;
  // The offsets, like every operand, may be the previous kernel's output.
  griddep_wait();
  Sched::prepare(gp, sched, tid);
  for (int item = blockIdx.x; item < sched.total; item += gridDim.x) {
    const TileWork w = Sched::work(gp, sched, item);
    // Barriers initialized afresh for each item: the last item's are all completed and no
    // thread waits on them any more (the CTA barrier at the end of the loop).
    const RawPipeline<T> pipe = start_pipeline<T>(gp.base, w, smem, smem, &map_a, &map_b, tid);
    if (tid >= kThreads) {
      Mainloop::produce(pipe, w, tid);
    } else {
      float acc[T::kRW][T::kNT][4] = {};
      Mainloop::run(pipe, w, smem, acc, tid);
      Units<T::kAcc> u;
      Mainloop::sum_warp_rows(acc, smem, u.v, tid);
      float* tile_s = Mainloop::store_units(u.v, smem, tid);
      const Params pe = Sched::expert_params(gp, sched, w, sizeof(OutT));
      TileWork we = w;
      we.batch = 0;
      Epilogue<T, OutT, ReduceGlobal>::run(pe, we, tile_s, tid);
    }
    // The warp-row slabs and the epilogue tile overlay the raw stages that the next item's TMA
    // loads fill: order these generic-proxy accesses before them.
    cutlass::arch::fence_view_async_shared();
    __syncthreads();
  }
}

}  // namespace bsg::sm90
