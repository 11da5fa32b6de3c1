// Exact NVFP4 x NVFP4 GEMM for Hopper (SM90), which has no FP4 tensor cores.
//
// Why a collective of our own: CUTLASS 4.2's SM90 mixed-input mainloop takes one narrow operand
// only and needs group_size % TileK == 0 with TileK >= 64, so NVFP4's 16-element scale groups on
// both operands are out of its reach (SPEC.md §7).
//
// Exactness: a * sf (e2m1 x ue4m3) has at most 6 significant bits and lies in [2^-10, 2688], so it
// is exact in FP16; FP16 x FP16 products are exact in the FP32 accumulator. Per CTA, TMA brings
// packed FP4 boxes (64 bytes, i.e. K = 128, of every row) and bulk copies bring the scale chunks
// into a ring of raw stages completing on mbarriers (issued by a producer warpgroup for the
// swapped tiles, by thread 0 otherwise); the two compute warpgroups decode each 64-K block into
// FP16 while their wgmma (CuTe's SM90 GMMA atoms) runs on an earlier one: for 128x64 and 128x128
// both operands into the GMMA 128B-swizzled layout (SS wgmma); for the swapped tiles, 128x256,
// 256x128 and a swapped 128x128 (activations x weights), the weights straight into register
// fragments (RS wgmma, weights x activations), the warpgroups taking turns at the tensor cores,
// while the activations are decoded once per GEMM by a pre-pass into the workspace and arrive
// through TMA already in FP16. The weights are never written out dequantized.
//
// Decode: the e2m1 nibble s|e1 e0 m, re-placed as the e4m3 byte s<<7 | (e1 e0 m)<<2, is exactly
// value * 2^-6 (subnormal codes too), so one cvt.rn.f16x2.e4m3x2 and one multiply by sf * 2^6
// (at most 448 * 64 = 28672, an FP16 number) give a * sf (the swapped 128x128 multiplies by sf
// alone and its accumulators by 64 at the end: Tile::kWScaleLow).
//
// Split-K: K is cut into `split_k` ranges (grid.y); each CTA stores its FP32 partial tile in the
// workspace, and the last CTA of a tile to arrive (per-tile counter) sums the partials in split
// order, so results do not depend on which CTA finishes last, and writes D. The counters sit in a
// fixed region at the start of the workspace that partials never touch; the caller zeroes the
// workspace once when it allocates it and every launch leaves the counters zero again (the last
// CTA resets its tile's), so no memset launch precedes the kernel. The swapped tiles with splits of
// 2 to 8 reduce through the cluster's shared memory instead (kMaxClusterSplit below).
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <climits>
#include <cstdint>

#include "blockscaled_gemm/kernel_abi.h"
#include "cute/arch/mma_sm90.hpp"
#include "cute/atom/mma_atom.hpp"
#include "cute/atom/mma_traits_sm90_gmma.hpp"
#include "cute/arch/cluster_sm90.hpp"
#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/cutlass.h"
#include "cutlass/float8.h"

// Experiments only (bench/ablate.cu; never set by build.rs): bit 1 skips the decode, bit 2 the
// wgmma, bit 4 the global loads, bit 8 the split-K partials and reduction (every CTA writes its
// own partial sums as D), bit 16 A's decode only (B's still runs; tiles 64 and 128), to measure
// what each stage costs.
#ifndef BSG_SM90_ABLATE
#define BSG_SM90_ABLATE 0
#endif
// K per raw stage (64-K blocks per TMA box x 64), a tuning knob for experiments.
#ifndef BSG_SM90_RAW_K
#define BSG_SM90_RAW_K 128
#endif

namespace bsg::sm90 {

using namespace cute;

// Experiments only (bench/ablate.cu): with BSG_SM90_TIMELINE set, thread 0 of every CTA stamps
// %globaltimer at entry, after the first raw stage arrived and was decoded, after the main loop
// and at exit into bsg_timeline[cta * 8] (word 4: the SM id; 5-7: the cluster reduction's steps).
#ifndef BSG_SM90_TIMELINE
#define BSG_SM90_TIMELINE 0
#endif
#if BSG_SM90_TIMELINE
__device__ uint64_t* bsg_timeline;
__device__ __forceinline__ void stamp(int slot) {
  if (threadIdx.x != 0 || bsg_timeline == nullptr) return;
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  uint64_t* row = bsg_timeline + (uint64_t(blockIdx.y) * gridDim.x + blockIdx.x) * 8;
  row[slot] = t;
  if (slot == 0) {
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    row[4] = sm;
  }
}
#else
__device__ __forceinline__ void stamp(int) {}
#endif
#ifndef BSG_SM90_TRACE
#define BSG_SM90_TRACE 0
#endif
// Experiments only (bench/ablate.cu): with BSG_SM90_TRACE set, threads 0 and 128 of CTA (0, 0)
// stamp clock64 at six points of each of the first 64 main-loop iterations (wgmma issued,
// decoded, wgmma waited for, barrier, refill) into bsg_trace.
#if BSG_SM90_TRACE
__device__ uint64_t* bsg_trace;  // [thread 0, 128][iteration < 64][6]
#define BSG_TRACE_INIT                                                                                         \
  uint64_t* trp = (blockIdx.x == 0 && blockIdx.y == 0 && (threadIdx.x == 0 || threadIdx.x == 128)) ? bsg_trace : nullptr; \
  if (trp) trp += (threadIdx.x / 128) * 64 * 6;
#define BSG_TRACE(i, slot) do { if (trp && (i) < 64) trp[(i) * 6 + (slot)] = clock64(); } while (0)
#else
#define BSG_TRACE_INIT
#define BSG_TRACE(i, slot) do {} while (0)
#endif

constexpr int kBK = 64;          // K per stage: one 128-byte swizzle row of FP16, one scale tile column block
constexpr int kThreads = 256;
constexpr int kRawK = BSG_SM90_RAW_K;  // K per raw (packed) stage: kRawK / 2 contiguous bytes of every row
constexpr int kSubs = kRawK / kBK;     // 64-K blocks per raw stage
static_assert(kSubs >= 1 && kSubs * kBK == kRawK && kRawK / 2 <= 256, "raw stage K");

struct Params {
  int32_t m, n, k, l, split_k;
  const uint8_t* a;
  const uint8_t* sfa;
  const uint8_t* b;
  const uint8_t* sfb;
  const void* c;
  void* d;
  float alpha, beta;
  uint32_t* counters;  // one per output tile, zero on entry and on exit
  float* partials;     // [split][tile][acc / 4][thread] float4
  uint8_t* sfd;               // FP4 output only
  const float* norm_constant;  // FP4 output only (device)
};

// Split-K through the cluster (swapped tiles, split_k <= kMaxClusterSplit, every output): the
// split_k CTAs of a tile form one cluster; each leaves its partial tile in its own shared memory
// and sums one slice of rows over all of them, in split order (as the global path does, so
// results are bit-identical), straight from the peers' shared memory, then writes that slice of
// D. No partials in global memory, and the reduction is spread over the tile's CTAs instead of
// falling to the last one. Up to the portable cluster size, 8; the host's split heuristic keeps
// all of a launch's clusters in one wave (an H100 runs 15 clusters of 8, 17 of 6, 30 of 4).
constexpr int kMaxClusterSplit = 8;

// The parts of a raw stage the issuing thread sends (gemm_kernel's `issue`).
constexpr int kIssueB = 1, kIssueA = 2;

// A launch configuration of the grid (tiles, split_k): with cluster_y > 1 the split_k CTAs of
// each tile run as one cluster along y; with `pdl` the kernel may be scheduled while the stream's
// previous kernel still runs (once that one's CTAs have all passed griddepcontrol.launch_dependents)
// and waits for it at griddepcontrol.wait. Not copyable: cfg points at attr.
struct KernelLaunch {
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[2];
  KernelLaunch(dim3 grid, int threads, int cluster_y, size_t smem, cudaStream_t stream, bool pdl = false) {
    cfg.gridDim = grid;
    cfg.blockDim = dim3(unsigned(threads));
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    if (cluster_y > 1) {
      attr[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
      attr[cfg.numAttrs].val.clusterDim.x = 1;
      attr[cfg.numAttrs].val.clusterDim.y = unsigned(cluster_y);
      attr[cfg.numAttrs].val.clusterDim.z = 1;
      ++cfg.numAttrs;
    }
    if (pdl) {
      attr[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[cfg.numAttrs].val.programmaticStreamSerializationAllowed = 1;
      ++cfg.numAttrs;
    }
  }
  KernelLaunch(const KernelLaunch&) = delete;
  KernelLaunch& operator=(const KernelLaunch&) = delete;
};

// Address of the same shared-memory location in the CTA of rank `rank` of this cluster.
__device__ __forceinline__ uint32_t peer_smem(const void* local, uint32_t rank) {
  uint32_t out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(local))), "r"(rank));
  return out;
}
__device__ __forceinline__ float4 ld_peer(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr) : "memory");
  return v;
}

// The N float4s at `local` in the partial tiles of the cluster's first split_k (<= kPeers) CTAs,
// summed in split order from 0.0 (as the global path sums its partials). Every peer's values are
// loaded before the first addition, so the loads are in flight together.
template <int kPeers, int N>
__device__ __forceinline__ void cluster_sum_upto(const float* local, int split_k, float4 (&v)[N]) {
  float4 x[kPeers][N];
  CUTE_UNROLL
  for (int q = 0; q < kPeers; ++q) {
    if (q < split_k) {
      const uint32_t addr = peer_smem(local, uint32_t(q));
      CUTE_UNROLL
      for (int e = 0; e < N; ++e) x[q][e] = ld_peer(addr + 16 * e);
    }
  }
  CUTE_UNROLL
  for (int e = 0; e < N; ++e) v[e] = make_float4(0.f, 0.f, 0.f, 0.f);
  CUTE_UNROLL
  for (int q = 0; q < kPeers; ++q) {
    if (q < split_k) {
      CUTE_UNROLL
      for (int e = 0; e < N; ++e) {
        v[e].x += x[q][e].x;
        v[e].y += x[q][e].y;
        v[e].z += x[q][e].z;
        v[e].w += x[q][e].w;
      }
    }
  }
}
// Unrolled for 4 peers where that suffices: the 8-peer code alone made FP4 outputs 1.4-1.6 us
// slower (nvfp4 128x7168x2048 26.1 vs 24.8 us, 128x4096x7168 split 6 33.8 vs 32.2; H100).
template <int N>
__device__ __forceinline__ void cluster_sum(const float* local, int split_k, float4 (&v)[N]) {
  if (split_k <= 4) cluster_sum_upto<4>(local, split_k, v);
  else cluster_sum_upto<kMaxClusterSplit>(local, split_k, v);
}

template <int BM, int BN, bool Swap>
struct Tile {
  static_assert((BM == 128 && (BN == 64 || BN == 128 || BN == 256)) || (BM == 256 && BN == 128), "tile M x N");
  static_assert(Swap == (BN == 256 || BM == 256) || (Swap && BM == 128 && BN == 128),
                "128x256 and 256x128 exist only swapped, 128x64 only unswapped; 128x128 both ways");
  static constexpr int kBM = BM;
  // Swap: the MMA operands are swapped (the kernel's swapped main loop says how): the weights
  // (B, BN rows) are the wgmma A operand, decoded from the raw stage straight into registers
  // (RS wgmma); only the activations (A, kBM rows) go through shared memory. Each warpgroup
  // owns BN / 2 weight rows: 128x256 two 64-row M blocks against 128 activation rows; 256x128
  // one against 256 (twice the MMA work per decoded weight); 128x128 one against 128 (half the
  // tile of 128x256: twice the CTAs for an output, half the split-K partial per CTA).
  static constexpr bool kSwap = Swap;
  static constexpr int kMB = BN / 128;  // kSwap: 64-row M blocks of weights per warpgroup
  // The swapped 128x128: one 64-row weight block per warpgroup against 128 activation rows.
  static constexpr bool kSwap128 = kSwap && kMB == 1 && BM == 128;
  static constexpr int kTurn = kSwap128 ? 2 : 1;  // kSwap: k-tiles per ping-pong turn
  // kSwap128: the weights' scale goes into decode8 as converted, without
  // decode8_scales' 2^6, so weights come out as w * sf * 2^-6 (exact in FP16: at least 2^-16,
  // at most 6 significant bits), and the accumulators are multiplied by 64 after the main loop
  // (exact: every product and partial sum is scaled by the same power of two, and none is an
  // FP32 subnormal, the smallest nonzero product being 2^-26). It saves that multiply and the
  // scale's permute, 2 of ~35 instructions per 16 weights: 128x4096x7168 split 3 23.36 -> 23.02
  // us back to back, 128x7168x16384 split 2 57.3 -> 56.1, D bit-identical (H100, session 11);
  // 128x256 and 256x128 ran 0.2-0.4 us slower with it and keep the 2^6 in the scale.
  static constexpr bool kWScaleLow = kSwap128;
  // kSwap: the activations come decoded (FP16, a * sf) from a pre-pass (predecode_a) through
  // TMA, straight into the wgmma's 128B-swizzled buffers: decoded once per GEMM instead of once
  // per CTA of every N tile, at the price of 2 * L * M * K bytes of workspace. Decoding them in
  // the CTA took ~480 of ~1700 clocks per k-tile (session 8: 128x7168x16384 70.9 -> 59.4 us,
  // 8192^3 1944 -> 1739, bit for bit the same results).
  static constexpr bool kPreA = kSwap;
  static constexpr int kSfChunksB = (BN + 127) / 128;
  // Unswapped keeps two CTAs per SM; BM = 256's FP16 activation buffers fit three stages.
  static constexpr int kRawStages = !kSwap ? 2 : BM == 256 ? 3 : 4;
  // Raw stage (TMA destination): A rows x kRawK/2 bytes, B rows likewise, then the scales of the
  // kSubs 64-K blocks: kSubs x 512 bytes per 128-row block (A: one unless kPreA, B: 1-2).
  static constexpr int kRawA = kPreA ? 0 : kBM * kRawK / 2;
  static constexpr int kRawB = BN * kRawK / 2;
  static constexpr int kSfStage = kSubs * 512;  // scale bytes of one 128-row block per raw stage
  static constexpr int kSfB = kRawA + kRawB + (kPreA ? 0 : kSfStage);  // B's scales in a raw stage
  static constexpr int kRawBytes = kSfB + kSfStage * kSfChunksB;
  using SmemAtom = GMMA::Layout_K_SW128_Atom<half_t>;  // 8 x 64 halves, 128-byte swizzle
  // kPreA: one FP16 buffer per k-tile of every raw stage (k-tile i in buffer i % kDecBufs), filled
  // with the raw stage and freed with it. Else see kAhead; unswapped keeps two CTAs per SM.
  static constexpr int kDecBufs = kPreA ? kSubs * kRawStages : 2;
  using SmemLayoutA = decltype(tile_to_shape(SmemAtom{}, make_shape(Int<kBM>{}, Int<kBK>{}, Int<kDecBufs>{})));
  using SmemLayoutB = decltype(tile_to_shape(SmemAtom{}, make_shape(Int<BN>{}, Int<kBK>{}, Int<kDecBufs>{})));
  // MMA M x N: activations x weights, or (kSwap) weights x activations.
  using MmaShape = std::conditional_t<kSwap, Shape<Int<BN>, Int<kBM>>, Shape<Int<kBM>, Int<BN>>>;
  using TiledMma = std::conditional_t<
      kSwap,
      decltype(make_tiled_mma(
          SM90::GMMA::rs_op_selector<half_t, half_t, float, Shape<_64, Int<kBM>, _16>, GMMA::Major::K, GMMA::Major::K>(),
          Layout<Shape<_2, _1, _1>>{})),
      decltype(make_tiled_mma(
          SM90::GMMA::ss_op_selector<half_t, half_t, float, Shape<_64, Int<BN>, _16>, GMMA::Major::K, GMMA::Major::K>(),
          Layout<Shape<_2, _1, _1>>{}))>;
  static constexpr int kDecA = kBM * kBK * 2 * kDecBufs;  // bytes
  static constexpr int kDecB = kSwap ? 0 : BN * kBK * 2 * kDecBufs;
  static constexpr int kSmem = 1024 + kDecA + kDecB + kRawStages * kRawBytes;  // 1024: swizzle alignment
  static constexpr int kMinBlocks = kSwap ? 1 : 2;
  // kSwap: a producer warpgroup (128 threads, one of which issues every raw stage) whose
  // registers setmaxnreg hands to the compute warpgroups: accumulators plus two register
  // fragments of weights need more than the 168 ptxas allows 384 threads. (A compute warp that
  // issued the stages itself stalled ~700 clocks per stage, and every barrier with it.)
  // Unswapped keeps 256 threads (thread 0 issues, behind its wgmma) and two CTAs per SM.
  static constexpr int kLaunchThreads = kThreads + (kSwap ? 128 : 0);
  static constexpr int kAcc = kBM * BN / kThreads;  // accumulator floats per thread
};

// 3-D tensor tile (k byte, row, batch) into shared memory, completing on an mbarrier (TMA).
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
// Contiguous bytes into shared memory, completing on an mbarrier.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst), "l"(src),
               "r"(bytes), "r"(bar)
               : "memory");
}

__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two_bytes) {
  uint32_t out;
  uint16_t in = static_cast<uint16_t>(two_bytes);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(out) : "h"(in));
  return out;
}

__device__ __forceinline__ uint32_t e4m3x2_hi_to_f16x2(uint32_t four_bytes) {
  uint32_t out;
  asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, hi;\n}\n" : "=r"(out) : "r"(four_bytes));
  return out;
}

__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
  __half2 r = __hmul2(*reinterpret_cast<__half2*>(&a), *reinterpret_cast<__half2*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}

// The low nibble of each byte of w (an e2m1 value s|e1 e0 m) as the e4m3 byte s<<7 | (e1 e0 m)<<2,
// i.e. the value * 2^-6 (see "Decode" at the top).
__device__ __forceinline__ uint32_t e2m1_lo_to_e4m3(uint32_t w) { return ((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u); }

// Two scales in FP16 (from e4m3x2_to_f16x2 or e4m3x2_hi_to_f16x2) times 2^6: the scale operand
// decode8 takes, undoing its e4m3 placement's 2^-6 (448 * 64 = 28672 is still an FP16 number).
__device__ __forceinline__ uint32_t decode8_scales(uint32_t two_scales_f16) { return hmul2(two_scales_f16, 0x54005400u); }

// a times the low half of s in both halves: HMUL2 reads s.H0_H0, so no permute builds the pair.
__device__ __forceinline__ uint32_t hmul2_lo(uint32_t a, uint32_t s) {
  const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&a), __low2half2(*reinterpret_cast<const __half2*>(&s)));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// 8 e2m1 values (one 32-bit word, element 2i in the low nibble of byte i) times scale2 (one
// scale of decode8_scales in both halves; with kLowScale, any FP16 factor in the low half), as 8
// FP16 values in the order 0 2 1 3 4 6 5 7: both operands are decoded
// alike, so the dot product is unchanged (each wgmma still sums the same 16 products) and the
// two byte permutes that would restore element order are saved, as are the shifts: the high half
// of a word goes to the conversion as it is (F2FP reads R.H1).
template <bool kLowScale = false>
__device__ __forceinline__ uint4 decode8(uint32_t w, uint32_t scale2) {
  const uint32_t even = e2m1_lo_to_e4m3(w), odd = e2m1_lo_to_e4m3(w >> 4);  // elements 0, 2, 4, 6 and 1, 3, 5, 7
  auto mul = [&](uint32_t v) {
    if constexpr (kLowScale) return hmul2_lo(v, scale2);
    else return hmul2(v, scale2);
  };
  uint4 r;
  r.x = mul(e4m3x2_to_f16x2(even));
  r.y = mul(e4m3x2_to_f16x2(odd));
  r.z = mul(e4m3x2_hi_to_f16x2(even));
  r.w = mul(e4m3x2_hi_to_f16x2(odd));
  return r;
}

// SPEC.md §3 offset of (row, scale column) inside one 128-row x 4-column chunk.
__host__ __device__ constexpr int sf_in_chunk(int row, int col) { return (row % 32) * 16 + ((row % 128) / 32) * 4 + col; }

// SPEC.md §3: scale columns of a K (or N, for generated scales) padded to 4, and the bytes of one
// batch of `rows` rows (padded to 128).
// (int arguments: KernelArgs' extents are int32, and the main kernel's index math stays 32-bit.)
__host__ __device__ constexpr int64_t sf_cols_padded(int k) { return (k / 16 + 3) / 4 * 4; }
__host__ __device__ constexpr int64_t sf_batch_bytes(int rows, int64_t sp) { return int64_t((rows + 127) / 128) * 128 * sp; }

// SPEC.md §3 offset of scale (row, col) in one batch whose padded scale-column count is sp.
__host__ __device__ constexpr int64_t sf_offset(int64_t row, int64_t col, int64_t sp) {
  return (row / 128) * (sp / 4) * 512 + (col / 4) * 512 + sf_in_chunk(int(row % 128), int(col % 4));
}

// What an output tag means to the kernel: N's multiple (16 bytes of D) and, for FP4 output
// (Fp4Out<Sf>, whose C is f32), the scale-factor type.
template <class T>
struct OutputInfo {
  using Sf = void;
  static constexpr int kNMultiple = 16 / sizeof(T);
};
template <class SfT>
struct OutputInfo<Fp4Out<SfT>> {
  using Sf = SfT;
  static constexpr int kNMultiple = 32;
};

// The FP4 epilogue's arithmetic, written as CUTLASS's host reference does it (gett.hpp,
// compute_1d_scaling_factor_and_quantized_output) so results match it bit for bit: IEEE
// operations one at a time (no contraction), NaN-propagating min/max in its operand order, and
// its conversions (float_ue4m3_t / float_ue8m0_t from float, NumericConverter to float_e2m1_t).
__device__ __forceinline__ float max_nan(float l, float r) { return l > r || isnan(l) ? l : r; }
__device__ __forceinline__ float min_nan(float l, float r) { return l < r || isnan(l) ? l : r; }

template <class Sf>
__device__ __forceinline__ uint8_t sf_from_float(float x) {
  if constexpr (std::is_same_v<Sf, cutlass::float_ue4m3_t>) {
    // Unsigned: the sign is dropped; round to nearest even, saturating at 448; NaN is 0x7F.
    uint16_t two;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(two) : "f"(0.f), "f"(fabsf(x)));
    return uint8_t(two & 0xFF);
  } else {
    // float_ue8m0_t: the exponent, rounded up unless the mantissa is zero; satfinite at 2^127;
    // NaN and infinities (exponent 0xFF) give 0xFF. Selects, no branches.
    const uint32_t bits = __float_as_uint(x);
    const uint32_t e = (bits >> 23) & 0xFF;
    const uint32_t mant = bits & 0x7FFFFF;
    const uint32_t up = uint32_t(mant > 0 && e != 0xFE && !(e == 0 && mant <= 0x400000));
    return uint8_t(e == 0xFF ? 0xFFu : e + up);
  }
}

template <class Sf>
__device__ __forceinline__ float sf_to_float(uint8_t b) {
  if constexpr (std::is_same_v<Sf, cutlass::float_ue4m3_t>) {
    return __half2float(__ushort_as_half(uint16_t(e4m3x2_to_f16x2(b) & 0xFFFF)));
  } else {
    // 0 is 2^-127, 0xFF NaN.
    return __uint_as_float(b == 0 ? 0x00400000u : (b == 0xFF ? 0x7FFFFFFFu : uint32_t(b) << 23));
  }
}

// Round to nearest even onto e2m1, saturating at 6, the sign kept (zeros too); NaN gives 6 with
// the NaN's sign. The code is the number of rounding points at or below |x| (`>` where the lower
// neighbour's code is even, `>=` where it is odd): selects, no branches.
__device__ __forceinline__ uint32_t e2m1_from_float(float x) {
  const uint32_t sign = (__float_as_uint(x) >> 28) & 8u;
  const float m = fabsf(x);
  const uint32_t code = uint32_t(m > 0.25f) + uint32_t(m >= 0.75f) + uint32_t(m > 1.25f) + uint32_t(m >= 1.75f) +
                        uint32_t(m > 2.5f) + uint32_t(m >= 3.5f) + uint32_t(m > 5.0f);
  return sign | (isnan(x) ? 7u : code);
}

template <class T>
__device__ __forceinline__ float load_out(const T* p) {
  if constexpr (std::is_same_v<T, float>) return *p;
  else if constexpr (std::is_same_v<T, __half>) return __half2float(*p);
  else return __bfloat162float(*p);
}
template <class T>
__device__ __forceinline__ T to_out(float v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else if constexpr (std::is_same_v<T, __half>) return __float2half_rn(v);
  else return __float2bfloat16_rn(v);
}

// Byte offset of the 16-byte chunk `chunk` (8 halves, 0..7) of row `row` in a K-major FP16 tile of
// 64-half rows with the GMMA 128-byte swizzle (8-row, 1024-byte atoms stacked along the rows):
// the layout of GMMA::Layout_K_SW128_Atom tiled by tile_to_shape, on byte addresses.
__device__ __forceinline__ uint32_t sw128_offset(int row, int chunk) {
  return uint32_t((row >> 3) * 1024 + (row & 7) * 128 + ((chunk ^ (row & 7)) << 4));
}

// The swapped kernels' activations, one row's 64-K block (packed bytes q0 | q1, its four
// scales sf4) for thread parity hh = shift / 4: chunk st (8 halves) holds MMA step st's K
// positions 8 hh .. 8 hh + 7, i.e. for each scale group c the values 4 st + hh and 4 st + hh + 2
// (the kernel's swapped main loop says why this order). Decoded as decode8 does.
__device__ __forceinline__ void act_chunks(uint4 q0, uint4 q1, uint32_t sf4, int shift, uint4 (&ch)[4]) {
  const uint32_t s01 = decode8_scales(e4m3x2_to_f16x2(sf4)), s23 = decode8_scales(e4m3x2_hi_to_f16x2(sf4));
  const uint32_t sc[4] = {__byte_perm(s01, s01, 0x1010), __byte_perm(s01, s01, 0x3232), __byte_perm(s23, s23, 0x1010),
                          __byte_perm(s23, s23, 0x3232)};
  const uint32_t w[4][2] = {{q0.x, q0.y}, {q0.z, q0.w}, {q1.x, q1.y}, {q1.z, q1.w}};  // [group][word]
  CUTE_UNROLL
  for (int wd = 0; wd < 2; ++wd) {
    uint32_t lo[4], hi[4];
    CUTE_UNROLL
    for (int c = 0; c < 4; ++c) {
      const uint32_t e = e2m1_lo_to_e4m3(w[c][wd] >> shift);  // this parity's values
      lo[c] = hmul2(e4m3x2_to_f16x2(e), sc[c]);     // step 2 wd
      hi[c] = hmul2(e4m3x2_hi_to_f16x2(e), sc[c]);  // step 2 wd + 1
    }
    ch[2 * wd] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
    ch[2 * wd + 1] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
  }
}

// The swapped tiles' (kPreA) pre-pass: A (packed e2m1, tiled ue4m3 scales) as FP16 a * sf, (L, M, k_pad)
// with k_pad = K rounded up to 64, each 64-K block in act_chunks' order so that TMA's 128-byte
// swizzle lays it out as the kernel's decode did; K past the end is 0. One work item per (batch,
// row, 64-K block, parity), strided over the grid. Static: every translation unit that includes
// this keeps its own.
//
// Launched programmatically (Gemm::run says why): nothing is read or written before
// griddepcontrol.wait returns, i.e. before the stream's previous kernel has completed and its
// writes are visible; then the GEMM may be scheduled, and it issues its first weights while this
// runs.
static __global__ void __launch_bounds__(1024) predecode_a(const uint8_t* a, const uint8_t* sfa, uint4* out, int m, int k, int l) {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  const int kb_n = (k + 63) / 64;
  const int64_t items = int64_t(l) * m * kb_n * 2;
  for (int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; idx < items; idx += int64_t(gridDim.x) * blockDim.x) {
    const int hh = int(idx % 2), kb = int((idx / 2) % kb_n);
    const int64_t rowb = idx / 2 / kb_n;  // batch * m + row
    const int64_t batch = rowb / m;
    const int row = int(rowb % m);
    const bool whole = kb * 64 + 64 <= k;  // else 32 K (K % 32 == 0): groups 2 and 3 are past K
    const uint8_t* src = a + rowb * (k / 2) + kb * 32;
    const uint4 q0 = *reinterpret_cast<const uint4*>(src);
    const uint4 q1 = whole ? *reinterpret_cast<const uint4*>(src + 16) : make_uint4(0, 0, 0, 0);
    const int64_t sp = sf_cols_padded(k);
    uint32_t sf4 = *reinterpret_cast<const uint32_t*>(sfa + batch * sf_batch_bytes(m, sp) + sf_offset(row, 4 * kb, sp));
    if (!whole) sf4 &= 0xFFFFu;  // 0 * 0, whatever the padding scales hold
    uint4 ch[4];
    act_chunks(q0, q1, sf4, 4 * hh, ch);
    uint4* dst = out + (rowb * kb_n + kb) * 8;  // 8 chunks of 16 bytes per 64-K block
    CUTE_UNROLL
    for (int st = 0; st < 4; ++st) dst[2 * st + hh] = ch[st];
  }
}

// One operand's share of a stage for one thread: `kRows` rows of 32 packed bytes, two 16-byte
// halves each; units u = tid + j * kThreads map to (row u / 2, half u % 2).
template <int kRows>
struct Operand {
  static constexpr int kUnits = (kRows * 2 + kThreads - 1) / kThreads;
  // Every unit of every thread is a real one: no per-unit branch, which would keep the compiler
  // from interleaving the units' decode chains.
  static constexpr bool kAllActive = kRows * 2 % kThreads == 0;
  int raw_off[kUnits];             // the unit's 16 bytes in a raw stage (add 32 for the 2nd K-block)
  int sf_off[kUnits];              // the row's scale pair in the stage's scales (add 512 likewise)
  uint32_t dec_off[kUnits][4];     // swizzled byte offsets of the 4 output chunks
  bool active[kUnits];

  __device__ void init(int row_in_block0, int tid) {
    CUTE_UNROLL
    for (int j = 0; j < kUnits; ++j) {
      const int u = tid + j * kThreads, r = u / 2, h = u % 2;
      active[j] = u < kRows * 2;
      raw_off[j] = r * (kRawK / 2) + h * 16;
      const int in_block = row_in_block0 + r;  // row within the operand's 128-row scale chunks
      sf_off[j] = (in_block / 128) * (kSubs * 512) + sf_in_chunk(in_block % 128, 2 * h);
      CUTE_UNROLL
      for (int c = 0; c < 4; ++c) dec_off[j][c] = sw128_offset(r, h * 4 + c);
    }
  }
};

// One thread's packed bytes and scale pairs of a k-tile, loaded before they are decoded.
template <int kUnits>
struct RawUnits {
  uint4 q[kUnits];
  uint32_t sf2[kUnits];

  // Unit j's 16 bytes (32 values) of 64-K block `sub` and its row's two scales.
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

// FP4 output (CUTLASS example 72b's LinCombBlockScaleFactor) from the fp32 tile in shared memory
// (`ld` floats per row): one thread per row and 16 columns computes v = alpha * acc + beta * C,
// SFD = Sf(max|v| * (st / 6)) and D = e2m1(v * min(st / float(SFD), FLT_MAX)), in the order and
// roundings of CUTLASS's host reference, and writes 8 bytes of D and one scale factor.
template <class Sf, int BN>
__device__ __forceinline__ void fp4_epilogue(const Params& p, const float* tile_s, int ld, int m0, int n0, int64_t batch, int r_begin,
                                             int r_end) {
  const float st = *p.norm_constant;
  const float st_scaled_down = __fmul_rn(st, 1.0f / 6.0f);  // constant, rounded to nearest
  const int64_t sp = sf_cols_padded(p.n);
  uint8_t* sfd = p.sfd + batch * sf_batch_bytes(p.m, sp);
  const float* c = static_cast<const float*>(p.c) + batch * p.m * int64_t(p.n);
  uint8_t* d = static_cast<uint8_t*>(p.d) + batch * p.m * int64_t(p.n) / 2;
  for (int gi = threadIdx.x; gi < (r_end - r_begin) * (BN / 16); gi += kThreads) {
    const int r = r_begin + gi / (BN / 16), g = gi % (BN / 16);
    const int mm = m0 + r, nn = n0 + 16 * g;
    if (mm >= p.m || nn >= p.n) continue;  // N % 32 == 0: groups are whole
    const int64_t idx = int64_t(mm) * p.n + nn;
    float v[16];
    float amax = 0.f;
    CUTE_UNROLL
    for (int e = 0; e < 16; e += 4) {
      const float4 a = *reinterpret_cast<const float4*>(tile_s + r * ld + 16 * g + e);
      v[e] = __fmul_rn(p.alpha, a.x);
      v[e + 1] = __fmul_rn(p.alpha, a.y);
      v[e + 2] = __fmul_rn(p.alpha, a.z);
      v[e + 3] = __fmul_rn(p.alpha, a.w);
      if (p.beta != 0.f) {
        const float4 cv = *reinterpret_cast<const float4*>(c + idx + e);
        v[e] = __fadd_rn(__fmul_rn(p.beta, cv.x), v[e]);
        v[e + 1] = __fadd_rn(__fmul_rn(p.beta, cv.y), v[e + 1]);
        v[e + 2] = __fadd_rn(__fmul_rn(p.beta, cv.z), v[e + 2]);
        v[e + 3] = __fadd_rn(__fmul_rn(p.beta, cv.w), v[e + 3]);
      }
    }
    CUTE_UNROLL
    for (int e = 0; e < 16; ++e) amax = max_nan(amax, fabsf(v[e]));
    const uint8_t sf = sf_from_float<Sf>(__fmul_rn(amax, st_scaled_down));
    // 1.0f / x rounded to nearest is the correctly rounded reciprocal: __frcp_rn, no division.
    const float scale = min_nan(__fmul_rn(st, __frcp_rn(sf_to_float<Sf>(sf))), FLT_MAX);
    uint32_t packed[2] = {0, 0};
    CUTE_UNROLL
    for (int e = 0; e < 16; ++e) packed[e / 8] |= e2m1_from_float(__fmul_rn(v[e], scale)) << (4 * (e % 8));
    *reinterpret_cast<uint2*>(d + idx / 2) = make_uint2(packed[0], packed[1]);
    sfd[sf_offset(mm, nn / 16, sp)] = sf;
  }
}

// kClusterReduce: split-K through the cluster (a separate instantiation, so the other kernels'
// code is not perturbed by a branch they never take).
template <int BM, int BN, bool Swap, class OutT, bool kClusterReduce>
__global__ void __launch_bounds__(Tile<BM, BN, Swap>::kLaunchThreads, Tile<BM, BN, Swap>::kMinBlocks)
    gemm_kernel(const __grid_constant__ Params p, const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b) {
  using T = Tile<BM, BN, Swap>;
  constexpr int kBM = BM;
  constexpr bool kSwap = T::kSwap;
  extern __shared__ uint8_t smem_raw[];
  __shared__ uint64_t raw_bar[T::kRawStages];
  __shared__ uint64_t empty_bar[T::kRawStages];  // kSwap only: slot free to refill
  // 1024-byte alignment for the swizzle atoms, as pointer arithmetic on the __shared__ array so
  // the compiler keeps shared-memory instructions.
  const uint32_t pad = (1024u - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u;
  uint8_t* smem = smem_raw + pad;
  half_t* decA = reinterpret_cast<half_t*>(smem);
  half_t* decB = reinterpret_cast<half_t*>(smem + T::kDecA);
  uint8_t* raw = smem + T::kDecA + T::kDecB;
  const int tid = threadIdx.x;
  stamp(0);
  BSG_TRACE_INIT

  // Tile coordinates: groups of kGroupM tile rows, N fastest inside a group, so the ~132 CTAs
  // that run together cover a few row tiles across many column tiles: a swapped tile's row of
  // activations (FP16) weighs 2 * BM * K bytes against BN * K / 2 for a column of weights, and
  // the group size roughly balances the two. M fastest over all rows had each wave of 8192^3
  // stream all 128 MiB of activations (ablate, run10.txt, D bit-identical: 256x128 at 8192^3
  // 1589-1640 -> 1499-1527 us back to back, 4096^3 192.5-197.4 -> 189.0-189.3).
  constexpr int kGroupM = BM == 256 ? 4 : 8;
  const int tiles_m = (p.m + kBM - 1) / kBM;
  const int tiles_n = (p.n + BN - 1) / BN;
  const int64_t tile = blockIdx.x;
  const int64_t in_batch = tile % (int64_t(tiles_m) * tiles_n);
  const int group = int(in_batch / (int64_t(kGroupM) * tiles_n));
  const int group_rows = min(kGroupM, tiles_m - group * kGroupM);
  const int in_group = int(in_batch - int64_t(group) * kGroupM * tiles_n);
  const int tm = group * kGroupM + in_group % group_rows;
  const int tn = in_group / group_rows;
  const int64_t batch = tile / (int64_t(tiles_m) * tiles_n);
  const int m0 = tm * kBM, n0 = tn * BN;
  const int split = blockIdx.y;
  const int k_tiles = (p.k + kBK - 1) / kBK;
  const int kt_begin = int(int64_t(k_tiles) * split / p.split_k);
  const int kt_end = int(int64_t(k_tiles) * (split + 1) / p.split_k);
  const int n_kt = kt_end - kt_begin;
  const int n_raw = (n_kt + kSubs - 1) / kSubs;  // raw stages of kSubs 64-K blocks

  // One thread issues every copy of a raw stage (the producer warpgroup's first, else thread 0):
  // two TMA boxes and the scale chunks.
  const int64_t sp = sf_cols_padded(p.k);
  const uint8_t* sfa_rows = p.sfa + batch * sf_batch_bytes(p.m, sp) + int64_t(m0 / 128) * (sp / 4) * 512;
  const uint8_t* sfb_rows = p.sfb + batch * sf_batch_bytes(p.n, sp) + int64_t(n0 / 128) * (sp / 4) * 512;
  const int sfb_chunks = min(T::kSfChunksB, (p.n + 127) / 128 - n0 / 128);  // 128-row blocks of B inside N
  const uint32_t raw_s = static_cast<uint32_t>(__cvta_generic_to_shared(raw));
  const uint32_t dec_a_s = static_cast<uint32_t>(__cvta_generic_to_shared(decA));
  // Raw stage r: `what` says which copies (kIssueB: the barrier's transaction count, B and its
  // scales; kIssueA: A, and without kPreA its scales), so kPreA can issue B's before the pre-pass
  // ends and A's after.
  auto issue = [&](int r, int what = kIssueA | kIssueB) {
    const int slot = r % T::kRawStages;
    const uint32_t bar = static_cast<uint32_t>(__cvta_generic_to_shared(&raw_bar[slot]));
    const uint32_t base = raw_s + slot * T::kRawBytes;
    const int kt = kt_begin + kSubs * r;
    const uint32_t sf_bytes = min(kSubs, kt_end - kt) * 512;
    // kPreA: every box of FP16 activations is whole (zero-filled past K_pad, M or the batch).
    constexpr uint32_t kPreBytes = T::kPreA ? kSubs * kBM * kBK * 2 : 0;
    const uint32_t bytes = kPreBytes + T::kRawA + T::kRawB + sf_bytes * ((T::kPreA ? 0 : 1) + sfb_chunks);
    if (what & kIssueB) cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&raw_bar[slot], bytes);
    if constexpr ((BSG_SM90_ABLATE & 4) == 0) {
      if (what & kIssueB) {
        tma_load_3d(base + T::kRawA, &map_b, kt * (kBK / 2), n0, int(batch), bar);
        for (int c = 0; c < sfb_chunks; ++c)
          bulk_load(base + T::kSfB + T::kSfStage * c, sfb_rows + c * (sp / 4) * 512 + int64_t(kt) * 512, sf_bytes, bar);
      }
      if (what & kIssueA) {
        if constexpr (T::kPreA) {
          for (int s = 0; s < kSubs; ++s)
            tma_load_3d(dec_a_s + (slot * kSubs + s) * (kBM * kBK * 2), &map_a, (kt + s) * kBK, m0, int(batch), bar);
        } else {
          tma_load_3d(base, &map_a, kt * (kBK / 2), m0, int(batch), bar);
          bulk_load(base + T::kRawA + T::kRawB, sfa_rows + int64_t(kt) * 512, sf_bytes, bar);
        }
      }
    } else if (what & kIssueB) {
      // Ablation: no loads; complete the transaction count without moving data.
      asm volatile("mbarrier.complete_tx.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes));
    }
  };

  auto wait_raw = [&](int r) {
    cutlass::arch::ClusterTransactionBarrier::wait(&raw_bar[r % T::kRawStages], (r / T::kRawStages) & 1);
  };

  if (tid == 0) {
    for (int s = 0; s < T::kRawStages; ++s) {
      cutlass::arch::ClusterTransactionBarrier::init(&raw_bar[s], 1);
      cutlass::arch::ClusterBarrier::init(&empty_bar[s], kThreads);  // every compute thread arrives
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  if constexpr (kSwap) {
    // The producer warpgroup gives up its registers; one thread issues every raw stage, each
    // refill once the compute threads have released its slot, and all leave (exited threads do
    // not hold up later CTA or cluster barriers).
    if (tid >= kThreads) {
      cutlass::arch::warpgroup_reg_dealloc<40>();
      if (tid == kThreads) {
        int r = 0;
        if constexpr (T::kPreA) {
          // The first stage's weights while the pre-pass may still run; its activations are
          // complete and visible past griddepcontrol.wait (a no-op without a programmatic
          // dependency). The first stage goes alone, the next ones once it has landed: issued
          // together (every CTA at once), the first waited behind the others' bytes, ~4.7 us
          // from entry instead of ~3.0 (timeline, H100: 128x7168x2048 21.2 -> 19.5 us).
          if (n_raw > 0) {
            issue(0, kIssueB);
            asm volatile("griddepcontrol.wait;\n" ::: "memory");
            issue(0, kIssueA);
            wait_raw(0);
            for (r = 1; r < min(T::kRawStages, n_raw); ++r) issue(r);
          }
        }
        for (; r < n_raw; ++r) {
          if (r >= T::kRawStages) cutlass::arch::ClusterBarrier::wait(&empty_bar[r % T::kRawStages], ((r / T::kRawStages) - 1) & 1);
          issue(r);
        }
      }
      return;
    }
    cutlass::arch::warpgroup_reg_alloc<232>();
  } else if (tid == 0) {
    for (int r = 0; r < min(T::kRawStages, n_raw); ++r) issue(r);
  }
  // The compute threads' barrier: with a producer warpgroup, a named one that leaves it out.
  auto compute_sync = [&] {
    if constexpr (kSwap) asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory");
    else __syncthreads();
  };

  typename T::TiledMma mma;
  Tensor sA = make_tensor(make_smem_ptr(decA), typename T::SmemLayoutA{});
  auto wg_mma = mma.get_slice((tid / 128) * 128);
  Tensor acc = partition_fragment_C(mma, typename T::MmaShape{});
  clear(acc);
  // Once k-tile j is done with (unswapped: decoded by every compute thread, after a CTA barrier;
  // swapped: its wgmma completed), raw stage j / kSubs can be refilled if j is its last k-tile
  // and a later stage is due.
  auto stage_done = [&](int j) { return j < n_kt && (j % kSubs == kSubs - 1 || j == n_kt - 1) && j / kSubs + T::kRawStages < n_raw; };
  if constexpr (kSwap) {
    // D^T = B A^T: each warpgroup owns kMB 64-row M blocks of weights (128x256: two, against
    // 128 activation rows; 256x128: one, against 256; 128x128: one, against 128). Within each
    // 64-K block, thread c of an MMA quad holds K positions 2c, 2c + 1, 2c + 8, 2c + 9 of the
    // four 16-K MMA steps; they are taken to be the 16 values of scale group c (one 8-byte load
    // and one scale per row), in the order decode8 gives them: step s holds the group's values
    // 4s, 4s + 2 at 2c, 2c + 1 and 4s + 1, 4s + 3 at 2c + 8, 2c + 9. The activations go to shared
    // memory in the same order, so every product still pairs equal K and each wgmma sums the
    // same 16 products.
    Tensor tCrB = wg_mma.make_fragment_B(wg_mma.partition_B(sA));  // (MMA, MMA_N, MMA_K, bufs)
    using FragLayout = Layout<Shape<Shape<_2, _2, _2>, Int<T::kMB>, _4>>;  // (MMA values, M blocks, steps), compact
    Tensor frag0 = make_tensor<half_t>(FragLayout{});
    Tensor frag1 = make_tensor<half_t>(FragLayout{});
    // Weights: this thread's rows r, r + 8 (fragment values 0 and 2) of M block 0, and (kMB = 2)
    // 128 rows further of block 1 (the RS atom's A layout, two warpgroups along M), so every
    // row's raw bytes and scale lie at constant offsets from the first's (r % 32 + 8 < 32).
    const int w_row = (tid / 128) * 64 + ((tid % 128) / 32) * 16 + (tid % 32) / 4;
    const int w_raw = T::kRawA + w_row * (kRawK / 2) + 8 * (tid % 4);
    const int w_sf = T::kSfB + sf_in_chunk(w_row, tid % 4);
    // M block mb of k-tile i. Called once per block: one call looping over both blocks made
    // ptxas schedule the loop differently, ~1 % slower (8192^3 1903 vs 1884 us, session 7).
    auto decode_w = [&](int i, auto& frag, int mb) {
      if constexpr ((BSG_SM90_ABLATE & 1) != 0) return;
      const uint8_t* base = raw + ((i / kSubs) % T::kRawStages) * T::kRawBytes;
      const int sub = i % kSubs;
      auto regs = recast<uint32_t>(frag);  // register (pair + 2 hi + 4 block + 4 kMB step)
      CUTE_UNROLL
      for (int h = 0; h < 2; ++h) {
        const uint2 q = *reinterpret_cast<const uint2*>(base + w_raw + (8 * h + 128 * mb) * (kRawK / 2) + sub * 32);
        const uint32_t sf = e4m3x2_to_f16x2(base[w_sf + 8 * h * 16 + mb * T::kSfStage + sub * 512]);  // low half
        uint4 v0, v1;
        if constexpr (T::kWScaleLow) {
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
          regs(h + 4 * mb + 4 * T::kMB * st) = v[2 * st];          // K 2c, 2c + 1
          regs(h + 2 + 4 * mb + 4 * T::kMB * st) = v[2 * st + 1];  // K 2c + 8, 2c + 9
        }
      }
    };
    // The two warpgroups take turns at the tensor cores (ping-pong): a warp that issues a wgmma
    // stalls until the tensor cores' queue takes it, so in lockstep both warpgroups stalled
    // issuing at the same time and decoded at the same time (trace: ~570 clocks issuing, ~1030
    // decoding per k-tile). In turns, each decodes while the other's wgmma runs. Named barrier 2
    // passes the turn to warpgroup 1, 3 back to warpgroup 0. Weights are decoded one turn ahead
    // (two sets of register fragments: a wgmma reads its register operand until it completes). The
    // activations come with the raw stage (kPreA), so every compute thread arrives on a slot's
    // "empty" barrier once its wgmma of the slot's last k-tile completed.
    static_assert(T::kPreA, "the swapped tile takes pre-decoded activations");
    const int wg = tid / 128;
    auto release_after = [&](int j) {
      if (stage_done(j)) cutlass::arch::ClusterBarrier::arrive(&empty_bar[(j / kSubs) % T::kRawStages]);
    };
    // kTurn k-tiles per turn. A warpgroup with one 64-row block against 128 activation rows
    // runs 256 clocks of wgmma per k-tile, less than one block's decode takes a single warp
    // (~400-460, latency-bound): two k-tiles per turn give each decode two independent chains.
    // Trace, swapped 128x128 at 128x7168x16384 split 2 (H100): 811 -> 691 clocks per k-tile,
    // 63.0 -> 56.5 us back to back, D bit-identical (bench/results/2026-11-22-h100-session10/).
    constexpr int kTurn = T::kTurn;
    Tensor frag0b = make_tensor<half_t>(FragLayout{});
    Tensor frag1b = make_tensor<half_t>(FragLayout{});
    // Decodes k-tiles j .. j + kTurn - 1 (those below n_kt), waiting for each raw stage first.
    auto decode_turn = [&](int j, auto& fa, auto& fb) {
      if (j % kSubs == 0) wait_raw(j / kSubs);
      decode_w(j, fa, 0);
      if constexpr (T::kMB == 2) decode_w(j, fa, 1);
      if constexpr (kTurn == 2) {
        if (j + 1 < n_kt) {
          if ((j + 1) % kSubs == 0) wait_raw((j + 1) / kSubs);
          decode_w(j + 1, fb, 0);
        }
      }
    };
    if (n_kt > 0) decode_turn(0, frag0, frag0b);
    stamp(1);
    auto step = [&](int i, auto& cur, auto& curb, auto& next, auto& nextb) {
      BSG_TRACE(i / kTurn, 0);
      if (wg == 0) {
        if (i > 0) asm volatile("bar.sync 3, %0;\n" ::"n"(kThreads) : "memory");
      } else {
        asm volatile("bar.sync 2, %0;\n" ::"n"(kThreads) : "memory");
      }
      warpgroup_fence_operand(acc);
      warpgroup_fence_operand(cur);
      if constexpr (kTurn == 2) warpgroup_fence_operand(curb);
      warpgroup_arrive();
      CUTE_UNROLL
      for (int kb = 0; kb < 4; ++kb) {
        if constexpr ((BSG_SM90_ABLATE & 2) == 0) cute::gemm(mma, cur(_, _, kb), tCrB(_, _, kb, i % T::kDecBufs), acc);
      }
      if constexpr (kTurn == 2) {
        if (i + 1 < n_kt) {
          CUTE_UNROLL
          for (int kb = 0; kb < 4; ++kb) {
            if constexpr ((BSG_SM90_ABLATE & 2) == 0) cute::gemm(mma, curb(_, _, kb), tCrB(_, _, kb, (i + 1) % T::kDecBufs), acc);
          }
        }
      }
      warpgroup_commit_batch();
      if (wg == 0) asm volatile("bar.arrive 2, %0;\n" ::"n"(kThreads) : "memory");
      else if (i + kTurn < n_kt) asm volatile("bar.arrive 3, %0;\n" ::"n"(kThreads) : "memory");
      BSG_TRACE(i / kTurn, 1);
      if (i + kTurn < n_kt) decode_turn(i + kTurn, next, nextb);
      BSG_TRACE(i / kTurn, 2);
      warpgroup_wait<0>();
      BSG_TRACE(i / kTurn, 3);
      warpgroup_fence_operand(acc);
      warpgroup_fence_operand(cur);
      if constexpr (kTurn == 2) warpgroup_fence_operand(curb);
      BSG_TRACE(i / kTurn, 4);
      release_after(i);
      if constexpr (kTurn == 2) release_after(i + 1);
      BSG_TRACE(i / kTurn, 5);
    };
    for (int i = 0; i < n_kt; i += 2 * kTurn) {
      step(i, frag0, frag0b, frag1, frag1b);
      if (i + kTurn < n_kt) step(i + kTurn, frag1, frag1b, frag0, frag0b);
    }
    compute_sync();  // both warpgroups' wgmma done: the epilogue reuses the buffers
    if constexpr (T::kWScaleLow) {
      CUTE_UNROLL
      for (int i = 0; i < size(acc); ++i) acc(i) *= 64.f;  // the weights' 2^-6 (Tile::kWScaleLow)
    }
  } else {
    // Both operands into the swizzled FP16 buffers, for the SS wgmma.
    Operand<kBM> opA;
    Operand<BN> opB;
    opA.init(0, tid);
    opB.init(n0 % 128, tid);
    // Decode 64-K block `sub` (0 or 1) of raw slot `slot` into FP16 buffer `buf`.
    // Every load of the k-tile goes first: the compiler cannot tell raw and decoded buffers apart,
    // so a shared-memory load after a store waits for it (8192^3 2508 -> 2399 us, H200).
    auto decode = [&](int i, int buf) {  // MMA k-tile i of this split
      if constexpr ((BSG_SM90_ABLATE & 1) != 0) return;
      const uint8_t* base = raw + ((i / kSubs) % T::kRawStages) * T::kRawBytes;
      const int sub = i % kSubs;
      RawUnits<Operand<kBM>::kUnits> ra;
      RawUnits<Operand<BN>::kUnits> rb;
      uint8_t* dec_a = reinterpret_cast<uint8_t*>(decA) + buf * (kBM * kBK * 2);
      uint8_t* dec_b = reinterpret_cast<uint8_t*>(decB) + buf * (BN * kBK * 2);
      if constexpr ((BSG_SM90_ABLATE & 16) == 0) ra.load(opA, base, base + T::kRawA + T::kRawB, sub);
      rb.load(opB, base + T::kRawA, base + T::kSfB, sub);
      if constexpr ((BSG_SM90_ABLATE & 16) == 0) ra.store(opA, dec_a);
      rb.store(opB, dec_b);
    };
    Tensor sB = make_tensor(make_smem_ptr(decB), typename T::SmemLayoutB{});
    Tensor tCrA = wg_mma.make_fragment_A(wg_mma.partition_A(sA));  // (MMA, MMA_M, MMA_K, 2)
    Tensor tCrB = wg_mma.make_fragment_B(wg_mma.partition_B(sB));

    // The next k-tile is decoded while the wgmma runs on this one (two buffers).
    constexpr int kAhead = T::kDecBufs - 1;
    static_assert(kAhead == 1, "unswapped tiles: two decoded buffers");
    for (int j = 0; j < kAhead && j < n_kt; ++j) {
      if (j % kSubs == 0) wait_raw(j / kSubs);
      decode(j, j);
    }
    cutlass::arch::fence_view_async_shared();  // generic-proxy stores, read next by wgmma
    compute_sync();
    for (int j = 0; j < kAhead; ++j) {
      if (tid == 0 && stage_done(j)) issue(j / kSubs + T::kRawStages);
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
      // Thread 0 refills the slot the previous iteration finished here, behind its wgmma issue
      // rather than ahead of it: issuing a stage stalls the issuing warp, and the warpgroup's
      // wgmma waits for all its warps (128x4096x7168 33.0 -> 32.3 us).
      if (tid == 0 && i > 0 && stage_done(i - 1 + kAhead)) issue((i - 1 + kAhead) / kSubs + T::kRawStages);
      BSG_TRACE(i, 1);
      const int j = i + kAhead;
      if (j < n_kt) {  // decode a later k-tile while the tensor cores work
        if (j % kSubs == 0) wait_raw(j / kSubs);
        decode(j, j % T::kDecBufs);
        cutlass::arch::fence_view_async_shared();
      }
      BSG_TRACE(i, 2);
      warpgroup_wait<0>();
      BSG_TRACE(i, 3);
      warpgroup_fence_operand(acc);
      compute_sync();
      BSG_TRACE(i, 4);
      BSG_TRACE(i, 5);
    }
  }  // kSwap

  stamp(2);
  // The next kernel, if launched programmatically (the next call's pre-pass), may be scheduled;
  // it waits for this grid's completion before it touches memory.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  if ((BSG_SM90_ABLATE & 8) == 0 && p.split_k > 1 && !kClusterReduce) {
    // Split s's partial tile: [split][tile][acc / 4][thread] float4.
    auto partial = [&](int s) {
      return reinterpret_cast<float4*>(p.partials) + ((int64_t(s) * gridDim.x + tile) * (T::kAcc / 4)) * kThreads + tid;
    };
    float4* mine = partial(split);
    CUTE_UNROLL
    for (int i = 0; i < T::kAcc / 4; ++i)
      mine[int64_t(i) * kThreads] = make_float4(acc(4 * i), acc(4 * i + 1), acc(4 * i + 2), acc(4 * i + 3));
    __threadfence();
    __syncthreads();
    __shared__ int last;
    if (tid == 0) {
      last = atomicAdd(p.counters + tile, 1u) == uint32_t(p.split_k - 1);
      if (last) p.counters[tile] = 0;  // every split has counted: ready for the next launch
    }
    __syncthreads();
    if (!last) {
      stamp(3);
      return;
    }
    __threadfence();
    clear(acc);
    // Fixed order s = 0, 1, ...: the sum does not depend on arrival order. The loads of four
    // splits are issued together: one dependent L2 read after another made this reduction the
    // longest part of a CTA at M = 128.
    for (int s0 = 0; s0 < p.split_k; s0 += 4) {
      const int ns = min(4, p.split_k - s0);
      const float4* part[4] = {partial(s0), partial(min(s0 + 1, p.split_k - 1)), partial(min(s0 + 2, p.split_k - 1)),
                               partial(min(s0 + 3, p.split_k - 1))};
      CUTE_UNROLL
      for (int i = 0; i < T::kAcc / 4; ++i) {
        float4 v[4];
        CUTE_UNROLL
        for (int t = 0; t < 4; ++t) v[t] = __ldcg(part[t] + int64_t(i) * kThreads);  // L2: other SMs wrote these
        CUTE_UNROLL
        for (int t = 0; t < 4; ++t) {
          if (t < ns) {
            acc(4 * i) += v[t].x;
            acc(4 * i + 1) += v[t].y;
            acc(4 * i + 2) += v[t].z;
            acc(4 * i + 3) += v[t].w;
          }
        }
      }
    }
  }

  // Epilogue through shared memory (free now: every load was consumed, every wgmma waited for):
  // the accumulators go in as fragments and leave as whole row pieces, so C is read and D written
  // in 16-byte (or, for FP4, 8-byte) units rather than 2-element fragments.
  Tensor coord = mma.get_thread_slice(tid).partition_C(make_identity_tensor(typename T::MmaShape{}));
  // Floats per row. Unswapped: the 16-lane halves of a warp's float2 stores hit 32 distinct
  // banks. Swapped: the warp's transposed scalar stores (8 columns x 4 even rows) do with a pitch
  // of 4 mod 32 banks (BN + 8 made them 2-way conflicts: 1.2 us per CTA, now 0.6).
  constexpr int kLd = BN + (kSwap ? 4 : 8);
  static_assert(kBM * kLd * 4 <= T::kSmem - 1024, "the epilogue tile fits the kernel's shared memory");
  float* tile_s = reinterpret_cast<float*>(smem);
  if constexpr (kSwap) {
    CUTE_UNROLL
    for (int i = 0; i < size(acc); ++i) tile_s[get<1>(coord(i)) * kLd + get<0>(coord(i))] = acc(i);  // transposed back
  } else {
    CUTE_UNROLL
    for (int i = 0; i < size(acc); i += 2) {  // values i, i + 1: adjacent columns of one row
      *reinterpret_cast<float2*>(tile_s + get<0>(coord(i)) * kLd + get<1>(coord(i))) = make_float2(acc(i), acc(i + 1));
    }
  }
  using Sf = typename OutputInfo<OutT>::Sf;
  if constexpr (std::is_void_v<Sf>) {
    // D = alpha * acc + beta * C, rounded once to OutT, kW outputs per thread and step.
    constexpr int kW = 16 / sizeof(OutT);  // elements per 16 bytes; N % kW == 0
    OutT* d = static_cast<OutT*>(p.d) + batch * p.m * int64_t(p.n);
    const OutT* c = static_cast<const OutT*>(p.c) + batch * p.m * int64_t(p.n);
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
    if constexpr (kClusterReduce && (BSG_SM90_ABLATE & 8) == 0) {
      // Every CTA of the cluster holds its partial tile; this one sums rows [r0, r1) of all of
      // them in split order (from 0.0, as the global path does) and writes them out.
      stamp(5);
      cute::cluster_sync();
      stamp(6);
      const int r0 = split * kBM / p.split_k, r1 = (split + 1) * kBM / p.split_k;
      // One float4 (4 columns) per thread and step, consecutive threads on consecutive float4s:
      // 8 columns per thread (32-byte steps) was 2-3 us slower per CTA, 16 slower still.
      for (int u = tid; u < (r1 - r0) * (BN / 4); u += kThreads) {
        const int r = r0 + u / (BN / 4), col = (u % (BN / 4)) * 4;
        float4 v[1];
        cluster_sum(tile_s + r * kLd + col, p.split_k, v);
        store(std::integral_constant<int, 4>{}, r, col, reinterpret_cast<const float*>(v));
      }
      stamp(7);
      cute::cluster_sync();  // no CTA leaves while a peer still reads its shared memory
    } else {
      __syncthreads();
      // Unrolled, with 16-byte shared-memory loads: scalar loads and a loop the compiler kept
      // rolled took 5.3 us per 128x256 CTA, this 2.3 (timeline, H100).
      static_assert(kBM * BN / kW % kThreads == 0, "whole chunks per thread");
      CUTE_UNROLL
      for (int it = 0; it < kBM * BN / kW / kThreads; ++it) {
        const int chunk = tid + it * kThreads;
        const int r = chunk / (BN / kW), col = (chunk % (BN / kW)) * kW;
        float4 v[kW / 4];
        CUTE_UNROLL
        for (int e = 0; e < kW / 4; ++e) v[e] = *reinterpret_cast<const float4*>(tile_s + r * kLd + col + 4 * e);
        store_chunk(r, col, reinterpret_cast<const float*>(v));
      }
    }
  } else {
    int r0 = 0, r1 = kBM;  // the rows of the tile this CTA writes out
    if constexpr (kClusterReduce && (BSG_SM90_ABLATE & 8) == 0) {
      // As above, but the FP4 epilogue reads the tile: the slice's sums go into registers first
      // and back into this CTA's tile once no peer reads it any more.
      cute::cluster_sync();
      r0 = split * kBM / p.split_k;
      r1 = (split + 1) * kBM / p.split_k;
      constexpr int kUnits = (kBM / 2) * (BN / 4) / kThreads;  // float4s per thread, split_k >= 2
      float4 sum[kUnits];
      CUTE_UNROLL
      for (int j = 0; j < kUnits; ++j) {
        const int u = tid + j * kThreads, r = r0 + u / (BN / 4), col = (u % (BN / 4)) * 4;
        if (r >= r1) continue;
        float4 v[1];
        cluster_sum(tile_s + r * kLd + col, p.split_k, v);
        sum[j] = v[0];
      }
      cute::cluster_sync();  // no peer reads this CTA's tile any more
      CUTE_UNROLL
      for (int j = 0; j < kUnits; ++j) {
        const int u = tid + j * kThreads, r = r0 + u / (BN / 4), col = (u % (BN / 4)) * 4;
        if (r < r1) *reinterpret_cast<float4*>(tile_s + r * kLd + col) = sum[j];
      }
    }
    __syncthreads();
    fp4_epilogue<Sf, BN>(p, tile_s, kLd, m0, n0, batch, r0, r1);
  }
  stamp(3);
}

template <int BM, int BN, bool Swap, class OutT>
struct Gemm {
  using T = Tile<BM, BN, Swap>;
  static constexpr int kBM = BM;

  static int64_t tiles(const KernelArgs& a) {
    return int64_t((a.m + kBM - 1) / kBM) * ((a.n + BN - 1) / BN) * a.l;
  }

  static bool can_implement(const KernelArgs& a) {
    if (a.m <= 0 || a.n <= 0 || a.k <= 0 || a.l <= 0 || a.k % 32 != 0) return false;
    if (a.n % OutputInfo<OutT>::kNMultiple != 0) return false;
    if (!std::is_void_v<typename OutputInfo<OutT>::Sf> && (!a.sfd || !a.norm_constant)) return false;
    const int k_tiles = (a.k + kBK - 1) / kBK;
    return tiles(a) <= INT_MAX && a.split_k >= 1 && a.split_k <= k_tiles && a.split_k <= 65535 &&
           (a.split_k == 1 || tiles(a) <= kMaxSplitTiles);
  }

  // TMA descriptor of a packed operand: (row_bytes, rows, batch) bytes, boxes of kRawK / 2 bytes x
  // box_rows rows; or (f16) of the pre-decoded activations: (row_bytes / 2, rows, batch) halves,
  // boxes of 64 halves x box_rows rows in the GMMA 128-byte swizzle. Reads past a row, the rows or
  // the batch are zero-filled.
  static bool encode(CUtensorMap* map, const void* base, int64_t row_bytes, int64_t rows, int64_t batch, uint32_t box_rows,
                     bool f16 = false) {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
      void* f = nullptr;
      cudaDriverEntryPointQueryResult q;
      if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
          q != cudaDriverEntryPointSuccess)
        return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
      return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
    }();
    if (!fn) return false;
    const cuuint64_t dims[3] = {cuuint64_t(f16 ? row_bytes / 2 : row_bytes), cuuint64_t(rows), cuuint64_t(batch)};
    const cuuint64_t strides[2] = {cuuint64_t(row_bytes), cuuint64_t(row_bytes * rows)};
    const cuuint32_t box[3] = {f16 ? uint32_t(kBK) : uint32_t(kRawK / 2), box_rows, 1};
    const cuuint32_t elem[3] = {1, 1, 1};
    return fn(map, f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<void*>(base), dims, strides,
              box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, f16 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
              CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  }

  // The counter region does not depend on the problem, so a reused workspace never holds an
  // earlier call's partials where this call's counters are.
  static constexpr int64_t kMaxSplitTiles = 65536;
  static constexpr size_t kCountersBytes = kMaxSplitTiles * 4;

  // The swapped tiles (one CTA per SM). A cluster instance of the unswapped 128x128 (two CTAs
  // per SM; session 4, H100) was faster at 128x7168x2048 split 4 (20.2 vs 24.4 us) but slower at
  // 128x4096x7168 split 4 (41.0 vs 33.6) and 1024x1024x8192 split 4 (68.0 vs 51.2), for reasons
  // not yet measured, so that tile keeps the global path.
  static constexpr bool kClusterInstance = T::kSwap;
  static constexpr bool cluster_reducible(int split_k) { return kClusterInstance && split_k > 1 && split_k <= kMaxClusterSplit; }

  // Split-K's counters and partials, then (kPreA) the decoded activations at a 1024-byte boundary,
  // never over the counter region: one workspace serves every config of a BlockScaledGemm, and
  // another config's split-K launch needs its counters still zero.
  static size_t split_bytes(const KernelArgs& a) {
    if (a.split_k <= 1 || cluster_reducible(a.split_k)) return 0;
    return kCountersBytes + size_t(a.split_k) * size_t(tiles(a)) * kBM * BN * sizeof(float);
  }
  static constexpr int kPreSmem = 120 * 1024;  // the pre-pass's reservation: one CTA per SM
  static int64_t k_pad(const KernelArgs& a) { return (int64_t(a.k) + kBK - 1) / kBK * kBK; }
  static size_t pre_a_offset(const KernelArgs& a) { return (std::max(split_bytes(a), kCountersBytes) + 1023) / 1024 * 1024; }
  static size_t workspace_size(const KernelArgs& a) {
    if (!T::kPreA) return split_bytes(a);
    return pre_a_offset(a) + size_t(a.l) * size_t(a.m) * size_t(k_pad(a)) * 2;
  }

  static KernelStatus run(const KernelArgs& a) {
    if (!can_implement(a)) return {int32_t(cutlass::Status::kErrorInvalidProblem), 0};
    if (workspace_size(a) > a.workspace_bytes) return {int32_t(cutlass::Status::kErrorWorkspaceNull), 0};
    static std::atomic<uint64_t> configured{0};  // devices whose shared-memory limit is raised
    const uint64_t bit = uint64_t(1) << (a.device_id & 63);
    if (!(configured.load() & bit)) {
      cudaError_t e = cudaFuncSetAttribute(gemm_kernel<BM, BN, Swap, OutT, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmem);
      if (e == cudaSuccess && kClusterInstance)
        e = cudaFuncSetAttribute(gemm_kernel<BM, BN, Swap, OutT, kClusterInstance>, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmem);
      if (e == cudaSuccess && T::kPreA) e = cudaFuncSetAttribute(predecode_a, cudaFuncAttributeMaxDynamicSharedMemorySize, kPreSmem);
      if (e != cudaSuccess) return {int32_t(cutlass::Status::kErrorInternal), int32_t(e)};
      configured.fetch_or(bit);
    }
    CUtensorMap map_a, map_b;
    bool mapped;
    if constexpr (T::kPreA) {
      uint8_t* pre = static_cast<uint8_t*>(a.workspace) + pre_a_offset(a);
      // Programmatic launch: scheduled once the previous GEMM's CTAs leave their main loops, it
      // waits for that grid and then runs without a launch gap. One CTA of 1024 threads per SM
      // (the reserved, unused shared memory keeps two off one SM and off an SM a GEMM CTA
      // holds): as plain 256-thread blocks, the CTAs launched early piled onto the SMs the
      // previous GEMM left idle (128x7168x16384 back to back 55.0 -> 55.9 us). ablate, back to
      // back (bench/results/2026-11-22-h100-session9/experiments/run9.txt): 128x7168x2048
      // 17.2-17.4 -> 16.3-16.6 us, 128x4096x7168 split 6 25.5-25.9 -> 24.4-24.9,
      // 128x7168x16384 55.7-55.9 -> 54.2-54.4, 2048^3 30.6-30.9 -> 29.5-29.6; one launch alone
      // between events: 0 to 0.4 us slower (256-thread CTAs: up to 0.7).
      constexpr int kPreThreads = 1024;  // predecode_a's launch bound
      const int64_t items = int64_t(a.l) * a.m * (k_pad(a) / kBK) * 2;
      const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((items + kPreThreads - 1) / kPreThreads, a.sm_count));
      const KernelLaunch pre_launch(dim3(unsigned(blocks)), kPreThreads, 1, kPreSmem, static_cast<cudaStream_t>(a.stream), true);
      if (cudaError_t e = cudaLaunchKernelEx(&pre_launch.cfg, predecode_a, static_cast<const uint8_t*>(a.a), static_cast<const uint8_t*>(a.sfa),
                                             reinterpret_cast<uint4*>(pre), int(a.m), int(a.k), int(a.l));
          e != cudaSuccess)
        return {int32_t(cutlass::Status::kErrorInternal), int32_t(e)};
      mapped = encode(&map_a, pre, k_pad(a) * 2, a.m, a.l, kBM, true);
    } else {
      mapped = encode(&map_a, a.a, a.k / 2, a.m, a.l, kBM);
    }
    if (!mapped || !encode(&map_b, a.b, a.k / 2, a.n, a.l, BN)) return {int32_t(cutlass::Status::kErrorInternal), 0};
    Params p{a.m, a.n, a.k, a.l, a.split_k,
             static_cast<const uint8_t*>(a.a), static_cast<const uint8_t*>(a.sfa),
             static_cast<const uint8_t*>(a.b), static_cast<const uint8_t*>(a.sfb),
             a.c, a.d, a.alpha, a.beta,
             static_cast<uint32_t*>(a.workspace),
             reinterpret_cast<float*>(static_cast<uint8_t*>(a.workspace) + (a.split_k > 1 ? kCountersBytes : 0)),
             static_cast<uint8_t*>(a.sfd), a.norm_constant};
    const dim3 grid(unsigned(tiles(a)), unsigned(a.split_k));
    const bool cluster = cluster_reducible(a.split_k);
    const KernelLaunch launch(grid, T::kLaunchThreads, cluster ? a.split_k : 1, T::kSmem, static_cast<cudaStream_t>(a.stream), T::kPreA);
    const cudaError_t e = cluster ? cudaLaunchKernelEx(&launch.cfg, gemm_kernel<BM, BN, Swap, OutT, kClusterInstance>, p, map_a, map_b)
                                  : cudaLaunchKernelEx(&launch.cfg, gemm_kernel<BM, BN, Swap, OutT, false>, p, map_a, map_b);
    return {int32_t(e == cudaSuccess ? cutlass::Status::kSuccess : cutlass::Status::kErrorInternal), int32_t(e)};
  }

  // The layout the kernel indexes scales with (SPEC.md §3), for the host-side agreement test.
  static int64_t sf_offsets(int32_t m, int32_t n, int32_t k, int32_t l, SfOperand which, int64_t* out, size_t len) {
    const int32_t rows = which == SfOperand::A ? m : n;
    const int64_t cols = k / 16, sp = sf_cols_padded(k), per = sf_batch_bytes(rows, sp);
    if (len != size_t(rows * cols * l)) return -1;
    size_t i = 0;
    for (int64_t b = 0; b < l; ++b)
      for (int64_t s = 0; s < cols; ++s)
        for (int64_t r = 0; r < rows; ++r) out[i++] = b * per + sf_offset(r, s, sp);
    return per * l;
  }

  static KernelEntry entry() { return KernelEntry{&run, &workspace_size, &can_implement, &sf_offsets}; }
};

template <class T>
struct OutType { using type = T; };
template <>
struct OutType<cutlass::half_t> { using type = __half; };
template <>
struct OutType<cutlass::bfloat16_t> { using type = __nv_bfloat16; };

}  // namespace bsg::sm90

// Used by the generated translation units. The SM90 tile is tm x tn x 64 on one SM (Tile says which
// tm x tn), no cluster in the table (the kernel forms its own for split-K); swapped: the table's
// BSG_SM90_SWAPPED list names the config.
#define BSG_SM90_KERNEL(fn, sms, tm, tn, tk, cm, cn, out_type, swapped)                            \
  static_assert((sms) == 1 && (tk) == 64 && (cm) == 1 && (cn) == 1, "SM90 tile");                  \
  bsg::KernelEntry fn() {                                                                          \
    return bsg::sm90::Gemm<tm, tn, swapped, typename bsg::sm90::OutType<out_type>::type>::entry(); \
  }
