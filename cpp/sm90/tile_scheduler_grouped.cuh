// SM90 grouped tile scheduler (mixture-of-experts): one queue of the work items of every expert;
// the stream tiles' persistent CTAs walk it (item blockIdx.x, then every gridDim.x-th after it),
// the swapped tiles take item blockIdx.x of a grid sized for any routing (the rest exit). Items run
// expert by expert; inside an expert, n-tile by n-tile with its m-tiles adjacent, so CTAs that run
// together share a weight tile through L2. The experts' row ranges come from device offsets, read
// into shared memory and turned into prefix sums there (by each persistent CTA; for the swapped
// tiles once, by their pre-pass, whose sums each CTA copies: GroupedWalk): the host never learns
// the routing, so a call can be captured, and an expert without rows adds no item. The experts'
// rows are common/moe_rows.cuh's.
#pragma once

#include <cuda.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "blockscaled_gemm/kernel_abi.h"
#include "common/moe_rows.cuh"
#include "common/scale_layout.cuh"
#include "sm90/dispatch_policy.cuh"
#include "sm90/tile_scheduler.cuh"

namespace bsg::sm90 {

// The swapped tiles' walk over the experts (the scheduler's sums), stored by the first CTA of
// their activation pre-pass and read by every CTA of the grouped kernel, which runs one CTA per
// work item: one coalesced read each instead of reading the offsets and three scans over the
// experts. Followed in the workspace by row[experts + 1], sf_row[experts], work_end[experts].
struct GroupedWalk {
  int32_t total, pad[3];
  __device__ __forceinline__ int32_t* ends() { return reinterpret_cast<int32_t*>(this + 1); }
  __host__ __device__ static constexpr size_t bytes(int experts) { return sizeof(GroupedWalk) + size_t(3 * experts + 1) * sizeof(int32_t); }
};

// The launch's arguments on the device: the problem as one GEMM of T rows (m) and batch 1, whose
// B is indexed by expert, plus the routing.
struct GroupedParams {
  Params base;
  const int32_t* offsets;      // [experts + 1]
  const float* expert_alpha;   // [experts], or null
  int32_t experts;
  GroupedWalk* walk;           // the swapped tiles' (kPreA: their pre-pass stores it), else null
  int64_t d_row_units;         // GroupedArgs::zero_uncovered: D's 16-byte units a row, else 0
};

template <class T>
struct GroupedTileScheduler {
  static constexpr int kMaxGroups = BSG_MAX_GROUPS;

  // The launch's kernel arguments: the routing and the stacked operands' descriptors.
  struct Args {
    GroupedParams gp;
    CUtensorMap map_a, map_b;
  };

  struct Shared {
    MoeRows rows;              // the experts' rows and scale rows (common/moe_rows.cuh)
    int work_end[kMaxGroups];  // items of experts 0..e (inclusive prefix)
    int total;
  };

  // Every thread of the CTA, after griddep_wait (the offsets, or the walk the pre-pass stored,
  // may come from the previous kernel). Ends with a CTA barrier.
  __device__ static void prepare(const Args& args, Shared& s, int tid) {
    const GroupedParams& gp = args.gp;
    if constexpr (T::kPreA) {
      const int32_t* ends = gp.walk->ends();
      const int e = gp.experts;
      for (int i = tid; i <= e; i += blockDim.x) s.rows.row[i] = ends[i];
      for (int i = tid; i < e; i += blockDim.x) s.rows.sf_row[i] = ends[e + 1 + i], s.work_end[i] = ends[2 * e + 1 + i];
      if (tid == 0) s.total = gp.walk->total;
      __syncthreads();
    } else {
      walk(gp, s, tid);
    }
  }

  // The pre-pass's first CTA, after walk: stores it for prepare (kPreA).
  __device__ static void store_walk(const GroupedParams& gp, const Shared& s, int tid) {
    int32_t* ends = gp.walk->ends();
    const int e = gp.experts;
    for (int i = tid; i <= e; i += blockDim.x) ends[i] = s.rows.row[i];
    for (int i = tid; i < e; i += blockDim.x) ends[e + 1 + i] = s.rows.sf_row[i], ends[2 * e + 1 + i] = s.work_end[i];
    if (tid == 0) gp.walk->total = s.total;
  }

  // Every thread of the CTA; ends with a CTA barrier: the experts' rows from the offsets and the
  // items' prefix sums.
  __device__ static void walk(const GroupedParams& gp, Shared& s, int tid) {
    s.rows.prepare(gp.offsets, gp.experts, gp.base.m, tid);
    if (tid < 32) {
      const int tiles_n = (gp.base.n + T::kBN - 1) / T::kBN;
      const int total = warp_inclusive_scan(tid, gp.experts, [&](int e) { return (s.rows.rows_of(e) + T::kBM - 1) / T::kBM * tiles_n; }, s.work_end);
      if (tid == 0) s.total = total;
    }
    __syncthreads();
  }

  __device__ __forceinline__ static int total(const Shared& s) { return s.total; }

  // Item `item`'s tile: D rows m0.. of expert e (batch e of B), the whole K range.
  __device__ __forceinline__ static TileWork work(const Args& args, const Shared& s, int item) {
    const GroupedParams& gp = args.gp;
    const Params& p = gp.base;
    const int e = first_exceeding(s.work_end, gp.experts, item);
    const int local = item - (e ? s.work_end[e - 1] : 0);
    const int m_tiles = (s.rows.rows_of(e) + T::kBM - 1) / T::kBM;
    TileWork w = grouped_item<T>(item, e, e, local, m_tiles, p.k);
    w.a_row = s.rows.row[e] + w.m0;
    const int64_t sp = sf_cols_padded(p.k);
    // Expert starts are multiples of 128 in the scale layout, so the mainloop's row inside a
    // 128-row chunk (m0 % 128) holds there too.
    w.sfa_off = int64_t((s.rows.sf_row[e] + w.m0) / 128) * (sp / 4) * 512;
    w.sfb_off = int64_t(e) * sf_batch_bytes(p.n, sp) + int64_t(w.n0 / 128) * (sp / 4) * 512;
    return w;
  }

  // What the loads read: the stacked problem (the tile's scale offsets are from its bases).
  __device__ __forceinline__ static const Params& load_params(const Args& args, const Shared&, const TileWork&) { return args.gp.base; }

  // What the epilogue of item w needs: the expert's rows as a GEMM of their own (M, D, alpha;
  // FP4 output: its SFD, whose part of the MoE layout starts at a multiple of 128 rows and so is
  // the tiled layout of its own rows), and w with batch 0 (D is not batched).
  template <class OutT>
  __device__ __forceinline__ static Params epilogue_params(const Args& args, const Shared& s, const TileWork& w) {
    const GroupedParams& gp = args.gp;
    Params p = gp.base;
    const int e = int(w.batch);
    const int64_t row0 = s.rows.row[e];
    p.m = s.rows.rows_of(e);
    if constexpr (std::is_void_v<typename OutputInfo<OutT>::Sf>) {
      p.d = static_cast<uint8_t*>(p.d) + row0 * p.n * int64_t(sizeof(OutT));
    } else {
      p.d = static_cast<uint8_t*>(p.d) + row0 * p.n / 2;
      p.sfd += int64_t(s.rows.sf_row[e]) * sf_cols_padded(p.n);
    }
    if (gp.expert_alpha) p.alpha *= gp.expert_alpha[e];
    return p;
  }

  __device__ __forceinline__ static const CUtensorMap* map_a(const Args& args, const TileWork&) { return &args.map_a; }
  __device__ __forceinline__ static const CUtensorMap* map_b(const Args& args, const TileWork&) { return &args.map_b; }
  // The descriptors are kernel parameters: nothing to acquire.
  __device__ __forceinline__ static void acquire(const Args&, const TileWork&) {}

  // Where the launch asks for it (d_row_units), D's rows no expert covers ([0, row[0]) and
  // [row[E], T)) as zeros: part `part` of `parts` (threads, strided) of their 16-byte units. Every
  // output row's bytes are a multiple of 16 (OutputInfo::kNMultiple) and D is 16-byte aligned, so
  // the two ranges are whole units. The stream tiles' kernel writes them; for the swapped tiles
  // their pre-pass, which walks the rows already (an early return in the GEMM's spare CTAs
  // changed that kernel's code, bench/DESIGN.md §14).
  __device__ static void zero_uncovered(const GroupedParams& gp, const Shared& s, int64_t part, int64_t parts) {
    const int64_t row_units = gp.d_row_units;
    if (row_units == 0) return;
    const int64_t head = s.rows.row[0] * row_units, tail = int64_t(gp.base.m - s.rows.row[gp.experts]) * row_units;
    uint4* const d = static_cast<uint4*>(gp.base.d);
    const int64_t tail_at = int64_t(s.rows.row[gp.experts]) * row_units;
    for (int64_t i = part; i < head + tail; i += parts) d[i < head ? i : tail_at + (i - head)] = make_uint4(0, 0, 0, 0);
  }
  __device__ static void zero_uncovered(const Args& args, const Shared& s, int64_t part, int64_t parts) { zero_uncovered(args.gp, s, part, parts); }

  // ---- host side ----

  // Items of any routing of `rows` rows over `experts` experts: at most ceil(T / BM) + E m-tiles.
  static int64_t max_items(const GroupedArgs& a) {
    return ((int64_t(a.rows) + T::kBM - 1) / T::kBM + a.experts) * ((int64_t(a.n) + T::kBN - 1) / T::kBN);
  }
};

}  // namespace bsg::sm90
