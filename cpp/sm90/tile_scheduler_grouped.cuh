// SM90 grouped tile scheduler (mixture-of-experts): one queue of the work items of every expert;
// the stream tiles' persistent CTAs walk it (item blockIdx.x, then every gridDim.x-th after it),
// the swapped tiles take item blockIdx.x of a grid sized for any routing (the rest exit). Items run
// expert by expert; inside an expert, n-tile by n-tile with its m-tiles adjacent, so CTAs that run
// together share a weight tile through L2. The experts' row ranges come from device offsets, read
// once per CTA into shared memory and turned into prefix sums there: the host never learns the
// routing, so a call can be captured, and an expert without rows adds no item.
#pragma once

#include <climits>
#include <cstdint>

#include "blockscaled_gemm/kernel_abi.h"
#include "common/scale_layout.cuh"
#include "sm90/dispatch_policy.cuh"
#include "sm90/tile_scheduler.cuh"

namespace bsg::sm90 {

// The launch's arguments on the device: the problem as one GEMM of T rows (m) and batch 1, whose
// B is indexed by expert, plus the routing.
struct GroupedParams {
  Params base;
  const int32_t* offsets;      // [experts + 1]
  const float* expert_alpha;   // [experts], or null
  int32_t experts;
};

template <class T>
struct GroupedTileScheduler {
  static constexpr int kMaxGroups = BSG_MAX_GROUPS;

  struct Shared {
    int row[kMaxGroups + 1];   // the offsets as read: running maximum, clamped to [0, T]
    int work_end[kMaxGroups];  // items of experts 0..e (inclusive prefix)
    int sf_row[kMaxGroups];    // first row of expert e in A's padded scale layout
    int total;
  };

  // Every thread of the CTA, after griddep_wait (the offsets may come from the previous kernel).
  // Warp 0 scans; ends with a CTA barrier.
  __device__ static void prepare(const GroupedParams& gp, Shared& s, int tid) {
    const int experts = gp.experts, rows = gp.base.m;
    const int tiles_n = (gp.base.n + T::kBN - 1) / T::kBN;
    for (int e = tid; e <= experts; e += blockDim.x) s.row[e] = min(max(gp.offsets[e], 0), rows);
    __syncthreads();
    if (tid < 32) {
      const int lane = tid;
      // Running maximum over row[0..experts]: each lane a contiguous chunk, then across lanes.
      const int per = (experts + 1 + 31) / 32, b0 = min(lane * per, experts + 1), b1 = min(b0 + per, experts + 1);
      int mx = 0;
      for (int e = b0; e < b1; ++e) mx = max(mx, s.row[e]);
      int before = mx;
      for (int d = 1; d < 32; d *= 2) {
        const int v = __shfl_up_sync(0xffffffffu, before, d);
        if (lane >= d) before = max(before, v);
      }
      int run = __shfl_up_sync(0xffffffffu, before, 1);
      if (lane == 0) run = 0;
      for (int e = b0; e < b1; ++e) run = max(run, s.row[e]), s.row[e] = run;
      __syncwarp();
      // Items and padded scale rows of experts 0..experts-1, as prefix sums.
      const int q = (experts + 31) / 32, e0 = min(lane * q, experts), e1 = min(e0 + q, experts);
      int items = 0, sf = 0;
      for (int e = e0; e < e1; ++e) {
        const int m = s.row[e + 1] - s.row[e];
        items += (m + T::kBM - 1) / T::kBM * tiles_n;
        sf += (m + 127) / 128 * 128;
      }
      int items_incl = items, sf_incl = sf;
      for (int d = 1; d < 32; d *= 2) {
        const int vi = __shfl_up_sync(0xffffffffu, items_incl, d), vs = __shfl_up_sync(0xffffffffu, sf_incl, d);
        if (lane >= d) items_incl += vi, sf_incl += vs;
      }
      int it = items_incl - items, sr = sf_incl - sf;
      for (int e = e0; e < e1; ++e) {
        const int m = s.row[e + 1] - s.row[e];
        s.sf_row[e] = sr;
        sr += (m + 127) / 128 * 128;
        it += (m + T::kBM - 1) / T::kBM * tiles_n;
        s.work_end[e] = it;
      }
      if (lane == 31) s.total = items_incl;
    }
    __syncthreads();
  }

  // The expert of item `item` (< total): the first whose inclusive prefix exceeds it.
  __device__ __forceinline__ static int expert_of(const Shared& s, int experts, int item) {
    int lo = 0, hi = experts - 1;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (s.work_end[mid] > item) hi = mid;
      else lo = mid + 1;
    }
    return lo;
  }

  // The expert whose rows hold row r, or -1 where none does.
  __device__ __forceinline__ static int expert_of_row(const Shared& s, int experts, int r) {
    if (r < s.row[0] || r >= s.row[experts]) return -1;
    int lo = 0, hi = experts - 1;
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (s.row[mid + 1] > r) hi = mid;
      else lo = mid + 1;
    }
    return lo;
  }

  // Item `item`'s tile: D rows m0.. of expert e (batch e of B), the whole K range.
  __device__ __forceinline__ static TileWork work(const GroupedParams& gp, const Shared& s, int item) {
    const Params& p = gp.base;
    const int e = expert_of(s, gp.experts, item);
    const int local = item - (e ? s.work_end[e - 1] : 0);
    const int m_tiles = (s.row[e + 1] - s.row[e] + T::kBM - 1) / T::kBM;
    TileWork w;
    w.tile = item;
    w.batch = e;
    w.m0 = local % m_tiles * T::kBM;
    w.n0 = local / m_tiles * T::kBN;
    w.split = 0;
    w.kt_begin = 0;
    w.kt_end = w.n_kt = (p.k + kBK - 1) / kBK;
    w.n_raw = (w.n_kt + T::kSubs - 1) / T::kSubs;
    w.a_row = s.row[e] + w.m0;
    w.a_batch = 0;
    const int64_t sp = sf_cols_padded(p.k);
    // Expert starts are multiples of 128 in the scale layout, so the mainloop's row inside a
    // 128-row chunk (m0 % 128) holds there too.
    w.sfa_off = int64_t((s.sf_row[e] + w.m0) / 128) * (sp / 4) * 512;
    w.sfb_off = int64_t(e) * sf_batch_bytes(p.n, sp) + int64_t(w.n0 / 128) * (sp / 4) * 512;
    return w;
  }

  // What the epilogue of item w needs: the expert's rows as a GEMM of their own (M, D, alpha),
  // and w with batch 0 (D is not batched).
  __device__ __forceinline__ static Params expert_params(const GroupedParams& gp, const Shared& s, const TileWork& w, int out_bytes) {
    Params p = gp.base;
    const int e = int(w.batch);
    p.m = s.row[e + 1] - s.row[e];
    p.d = static_cast<uint8_t*>(p.d) + int64_t(s.row[e]) * p.n * out_bytes;
    if (gp.expert_alpha) p.alpha *= gp.expert_alpha[e];
    return p;
  }

  // ---- host side ----

  // Items of any routing of `rows` rows over `experts` experts: at most ceil(T / BM) + E m-tiles.
  static int64_t max_items(const GroupedArgs& a) {
    return (int64_t(a.rows + T::kBM - 1) / T::kBM + a.experts) * ((a.n + T::kBN - 1) / T::kBN);
  }
};

}  // namespace bsg::sm90
