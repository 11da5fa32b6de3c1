// The SM90 grouped (mixture-of-experts) kernels, wired from the parts of the dense ones over the
// grouped tile scheduler: the stream tiles' persistent kernel (kernel_stream.cuh's producer warp,
// main loop, warp-row sum and epilogue once per work item), and for the swapped tiles the
// activation pre-pass over the experts' rows and kernel.cuh's swapped kernel, one CTA per item.
// Each item covers an expert's whole K range (no split-K), so no reduction runs and the tile's
// sums are the per-group GEMM's own.
#pragma once

#include <cuda.h>

#include <algorithm>
#include <climits>
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
#include "sm90/tensormap.cuh"
#include "sm90/tile_scheduler_grouped.cuh"
#include "sm90/tile_scheduler_list.cuh"

namespace bsg::sm90 {

// Item w as its epilogue sees it: D is not batched. The MoE scheduler's items carry their expert
// in w.batch (the weights' batch) and its epilogue_params point D at the expert's rows; the list
// form's items have batch 0 already.
__device__ __forceinline__ TileWork epilogue_work(TileWork w) {
  w.batch = 0;
  return w;
}

// The persistent stream kernel's dynamic shared memory: the raw ring and, where they fit beside
// it (with the scheduler's table and the barriers), the warp-row slabs, the epilogue tile being
// slab 0. Apart, the producer fills the next item's stages while an item's sums and epilogue
// run; over the ring, it waits for them at each item's end. kEpilogueWarp: the sums and the
// epilogue run on a warp of their own while the compute warps decode the next item; taken by
// the short-K tiles (short items, where the per-item work weighs most), not by the long-stage
// ones, which it made 1-4.5 % slower (bench/DESIGN.md §14).
template <class T, class Sched>
struct GroupedStreamSmem {
  static constexpr int kRing = T::kRawStages * T::kRawBytes;
  static constexpr int kApartBytes = 1024 + kRing + T::kWk * T::kSlab;  // 1024: swizzle alignment
  static constexpr bool kApart = kApartBytes + int(sizeof(typename Sched::Shared)) + 1024 <= kMaxCtaSmem;
  static constexpr int kBytes = !kApart ? T::kSmem : kApartBytes > kOneCtaPerSmSmem ? kApartBytes : kOneCtaPerSmSmem;
  static constexpr bool kEpilogueWarp = kApart && T::kShortK;
};

// A grouped kernel's dynamic shared memory and threads (the stream tiles' epilogue warp, where
// they have one, after the producer warp).
template <class T, class Sched>
constexpr int grouped_smem() {
  if constexpr (T::kPreA) return T::kSmem;
  else return GroupedStreamSmem<T, Sched>::kBytes;
}
template <class T, class Sched>
constexpr int grouped_threads() {
  if constexpr (T::kPreA) return T::kLaunchThreads;
  else return T::kLaunchThreads + (GroupedStreamSmem<T, Sched>::kEpilogueWarp ? 32 : 0);
}
// A grouped launch's CTAs for at most max_items work items: the swapped tiles one an item; the
// stream tiles' persistent CTAs one an SM, fewer where there are fewer items, and at most 4096
// whatever SM count the caller passed (their item loops step by gridDim.x in int).
template <class T>
inline int64_t grouped_grid(int64_t max_items, int sm_count) {
  constexpr int64_t kMaxPersistentCtas = 4096;
  if constexpr (T::kPreA) return max_items;
  else return std::max<int64_t>(1, std::min<int64_t>({int64_t(sm_count), max_items, kMaxPersistentCtas}));
}

// The slab handoff's mbarrier arrive and wait: CUTLASS's order memory in hardware (release,
// acquire) but are no compiler barriers, and the slabs are plain shared-memory accesses.
__device__ __forceinline__ void slab_arrive(uint64_t* bar) {
  asm volatile("" ::: "memory");
  cutlass::arch::ClusterBarrier::arrive(bar);
}
__device__ __forceinline__ void slab_wait(uint64_t* bar, uint32_t parity) {
  cutlass::arch::ClusterBarrier::wait(bar, parity);
  asm volatile("" ::: "memory");
}

// Roles: compute warps (tid < kThreads) run the main loop of each of the CTA's items; the producer
// warp (the next 32) fills the ring; with kEpilogueWarp, the last warp sums each item's warp-row
// slabs and writes the item out while the compute warps decode the next. The slabs are one
// buffer: the compute warps store an item's slabs once the epilogue warp has read the previous
// item's (slab_bar[1], the only wait left them at an item's end), and it starts on them once all
// have (slab_bar[0]).
template <class T, class OutT, class Sched>
__global__ void __launch_bounds__(grouped_threads<T, Sched>(), 1) grouped_stream_kernel(const __grid_constant__ typename Sched::Args args) {
  using Mainloop = CollectiveMainloop<T>;
  using Smem = GroupedStreamSmem<T, Sched>;
  __shared__ typename Sched::Shared sched;
  __shared__ uint64_t full_bar[T::kRawStages];
  __shared__ uint64_t empty_bar[T::kRawStages];
  __shared__ uint64_t slab_bar[2];  // [0]: every compute thread stored its slab; [1]: the epilogue warp read them
  uint8_t* ring = aligned_smem();
  uint8_t* slabs = Smem::kApart ? ring + Smem::kRing : ring;
  const int tid = threadIdx.x;
  // One ring for all of the CTA's items: its barriers' phases run on from item to item.
  if (tid == 0) {
    init_ring_barriers<T>(full_bar, empty_bar);
    if constexpr (Smem::kEpilogueWarp) {
      cutlass::arch::ClusterBarrier::init(&slab_bar[0], kThreads);
      cutlass::arch::ClusterBarrier::init(&slab_bar[1], 32);
      cutlass::arch::fence_barrier_init();
    }
  }
  // The offsets or sizes, like every operand, may be the previous kernel's output.
  griddep_wait();
  Sched::prepare(args, sched, tid);  // ends with a CTA barrier, which publishes the barriers too
  // The rows no item writes, where the launch asks: the compute threads of every CTA, while the
  // producer issues the first loads. Here rather than after the items, where it changed the item
  // loop's code (bench/DESIGN.md §14).
  if (tid < kThreads) Sched::zero_uncovered(args, sched, int64_t(blockIdx.x) * kThreads + tid, int64_t(gridDim.x) * kThreads);
  // Stages ahead of arrival: two where each CTA takes at most two items (few tokens: the first
  // stages' order decides), the ring full where CTAs stream item after item (bench/DESIGN.md §12).
  const int ahead = Sched::total(sched) <= 2 * int(gridDim.x) ? Mainloop::kLoadsAhead : T::kRawStages;
  int base = 0;  // ring stages of the items before
  int n = 0;     // the CTA's items before
  for (int item = blockIdx.x; item < Sched::total(sched); item += gridDim.x, ++n) {
    const TileWork w = Sched::work(args, sched, item);
    if (tid >= kThreads + 32) {
      if constexpr (Smem::kEpilogueWarp) {
        // Its global reads (the expert's or group's alpha, D's address) while the slabs are stored.
        const Params pe = Sched::template epilogue_params<OutT>(args, sched, w);
        slab_wait(&slab_bar[0], n & 1);
        float* tile_s = Mainloop::sum_slabs_in_place(slabs, tid % 32);
        Epilogue<T, OutT, ReduceGlobal, EpilogueWarp>::run(pe, epilogue_work(w), tile_s, tid % 32);
        slab_arrive(&slab_bar[1]);
      }
      continue;
    }
    // Every stage is released for a refill, by this item or a later one (the CTA's last
    // kRawStages releases are arrivals nobody waits for).
    const RawPipeline<T> pipe(Sched::load_params(args, sched, w), w, full_bar, empty_bar, ring, ring, Sched::map_a(args, w),
                              Sched::map_b(args, w), base, INT_MAX);
    if (tid >= kThreads) {
      Sched::acquire(args, w);
      Mainloop::produce(pipe, w, tid, ahead);
    } else {
      float acc[T::kRW][T::kNT][4] = {};
      Mainloop::run(pipe, w, ring, acc, tid);
      if constexpr (Smem::kEpilogueWarp) {
        if (n > 0) slab_wait(&slab_bar[1], (n - 1) & 1);
        Mainloop::store_slab(acc, slabs, tid);
        slab_arrive(&slab_bar[0]);
      } else {
        Units<T::kAcc> u;
        Mainloop::sum_warp_rows(acc, slabs, u.v, tid);  // its first compute barrier: every thread is past the last epilogue
        float* tile_s = Mainloop::store_units(u.v, slabs, tid);
        const Params pe = Sched::template epilogue_params<OutT>(args, sched, w);
        Epilogue<T, OutT, ReduceGlobal>::run(pe, epilogue_work(w), tile_s, tid);
      }
    }
    base += w.n_raw;
    static_assert(!Smem::kEpilogueWarp || Smem::kApart, "the epilogue warp's `continue` skips the barrier below");
    if constexpr (!Smem::kApart) {
      // The slabs and the epilogue tile overlay the raw stages that the next item's TMA loads
      // fill: order these generic-proxy accesses before them.
      cutlass::arch::fence_view_async_shared();
      __syncthreads();
    }
  }
}

// The swapped tiles' pre-pass over the stacked rows: row r decoded with its scales at its
// expert's place in the MoE scale layout; rows no expert holds decode to zeros (no tile reads
// them into an output row), and where the launch asks their rows of D are written as zeros. Its
// first CTA also stores the walk over the experts for the grouped kernel's CTAs.
template <class T>
__global__ void __launch_bounds__(kPreThreads) predecode_a_grouped(const __grid_constant__ GroupedParams gp, uint4* out) {
  using Sched = GroupedTileScheduler<T>;
  __shared__ typename Sched::Shared sched;
  griddep_wait();
  griddep_launch_dependents();
  Sched::walk(gp, sched, threadIdx.x);
  if (blockIdx.x == 0) Sched::store_walk(gp, sched, threadIdx.x);
  const Params& p = gp.base;
  const int kb_n = (p.k + 63) / 64;
  const int64_t sp = sf_cols_padded(p.k);
  for_items(int64_t(p.m) * kb_n * 2, [&](auto idx) {
    using I = decltype(idx);
    const int row = int(idx / 2 / I(kb_n));
    const int e = sched.rows.expert_of_row(gp.experts, row);
    const int sr = e < 0 ? 0 : sched.rows.sf_row[e] + row - sched.rows.row[e];
    const uint8_t* sf_rows = e < 0 ? nullptr : p.sfa + int64_t(sr / 128) * (sp / 4) * 512;
    predecode_item(p.a + int64_t(row) * (p.k / 2), sf_rows, sr % 128, out + int64_t(row) * kb_n * 8, int((idx / 2) % I(kb_n)), int(idx % 2), p.k);
  });
  Sched::zero_uncovered(gp, sched, int64_t(blockIdx.x) * blockDim.x + threadIdx.x, int64_t(gridDim.x) * blockDim.x);
}

// W4A16's swapped tiles' pre-pass: the dense re-order of the T stacked rows (rows no expert holds
// are re-ordered and never read), its first CTA also storing the walk over the experts; where the
// launch asks for D's rows no expert covers as zeros, every CTA walks the rows and writes a part.
template <class T>
__global__ void __launch_bounds__(kPreThreads) reorder_a_grouped(const __grid_constant__ GroupedParams gp, const uint16_t* a, uint4* out) {
  using Sched = GroupedTileScheduler<T>;
  __shared__ typename Sched::Shared sched;
  griddep_wait();
  griddep_launch_dependents();
  if (blockIdx.x == 0 || gp.d_row_units != 0) Sched::walk(gp, sched, threadIdx.x);
  if (blockIdx.x == 0) Sched::store_walk(gp, sched, threadIdx.x);
  reorder_rows(a, out, gp.base.m, gp.base.m, gp.base.k, 1);
  Sched::zero_uncovered(gp, sched, int64_t(blockIdx.x) * blockDim.x + threadIdx.x, int64_t(gridDim.x) * blockDim.x);
}

// The swapped tiles: CTA blockIdx.x takes item blockIdx.x (the grid holds any routing's items;
// CTAs past this routing's exit at once), as gemm_kernel takes its tile at split 1.
template <class T, class OutT, class Sched>
__global__ void __launch_bounds__(T::kLaunchThreads, T::kMinBlocks) grouped_gemm_kernel(const __grid_constant__ typename Sched::Args args) {
  using Mainloop = CollectiveMainloop<T>;
  static_assert(T::kPreA && Mainloop::kProducerWarpgroup, "grouped_gemm_kernel: the swapped tiles");
  __shared__ typename Sched::Shared sched;
  uint8_t* smem = aligned_smem();
  half_t* decA = reinterpret_cast<half_t*>(smem);
  uint8_t* raw = smem + T::kDecA + T::kDecB;
  const int tid = threadIdx.x;
  // The walk over the groups is the pre-pass's output (and the routing it read may be the kernel
  // before it's): wait for the pre-pass to complete before reading it.
  griddep_wait();
  Sched::prepare(args, sched, tid);
  if (int(blockIdx.x) >= Sched::total(sched)) return;
  const TileWork w = Sched::work(args, sched, int(blockIdx.x));
  const RawPipeline<T> pipe =
      start_pipeline<T>(Sched::load_params(args, sched, w), w, raw, decA, Sched::map_a(args, w), Sched::map_b(args, w), tid);
  if (tid >= kThreads) {
    Sched::acquire(args, w);
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
  const Params pe = Sched::template epilogue_params<OutT>(args, sched, w);
  Epilogue<T, OutT, ReduceGlobal>::run(pe, epilogue_work(w), tile_s, tid);
}

// The list form's prologue: thread g of the grid makes group g's descriptors, where the group has
// tiles (A: its packed rows, or for the swapped tiles its decoded rows in the workspace; B: its
// packed rows) from the host's templates; then, for the swapped tiles, the grid decodes every
// such group's activations into its rows of the workspace (a row's 64-K blocks past its group's K
// are neither written nor read). Only the swapped tiles need the scheduler's walk over all groups
// (a group's rows start at the sum of the rows before it, and the row bound may cut it), which the
// first CTA also stores for the grouped kernel's CTAs; the stream tiles' thread g decides from
// group g alone, so the descriptors follow one read.
template <class T>
__global__ void __launch_bounds__(kPreThreads) list_prologue(const __grid_constant__ ListParams lp, const __grid_constant__ CUtensorMap tmpl_a,
                                                             const __grid_constant__ CUtensorMap tmpl_b) {
  using Sched = ListTileScheduler<T>;
  __shared__ typename Sched::Shared sched;
  griddep_wait();
  griddep_launch_dependents();
  if constexpr (T::kPreA) {
    Sched::walk(typename Sched::Args{lp}, sched, threadIdx.x);
    if (blockIdx.x == 0) Sched::store_walk(lp, sched, threadIdx.x);
  }
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const ListGroup q = tid < lp.groups ? list_group(lp, int(tid)) : ListGroup{0, 0, 0, false};
  bool tiles;
  if constexpr (T::kPreA) tiles = tid < lp.groups && Sched::has_tiles(sched, int(tid));
  else tiles = Sched::has_rows(q);
  if (tiles) {
    const int g = int(tid);
    if constexpr (T::kPreA) {
      const int64_t k_pad = (q.k + kBK - 1) / kBK * kBK;
      make_tensormap(lp.maps + 2 * g, tmpl_a, lp.pre + int64_t(Sched::row0(sched, g)) * lp.pre_pitch, uint32_t(k_pad), uint32_t(q.m), lp.pre_pitch);
    } else {
      make_tensormap(lp.maps + 2 * g, tmpl_a, reinterpret_cast<const void*>(lp.a[g]), uint32_t(q.k / 2), uint32_t(q.m), uint64_t(q.k / 2));
    }
    make_tensormap_b(lp.maps + 2 * g + 1, tmpl_b, reinterpret_cast<const void*>(lp.b[g]), q.k, q.n, lp.b_chunked);
  }
  if constexpr (T::kPreA) {
    // Work items (row of `pre`, 64-K block of the longest K, parity) over the rows the groups with
    // tiles hold; a row belongs to the first group whose rows end past it.
    const int kb_n = int(lp.pre_pitch / 128);
    const int64_t items = sched.rows * kb_n * 2;
    for (int64_t idx = tid; idx < items; idx += int64_t(gridDim.x) * blockDim.x) {
      const int row = int(idx / 2 / kb_n), kb = int((idx / 2) % kb_n);
      const int g = first_exceeding(sched.row_end, lp.groups, row);
      if (!Sched::has_tiles(sched, g)) continue;
      const ListGroup q = list_group(lp, g);
      const int r = row - Sched::row0(sched, g);
      if (r >= q.m || kb * 64 >= q.k) continue;
      const int64_t sp = sf_cols_padded(q.k);
      const uint8_t* sfa = reinterpret_cast<const uint8_t*>(lp.sfa[g]) + int64_t(r / 128) * (sp / 4) * 512;
      predecode_item(reinterpret_cast<const uint8_t*>(lp.a[g]) + int64_t(r) * (q.k / 2), sfa, r % 128,
                     reinterpret_cast<uint4*>(lp.pre + int64_t(row) * lp.pre_pitch), kb, int(idx % 2), q.k);
    }
  }
}

// A grouped schedule's kernel: the persistent stream one or the swapped one.
template <class T, class OutT, class Sched>
inline constexpr auto grouped_kernel = [] {
  if constexpr (T::kPreA) return &grouped_gemm_kernel<T, OutT, Sched>;
  else return &grouped_stream_kernel<T, OutT, Sched>;
}();

}  // namespace bsg::sm90
