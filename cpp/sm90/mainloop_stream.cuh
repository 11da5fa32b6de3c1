// SM90 collective main loop, MainloopStream (small M: decode steps, MoE experts). The
// weights are the MMA's M: each warp decodes its rows of a k-tile from the raw stage straight into
// mma.sync m16n8k16 A fragments and its tokens' activations into B fragments, so nothing decoded
// is stored and no pre-pass runs. A stage holds kWk k-tiles, one per warp row (warps along K), and
// the warp rows' partial sums meet in shared memory after the loop (sum_warp_rows), in a fixed
// order.
#pragma once

#include "common/nvfp4.cuh"
#include "common/ptx.cuh"
#include "common/scale_layout.cuh"
#include "cute/config.hpp"
#include "sm90/dispatch_policy.cuh"
#include "sm90/raw_pipeline.cuh"

namespace bsg::sm90 {

template <class T>
struct CollectiveMainloop;

// The 8 packed bytes of scale group c (16 values) of k-tile `sub` (0..3 of a box) in row r of a
// raw box of 128-byte rows in the 128-byte swizzle (16-byte chunk j of row r at chunk j ^ (r % 8)):
// the eight rows g of an MMA fragment read eight distinct chunks. The swizzle of sw128_offset
// (common/ptx.cuh) with row * 128 written directly: through sw128_offset nvcc does not fold
// (r >> 3) * 1024 + (r & 7) * 128 and the stream kernels grow by ~130 instructions.
__device__ __forceinline__ uint32_t sw128_group(int r, int sub, int c) {
  return uint32_t(r * 128 + (((sub * 2 + (c >> 1)) ^ (r & 7)) << 4) + (c & 1) * 8);
}

// Thread (g, c) of an MMA fragment takes scale group c of its row: decoded as decode8<true>
// (value * sf * 2^-6 in FP16, exact), v[2 st] goes to MMA step st's K positions 2c, 2c + 1 and
// v[2 st + 1] to 2c + 8, 2c + 9. Both operands are decoded alike, so every product pairs equal K
// (the order of mainloop_swapped.cuh), and each product carries 2^-12, undone after the loop.
// E = bfloat16_t (W4A16 with bf16 activations): decode8_bf16, value * sf * 2^-7 exactly.
// kExact (FP16): value * sf * 2^-7 exactly too (decode8 with the scale times 2^-1), for bf16
// activations taken as FP16 (run<true>), whose products then equal the BF16 loop's.
template <class E = cute::half_t, bool kExact = false>
__device__ __forceinline__ void decode_group(const uint8_t* box, const uint8_t* sf_chunk, int r, int sub, int c, int sf_row,
                                             uint32_t (&v)[8]) {
  const uint2 q = *reinterpret_cast<const uint2*>(box + sw128_group(r, sub, c));
  const uint32_t sf = sf_chunk[sf_in_chunk(sf_row, c)];
  uint4 v0, v1;
  if constexpr (std::is_same_v<E, cute::bfloat16_t>) {
    const uint32_t s = decode8_bf16_scale(sf);
    v0 = decode8_bf16(q.x, s), v1 = decode8_bf16(q.y, s);
  } else if constexpr (kExact) {
    const uint32_t s = decode8_scales_bf16_sums(e4m3x2_to_f16x2(sf * 0x0101u));
    v0 = decode8(q.x, s), v1 = decode8(q.y, s);
  } else {
    const uint32_t s = e4m3x2_to_f16x2(sf);
    v0 = decode8<true>(q.x, s), v1 = decode8<true>(q.y, s);
  }
  v[0] = v0.x, v[1] = v0.y, v[2] = v0.z, v[3] = v0.w, v[4] = v1.x, v[5] = v1.y, v[6] = v1.z, v[7] = v1.w;
}

// Dense activations (W4A16): thread (g, c) takes the 16 values of group c (K 16c .. 16c + 15 of
// the k-tile; 16-byte chunks 2c and 2c + 1 of row r of a box of 128-byte rows, 128-byte swizzle)
// in decode8's order, so they pair with the weights as decode_group's do: v[2 st] = (4 st,
// 4 st + 2), v[2 st + 1] = (4 st + 1, 4 st + 3).
__device__ __forceinline__ void load_group_dense(const uint8_t* box, int r, int c, uint32_t (&v)[8]) {
  const uint4 lo = *reinterpret_cast<const uint4*>(box + r * 128 + (((2 * c) ^ (r & 7)) << 4));
  const uint4 hi = *reinterpret_cast<const uint4*>(box + r * 128 + (((2 * c + 1) ^ (r & 7)) << 4));
  const uint32_t q[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};  // values (2i, 2i + 1)
  CUTE_UNROLL
  for (int st = 0; st < 4; ++st) {
    v[2 * st] = __byte_perm(q[2 * st], q[2 * st + 1], 0x5410);
    v[2 * st + 1] = __byte_perm(q[2 * st], q[2 * st + 1], 0x7632);
  }
}

template <int BM, int BN, int kStageKTiles, class Act>
struct CollectiveMainloop<Tile<BM, BN, MainloopStream<kStageKTiles>, Act>> {
  using T = Tile<BM, BN, MainloopStream<kStageKTiles>, Act>;
  using E = typename T::MmaElement;
  static constexpr int kRW = T::kRW, kNT = T::kNT;
  static constexpr bool kProducerWarpgroup = true;  // a producer warp

  // Stages in flight at once where a CTA has one or two work items: issued together, a CTA's
  // stages share the bandwidth and land together, so the decode of the first waits for nearly
  // all of them; two at a time land in order and the decode of one overlaps the loads of the
  // next two. Where CTAs stream item after item (the persistent grouped kernels with many
  // items) the ring stays full (`ahead` = kRawStages: no wait beyond the slot's), which is
  // faster there (bench/DESIGN.md §12).
  static constexpr int kLoadsAhead = T::kRawStages < 2 ? T::kRawStages : 2;

  // bf16 activations on the 8-row tiles: where all of a CTA's activations are exact in FP16
  // (nvfp4.cuh, Bf16RangeAcc; the dense kernel checks them before its loop,
  // activations_fit_f16), run<true> takes them as FP16 and decodes the weights to FP16 (17
  // instructions for 8 weights against 20 to BF16); the products are the BF16 path's, each
  // exact in FP32. Only where the CTA holds one token row (kF16TestRows): the check's reads grow
  // with the rows, and from two rows on they cost more than the path saves at all but one shape
  // measured (bench/DESIGN.md §15); the grouped kernels keep
  // the BF16 path (a check per work item would sit on each item's start). One path a loop: both
  // in one loop, chosen per k-tile, ran 20-50 % slower than either (bench/DESIGN.md §15).
  static constexpr bool kBf16AsF16 = std::is_same_v<E, cute::bfloat16_t> && !Act::kScaled && kNT == 1;
  static constexpr int kF16TestRows = 1;

  // Whether this CTA's activations (rows m0 .. m0 + BM of A, its K range) are all exact in FP16:
  // every compute thread reads its share from global memory (the same for all CTAs of an output
  // row block and K range, so mostly from L2), while the producer's first stages are in flight,
  // and the compute threads AND their answers. Only where kBf16AsF16; after griddep_wait.
  __device__ __forceinline__ static bool activations_fit_f16(const Params& p, const TileWork& w, int tid) {
    Bf16RangeAcc range;
    // Unsigned counts: rows * chunks is at most K (< 2^31), and i below passes it by at most
    // kThreads * kInFlight.
    const int k0 = w.kt_begin * kBK, k1 = int(min(int64_t(w.kt_end) * kBK, int64_t(p.k)));
    const uint32_t chunks = uint32_t(k1 - k0 + 7) / 8, total = uint32_t(min(BM, p.m - w.m0)) * chunks;  // 8 values (16 bytes) a chunk
    const uint16_t* a = reinterpret_cast<const uint16_t*>(p.a) + (int64_t(w.a_batch) * p.m + w.m0) * p.k + k0;
    constexpr int kInFlight = 8;  // loads issued before the first is used (one at a time, the reads took microseconds at 16 rows)
    for (uint32_t i0 = tid; i0 < total; i0 += kThreads * kInFlight) {
      uint4 v[kInFlight];
      CUTE_UNROLL
      for (int j = 0; j < kInFlight; ++j) {
        const uint32_t i = i0 + j * kThreads, r = i / chunks, ch = i % chunks;
        v[j] = i < total ? *reinterpret_cast<const uint4*>(a + int64_t(r) * p.k + ch * 8) : make_uint4(0, 0, 0, 0);
      }
      CUTE_UNROLL
      for (int j = 0; j < kInFlight; ++j) range.add(v[j].x), range.add(v[j].y), range.add(v[j].z), range.add(v[j].w);
    }
    return compute_and<T>(range.exact_in_f16());
  }

  // Lane 0 of the producer warp issues every raw stage once the stage `ahead` before it in the
  // ring (of this item or, in a persistent kernel, of the one before) has landed and, for a
  // refill, the compute warps have freed its slot (whose barrier no refill has re-armed since
  // that stage: ahead <= kRawStages). Nothing is read before the previous kernel completes
  // (programmatic launch); the first `prefetch` stages' weights are asked into L2 before that.
  __device__ __forceinline__ static void produce(const RawPipeline<T>& pipe, const TileWork& w, int tid, int ahead = kLoadsAhead,
                                                 int prefetch = 0) {
    if (tid != kThreads) return;
    for (int r = 0; r < min(w.n_raw, prefetch); ++r) pipe.prefetch_b(r);
    griddep_wait();
    for (int r = 0; r < w.n_raw; ++r) {
      if (pipe.refills(r)) pipe.wait_empty(r);
      if (pipe.base + r >= ahead) pipe.wait(r - ahead);
      pipe.issue(r);
    }
  }

  // Weight rows t (g and g + 8 of its 16) of this warp's k-tile, decoded as decode_group<ME, kExact>
  // gives them, times the activation fragments b (of type ME).
  template <class ME, bool kExact>
  __device__ __forceinline__ static void mma_rows(float (&acc)[kNT][4], const uint32_t (&b)[kNT][8], const uint8_t* b_box, const uint8_t* sfb,
                                                  int t, int row0, int sub, int c, int wsf) {
    uint32_t w0[8], w1[8];
    decode_group<ME, kExact>(b_box, sfb, row0 + 16 * t, sub, c, wsf + 16 * t, w0);
    decode_group<ME, kExact>(b_box, sfb, row0 + 16 * t + 8, sub, c, wsf + 16 * t + 8, w1);
    CUTE_UNROLL
    for (int s = 0; s < 4; ++s) {
      CUTE_UNROLL
      for (int nt = 0; nt < kNT; ++nt) mma_m16n8k16<ME>(acc[nt], w0[2 * s], w1[2 * s], w0[2 * s + 1], w1[2 * s + 1], b[nt][2 * s], b[nt][2 * s + 1]);
    }
  }

  // acc[t][nt]: the m16n8 fragment of weight rows wn * 16 kRW + 16 t + (g, g + 8) and tokens
  // 8 nt + (2c, 2c + 1), over this warp row's k-tiles (k-tile wk of every stage).
  // kAsF16 (kBf16AsF16 only): the activations as FP16, the weights decoded to FP16.
  template <bool kAsF16 = false>
  __device__ __forceinline__ static void run(const RawPipeline<T>& pipe, const TileWork& w, const uint8_t* raw,
                                             float (&acc)[kRW][kNT][4], int tid) {
    static_assert(!kAsF16 || kBf16AsF16, "FP16 activations: bf16 ones on the 8-row tiles");
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
    const int wn = warp % T::kWn, wk = warp / T::kWn;
    const int box = wk / 4, sub = wk % 4;
    const int row0 = wn * 16 * kRW + g;
    const int wsf = w.n0 % 128 + row0, asf = w.m0 % 128 + g;  // rows in their 128-row scale chunks
    for (int r = 0; r < w.n_raw; ++r) {
      pipe.wait(r);
      if (r * T::kSubs + wk < w.n_kt && (BSG_SM90_ABLATE & 3) != 3) {
        const uint8_t* st = raw + pipe.slot(r) * T::kRawBytes;
        const uint8_t* a_box = st + box * (BM * 128);
        const uint8_t* b_box = st + T::kRawA + box * (BN * 128);
        const uint8_t* sfa = st + T::kSfA + wk * 512;
        const uint8_t* sfb = st + T::kSfB + wk * 512;
        uint32_t b[kNT][8];
        if constexpr (Act::kScaled) {
          CUTE_UNROLL
          for (int nt = 0; nt < kNT; ++nt) decode_group(a_box, sfa, nt * 8 + g, sub, c, asf + nt * 8, b[nt]);
        } else {
          const uint8_t* a_tile = st + wk * (BM * 128);  // dense: k-tile wk's own box
          CUTE_UNROLL
          for (int nt = 0; nt < kNT; ++nt) load_group_dense(a_tile, nt * 8 + g, c, b[nt]);
        }
        if constexpr (kAsF16) {
          CUTE_UNROLL
          for (int nt = 0; nt < kNT; ++nt) {
            CUTE_UNROLL
            for (int i = 0; i < 8; ++i) b[nt][i] = bf16x2_to_f16x2(b[nt][i]);
          }
          CUTE_UNROLL
          for (int t = 0; t < kRW; ++t) mma_rows<cute::half_t, true>(acc[t], b, b_box, sfb, t, row0, sub, c, wsf);
        } else {
          CUTE_UNROLL
          for (int t = 0; t < kRW; ++t) mma_rows<E, false>(acc[t], b, b_box, sfb, t, row0, sub, c, wsf);
        }
      }
      __syncwarp();
      if (lane == 0) pipe.release_stage(r);
    }
  }

  // This warp's fragments, times kStreamUnscale, into its warp row's slab of the FP32 tile (tokens
  // as rows, transposed back; conflict-free with the pitch of BN + 4).
  __device__ __forceinline__ static void store_slab(const float (&acc)[kRW][kNT][4], uint8_t* smem, int tid) {
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
    const int wn = warp % T::kWn, wk = warp / T::kWn;
    float* slab = reinterpret_cast<float*>(smem);
    constexpr int kLd = T::kEpiLd, kSlab = T::kSlab / 4;
    CUTE_UNROLL
    for (int t = 0; t < kRW; ++t) {
      CUTE_UNROLL
      for (int nt = 0; nt < kNT; ++nt) {
        CUTE_UNROLL
        for (int i = 0; i < 4; ++i)
          slab[wk * kSlab + (nt * 8 + 2 * c + (i & 1)) * kLd + wn * 16 * kRW + 16 * t + g + 8 * (i >> 1)] = acc[t][nt][i] * kStreamUnscale<Act>;
      }
    }
  }

  // Float4 unit `unit` of the tile (row unit / (BN / 4), four columns) summed over the slabs in
  // warp-row order, and where it sits in a slab.
  __device__ __forceinline__ static int unit_offset(int unit) { return unit / (BN / 4) * T::kEpiLd + (unit % (BN / 4)) * 4; }
  __device__ __forceinline__ static float4 sum_unit(const uint8_t* smem, int unit) {
    const float* slab = reinterpret_cast<const float*>(smem) + unit_offset(unit);
    float4 s = *reinterpret_cast<const float4*>(slab);
    CUTE_UNROLL
    for (int q = 1; q < T::kWk; ++q) {
      const float4 v = *reinterpret_cast<const float4*>(slab + q * (T::kSlab / 4));
      s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
    }
    return s;
  }

  // The warp rows' sums: every compute warp's slab (store_slab), then thread tid sums float4
  // units tid + j * kThreads of the tile over the slabs in warp-row order into u[4 j .. 4 j + 3].
  // `smem`: the slabs, over the raw stages where the kernel has no room for both (every warp has
  // then passed every stage, so every load has landed, before the first store) or beside them.
  __device__ __forceinline__ static void sum_warp_rows(const float (&acc)[kRW][kNT][4], uint8_t* smem, float (&u)[T::kAcc], int tid) {
    compute_sync<T>();
    store_slab(acc, smem, tid);
    compute_sync<T>();
    CUTE_UNROLL
    for (int j = 0; j < T::kAcc / 4; ++j) {
      const int unit = tid + j * kThreads;
      if (T::kUnits < kThreads && unit >= T::kUnits) {
        u[4 * j] = u[4 * j + 1] = u[4 * j + 2] = u[4 * j + 3] = 0.f;
        continue;
      }
      const float4 s = sum_unit(smem, unit);
      u[4 * j] = s.x, u[4 * j + 1] = s.y, u[4 * j + 2] = s.z, u[4 * j + 3] = s.w;
    }
  }

  // The epilogue warp of a persistent grouped kernel, once every compute warp's slab is stored:
  // the sums as sum_warp_rows forms them, each into its own place in slab 0, which is then the
  // tile (pitch kEpiLd) the epilogue reads.
  __device__ __forceinline__ static float* sum_slabs_in_place(uint8_t* smem, int lane) {
    float* tile = reinterpret_cast<float*>(smem);
    for (int unit = lane; unit < T::kUnits; unit += 32) *reinterpret_cast<float4*>(tile + unit_offset(unit)) = sum_unit(smem, unit);
    __syncwarp();
    return tile;
  }

  // Units back into the tile (slab 0), where the epilogue reads them once the compute threads
  // have synchronized.
  __device__ __forceinline__ static float* store_units(const float (&u)[T::kAcc], uint8_t* smem, int tid) {
    float* tile = reinterpret_cast<float*>(smem);
    compute_sync<T>();  // every thread has read the slabs
    CUTE_UNROLL
    for (int j = 0; j < T::kAcc / 4; ++j) {
      const int unit = tid + j * kThreads;
      if (T::kUnits < kThreads && unit >= T::kUnits) continue;
      *reinterpret_cast<float4*>(tile + unit_offset(unit)) = make_float4(u[4 * j], u[4 * j + 1], u[4 * j + 2], u[4 * j + 3]);
    }
    return tile;
  }
};

}  // namespace bsg::sm90
