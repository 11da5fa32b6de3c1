// SM90 kernel policies: the main-loop schedules as tag types, the split-K reduction tags, the
// tile (its shared-memory plan and MMA), the kernel parameters and what an output tag means.
// Design and the measurements behind each choice: bench/DESIGN.md.
#pragma once

#include <cstdint>
#include <type_traits>

#include "blockscaled_gemm/kernel_abi.h"
#include "common/instrument.cuh"
#include "common/nvfp4.cuh"
#include "cute/arch/mma_sm90.hpp"
#include "cute/atom/mma_atom.hpp"
#include "cute/atom/mma_traits_sm90_gmma.hpp"
#include "cute/tensor.hpp"

// Small-M tile choices by token rows (BM): warps along K, raw stages. Experiments override them
// through BSG_NVCC_DEFINES, e.g. "BSG_SM90_STREAM_WK(bm)=4".
#ifndef BSG_SM90_STREAM_WK
#define BSG_SM90_STREAM_WK(bm) ((bm) <= 16 ? 8 : 4)
#endif
#ifndef BSG_SM90_STREAM_STAGES
#define BSG_SM90_STREAM_STAGES(bm) ((bm) <= 16 ? 4 : 6)
#endif
// The swapped 128x128 and 64x128 tiles' k-tiles per ping-pong turn and the swapped tiles' raw
// stages (not 256x128, whose activation buffers fit three), by token rows (BM).
#ifndef BSG_SM90_SWAP_TURN
#define BSG_SM90_SWAP_TURN(bm) 2
#endif
#ifndef BSG_SM90_SWAP_STAGES
#define BSG_SM90_SWAP_STAGES(bm) 4
#endif

namespace bsg::sm90 {

using namespace cute;

constexpr int kBK = 64;          // K per MMA k-tile: one 128-byte swizzle row of FP16, one scale column block
constexpr int kThreads = 256;    // the two compute warpgroups
constexpr int kRawK = BSG_SM90_RAW_K;  // K per raw (packed) stage of the wgmma tiles: kRawK / 2 contiguous bytes of every row
static_assert(kRawK % kBK == 0 && kRawK / 2 <= 256, "raw stage K");

// Split-K through the cluster's shared memory: up to the portable cluster size.
constexpr int kMaxClusterSplit = BSG_SM90_MAX_CLUSTER_SPLIT;
// Dynamic shared memory that keeps a second CTA off an SM (228 KB a Hopper SM, 1 KB of it per CTA
// reserved).
constexpr int kOneCtaPerSmSmem = 116 * 1024;
// A CTA's shared memory at most, static and dynamic (cudaDevAttrMaxSharedMemoryPerBlockOptin).
constexpr int kMaxCtaSmem = 227 * 1024;

// Main-loop schedules.
// Both operands decoded from the raw stage into 128B-swizzled FP16 buffers, SS wgmma; thread 0
// issues the loads behind its wgmma; two CTAs per SM.
struct MainloopSmemDecode {};
// Operands swapped (D^T = B A^T): the weights decoded straight into register fragments (RS
// wgmma), the activations pre-decoded to FP16 once per GEMM (predecode.cuh) and loaded by TMA; a
// producer warpgroup issues the loads, the two compute warpgroups take turns at the tensor cores.
struct MainloopSwappedRegisterDecode {};
// Small M (decode, MoE experts): the weights stream through a ring of raw stages and are decoded in
// registers straight into mma.sync fragments (weights as the MMA's M, tokens as its N); each warp
// decodes its own activation fragments from the same stage (no pre-pass); the eight warps split
// each stage's k-tiles and the tile's weight rows; a producer warp issues. kStageKTiles: k-tiles
// per raw stage, 0 for the tile's default (BSG_SM90_STREAM_WK).
template <int kStageKTiles>
struct MainloopStream {};
using MainloopStreamWeights = MainloopStream<0>;
// The same loop in stages of four k-tiles, eight of them, for the 8- and 16-row tiles: the last
// stage, whose decode no load hides, is half as long, which pays where a CTA's K range is short.
using MainloopStreamWeightsShortK = MainloopStream<4>;

// The activation operand (A). ActNvfp4: packed e2m1 with ue4m3 scales, decoded like the weights
// into FP16. ActDense<E>: dense 16-bit (E = half_t or bfloat16_t), loaded as it is (W4A16); the
// weights are decoded into E. Mma: the MMA's element type.
struct ActNvfp4 {
  using Mma = cute::half_t;
  static constexpr bool kScaled = true;
};
template <class E>
struct ActDense {
  static_assert(std::is_same_v<E, cute::half_t> || std::is_same_v<E, cute::bfloat16_t>, "W4A16 activations: f16 or bf16");
  using Mma = E;
  static constexpr bool kScaled = false;
};

// What the FP32 sums of a stream tile carry: 2^-6 per operand decoded as decode8<true> (FP16),
// 2^-7 for BF16 weights (decode8_bf16, and the FP16 loop that stands in for them); dense
// activations carry none.
template <class Act>
inline constexpr float kStreamUnscale = Act::kScaled ? 4096.f : std::is_same_v<typename Act::Mma, cute::half_t> ? 64.f : kBf16WeightUnscale;

// Split-K reductions (split_k > 1): partial tiles in global memory, summed in split order by the
// last CTA of a tile; or through the cluster's distributed shared memory.
struct ReduceGlobal {};
struct ReduceCluster {};

// The first raw stages whose weights reach L2 before griddepcontrol.wait (a swapped tile loads stage
// 0 there and prefetches the rest): two in the kernels whose K ranges meet in the cluster, none in
// the others (measured per kernel, bench/DESIGN.md §9).
template <class Reduce>
inline constexpr int kL2PrefetchStages = std::is_same_v<Reduce, ReduceCluster> ? 2 : 0;

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
  uint8_t* sfd;        // FP4 output only
  float norm_constant;  // FP4 output only
  // B's values prepacked (WeightLayout::Prepacked): its map's K coordinate is (byte in chunk,
  // chunk), and K ranges start at multiples of a TMA box.
  int32_t b_chunked = 0;
  // The swapped tiles: weights issued before griddep_wait, the kernel before being the pre-pass
  // (0 where the decoded activations are given and the kernel before may be any).
  int32_t weights_early = 1;
};

template <int BM, int BN, class Schedule, class Act = ActNvfp4>
struct Tile {
  using Activation = Act;
  using MmaElement = typename Act::Mma;
  static constexpr bool kSwap = std::is_same_v<Schedule, MainloopSwappedRegisterDecode>;
  static_assert(Act::kScaled || kSwap, "dense activations: the swapped and stream tiles");
  static_assert(kSwap || std::is_same_v<Schedule, MainloopSmemDecode>, "schedule tag");
  static_assert((BM == 128 && (BN == 64 || BN == 128 || BN == 256)) || (BM == 256 && BN == 128) || (BM == 64 && (BN == 128 || BN == 256)), "tile M x N");
  static_assert(kSwap == (BN == 256 || BM != 128) || (kSwap && BM == 128 && BN == 128),
                "128x256, 256x128, 64x128 and 64x256 exist only swapped, 128x64 only unswapped; 128x128 both ways");
  using Mainloop = Schedule;
  static constexpr int kBM = BM;
  static constexpr int kBN = BN;
  static constexpr int kRawK = ::bsg::sm90::kRawK;
  static constexpr int kSubs = kRawK / kBK;  // k-tiles per raw stage
  // Swapped: each warpgroup owns BN / 2 weight rows, kMB 64-row M blocks of the MMA: 128x256 and
  // 64x256 two against 128 or 64 activation rows; 256x128 one against 256; 128x128 and 64x128 one
  // against 128 or 64.
  static constexpr int kMB = BN / 128;
  static constexpr bool kSwap128 = kSwap && kMB == 1 && BM <= 128;
  // Swapped: k-tiles per ping-pong turn (the swapped 128x128's and 64x128's decode needs two
  // chains to hide).
  static constexpr int kTurn = kSwap128 ? BSG_SM90_SWAP_TURN(BM) : 1;
  // The swapped 128x128 and 64x128 (kSwap128) decode FP16 weights with the scale as converted
  // (decode8<true>); the other swapped tiles keep the 2^6 in the scale. What the FP32 sums then
  // carry (2^-6, or 2^-7 from BF16 weights) is undone after the loop.
  static constexpr bool kWScaleLow = kSwap128 && std::is_same_v<MmaElement, half_t>;
  static constexpr float kWUnscale = kWScaleLow ? 64.f : std::is_same_v<MmaElement, cute::bfloat16_t> ? kBf16WeightUnscale : 1.f;
  // Swapped: activations arrive pre-decoded (FP16, a * sf) or, dense, re-ordered (predecode.cuh)
  // through TMA.
  static constexpr bool kPreA = kSwap;
  static constexpr int kSfChunksB = (BN + 127) / 128;
  // Unswapped keeps two CTAs per SM; BM = 256's FP16 activation buffers fit three stages.
  static constexpr int kRawStages = !kSwap ? 2 : BM == 256 ? 3 : BSG_SM90_SWAP_STAGES(BM);
  // Raw stage (TMA destination): A rows x kRawK/2 bytes, B rows likewise, then the scales of the
  // kSubs k-tiles: kSubs x 512 bytes per 128-row block (A: one unless kPreA, B: 1-2).
  static constexpr int kRawA = kPreA ? 0 : kBM * kRawK / 2;
  static constexpr int kRawB = BN * kRawK / 2;
  static constexpr int kSfStage = kSubs * 512;  // scale bytes of one 128-row block per raw stage
  static constexpr int kSfB = kRawA + kRawB + (kPreA ? 0 : kSfStage);  // B's scales in a raw stage
  static constexpr int kRawBytes = kSfB + kSfStage * kSfChunksB;
  using SmemAtom = GMMA::Layout_K_SW128_Atom<MmaElement>;  // 8 x 64 halves, 128-byte swizzle
  // kPreA: one FP16 buffer per k-tile of every raw stage (k-tile i in buffer i % kDecBufs), filled
  // with the raw stage and freed with it. Unswapped: two, decoded one k-tile ahead.
  static constexpr int kDecBufs = kPreA ? kSubs * kRawStages : 2;
  using SmemLayoutA = decltype(tile_to_shape(SmemAtom{}, make_shape(Int<kBM>{}, Int<kBK>{}, Int<kDecBufs>{})));
  using SmemLayoutB = decltype(tile_to_shape(SmemAtom{}, make_shape(Int<BN>{}, Int<kBK>{}, Int<kDecBufs>{})));
  // MMA M x N: activations x weights, or (kSwap) weights x activations.
  using MmaShape = std::conditional_t<kSwap, Shape<Int<BN>, Int<kBM>>, Shape<Int<kBM>, Int<BN>>>;
  using TiledMma = std::conditional_t<
      kSwap,
      decltype(make_tiled_mma(
          SM90::GMMA::rs_op_selector<MmaElement, MmaElement, float, Shape<_64, Int<kBM>, _16>, GMMA::Major::K, GMMA::Major::K>(),
          Layout<Shape<_2, _1, _1>>{})),
      decltype(make_tiled_mma(
          SM90::GMMA::ss_op_selector<MmaElement, MmaElement, float, Shape<_64, Int<BN>, _16>, GMMA::Major::K, GMMA::Major::K>(),
          Layout<Shape<_2, _1, _1>>{}))>;
  static constexpr int kDecA = kBM * kBK * 2 * kDecBufs;  // bytes
  static constexpr int kDecB = kSwap ? 0 : BN * kBK * 2 * kDecBufs;
  static constexpr int kSmem = 1024 + kDecA + kDecB + kRawStages * kRawBytes;  // 1024: swizzle alignment
  // Swapped: one CTA per SM, held by registers (384 threads x 168: the whole file, which
  // setmaxnreg needs); the 64x128 tile's shared memory alone would admit a second.
  static constexpr int kMinBlocks = kSwap ? 1 : 2;
  // Swapped: a producer warpgroup (128 threads, one of which issues every raw stage) whose
  // registers setmaxnreg hands to the compute warpgroups (accumulators plus two register
  // fragments of weights). Unswapped: 256 threads, thread 0 issues.
  static constexpr int kLaunchThreads = kThreads + (kSwap ? 128 : 0);
  static constexpr int kAcc = kBM * BN / kThreads;  // accumulator floats per thread
  // Split-K through the cluster: the swapped tiles (one CTA per SM) only.
  static constexpr bool kClusterReduce = kSwap;
  // What the shared parts read of every tile (with kRawK and kSubs above): the TMA boxes of a
  // packed operand's stage (count along K, bytes each, swizzle), arrivals that free a raw slot,
  // whether producer warps exit early (then the compute threads synchronize on a named barrier),
  // and the row pitch in floats of the FP32 output tile in shared memory (unswapped: float2
  // stores; swapped: transposed scalar stores; both free of bank conflicts).
  static constexpr int kBoxesK = 1;
  static constexpr int kBoxBytesK = kRawK / 2;
  static constexpr bool kSwizzleRaw = false;
  static constexpr int kEmptyArrivals = kThreads;
  static constexpr bool kProducerExits = kSwap;
  static constexpr int kEpiLd = BN + (kSwap ? 4 : 8);
  // Launched programmatically behind the previous kernel: the swapped tiles behind their pre-pass
  // (only the activations wait for it); the unswapped kernel never waits, so it is not.
  static constexpr bool kProgrammatic = kPreA;
};

// The small-M tile: BM tokens x BN weight rows. Eight compute warps: kWk along K (k-tile j of a
// raw stage belongs to warp row j), kWn along N (kRW m16 blocks of weight rows each). A raw stage
// holds kWk k-tiles of both operands as TMA boxes of 128-byte rows in the 128-byte swizzle (so the
// fragment loads of eight rows at one K offset hit distinct banks) and their scale chunks; one
// producer warp issues the stages and exits (the persistent grouped kernels of the short-K tiles
// add a tenth warp for their epilogues: kernel_grouped.cuh). Accumulators: kRW x (BM / 8) m16n8
// fragments per thread, summed over the warp rows in shared memory after the loop.
//
// Dense activations (W4A16): one box of 128-byte rows (64 values) per k-tile, no scales; fewer
// stages where the default ring would not fit.
template <int BM, int BN, int kStageKTiles, class Act>
struct Tile<BM, BN, MainloopStream<kStageKTiles>, Act> {
  using Mainloop = MainloopStream<kStageKTiles>;
  using Activation = Act;
  using MmaElement = typename Act::Mma;
  static constexpr bool kSwap = false;
  static constexpr bool kPreA = false;
  static constexpr bool kClusterReduce = true;  // splits of 2 to kMaxClusterSplit: no partials through L2
  static constexpr bool kSwap128 = false;
  static constexpr int kBM = BM;
  static constexpr int kBN = BN;
  static constexpr int kWk = kStageKTiles ? kStageKTiles : BSG_SM90_STREAM_WK(BM);
  static constexpr int kWn = 8 / kWk;
  static constexpr bool kShortK = kStageKTiles != 0;  // the short-K stages (MainloopStreamWeightsShortK)
  static constexpr int kRW = BN / (16 * kWn);
  static constexpr int kNT = BM / 8;
  static_assert(BM % 8 == 0 && BM <= 64 && (kWk == 4 || kWk == 8) && kRW >= 1 && kRW * 16 * kWn == BN && BN <= 128 && 128 % BN == 0,
                "stream tile (within one 128-row chunk of B's scales)");
  static constexpr int kRawK = kBK * kWk;
  static constexpr int kSubs = kWk;
  static constexpr int kBoxesK = kWk / 4;
  static constexpr int kBoxesKA = Act::kScaled ? kBoxesK : kWk;  // A's boxes per stage
  static constexpr int kBoxBytesK = 128;
  static constexpr bool kSwizzleRaw = true;
  static constexpr int kSfChunksB = 1;
  static constexpr int kRawA = Act::kScaled ? BM * kRawK / 2 : BM * kRawK * 2;
  static constexpr int kRawB = BN * kRawK / 2;
  static constexpr int kSfStage = kSubs * 512;
  static constexpr int kSfA = kRawA + kRawB;  // A's scales in a raw stage (ActNvfp4)
  static constexpr int kSfB = kRawA + kRawB + (Act::kScaled ? kSfStage : 0);  // B's scales
  static constexpr int kRawBytes = kSfB + kSfStage;
  static constexpr int kDefaultStages = kStageKTiles ? 32 / kStageKTiles : BSG_SM90_STREAM_STAGES(BM);
  static constexpr int kRawStages = kDefaultStages * kRawBytes <= 208 * 1024 ? kDefaultStages : 208 * 1024 / kRawBytes;
  static constexpr int kEmptyArrivals = 8;  // one per compute warp
  static constexpr bool kProducerExits = true;
  static constexpr bool kProgrammatic = true;  // every thread waits before its first global access
  static constexpr int kLaunchThreads = kThreads + 32;
  static constexpr int kEpiLd = BN + 4;
  // The output tile once the warp rows are summed: kUnits float4 units, unit u of thread
  // u % kThreads; kAcc floats a thread (where the tile has fewer units than threads, 8x64, 8x32
  // and 16x32, the others hold one unit of zeros, which the global split-K sum stores and adds
  // like the rest).
  static constexpr int kUnits = BM * BN / 4;
  static constexpr int kAcc = 4 * ((kUnits + kThreads - 1) / kThreads);
  static_assert(kUnits % kThreads == 0 || kUnits < kThreads, "stream tile: whole float4 units per thread");
  // kWk slabs of the FP32 tile for the sum over warp rows; they reuse the raw stages (the
  // persistent grouped kernel keeps them apart where both fit: kernel_grouped.cuh).
  static constexpr int kSlab = BM * kEpiLd * 4;
  // One CTA per SM, as the split rule assumes: the 64- and 32-wide tiles need less than half an
  // SM's shared memory, and a second CTA on an SM (of the next launch, which the programmatic
  // launch lets in early) leaves others idle (bench/DESIGN.md §12).
  static constexpr int kSmemUsed = 1024 + (kRawStages * kRawBytes > kWk * kSlab ? kRawStages * kRawBytes : kWk * kSlab);
  static constexpr int kSmem = kSmemUsed > kOneCtaPerSmSmem ? kSmemUsed : kOneCtaPerSmSmem;
  static constexpr int kMinBlocks = 1;
  static_assert(kRawA % 1024 == 0 && kRawB % 1024 == 0 && kRawBytes % 1024 == 0, "swizzled boxes start at 1024-byte boundaries");
};

// The compute threads' barrier. Where producer warps exit early, a named barrier over the kThreads
// compute threads: barrier 0 spans the whole CTA, exited warps included.
template <class T>
__device__ __forceinline__ void compute_sync() {
  if constexpr (T::kProducerExits) asm volatile("bar.sync 1, %0;\n" ::"n"(kThreads) : "memory");
  else __syncthreads();
}

// The threads that run an epilogue, as a tag: the compute threads (their barrier) or the one
// epilogue warp of a persistent grouped kernel (kernel_grouped.cuh), which writes an item out
// while the compute warps decode the next.
template <class T>
struct ComputeThreads {
  static constexpr int kCount = kThreads;
  __device__ __forceinline__ static void sync() { compute_sync<T>(); }
};
struct EpilogueWarp {
  static constexpr int kCount = 32;
  __device__ __forceinline__ static void sync() { __syncwarp(); }
};

// The compute threads' AND of a per-thread condition (a barrier, as compute_sync).
template <class T>
__device__ __forceinline__ bool compute_and(bool v) {
  if constexpr (T::kProducerExits) {
    uint32_t r;
    asm volatile("{\n .reg .pred p, q;\n setp.ne.u32 q, %1, 0;\n bar.red.and.pred p, 1, %2, q;\n selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(r)
                 : "r"(uint32_t(v)), "n"(kThreads)
                 : "memory");
    return r != 0;
  } else {
    return __syncthreads_and(v) != 0;
  }
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

}  // namespace bsg::sm90
