// SM90 static tile scheduler: one CTA per (output tile, K range). grid.x enumerates the tiles of
// every batch, rastered in groups of kGroupM tile rows with N fastest inside a group, so the CTAs
// that run together share a few rows of activations across many columns of weights; grid.y is the
// K range. It also owns the workspace layout the schedule needs (split-K counters and partials,
// then the pre-decoded activations of the swapped tiles).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "blockscaled_gemm/kernel_abi.h"
#include "common/scale_layout.cuh"
#include "sm90/dispatch_policy.cuh"

namespace bsg::sm90 {

// Where one CTA works: its output tile and its range of k-tiles, and where the loads find the
// tile's operands (the scheduler owns these: a grouped schedule places experts differently).
struct TileWork {
  int64_t tile;   // linear tile index over all batches (grid.x)
  int64_t batch;  // batch of D and of B (the expert, MoE form)
  int group;      // the grouped schedulers' group (expert); 0 otherwise
  int m0, n0;     // first output row and column
  int split;      // K range index (grid.y)
  int kt_begin, kt_end, n_kt;
  int n_raw;      // raw stages of T::kSubs k-tiles
  int a_row, a_batch;        // A's TMA coordinates of the tile's first row
  int64_t sfa_off, sfb_off;  // bytes from SFA / SFB to the tile's first 128-row scale block
};

// A grouped schedule's work item: tile `local` of a group of m_tiles m-tiles (n-tile by n-tile,
// m-tiles adjacent), the group's whole K range of k k-values, no split. The caller sets where A
// and the scales are (a_row, a_batch, sfa_off, sfb_off).
template <class T>
__device__ __forceinline__ TileWork grouped_item(int item, int64_t batch, int group, int local, int m_tiles, int k) {
  TileWork w;
  w.tile = item;
  w.batch = batch;
  w.group = group;
  w.m0 = local % m_tiles * T::kBM;
  w.n0 = local / m_tiles * T::kBN;
  w.split = 0;
  w.kt_begin = 0;
  w.kt_end = w.n_kt = (k + kBK - 1) / kBK;
  w.n_raw = (w.n_kt + T::kSubs - 1) / T::kSubs;
  w.a_batch = 0;
  return w;
}

template <class T>
struct TileScheduler {
  static constexpr int kGroupM = T::kBM == 256 ? 4 : 8;
  static constexpr int kBoxKTiles = T::kBoxBytesK / (kBK / 2);  // k-tiles in one TMA box of B
  static_assert(BSG_PREPACK_CHUNK_BYTES % T::kBoxBytesK == 0, "a box of B inside one prepacked chunk");

  // K ranges a launch may have: one per k-tile, per box of B where it is prepacked.
  static int64_t max_split(const KernelArgs& a) {
    const int64_t k_tiles = (int64_t(a.k) + kBK - 1) / kBK;
    return a.b_layout == int32_t(WeightLayout::Prepacked) ? (k_tiles + kBoxKTiles - 1) / kBoxKTiles : k_tiles;
  }

  // In 32-bit unsigned arithmetic: the host bounds a launch's tiles by i32::MAX (so do the grid's
  // limits) and split_k by 65535, and a 64-bit division is a call of about 90 instructions that
  // every CTA would make before its first load.
  __device__ __forceinline__ static TileWork work(const Params& p) {
    constexpr int kBM = T::kBM, BN = T::kBN;
    TileWork w;
    const uint32_t tiles_m = (uint32_t(p.m) + kBM - 1) / kBM;
    const uint32_t tiles_n = (uint32_t(p.n) + BN - 1) / BN;
    const uint32_t tile = blockIdx.x, per_batch = tiles_m * tiles_n;
    const uint32_t in_batch = tile % per_batch;
    const uint32_t group = in_batch / (kGroupM * tiles_n);
    const uint32_t group_rows = min(uint32_t(kGroupM), tiles_m - group * kGroupM);
    const uint32_t in_group = in_batch - group * kGroupM * tiles_n;
    const uint32_t tm = group * kGroupM + in_group % group_rows;
    const uint32_t tn = in_group / group_rows;
    w.tile = tile;
    w.batch = tile / per_batch;
    w.group = 0;
    w.m0 = int(tm * kBM);
    w.n0 = int(tn * BN);
    w.split = blockIdx.y;
    const int k_tiles = (p.k + kBK - 1) / kBK;
    // Prepacked weights: ranges in whole TMA boxes of B (no box straddles a K chunk).
    const int align = p.b_chunked ? kBoxKTiles : 1;
    const uint32_t units = (k_tiles + align - 1) / align, splits = p.split_k;
    // floor(units * s / splits) as q * s + floor(r * s / splits), units = q * splits + r: r * s
    // stays below 65535^2.
    const uint32_t q = units / splits, r = units % splits;
    auto bound = [&](uint32_t s) { return int(q * s + r * s / splits); };
    w.kt_begin = min(k_tiles, bound(w.split) * align);
    w.kt_end = min(k_tiles, bound(w.split + 1) * align);
    w.n_kt = w.kt_end - w.kt_begin;
    w.n_raw = (w.n_kt + T::kSubs - 1) / T::kSubs;
    w.a_row = w.m0;
    w.a_batch = int(w.batch);
    const int64_t sp = sf_cols_padded(p.k);
    w.sfa_off = w.batch * sf_batch_bytes(p.m, sp) + int64_t(w.m0 / 128) * (sp / 4) * 512;
    w.sfb_off = w.batch * sf_batch_bytes(p.n, sp) + int64_t(w.n0 / 128) * (sp / 4) * 512;
    return w;
  }

  // ---- host side ----

  static int64_t tiles(const KernelArgs& a) {
    return int64_t((a.m + T::kBM - 1) / T::kBM) * ((a.n + T::kBN - 1) / T::kBN) * a.l;
  }

  // The counter region does not depend on the problem, so a reused workspace never holds an
  // earlier call's partials where this call's counters are.
  static constexpr int64_t kMaxSplitTiles = BSG_SM90_MAX_SPLIT_TILES;
  static constexpr size_t kCountersBytes = kMaxSplitTiles * 4;

  static bool cluster_reducible(const KernelArgs& a) {
    return T::kClusterReduce && !a.split_global && a.split_k > 1 && a.split_k <= kMaxClusterSplit;
  }

  // Split-K's counters and partials, then (kPreA) the decoded activations at a 1024-byte boundary,
  // never over the counter region: one workspace serves every config, and another config's
  // split-K launch needs its counters still zero.
  static size_t split_bytes(const KernelArgs& a) {
    if (a.split_k <= 1 || cluster_reducible(a)) return 0;
    // A CTA's partial tile as SplitKGlobal stores it: kAcc floats a compute thread.
    return kCountersBytes + size_t(a.split_k) * size_t(tiles(a)) * T::kAcc * kThreads * sizeof(float);
  }
  static int64_t k_pad(const KernelArgs& a) { return (int64_t(a.k) + kBK - 1) / kBK * kBK; }
  // Rows a batch of the decoded activations: M rounded up to the tile's, so no TMA box of them
  // reaches past the buffer (predecode.cuh).
  static int64_t m_pad(const KernelArgs& a) { return (int64_t(a.m) + T::kBM - 1) / T::kBM * T::kBM; }
  static size_t pre_a_offset(const KernelArgs& a) { return (std::max(split_bytes(a), kCountersBytes) + 1023) / 1024 * 1024; }
  // With `rows` decoded rows a batch: the dense GEMM's m_pad, the grouped pre-pass's stacked rows.
  static size_t workspace_size(const KernelArgs& a, int64_t rows) {
    if (!T::kPreA) return split_bytes(a);
    return pre_a_offset(a) + size_t(a.l) * size_t(rows) * size_t(k_pad(a)) * 2;
  }
  static size_t workspace_size(const KernelArgs& a) { return workspace_size(a, m_pad(a)); }
};

}  // namespace bsg::sm90
