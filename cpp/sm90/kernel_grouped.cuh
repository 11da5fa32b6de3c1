// The SM90 grouped (mixture-of-experts) kernels, wired from the parts of the dense ones over the
// grouped tile scheduler: the stream tiles' persistent kernel (kernel_stream.cuh's producer warp,
// main loop, warp-row sum and epilogue once per work item), and for the swapped tiles the
// activation pre-pass over the experts' rows and kernel.cuh's swapped kernel, one CTA per item.
// Each item covers an expert's whole K range (no split-K), so no reduction runs and the tile's
// sums are the per-group GEMM's own.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/ptx.cuh"
#include "cutlass/arch/barrier.h"
#include "sm90/dispatch_policy.cuh"
#include "sm90/epilogue.cuh"
#include "sm90/kernel_stream.cuh"
#include "sm90/mainloop_stream.cuh"
#include "sm90/mainloop_swapped.cuh"
#include "sm90/predecode.cuh"
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
    // Barriers initialized afresh for each item: the last item's are all completed, no thread
    // waits on them any more (the CTA barrier at the end of the loop) and thread 0 has
    // invalidated them.
    const RawPipeline<T> pipe = start_pipeline<T>(gp.base, w, smem, smem, &map_a, &map_b, tid);
    if (tid >= kThreads) {
      Mainloop::produce(pipe, w, tid);
    } else {
      float acc[T::kRW][T::kNT][4] = {};
      Mainloop::run(pipe, w, smem, acc, tid);
      Units<T::kAcc> u;
      Mainloop::sum_warp_rows(acc, smem, u.v, tid);
      float* tile_s = Mainloop::store_units(u.v, smem, tid);
      const Params pe = Sched::template expert_params<OutT>(gp, sched, w);
      TileWork we = w;
      we.batch = 0;
      Epilogue<T, OutT, ReduceGlobal>::run(pe, we, tile_s, tid);
    }
    // The warp-row slabs and the epilogue tile overlay the raw stages that the next item's TMA
    // loads fill: order these generic-proxy accesses before them.
    cutlass::arch::fence_view_async_shared();
    __syncthreads();
    if (tid == 0) pipe.inval_barriers();
  }
}

// The swapped tiles' pre-pass over the stacked rows: row r decoded with its scales at its
// expert's place in the MoE scale layout; rows no expert holds decode to zeros (no tile reads
// them into an output row).
template <class T>
__global__ void __launch_bounds__(kPreThreads) predecode_a_grouped(const __grid_constant__ GroupedParams gp, uint4* out) {
  using Sched = GroupedTileScheduler<T>;
  __shared__ typename Sched::Shared sched;
  griddep_wait();
  griddep_launch_dependents();
  Sched::prepare(gp, sched, threadIdx.x);
  const Params& p = gp.base;
  const int kb_n = (p.k + 63) / 64;
  const int64_t items = int64_t(p.m) * kb_n * 2, sp = sf_cols_padded(p.k);
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < items; idx += int64_t(gridDim.x) * blockDim.x) {
    const int row = int(idx / 2 / kb_n);
    const int e = sched.rows.expert_of_row(gp.experts, row);
    const int sr = e < 0 ? 0 : sched.rows.sf_row[e] + row - sched.rows.row[e];
    const uint8_t* sf_rows = e < 0 ? nullptr : p.sfa + int64_t(sr / 128) * (sp / 4) * 512;
    predecode_item(p.a, sf_rows, sr % 128, out, row, int((idx / 2) % kb_n), int(idx % 2), p.k, kb_n);
  }
}

// The swapped tiles: CTA blockIdx.x takes item blockIdx.x (the grid holds any routing's items;
// CTAs past this routing's exit at once), as gemm_kernel takes its tile at split 1.
template <class T, class OutT>
__global__ void __launch_bounds__(T::kLaunchThreads, T::kMinBlocks)
    grouped_gemm_kernel(const __grid_constant__ GroupedParams gp, const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b) {
  using Mainloop = CollectiveMainloop<T>;
  using Sched = GroupedTileScheduler<T>;
  static_assert(T::kPreA && Mainloop::kProducerWarpgroup, "grouped_gemm_kernel: the swapped tiles");
  __shared__ typename Sched::Shared sched;
  uint8_t* smem = aligned_smem();
  half_t* decA = reinterpret_cast<half_t*>(smem);
  uint8_t* raw = smem + T::kDecA + T::kDecB;
  const int tid = threadIdx.x;
  // The offsets may be the output of the kernel before the pre-pass: wait for the pre-pass to
  // complete (it waited for that kernel) before reading them.
  griddep_wait();
  Sched::prepare(gp, sched, tid);
  if (int(blockIdx.x) >= sched.total) return;
  const TileWork w = Sched::work(gp, sched, int(blockIdx.x));
  const RawPipeline<T> pipe = start_pipeline<T>(gp.base, w, raw, decA, &map_a, &map_b, tid);
  if (tid >= kThreads) {
    Mainloop::produce(pipe, w, tid);
    return;
  }
  Mainloop::consumer_start();
  typename T::TiledMma mma;
  Tensor acc = partition_fragment_C(mma, typename T::MmaShape{});
  clear(acc);
  Mainloop::run(pipe, w, raw, decA, mma, acc, tid);
  griddep_launch_dependents();
  float* tile_s = EpilogueTile<T>::stage(mma, acc, smem, tid);
  const Params pe = Sched::template expert_params<OutT>(gp, sched, w);
  TileWork we = w;
  we.batch = 0;
  Epilogue<T, OutT, ReduceGlobal>::run(pe, we, tile_s, tid);
}

}  // namespace bsg::sm90
