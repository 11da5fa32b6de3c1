// The SM90 main loops' loads: a ring of kRawStages raw stages in shared memory, each filled by one
// thread (TMA boxes of packed FP4 rows, kBoxesK along K, of 16-bit activations, pre-decoded or
// dense; bulk copies of the scale chunks) and completing on its "full" mbarrier; with producer warps, a stage
// is refilled once T::kEmptyArrivals compute threads have arrived on its "empty" mbarrier.
// A work item's stage r is stage base + r of the ring's sequence: a persistent kernel keeps one
// ring over its items (base: the stages of the items before), so the next item's stages land
// while an item ends. Stage s is released for a refill where one is due, s + kRawStages <
// refill_end (the end of the item's own stages, or of none where later items follow).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "blockscaled_gemm/kernel_abi.h"
#include "common/ptx.cuh"
#include "common/scale_layout.cuh"
#include "cutlass/arch/barrier.h"
#include "sm90/dispatch_policy.cuh"
#include "sm90/tile_scheduler.cuh"

namespace bsg::sm90 {

// The parts of a raw stage `issue` sends: B and its scales (and the barrier's transaction count),
// A (and, without kPreA, its scales). The swapped tiles issue B's before the pre-pass has ended.
constexpr int kIssueB = 1, kIssueA = 2;

// Thread 0, before the CTA barrier that publishes them: a ring's barriers.
template <class T>
__device__ __forceinline__ void init_ring_barriers(uint64_t* full, uint64_t* empty) {
  for (int s = 0; s < T::kRawStages; ++s) {
    cutlass::arch::ClusterTransactionBarrier::init(&full[s], 1);
    cutlass::arch::ClusterBarrier::init(&empty[s], T::kEmptyArrivals);
  }
  cutlass::arch::fence_barrier_init();
}

template <class T>
struct RawPipeline {
  uint64_t* full;   // [kRawStages] transaction barriers
  uint64_t* empty;  // [kRawStages] (producer warpgroup only) every compute thread arrives
  uint32_t raw_s, dec_a_s;
  const CUtensorMap* map_a;
  const CUtensorMap* map_b;
  const uint8_t* sfa_rows;
  const uint8_t* sfb_rows;
  int64_t sp;
  int sfb_chunks;
  bool b_chunked;  // B prepacked: its K coordinate is (byte in chunk, chunk)
  int base;        // the ring's stages before this item's first
  int refill_end;  // ring stages issued at most: stage s is released where s + kRawStages < refill_end
  const TileWork& w;

  // refill_end < 0: the item's own stages only (one item a CTA).
  __device__ __forceinline__ RawPipeline(const Params& p, const TileWork& work, uint64_t* full_bar, uint64_t* empty_bar, uint8_t* raw,
                                         void* dec_a, const CUtensorMap* ma, const CUtensorMap* mb, int ring_base = 0, int ring_refill_end = -1)
      : full(full_bar), empty(empty_bar), map_a(ma), map_b(mb), base(ring_base), refill_end(ring_refill_end < 0 ? ring_base + work.n_raw : ring_refill_end), w(work) {
    sp = sf_cols_padded(p.k);
    sfa_rows = T::Activation::kScaled ? p.sfa + w.sfa_off : nullptr;
    sfb_rows = p.sfb + w.sfb_off;
    sfb_chunks = min(T::kSfChunksB, (p.n + 127) / 128 - w.n0 / 128);  // 128-row blocks of B inside N
    b_chunked = p.b_chunked != 0;
    raw_s = static_cast<uint32_t>(__cvta_generic_to_shared(raw));
    dec_a_s = static_cast<uint32_t>(__cvta_generic_to_shared(dec_a));
  }


  // The first k-tile of raw stage r.
  __device__ __forceinline__ int stage_kt(int r) const { return w.kt_begin + T::kSubs * r; }
  // B's TMA coordinates of box x of k-tile kt. Standard: one chunk of the whole row. Prepacked:
  // the box lies inside one chunk (the scheduler starts K ranges at whole boxes).
  __device__ __forceinline__ int b_k_bytes(int kt, int x) const { return kt * (kBK / 2) + x * T::kBoxBytesK; }
  __device__ __forceinline__ int b_byte(int kt, int x) const {
    return b_chunked ? b_k_bytes(kt, x) % BSG_PREPACK_CHUNK_BYTES : b_k_bytes(kt, x);
  }
  __device__ __forceinline__ int b_chunk(int kt, int x) const { return b_chunked ? b_k_bytes(kt, x) / BSG_PREPACK_CHUNK_BYTES : 0; }
  // Scale chunk c (128 rows of B) of the stage from k-tile kt, and the bytes of one scale chunk
  // of that stage (512 a k-tile, fewer k-tiles in the range's last stage).
  __device__ __forceinline__ const uint8_t* sfb_stage(int kt, int c) const { return sfb_rows + c * (sp / 4) * 512 + int64_t(kt) * 512; }
  __device__ __forceinline__ uint32_t sf_stage_bytes(int kt) const { return min(T::kSubs, w.kt_end - kt) * 512; }

  // Raw stage r's weights and their scales into L2 only. The producer sends them before
  // griddepcontrol.wait, so the weights stream while the previous kernel ends; the stage's loads
  // still fetch them after the wait.
  __device__ __forceinline__ void prefetch_b(int r) const {
    if constexpr ((BSG_SM90_ABLATE & 4) == 0) {
      const int kt = stage_kt(r);
      for (int x = 0; x < T::kBoxesK; ++x) tma_prefetch_l2_4d(map_b, b_byte(kt, x), w.n0, b_chunk(kt, x), int(w.batch));
      for (int c = 0; c < sfb_chunks; ++c) bulk_prefetch_l2(sfb_stage(kt, c), sf_stage_bytes(kt));
    }
  }

  // Raw stage r (k-tiles kt_begin + T::kSubs r ...), the copies `what` names.
  __device__ __forceinline__ void issue(int r, int what = kIssueA | kIssueB) const {
    constexpr int kBM = T::kBM;
    const int slot = this->slot(r);
    const uint32_t bar = static_cast<uint32_t>(__cvta_generic_to_shared(&full[slot]));
    const uint32_t stage_s = raw_s + slot * T::kRawBytes;
    const int kt = stage_kt(r);
    const uint32_t sf_bytes = sf_stage_bytes(kt);
    // kPreA: every box of FP16 activations is whole (zero-filled by TMA past K_pad, the rows or
    // the batch; the dense pre-pass pads the rows itself).
    constexpr uint32_t kPreBytes = T::kPreA ? T::kSubs * kBM * kBK * 2 : 0;
    constexpr int kSfA = T::kPreA || !T::Activation::kScaled ? 0 : 1;
    const uint32_t bytes = kPreBytes + T::kRawA + T::kRawB + sf_bytes * (kSfA + sfb_chunks);
    if (what & kIssueB) cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&full[slot], bytes);
    if constexpr ((BSG_SM90_ABLATE & 4) == 0) {
      if (what & kIssueB) {
        for (int x = 0; x < T::kBoxesK; ++x)
          tma_load_4d(stage_s + T::kRawA + x * (T::kBN * T::kBoxBytesK), map_b, b_byte(kt, x), w.n0, b_chunk(kt, x), int(w.batch), bar);
        for (int c = 0; c < sfb_chunks; ++c) bulk_load(stage_s + T::kSfB + T::kSfStage * c, sfb_stage(kt, c), sf_bytes, bar);
      }
      if (what & kIssueA) {
        if constexpr (T::kPreA) {
          for (int s = 0; s < T::kSubs; ++s)
            tma_load_3d(dec_a_s + (slot * T::kSubs + s) * (kBM * kBK * 2), map_a, (kt + s) * kBK, w.a_row, w.a_batch, bar);
        } else if constexpr (T::Activation::kScaled) {
          for (int x = 0; x < T::kBoxesK; ++x)
            tma_load_3d(stage_s + x * (kBM * T::kBoxBytesK), map_a, kt * (kBK / 2) + x * T::kBoxBytesK, w.a_row, w.a_batch, bar);
          bulk_load(stage_s + T::kRawA + T::kRawB, sfa_rows + int64_t(kt) * 512, sf_bytes, bar);
        } else {
          // Dense 16-bit activations: one box of 64 values per k-tile (the map counts elements).
          for (int x = 0; x < T::kBoxesKA; ++x) tma_load_3d(stage_s + x * (kBM * T::kBoxBytesK), map_a, (kt + x) * kBK, w.a_row, w.a_batch, bar);
        }
      }
    } else if (what & kIssueB) {
      // Ablation: no loads; complete the transaction count without moving data.
      asm volatile("mbarrier.complete_tx.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes));
    }
  }

  // The ring slot of the item's raw stage r (r < 0: a stage of the items before; base + r >= 0).
  __device__ __forceinline__ int slot(int r) const { return (base + r) % T::kRawStages; }
  __device__ __forceinline__ void wait(int r) const {
    cutlass::arch::ClusterTransactionBarrier::wait(&full[slot(r)], ((base + r) / T::kRawStages) & 1);
  }
  // Whether raw stage r refills a slot (an earlier stage of the ring used it).
  __device__ __forceinline__ bool refills(int r) const { return base + r >= T::kRawStages; }
  __device__ __forceinline__ void wait_empty(int r) const {
    cutlass::arch::ClusterBarrier::wait(&empty[slot(r)], (((base + r) / T::kRawStages) - 1) & 1);
  }
  // Whether k-tile j is the last of its raw stage and a later stage is due in that slot.
  __device__ __forceinline__ bool stage_done(int j) const {
    return j < w.n_kt && (j % T::kSubs == T::kSubs - 1 || j == w.n_kt - 1) && base + j / T::kSubs + T::kRawStages < refill_end;
  }
  // One arrival per compute warp (T::kEmptyArrivals of 8): the warp is done with raw stage r.
  __device__ __forceinline__ void release_stage(int r) const {
    if (base + r + T::kRawStages < refill_end) cutlass::arch::ClusterBarrier::arrive(&empty[slot(r)]);
  }
  // Producer warps: this compute thread is done with k-tile j.
  __device__ __forceinline__ void release_after(int j) const {
    if (stage_done(j)) cutlass::arch::ClusterBarrier::arrive(&empty[slot(j / T::kSubs)]);
  }
};

// The kernel's dynamic shared memory from its first 1024-byte boundary (swizzle atoms and swizzled
// boxes), as pointer arithmetic on the __shared__ array so the compiler keeps shared-memory
// instructions.
__device__ __forceinline__ uint8_t* aligned_smem() {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t pad = (1024u - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u;
  return smem_raw + pad;
}

// Every kernel's start: the CTA's pipeline over `raw` (and `dec_a`) with its barriers initialized
// and published to all threads.
template <class T>
__device__ __forceinline__ RawPipeline<T> start_pipeline(const Params& p, const TileWork& w, uint8_t* raw, void* dec_a,
                                                         const CUtensorMap* map_a, const CUtensorMap* map_b, int tid) {
  __shared__ uint64_t full_bar[T::kRawStages];
  __shared__ uint64_t empty_bar[T::kRawStages];
  const RawPipeline<T> pipe(p, w, full_bar, empty_bar, raw, dec_a, map_a, map_b);
  if (tid == 0) init_ring_barriers<T>(full_bar, empty_bar);
  __syncthreads();
  return pipe;
}

}  // namespace bsg::sm90
