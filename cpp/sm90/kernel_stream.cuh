// The SM90 small-M kernel: wires the parts together. One CTA per (output tile, K range) of the
// tile scheduler: a producer warp fills the raw ring, eight compute warps run the stream main loop,
// then their warp rows are summed, split-K reduced (through the cluster's shared memory for
// ReduceCluster, else through global memory where the launch splits K) and written by the
// epilogue of the output type.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/instrument.cuh"
#include "common/ptx.cuh"
#include "sm90/dispatch_policy.cuh"
#include "sm90/epilogue.cuh"
#include "sm90/epilogue_fp4.cuh"
#include "sm90/mainloop_stream.cuh"
#include "sm90/raw_pipeline.cuh"
#include "sm90/split_k.cuh"
#include "sm90/tile_scheduler.cuh"

namespace bsg::sm90 {

// A thread's floats of the summed tile, as the split-K reduction reads them.
template <int N>
struct Units {
  float v[N];
  __device__ __forceinline__ float& operator()(int i) { return v[i]; }
};

template <class T, class OutT, class Reduce>
__global__ void __launch_bounds__(T::kLaunchThreads, T::kMinBlocks)
    stream_kernel(const __grid_constant__ Params p, const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b) {
  using Mainloop = CollectiveMainloop<T>;
  uint8_t* smem = aligned_smem();
  const int tid = threadIdx.x;
  stamp(0);

  const TileWork w = TileScheduler<T>::work(p);
  const RawPipeline<T> pipe = start_pipeline<T>(p, w, smem, smem, &map_a, &map_b, tid);
  if (tid >= kThreads) {  // the producer warp; exited threads hold up no later barrier
    Mainloop::produce(pipe, w, tid, Mainloop::kLoadsAhead, kL2PrefetchStages<Reduce>);
    return;
  }
  // Before this thread's first global access (A where the FP16 test reads it, else the
  // epilogue's C and D): the previous kernel of a programmatic launch has completed.
  griddep_wait();

  float acc[T::kRW][T::kNT][4] = {};
  if constexpr (Mainloop::kBf16AsF16) {
    if (p.m - w.m0 <= Mainloop::kF16TestRows && Mainloop::activations_fit_f16(p, w, tid)) Mainloop::template run<true>(pipe, w, smem, acc, tid);
    else Mainloop::run(pipe, w, smem, acc, tid);
  } else {
    Mainloop::run(pipe, w, smem, acc, tid);
  }
  stamp(2);
  griddep_launch_dependents();
  Units<T::kAcc> u;
  Mainloop::sum_warp_rows(acc, smem, u.v, tid);
  if constexpr (std::is_same_v<Reduce, ReduceGlobal> && (BSG_SM90_ABLATE & 8) == 0) {
    if (p.split_k > 1 && !SplitKGlobal<T>::reduce(p, w, u, tid)) return;
  }
  float* tile_s = Mainloop::store_units(u.v, smem, tid);
  Epilogue<T, OutT, Reduce>::run(p, w, tile_s, tid);
  stamp(3);
}

}  // namespace bsg::sm90
