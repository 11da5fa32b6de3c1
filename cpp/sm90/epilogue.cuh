// SM90 epilogue for f16, bf16 and f32 outputs: D = alpha * acc + beta * C, rounded once. The
// accumulators go through shared memory (free once every wgmma has been waited for) so C is read
// and D written in 16-byte row pieces rather than 2-element fragments. With ReduceCluster this is
// also where the split-K partials of the cluster's CTAs are summed, one slice of rows per CTA.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/instrument.cuh"
#include "common/nvfp4.cuh"
#include "cute/arch/cluster_sm90.hpp"
#include "sm90/dispatch_policy.cuh"
#include "sm90/split_k.cuh"
#include "sm90/tile_scheduler.cuh"

namespace bsg::sm90 {

template <class T>
struct EpilogueTile {
  // Floats per row of the FP32 tile in shared memory, chosen so the accumulator stores are free of
  // bank conflicts (unswapped: float2 stores; swapped: transposed scalar stores).
  static constexpr int kLd = T::kEpiLd;
  static_assert(T::kBM * kLd * 4 <= T::kSmem - 1024, "the epilogue tile fits the kernel's shared memory");

  // The accumulators into the FP32 tile (row-major over the output tile, transposed back for the
  // swapped tiles).
  template <class Mma, class Acc>
  __device__ __forceinline__ static float* stage(const Mma& mma, const Acc& acc, uint8_t* smem, int tid) {
    Tensor coord = mma.get_thread_slice(tid).partition_C(make_identity_tensor(typename T::MmaShape{}));
    float* tile_s = reinterpret_cast<float*>(smem);
    if constexpr (T::kSwap) {
      CUTE_UNROLL
      for (int i = 0; i < size(acc); ++i) tile_s[get<1>(coord(i)) * kLd + get<0>(coord(i))] = acc(i);
    } else {
      CUTE_UNROLL
      for (int i = 0; i < size(acc); i += 2) {  // values i, i + 1: adjacent columns of one row
        *reinterpret_cast<float2*>(tile_s + get<0>(coord(i)) * kLd + get<1>(coord(i))) = make_float2(acc(i), acc(i + 1));
      }
    }
    return tile_s;
  }
};

// Threads: who runs it (ComputeThreads<T>, or EpilogueWarp where Reduce is ReduceGlobal and the
// tile is whole); tid is the thread's index among them.
template <class T, class OutT, class Reduce, class Threads = ComputeThreads<T>>
struct Epilogue {
  static constexpr int kBM = T::kBM, BN = T::kBN, kLd = T::kEpiLd;
  static_assert(std::is_same_v<Threads, ComputeThreads<T>> || !std::is_same_v<Reduce, ReduceCluster>, "the cluster sum runs on the compute threads");

  __device__ __forceinline__ static void run(const Params& p, const TileWork& w, const float* tile_s, int tid) {
    constexpr int kW = 16 / sizeof(OutT);  // elements per 16 bytes; N % kW == 0
    const int m0 = w.m0, n0 = w.n0;
    OutT* d = static_cast<OutT*>(p.d) + w.batch * p.m * int64_t(p.n);
    const OutT* c = static_cast<const OutT*>(p.c) + w.batch * p.m * int64_t(p.n);
    // The W sums of row r, columns col.. (W * sizeof(OutT) of 4, 8 or 16 bytes).
    auto store = [&](auto width, int r, int col, const float* sums) {
      constexpr int W = decltype(width)::value;
      using V = std::conditional_t<W * sizeof(OutT) == 16, uint4, std::conditional_t<W * sizeof(OutT) == 8, uint2, uint32_t>>;
      const int mm = m0 + r, nn = n0 + col;
      if (mm >= p.m || nn >= p.n) return;
      const int64_t idx = int64_t(mm) * p.n + nn;
      float v[W];
      CUTE_UNROLL
      for (int e = 0; e < W; ++e) v[e] = p.alpha * sums[e];
      if (p.beta != 0.f) {
        V craw = *reinterpret_cast<const V*>(c + idx);
        const OutT* cv = reinterpret_cast<const OutT*>(&craw);
        CUTE_UNROLL
        for (int e = 0; e < W; ++e) v[e] = fmaf(p.beta, load_out(cv + e), v[e]);
      }
      V out;
      OutT* o = reinterpret_cast<OutT*>(&out);
      CUTE_UNROLL
      for (int e = 0; e < W; ++e) o[e] = to_out<OutT>(v[e]);
      *reinterpret_cast<V*>(d + idx) = out;
    };
    auto store_chunk = [&](int r, int col, const float* sums) { store(std::integral_constant<int, kW>{}, r, col, sums); };
    if constexpr (std::is_same_v<Reduce, ReduceCluster> && (BSG_SM90_ABLATE & 8) == 0) {
      // Every CTA of the cluster holds its partial tile; this one sums rows [r0, r1) of all of
      // them in split order and writes them out, one float4 per thread and step, consecutive
      // threads on consecutive float4s. Only units inside D are read: every peer load then
      // feeds a store (N % 4 == 0, so a unit is inside or outside whole).
      stamp(5);
      cute::cluster_sync();
      stamp(6);
      const int r0 = w.split * kBM / p.split_k, r1 = min((w.split + 1) * kBM / p.split_k, p.m - w.m0);
      for (int u = tid; u < (r1 - r0) * (BN / 4); u += kThreads) {
        const int r = r0 + u / (BN / 4), col = (u % (BN / 4)) * 4;
        if (w.n0 + col >= p.n) continue;
        float4 v[1];
        cluster_sum(tile_s + r * kLd + col, p.split_k, v);
        store(std::integral_constant<int, 4>{}, r, col, reinterpret_cast<const float*>(v));
      }
      stamp(7);
      // No CTA leaves while a peer still reads its shared memory. A relaxed arrive: a release
      // one would first wait for this CTA's global stores above to complete (MEMBAR.GPU), which
      // no peer needs. This CTA's peer loads have returned by then: each one's value feeds a
      // store issued before the arrive (checked in SASS: loads, stores, then UCGABAR_ARV).
      cute::cluster_arrive_relaxed();
      cute::cluster_wait();
    } else {
      Threads::sync();
      // Unrolled, with 16-byte shared-memory loads; tiles of fewer chunks than threads leave the
      // rest idle.
      constexpr int kChunks = kBM * BN / kW, kN = Threads::kCount;
      CUTE_UNROLL
      for (int it = 0; it < (kChunks + kN - 1) / kN; ++it) {
        const int chunk = tid + it * kN;
        if (kChunks % kN != 0 && chunk >= kChunks) break;
        const int r = chunk / (BN / kW), col = (chunk % (BN / kW)) * kW;
        float4 v[kW / 4];
        CUTE_UNROLL
        for (int e = 0; e < kW / 4; ++e) v[e] = *reinterpret_cast<const float4*>(tile_s + r * kLd + col + 4 * e);
        store_chunk(r, col, reinterpret_cast<const float*>(v));
      }
    }
  }
};

}  // namespace bsg::sm90
