// SM90 collective main loop, MainloopSmemDecode: both operands decoded from the raw stage into
// 128B-swizzled FP16 buffers, the next k-tile while the SS wgmma runs on this one. Thread 0
// issues the raw stages, behind its own wgmma.
#pragma once

#include "common/nvfp4.cuh"
#include "common/ptx.cuh"
#include "common/scale_layout.cuh"
#include "cutlass/arch/barrier.h"
#include "sm90/dispatch_policy.cuh"
#include "sm90/raw_pipeline.cuh"

namespace bsg::sm90 {

template <class T>
struct CollectiveMainloop;

// One operand's share of a k-tile for one thread: `kRows` rows of 32 packed bytes, two 16-byte
// halves each; units u = tid + j * kThreads map to (row u / 2, half u % 2).
template <class T, int kRows>
struct Operand {
  static constexpr int kUnits = (kRows * 2 + kThreads - 1) / kThreads;
  // Every unit of every thread is a real one: no per-unit branch, which would keep the compiler
  // from interleaving the units' decode chains.
  static constexpr bool kAllActive = kRows * 2 % kThreads == 0;
  int raw_off[kUnits];             // the unit's 16 bytes in a raw stage (add 32 for the 2nd k-tile)
  int sf_off[kUnits];              // the row's scale pair in the stage's scales (add 512 likewise)
  uint32_t dec_off[kUnits][4];     // swizzled byte offsets of the 4 output chunks
  bool active[kUnits];

  __device__ void init(int row_in_block0, int tid) {
    CUTE_UNROLL
    for (int j = 0; j < kUnits; ++j) {
      const int u = tid + j * kThreads, r = u / 2, h = u % 2;
      active[j] = u < kRows * 2;
      raw_off[j] = r * (T::kRawK / 2) + h * 16;
      const int in_block = row_in_block0 + r;  // row within the operand's 128-row scale chunks
      sf_off[j] = (in_block / 128) * (T::kSubs * 512) + sf_in_chunk(in_block % 128, 2 * h);
      CUTE_UNROLL
      for (int c = 0; c < 4; ++c) dec_off[j][c] = sw128_offset(r, h * 4 + c);
    }
  }
};

// One thread's packed bytes and scale pairs of a k-tile, all loaded before any is decoded (the
// compiler cannot tell raw and decoded buffers apart, so a load after a store would wait for it).
template <int kUnits>
struct RawUnits {
  uint4 q[kUnits];
  uint32_t sf2[kUnits];

  // Unit j's 16 bytes (32 values) of k-tile `sub` of the stage and its row's two scales.
  template <class Op>
  __device__ __forceinline__ void load(const Op& op, const uint8_t* raw_rows, const uint8_t* raw_sf, int sub) {
    CUTE_UNROLL
    for (int j = 0; j < kUnits; ++j) {
      if (!Op::kAllActive && !op.active[j]) continue;
      q[j] = *reinterpret_cast<const uint4*>(raw_rows + op.raw_off[j] + sub * 32);
      sf2[j] = *reinterpret_cast<const uint16_t*>(raw_sf + op.sf_off[j] + sub * 512);
    }
  }

  // a * sf in FP16, into the swizzled buffer `dec`.
  template <class Op>
  __device__ __forceinline__ void store(const Op& op, uint8_t* dec) const {
    CUTE_UNROLL
    for (int j = 0; j < kUnits; ++j) {
      if (!Op::kAllActive && !op.active[j]) continue;
      const uint32_t sc = decode8_scales(e4m3x2_to_f16x2(sf2[j]));  // the row's two scales
      const uint32_t s0 = __byte_perm(sc, sc, 0x1010), s1 = __byte_perm(sc, sc, 0x3232);
      *reinterpret_cast<uint4*>(dec + op.dec_off[j][0]) = decode8(q[j].x, s0);
      *reinterpret_cast<uint4*>(dec + op.dec_off[j][1]) = decode8(q[j].y, s0);
      *reinterpret_cast<uint4*>(dec + op.dec_off[j][2]) = decode8(q[j].z, s1);
      *reinterpret_cast<uint4*>(dec + op.dec_off[j][3]) = decode8(q[j].w, s1);
    }
  }
};

template <int BM, int BN>
struct CollectiveMainloop<Tile<BM, BN, MainloopSmemDecode>> {
  using T = Tile<BM, BN, MainloopSmemDecode>;
  static constexpr bool kProducerWarpgroup = false;

  // Thread 0, before the main loop: the first stages.
  __device__ __forceinline__ static void prologue(const RawPipeline<T>& pipe, const TileWork& w) {
    for (int r = 0; r < min(T::kRawStages, w.n_raw); ++r) pipe.issue(r);
  }

  template <class Mma, class Acc>
  __device__ __forceinline__ static void run(const RawPipeline<T>& pipe, const TileWork& w, uint8_t* raw, half_t* decA, half_t* decB,
                                             Mma& mma, Acc& acc, int tid) {
    constexpr int kBM = BM;
    const int n_kt = w.n_kt;
    BSG_TRACE_INIT
    Operand<T, kBM> opA;
    Operand<T, BN> opB;
    opA.init(0, tid);
    opB.init(w.n0 % 128, tid);
    // Decode MMA k-tile i of this split into FP16 buffer `buf`.
    auto decode = [&](int i, int buf) {
      if constexpr ((BSG_SM90_ABLATE & 1) != 0) return;
      const uint8_t* base = raw + ((i / T::kSubs) % T::kRawStages) * T::kRawBytes;
      const int sub = i % T::kSubs;
      RawUnits<Operand<T, kBM>::kUnits> ra;
      RawUnits<Operand<T, BN>::kUnits> rb;
      uint8_t* dec_a = reinterpret_cast<uint8_t*>(decA) + buf * (kBM * kBK * 2);
      uint8_t* dec_b = reinterpret_cast<uint8_t*>(decB) + buf * (BN * kBK * 2);
      if constexpr ((BSG_SM90_ABLATE & 16) == 0) ra.load(opA, base, base + T::kRawA + T::kRawB, sub);
      rb.load(opB, base + T::kRawA, base + T::kSfB, sub);
      if constexpr ((BSG_SM90_ABLATE & 16) == 0) ra.store(opA, dec_a);
      rb.store(opB, dec_b);
    };
    auto wg_mma = mma.get_slice((tid / 128) * 128);
    Tensor sA = make_tensor(make_smem_ptr(decA), typename T::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(decB), typename T::SmemLayoutB{});
    Tensor tCrA = wg_mma.make_fragment_A(wg_mma.partition_A(sA));  // (MMA, MMA_M, MMA_K, 2)
    Tensor tCrB = wg_mma.make_fragment_B(wg_mma.partition_B(sB));

    // The next k-tile is decoded while the wgmma runs on this one (two buffers).
    constexpr int kAhead = T::kDecBufs - 1;
    static_assert(kAhead == 1, "unswapped tiles: two decoded buffers");
    for (int j = 0; j < kAhead && j < n_kt; ++j) {
      if (j % T::kSubs == 0) pipe.wait(j / T::kSubs);
      decode(j, j);
    }
    cutlass::arch::fence_view_async_shared();  // generic-proxy stores, read next by wgmma
    __syncthreads();
    for (int j = 0; j < kAhead; ++j) {
      if (tid == 0 && pipe.stage_done(j)) pipe.issue(j / T::kSubs + T::kRawStages);
    }
    stamp(1);
    for (int i = 0; i < n_kt; ++i) {
      const int buf = i % T::kDecBufs;
      BSG_TRACE(i, 0);
      warpgroup_fence_operand(acc);
      warpgroup_arrive();
      CUTE_UNROLL
      for (int kb = 0; kb < size<2>(tCrA); ++kb) {
        if constexpr ((BSG_SM90_ABLATE & 2) == 0) cute::gemm(mma, tCrA(_, _, kb, buf), tCrB(_, _, kb, buf), acc);
      }
      warpgroup_commit_batch();
      // Thread 0 refills the slot the previous k-tile finished, behind its wgmma issue rather than
      // ahead of it: issuing a stage stalls the issuing warp, and the warpgroup's wgmma waits for
      // all its warps.
      if (tid == 0 && i > 0 && pipe.stage_done(i - 1 + kAhead)) pipe.issue((i - 1 + kAhead) / T::kSubs + T::kRawStages);
      BSG_TRACE(i, 1);
      const int j = i + kAhead;
      if (j < n_kt) {  // decode a later k-tile while the tensor cores work
        if (j % T::kSubs == 0) pipe.wait(j / T::kSubs);
        decode(j, j % T::kDecBufs);
        cutlass::arch::fence_view_async_shared();
      }
      BSG_TRACE(i, 2);
      warpgroup_wait<0>();
      BSG_TRACE(i, 3);
      warpgroup_fence_operand(acc);
      __syncthreads();
      BSG_TRACE(i, 4);
      BSG_TRACE(i, 5);
    }
  }
};

}  // namespace bsg::sm90
