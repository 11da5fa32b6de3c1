// SM90 collective main loop, MainloopSwappedRegisterDecode: D^T = B A^T. The weights (B) are
// decoded from the raw stage straight into wgmma register fragments (RS wgmma); the activations
// come pre-decoded to FP16 (or, dense, re-ordered: W4A16) through TMA (predecode.cuh); the weights
// are decoded to the activations' type. A producer warpgroup issues the raw
// stages; the two compute warpgroups take turns at the tensor cores (ping-pong), each decoding
// its next turn's weights while the other's wgmma runs.
#pragma once

#include "common/nvfp4.cuh"
#include "common/ptx.cuh"
#include "common/scale_layout.cuh"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"
#include "sm90/dispatch_policy.cuh"
#include "sm90/raw_pipeline.cuh"

namespace bsg::sm90 {

template <class T>
struct CollectiveMainloop;

template <int BM, int BN, class Act>
struct CollectiveMainloop<Tile<BM, BN, MainloopSwappedRegisterDecode, Act>> {
  using T = Tile<BM, BN, MainloopSwappedRegisterDecode, Act>;
  using E = typename T::MmaElement;
  static_assert(T::kPreA, "the swapped tile takes pre-decoded activations");
  static constexpr bool kProducerWarpgroup = true;

  // The producer warpgroup: gives up its registers; one thread issues every raw stage, each refill
  // once the compute threads have released its slot. The first stage's weights go out while the
  // pre-pass may still run (its activations are complete past griddep_wait), and the first stage
  // alone: the next ones once it has landed, so it does not wait behind their bytes. Stages 1 ..
  // prefetch - 1 are asked into L2 meanwhile, which costs the first stage less than it saves.
  // prefetch < 0: nothing before the wait (the kernel before may be any kernel, not the pre-pass
  // that only follows its own predecessor's completion, and may have written the weights).
  __device__ __forceinline__ static void produce(const RawPipeline<T>& pipe, const TileWork& w, int tid, int prefetch = 0) {
    cutlass::arch::warpgroup_reg_dealloc<40>();
    if (tid == kThreads) {
      int r = 0;
      if (w.n_raw > 0) {
        // One branch per path rather than copy masks chosen at run time, so the usual path's
        // first stage is the code it had before the decoded path (bench/DESIGN.md §3).
        if (prefetch >= 0) {
          pipe.issue(0, kIssueB);
          for (r = 1; r < min(w.n_raw, prefetch); ++r) pipe.prefetch_b(r);
          griddep_wait();
          pipe.issue(0, kIssueA);
        } else {
          griddep_wait();
          pipe.issue(0);
        }
        pipe.wait(0);
        for (r = 1; r < min(T::kRawStages, w.n_raw); ++r) pipe.issue(r);
      }
      for (; r < w.n_raw; ++r) {
        if (r >= T::kRawStages) pipe.wait_empty(r);
        pipe.issue(r);
      }
    }
  }

  // The compute warpgroups take the producer's registers.
  __device__ __forceinline__ static void consumer_start() { cutlass::arch::warpgroup_reg_alloc<232>(); }

  template <class Mma, class Acc>
  __device__ __forceinline__ static void run(const RawPipeline<T>& pipe, const TileWork& w, uint8_t* raw, void* decA, Mma& mma, Acc& acc,
                                             int tid) {
    constexpr int kBM = BM;
    const int n_kt = w.n_kt;
    BSG_TRACE_INIT
    auto wg_mma = mma.get_slice((tid / 128) * 128);
    Tensor sA = make_tensor(make_smem_ptr(static_cast<E*>(decA)), typename T::SmemLayoutA{});
    // Each warpgroup owns kMB 64-row M blocks of weights. Within each k-tile, thread c of an MMA
    // quad holds K positions 2c, 2c + 1, 2c + 8, 2c + 9 of the four 16-K MMA steps; they are taken
    // to be the 16 values of scale group c (one 8-byte load and one scale per row), in the order
    // decode8 gives them: step s holds the group's values 4s, 4s + 2 at 2c, 2c + 1 and 4s + 1,
    // 4s + 3 at 2c + 8, 2c + 9. The pre-pass writes the activations in the same order, so every
    // product still pairs equal K and each wgmma sums the same 16 products.
    Tensor tCrB = wg_mma.make_fragment_B(wg_mma.partition_B(sA));  // (MMA, MMA_N, MMA_K, bufs)
    constexpr int kTurn = T::kTurn;
    // (MMA values, M blocks, steps, k-tiles of a turn), compact.
    using FragLayout = Layout<Shape<Shape<_2, _2, _2>, Int<T::kMB>, _4, Int<kTurn>>>;
    // Weights: this thread's rows r, r + 8 (fragment values 0 and 2) of M block 0, and (kMB = 2)
    // 128 rows further of block 1 (the RS atom's A layout, two warpgroups along M), so every row's
    // raw bytes and scale lie at constant offsets from the first's (r % 32 + 8 < 32).
    const int w_row = (tid / 128) * 64 + ((tid % 128) / 32) * 16 + (tid % 32) / 4;
    const int w_raw = T::kRawA + w_row * (T::kRawK / 2) + 8 * (tid % 4);
    const int w_sf = T::kSfB + sf_in_chunk(w_row, tid % 4);
    // M block mb of k-tile i into the turn's k-tile t. One call per block: a loop over both blocks
    // scheduled worse.
    auto decode_w = [&](int i, auto& frag, int mb, int t) {
      if constexpr ((BSG_SM90_ABLATE & 1) != 0) return;
      const uint8_t* base = raw + ((i / T::kSubs) % T::kRawStages) * T::kRawBytes;
      const int sub = i % T::kSubs;
      auto regs = recast<uint32_t>(frag);  // register (pair + 2 hi + 4 block + 4 kMB step + 16 kMB t)
      CUTE_UNROLL
      for (int h = 0; h < 2; ++h) {
        const uint2 q = *reinterpret_cast<const uint2*>(base + w_raw + (8 * h + 128 * mb) * (T::kRawK / 2) + sub * 32);
        const uint8_t sf_byte = base[w_sf + 8 * h * 16 + mb * T::kSfStage + sub * 512];
        const uint32_t sf = e4m3x2_to_f16x2(sf_byte);  // low half
        uint4 v0, v1;
        if constexpr (std::is_same_v<E, bfloat16_t>) {
          const uint32_t s = decode8_bf16_scale(sf_byte);
          v0 = decode8_bf16(q.x, s);
          v1 = decode8_bf16(q.y, s);
        } else if constexpr (T::kWScaleLow) {
          v0 = decode8<true>(q.x, sf);
          v1 = decode8<true>(q.y, sf);
        } else {
          const uint32_t sc = decode8_scales(sf), s = __byte_perm(sc, sc, 0x1010);
          v0 = decode8(q.x, s);
          v1 = decode8(q.y, s);
        }
        const uint32_t v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
        CUTE_UNROLL
        for (int st = 0; st < 4; ++st) {
          regs(h + 4 * mb + 4 * T::kMB * st + 16 * T::kMB * t) = v[2 * st];          // K 2c, 2c + 1
          regs(h + 2 + 4 * mb + 4 * T::kMB * st + 16 * T::kMB * t) = v[2 * st + 1];  // K 2c + 8, 2c + 9
        }
      }
    };
    // Ping-pong: named barrier 2 passes the turn to warpgroup 1, 3 back to warpgroup 0. Weights
    // are decoded one turn ahead into the other set of fragments (a wgmma reads its register
    // operand until it completes). Every compute thread arrives on a slot's "empty" barrier once
    // its wgmma of the slot's last k-tile has completed.
    const int wg = tid / 128;
    Tensor frag0 = make_tensor<E>(FragLayout{});
    Tensor frag1 = make_tensor<E>(FragLayout{});
    // Decodes k-tiles j .. j + kTurn - 1 (those below n_kt), waiting for each raw stage first.
    auto decode_turn = [&](int j, auto& f) {
      CUTE_UNROLL
      for (int t = 0; t < kTurn; ++t) {
        if (t == 0 || j + t < n_kt) {
          if ((j + t) % T::kSubs == 0) pipe.wait((j + t) / T::kSubs);
          decode_w(j + t, f, 0, t);
          if constexpr (T::kMB == 2) decode_w(j + t, f, 1, t);
        }
      }
    };
    if (n_kt > 0) decode_turn(0, frag0);
    stamp(1);
    auto step = [&](int i, auto& cur, auto& next) {
      BSG_TRACE(i / kTurn, 0);
      if (wg == 0) {
        if (i > 0) asm volatile("bar.sync 3, %0;\n" ::"n"(kThreads) : "memory");
      } else {
        asm volatile("bar.sync 2, %0;\n" ::"n"(kThreads) : "memory");
      }
      warpgroup_fence_operand(acc);
      warpgroup_fence_operand(cur);
      warpgroup_arrive();
      CUTE_UNROLL
      for (int t = 0; t < kTurn; ++t) {
        if (t == 0 || i + t < n_kt) {
          CUTE_UNROLL
          for (int kb = 0; kb < 4; ++kb) {
            if constexpr ((BSG_SM90_ABLATE & 2) == 0) cute::gemm(mma, cur(_, _, kb, t), tCrB(_, _, kb, (i + t) % T::kDecBufs), acc);
          }
        }
      }
      warpgroup_commit_batch();
      if (wg == 0) asm volatile("bar.arrive 2, %0;\n" ::"n"(kThreads) : "memory");
      else if (i + kTurn < n_kt) asm volatile("bar.arrive 3, %0;\n" ::"n"(kThreads) : "memory");
      BSG_TRACE(i / kTurn, 1);
      if (i + kTurn < n_kt) decode_turn(i + kTurn, next);
      BSG_TRACE(i / kTurn, 2);
      warpgroup_wait<0>();
      BSG_TRACE(i / kTurn, 3);
      warpgroup_fence_operand(acc);
      warpgroup_fence_operand(cur);
      BSG_TRACE(i / kTurn, 4);
      CUTE_UNROLL
      for (int t = 0; t < kTurn; ++t) pipe.release_after(i + t);
      BSG_TRACE(i / kTurn, 5);
    };
    for (int i = 0; i < n_kt; i += 2 * kTurn) {
      step(i, frag0, frag1);
      if (i + kTurn < n_kt) step(i + kTurn, frag1, frag0);
    }
    asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory");  // both warpgroups' wgmma done: the epilogue reuses the buffers
    if constexpr (T::kWUnscale != 1.f) {
      CUTE_UNROLL
      for (int i = 0; i < size(acc); ++i) acc(i) *= T::kWUnscale;  // the weights' 2^-6 or 2^-7
    }
    (void)kBM;
  }
};

}  // namespace bsg::sm90
