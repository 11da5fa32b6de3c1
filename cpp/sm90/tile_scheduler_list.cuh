// SM90 grouped tile scheduler, list form: G independent GEMMs whose sizes and operand addresses
// live in device arrays (GroupedListArgs). One queue of every group's output tiles, group by
// group, n-tile by n-tile with the m-tiles adjacent (as the MoE scheduler orders experts); a group
// the device finds invalid adds no tile, so nothing of it is read or written. The groups' TMA
// descriptors are made on the device by the list prologue (kernel_grouped.cuh) in the workspace
// (past the split-K counters), one pair per group; for the swapped tiles the walk over the groups
// (ListWalk) and the decoded activations follow them, each group's rows at the running sum of the
// rows before it, every row k_pad(max_k) halves long.
#pragma once

#include <cuda.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "blockscaled_gemm/kernel_abi.h"
#include "common/moe_rows.cuh"
#include "common/scale_layout.cuh"
#include "sm90/dispatch_policy.cuh"
#include "sm90/tensormap.cuh"
#include "sm90/tile_scheduler.cuh"

namespace bsg::sm90 {

// The swapped tiles' walk over the groups (the scheduler's prefix sums), stored by the list
// prologue's first CTA and read by every CTA of the grouped kernel, which runs one CTA per work
// item: one coalesced read each instead of ceil(G / 32) dependent rounds of global reads. Followed
// in the workspace by work_end[groups], then row_end[groups].
struct ListWalk {
  int64_t rows;
  int32_t total, pad;
  __device__ __forceinline__ int32_t* ends() { return reinterpret_cast<int32_t*>(this + 1); }
  __host__ __device__ static constexpr size_t bytes(int groups) { return sizeof(ListWalk) + size_t(groups) * 2 * sizeof(int32_t); }
};

// The launch's arguments on the device.
struct ListParams {
  const int32_t* problems;  // [groups][3]: m, n, k
  const uint64_t *a, *sfa, *b, *sfb, *c, *d, *sfd;  // [groups]; c null: no C; sfd null: not FP4
  const float* alphas;      // [groups], or null
  float alpha, beta, norm_constant;
  int32_t groups, max_m, max_n, max_k, n_multiple;
  int64_t max_rows;         // rows of `pre` (swapped tiles)
  CUtensorMap* maps;        // [groups][2] (A, B), in the workspace
  ListWalk* walk;           // the swapped tiles' walk, in the workspace (else null)
  uint8_t* pre;             // the decoded activations (swapped tiles), rows of pre_pitch bytes
  int64_t pre_pitch;
  int32_t b_chunked;        // every group's B prepacked (WeightLayout::Prepacked)
};

// A group's sizes as the device reads them, and whether they and its addresses (16-byte aligned,
// none null) are usable.
struct ListGroup {
  int m, n, k;
  bool ok;
};

__device__ __forceinline__ ListGroup list_group(const ListParams& lp, int g) {
  ListGroup r{lp.problems[3 * g], lp.problems[3 * g + 1], lp.problems[3 * g + 2], false};
  const uint64_t addr = lp.a[g] | lp.sfa[g] | lp.b[g] | lp.sfb[g] | lp.d[g] | (lp.c ? lp.c[g] : 0) | (lp.sfd ? lp.sfd[g] : 0);
  const bool null = !lp.a[g] || !lp.sfa[g] || !lp.b[g] || !lp.sfb[g] || !lp.d[g] || (lp.c && !lp.c[g]) || (lp.sfd && !lp.sfd[g]);
  r.ok = r.m >= 0 && r.m <= lp.max_m && r.n >= 1 && r.n <= lp.max_n && r.n % lp.n_multiple == 0 && r.k >= 32 && r.k <= lp.max_k &&
         r.k % 32 == 0 && (addr & 15) == 0 && !null;
  return r;
}

template <class T>
struct ListTileScheduler {
  static_assert(T::Activation::kScaled, "the list form: NVFP4 activations");
  static constexpr int kMaxGroups = BSG_MAX_GROUPS;

  // The launch's kernel arguments (the descriptors are in the workspace).
  struct Args {
    ListParams lp;
  };

  struct Shared {
    int work_end[kMaxGroups];  // tiles of groups 0..g (inclusive prefix)
    int row_end[kMaxGroups];   // rows of `pre` of groups 0..g (inclusive prefix, clamped to INT_MAX)
    int total;
    int64_t rows;              // rows of the groups with tiles (swapped tiles: within max_rows)
  };

  // Whether group g can have tiles before any row bound: its sizes and addresses are usable and
  // it has rows. For the stream tiles (no row bound) this is has_tiles, decided from the group alone.
  __device__ __forceinline__ static bool has_rows(const ListGroup& q) { return q.ok && q.m > 0; }

  // Every thread of the CTA; ends with a CTA barrier. The stream tiles' persistent kernel walks
  // the groups itself; the swapped tiles' kernel reads the walk the list prologue stored.
  __device__ static void prepare(const Args& args, Shared& s, int tid) {
    if constexpr (T::kPreA) {
      const ListParams& lp = args.lp;
      const int32_t* ends = lp.walk->ends();
      for (int g = tid; g < lp.groups; g += blockDim.x) s.work_end[g] = ends[g], s.row_end[g] = ends[lp.groups + g];
      if (tid == 0) s.total = lp.walk->total, s.rows = lp.walk->rows;
      __syncthreads();
    } else {
      walk(args, s, tid);
    }
  }

  // The list prologue's first CTA, after walk: stores it for prepare (kPreA).
  __device__ static void store_walk(const ListParams& lp, const Shared& s, int tid) {
    int32_t* ends = lp.walk->ends();
    for (int g = tid; g < lp.groups; g += blockDim.x) ends[g] = s.work_end[g], ends[lp.groups + g] = s.row_end[g];
    if (tid == 0) lp.walk->total = s.total, lp.walk->rows = s.rows;
  }

  // Every thread of the CTA; ends with a CTA barrier. Group g has tiles where it is usable, has
  // rows and (the swapped tiles) its rows end within max_rows, counting from the sum of m over the
  // usable groups before it (a running sum: once one group is past, every later one with rows is).
  __device__ static void walk(const Args& args, Shared& s, int tid) {
    const ListParams& lp = args.lp;
    if (tid < 32) {
      int64_t run = 0;
      for (int g0 = 0; g0 < lp.groups; g0 += 32) {
        const int g = g0 + tid;
        const ListGroup q = g < lp.groups ? list_group(lp, g) : ListGroup{0, 0, 0, false};
        const int64_t want = has_rows(q) ? q.m : 0;
        int64_t incl = want;
        for (int d = 1; d < 32; d *= 2) {
          const int64_t v = __shfl_up_sync(0xffffffffu, incl, d);
          if (tid >= d) incl += v;
        }
        const int64_t before = run + incl - want;
        const bool fits = !T::kPreA || before + want <= lp.max_rows;
        if (g < lp.groups) {
          s.row_end[g] = int(min(before + want, int64_t(INT_MAX)));
          s.work_end[g] = fits && has_rows(q) ? int((want + T::kBM - 1) / T::kBM) * ((q.n + T::kBN - 1) / T::kBN) : 0;
        }
        run += __shfl_sync(0xffffffffu, incl, 31);
      }
      __syncwarp();
      const int total = warp_inclusive_scan(tid, lp.groups, [&](int g) { return s.work_end[g]; }, s.work_end);
      if (tid == 0) s.total = total, s.rows = T::kPreA ? min(run, lp.max_rows) : run;
    }
    __syncthreads();
  }

  // Whether group g has tiles, and its first row in `pre` (after prepare).
  __device__ __forceinline__ static bool has_tiles(const Shared& s, int g) { return s.work_end[g] > (g ? s.work_end[g - 1] : 0); }
  __device__ __forceinline__ static int row0(const Shared& s, int g) { return g ? s.row_end[g - 1] : 0; }

  __device__ __forceinline__ static int total(const Shared& s) { return s.total; }

  // The grouped kernels' hook for the MoE form's uncovered rows: the groups' outputs are their
  // own buffers, so there are none.
  __device__ static void zero_uncovered(const Args&, const Shared&, int64_t, int64_t) {}

  // Item `item`'s tile: rows m0.. and columns n0.. of group g, its whole K (batch 0: each
  // descriptor covers its group alone).
  __device__ __forceinline__ static TileWork work(const Args& args, const Shared& s, int item) {
    const int g = first_exceeding(s.work_end, args.lp.groups, item);
    const ListGroup q = list_group(args.lp, g);
    const int local = item - (g ? s.work_end[g - 1] : 0);
    const int m_tiles = (q.m + T::kBM - 1) / T::kBM;
    TileWork w = grouped_item<T>(item, 0, g, local, m_tiles, q.k);
    w.a_row = w.m0;
    const int64_t sp = sf_cols_padded(q.k);
    w.sfa_off = int64_t(w.m0 / 128) * (sp / 4) * 512;
    w.sfb_off = int64_t(w.n0 / 128) * (sp / 4) * 512;
    return w;
  }

  // Group g (one with tiles, so its sizes were checked) as a GEMM of its own at L = 1: what the
  // loads and the epilogue read.
  __device__ __forceinline__ static Params group_params(const ListParams& lp, int g) {
    Params p{};
    p.m = lp.problems[3 * g], p.n = lp.problems[3 * g + 1], p.k = lp.problems[3 * g + 2], p.l = 1, p.split_k = 1;
    p.a = reinterpret_cast<const uint8_t*>(lp.a[g]);
    p.sfa = reinterpret_cast<const uint8_t*>(lp.sfa[g]);
    p.b = reinterpret_cast<const uint8_t*>(lp.b[g]);
    p.sfb = reinterpret_cast<const uint8_t*>(lp.sfb[g]);
    p.d = reinterpret_cast<void*>(lp.d[g]);
    p.c = lp.c ? reinterpret_cast<const void*>(lp.c[g]) : p.d;
    p.alpha = lp.alphas ? lp.alpha * lp.alphas[g] : lp.alpha;
    p.beta = lp.beta;
    p.sfd = lp.sfd ? reinterpret_cast<uint8_t*>(lp.sfd[g]) : nullptr;
    p.norm_constant = lp.norm_constant;
    p.b_chunked = lp.b_chunked;
    return p;
  }
  __device__ __forceinline__ static Params load_params(const Args& args, const Shared&, const TileWork& w) {
    return group_params(args.lp, w.group);
  }
  template <class OutT>
  __device__ __forceinline__ static Params epilogue_params(const Args& args, const Shared&, const TileWork& w) {
    return group_params(args.lp, w.group);
  }
  __device__ __forceinline__ static const CUtensorMap* map_a(const Args& args, const TileWork& w) { return args.lp.maps + 2 * w.group; }
  __device__ __forceinline__ static const CUtensorMap* map_b(const Args& args, const TileWork& w) { return args.lp.maps + 2 * w.group + 1; }
  // The producer threads, before the first load of a work item.
  __device__ __forceinline__ static void acquire(const Args& args, const TileWork& w) {
    acquire_tensormap(map_a(args, w));
    acquire_tensormap(map_b(args, w));
  }

  // ---- host side ----

  // Work items of any sizes within the bounds: at most G * ceil(max_m / BM) m-tiles, and (the
  // swapped tiles) ceil(max_rows / BM) + G.
  static int64_t max_items(const GroupedListArgs& a) {
    int64_t m_tiles = int64_t(a.groups) * ((int64_t(a.max_m) + T::kBM - 1) / T::kBM);
    if (T::kPreA) m_tiles = std::min<int64_t>(m_tiles, (a.max_rows + T::kBM - 1) / T::kBM + a.groups);
    return m_tiles * ((int64_t(a.max_n) + T::kBN - 1) / T::kBN);
  }
  static int64_t k_pad(const GroupedListArgs& a) { return (int64_t(a.max_k) + kBK - 1) / kBK * kBK; }
  // The workspace: the descriptors past the split-K counter region (one workspace serves every
  // call, and a later split-K launch needs those counters still zero), then (kPreA) the walk and
  // max_rows decoded rows from a 1024-byte boundary.
  static size_t maps_offset(const GroupedListArgs&) { return TileScheduler<T>::kCountersBytes; }
  static size_t maps_bytes(const GroupedListArgs& a) { return size_t(a.groups) * 2 * sizeof(CUtensorMap); }
  static size_t walk_offset(const GroupedListArgs& a) { return maps_offset(a) + maps_bytes(a); }
  static size_t pre_offset(const GroupedListArgs& a) { return (walk_offset(a) + ListWalk::bytes(a.groups) + 1023) / 1024 * 1024; }
  static size_t workspace_size(const GroupedListArgs& a) {
    return T::kPreA ? pre_offset(a) + size_t(a.max_rows) * size_t(k_pad(a)) * 2 : maps_offset(a) + maps_bytes(a);
  }
};

}  // namespace bsg::sm90
