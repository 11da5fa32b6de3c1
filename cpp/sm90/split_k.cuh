// SM90 split-K reductions, both deterministic: partial tiles are summed in split order from 0.0,
// so results do not depend on which CTA finishes first, and the two paths give the same bits.
//  - ReduceGlobal: each CTA stores its FP32 partial tile in the workspace; the last CTA of a tile
//    to arrive (per-tile counter) sums them and goes on to the epilogue. The counters sit in a
//    fixed region at the start of the workspace, zeroed once when it is allocated; each launch
//    leaves them zero again (the last CTA resets its tile's), so no memset precedes the kernel.
//  - ReduceCluster (swapped and stream tiles, split_k <= kMaxClusterSplit, unless the launch says
//    split_global): the split_k CTAs of a tile form one cluster; each keeps its partial tile in its
//    own shared memory and the epilogue sums one slice of rows over all of them straight from the
//    peers' shared memory (cluster_sum).
#pragma once

#include <cstdint>

#include "common/instrument.cuh"
#include "common/ptx.cuh"
#include "sm90/dispatch_policy.cuh"
#include "sm90/tile_scheduler.cuh"

namespace bsg::sm90 {

// The N float4s at `local` in the partial tiles of the cluster's first split_k (<= kPeers) CTAs,
// summed in split order from 0.0. Every peer's values are loaded before the first addition, so
// the loads are in flight together.
template <int kPeers, int N>
__device__ __forceinline__ void cluster_sum_upto(const float* local, int split_k, float4 (&v)[N]) {
  float4 x[kPeers][N];
  CUTE_UNROLL
  for (int q = 0; q < kPeers; ++q) {
    if (q < split_k) {
      const uint32_t addr = peer_smem(local, uint32_t(q));
      CUTE_UNROLL
      for (int e = 0; e < N; ++e) x[q][e] = ld_peer(addr + 16 * e);
    }
  }
  CUTE_UNROLL
  for (int e = 0; e < N; ++e) v[e] = make_float4(0.f, 0.f, 0.f, 0.f);
  CUTE_UNROLL
  for (int q = 0; q < kPeers; ++q) {
    if (q < split_k) {
      CUTE_UNROLL
      for (int e = 0; e < N; ++e) {
        v[e].x += x[q][e].x;
        v[e].y += x[q][e].y;
        v[e].z += x[q][e].z;
        v[e].w += x[q][e].w;
      }
    }
  }
}
// Unrolled for 4 peers where that suffices (the 8-peer code costs registers the FP4 epilogue
// needs).
template <int N>
__device__ __forceinline__ void cluster_sum(const float* local, int split_k, float4 (&v)[N]) {
  if (split_k <= 4) cluster_sum_upto<4>(local, split_k, v);
  else cluster_sum_upto<kMaxClusterSplit>(local, split_k, v);
}

template <class T>
struct SplitKGlobal {
  // Stores this CTA's partial tile (acc(i), i < T::kAcc, this thread's share in any fixed
  // order: the accumulator fragment, or units of a tile summed in shared memory); the tile's last
  // CTA sums all of them into acc and returns true, the others return false and leave.
  template <class Acc>
  __device__ __forceinline__ static bool reduce(const Params& p, const TileWork& w, Acc& acc, int tid) {
    // Split s's partial tile: [split][tile][acc / 4][thread] float4.
    auto partial = [&](int s) {
      return reinterpret_cast<float4*>(p.partials) + ((int64_t(s) * gridDim.x + w.tile) * (T::kAcc / 4)) * kThreads + tid;
    };
    float4* mine = partial(w.split);
    CUTE_UNROLL
    for (int i = 0; i < T::kAcc / 4; ++i)
      mine[int64_t(i) * kThreads] = make_float4(acc(4 * i), acc(4 * i + 1), acc(4 * i + 2), acc(4 * i + 3));
    __threadfence();
    compute_sync<T>();
    __shared__ int last;
    if (tid == 0) {
      last = atomicAdd(p.counters + w.tile, 1u) == uint32_t(p.split_k - 1);
      if (last) p.counters[w.tile] = 0;  // every split has counted: ready for the next launch
    }
    compute_sync<T>();
    if (!last) {
      stamp(3);
      return false;
    }
    __threadfence();
    CUTE_UNROLL
    for (int i = 0; i < T::kAcc; ++i) acc(i) = 0.f;
    // Fixed order s = 0, 1, ...; the loads of four splits are issued together.
    for (int s0 = 0; s0 < p.split_k; s0 += 4) {
      const int ns = min(4, p.split_k - s0);
      const float4* part[4] = {partial(s0), partial(min(s0 + 1, p.split_k - 1)), partial(min(s0 + 2, p.split_k - 1)),
                               partial(min(s0 + 3, p.split_k - 1))};
      CUTE_UNROLL
      for (int i = 0; i < T::kAcc / 4; ++i) {
        float4 v[4];
        CUTE_UNROLL
        for (int t = 0; t < 4; ++t) v[t] = __ldcg(part[t] + int64_t(i) * kThreads);  // L2: other SMs wrote these
        CUTE_UNROLL
        for (int t = 0; t < 4; ++t) {
          if (t < ns) {
            acc(4 * i) += v[t].x;
            acc(4 * i + 1) += v[t].y;
            acc(4 * i + 2) += v[t].z;
            acc(4 * i + 3) += v[t].w;
          }
        }
      }
    }
    return true;
  }
};

}  // namespace bsg::sm90
