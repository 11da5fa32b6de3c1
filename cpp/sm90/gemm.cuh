// SM90 host adapter: checks, workspace, TMA descriptors and the launches (the activation pre-pass,
// then the GEMM) of one instantiation, and the entry the generated translation units export.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>

#include "blockscaled_gemm/kernel_abi.h"
#include "common/launch.h"
#include "common/scale_layout.cuh"
#include "cutlass/cutlass.h"
#include "sm90/dispatch_policy.cuh"
#include "sm90/kernel.cuh"
#include "sm90/kernel_stream.cuh"
#include "sm90/predecode.cuh"
#include "sm90/tile_scheduler.cuh"

namespace bsg::sm90 {

// The kernel a tile's schedule launches, per split-K reduction.
template <class T, class OutT, class Reduce, class Schedule = typename T::Mainloop>
inline constexpr auto kKernel = &gemm_kernel<T, OutT, Reduce>;
template <class T, class OutT, class Reduce, int kStageKTiles>
inline constexpr auto kKernel<T, OutT, Reduce, MainloopStream<kStageKTiles>> = &stream_kernel<T, OutT, Reduce>;

template <class T, class OutT>
struct Gemm {
  using Sched = TileScheduler<T>;
  // The instance a split of 2 to kMaxClusterSplit launches (the global one where T has none).
  using SplitReduce = std::conditional_t<T::kClusterReduce, ReduceCluster, ReduceGlobal>;
  static constexpr int kBM = T::kBM, BN = T::kBN;
  static constexpr bool kDenseA = !T::Activation::kScaled;  // W4A16: a is (L, M, K) 16-bit, sfa unused

  static int64_t tiles(const KernelArgs& a) { return Sched::tiles(a); }

  static bool can_implement(const KernelArgs& a) {
    if (a.m <= 0 || a.n <= 0 || a.k <= 0 || a.l <= 0 || a.k % 32 != 0) return false;
    if (a.m > BSG_MAX_EXTENT || a.n > BSG_MAX_EXTENT || a.k > BSG_MAX_EXTENT) return false;
    if (a.n % OutputInfo<OutT>::kNMultiple != 0) return false;
    if (!std::is_void_v<typename OutputInfo<OutT>::Sf> && (!a.sfd || !fp4_norm_constant_ok(a.norm_constant))) return false;
    const int k_tiles = (a.k + kBK - 1) / kBK;
    return is_weight_layout(a.b_layout) && tiles(a) <= INT_MAX &&
           a.split_k >= 1 && a.split_k <= k_tiles && a.split_k <= Sched::max_split(a) && a.split_k <= BSG_SM90_MAX_SPLIT_K &&
           (a.split_k == 1 || tiles(a) <= Sched::kMaxSplitTiles);
  }

  // cuTensorMapEncodeTiled through the runtime's driver entry point (nothing links libcuda);
  // element strides 1, 128-byte L2 promotion, reads past any dimension zero-filled.
  static bool encode_tiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, const void* base, const cuuint64_t* dims,
                           const cuuint64_t* strides, const cuuint32_t* box, bool swizzle) {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
      void* f = nullptr;
      cudaDriverEntryPointQueryResult q;
      if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
          q != cudaDriverEntryPointSuccess)
        return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
      return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
    }();
    if (!fn) return false;
    const cuuint32_t elem[4] = {1, 1, 1, 1};
    return fn(map, type, rank, const_cast<void*>(base), dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE,
              swizzle ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  }

  // TMA descriptor of packed activations: (row_bytes, rows, batch) bytes, boxes of the tile's
  // kBoxBytesK bytes x box_rows rows (in the 128-byte swizzle where the tile says so); or (f16)
  // of 16-bit activations (pre-decoded, re-ordered or dense; f16 or bf16 bits, moved as they
  // are): (row_bytes / 2, rows, batch) elements, boxes of 64 x box_rows in the 128-byte swizzle.
  static bool encode(CUtensorMap* map, const void* base, int64_t row_bytes, int64_t rows, int64_t batch, uint32_t box_rows,
                     bool f16 = false) {
    const cuuint64_t dims[3] = {cuuint64_t(f16 ? row_bytes / 2 : row_bytes), cuuint64_t(rows), cuuint64_t(batch)};
    const cuuint64_t strides[2] = {cuuint64_t(row_bytes), cuuint64_t(row_bytes * rows)};
    const cuuint32_t box[3] = {f16 ? uint32_t(kBK) : uint32_t(T::kBoxBytesK), box_rows, 1};
    return encode_tiled(map, f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, base, dims, strides, box,
                        f16 || T::kSwizzleRaw);
  }

  // TMA descriptor of the weights (B): (byte in chunk, row, chunk, batch) over `rows` rows of K
  // values, boxes of kBoxBytesK bytes x box_rows rows in one chunk. Standard: one chunk, the
  // whole row (K / 2 bytes); prepacked (kernel_abi.h): chunks of BSG_PREPACK_CHUNK_BYTES, each
  // holding that part of every row.
  static bool encode_b(CUtensorMap* map, const void* base, int64_t k, int64_t rows, int64_t batch, uint32_t box_rows, bool prepacked) {
    const int64_t row_bytes = k / 2, chunk = prepacked ? BSG_PREPACK_CHUNK_BYTES : row_bytes;
    const int64_t chunks = (row_bytes + chunk - 1) / chunk;
    const cuuint64_t dims[4] = {cuuint64_t(chunk), cuuint64_t(rows), cuuint64_t(chunks), cuuint64_t(batch)};
    // Rows one chunk apart (standard: the chunk is the row), chunks every row's chunk apart.
    const cuuint64_t strides[3] = {cuuint64_t(chunk), cuuint64_t(chunk * rows), cuuint64_t(chunks * chunk * rows)};
    const cuuint32_t box[4] = {uint32_t(T::kBoxBytesK), box_rows, 1, 1};
    return encode_tiled(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, base, dims, strides, box, T::kSwizzleRaw);
  }

  // The A operand's map, as the tile reads it: the pre-pass's output `pre` ((batch, rows, K
  // rounded up to 64) halves) for the swapped tiles, else A itself (dense 16-bit or packed).
  static bool encode_a(CUtensorMap* map, const void* a, const void* pre, int64_t k, int64_t rows, int64_t batch) {
    if constexpr (T::kPreA) return encode(map, pre, (k + kBK - 1) / kBK * kBK * 2, rows, batch, kBM, true);
    else if constexpr (kDenseA) return encode(map, a, k * 2, rows, batch, kBM, true);
    else return encode(map, a, k / 2, rows, batch, kBM);
  }

  // Decoded activations given (pre_a) need no room for the pre-pass's output.
  static size_t workspace_size(const KernelArgs& a) {
    return T::kPreA && a.pre_a ? Sched::pre_a_offset(a) : Sched::workspace_size(a);
  }

  // Every check comes before the first write or launch, so a refused call leaves memory as it was.
  static KernelStatus run(const KernelArgs& a) {
    if (!can_implement(a) || (a.pre_a && a.pre_a_rows < a.m)) return {BSG_STATUS_INVALID_PROBLEM, 0, 0};
    if (workspace_size(a) > a.workspace_bytes) return {BSG_STATUS_WORKSPACE_NULL, 0, uint64_t(workspace_size(a))};
    void* const workspace = reinterpret_cast<void*>(a.workspace);
    const auto stream = reinterpret_cast<cudaStream_t>(a.stream);
    static SmemLimitOnce smem_limit;
    if (const cudaError_t e = smem_limit.ensure(a.device_id, [] {
          cudaError_t e = cudaFuncSetAttribute(kKernel<T, OutT, ReduceGlobal>, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmem);
          if (e == cudaSuccess && T::kClusterReduce)
            e = cudaFuncSetAttribute(kKernel<T, OutT, SplitReduce>, cudaFuncAttributeMaxDynamicSharedMemorySize, T::kSmem);
          if constexpr (T::kPreA) {
            if (e == cudaSuccess) e = kDenseA ? reserve_pre_pass_smem(reorder_a) : reserve_pre_pass_smem(predecode_a);
          }
          return e;
        });
        e != cudaSuccess)
      return {int32_t(cutlass::Status::kErrorInternal), int32_t(e), 0};
    // The decoded activations: given, or the pre-pass's output in the workspace (rows padded to
    // the tile's: TMA filling a box past the last row was slow, bench/DESIGN.md §3).
    const bool given = T::kPreA && a.pre_a;
    uint8_t* const pre = given ? reinterpret_cast<uint8_t*>(a.pre_a) : static_cast<uint8_t*>(workspace) + Sched::pre_a_offset(a);
    CUtensorMap map_a, map_b;
    const int64_t m_pad = Sched::m_pad(a);
    if (!encode_a(&map_a, reinterpret_cast<const void*>(a.a), pre, a.k, !T::kPreA ? a.m : given ? a.pre_a_rows : m_pad, a.l) ||
        !encode_b(&map_b, reinterpret_cast<const void*>(a.b), a.k, a.n, a.l, BN, a.b_layout == int32_t(WeightLayout::Prepacked)))
      return {int32_t(cutlass::Status::kErrorInternal), 0, 0};
    if constexpr (T::kPreA && (BSG_SM90_ABLATE & 32) == 0) {
      const cudaError_t e = given ? cudaSuccess :
          kDenseA ? launch_reorder_a(reinterpret_cast<const void*>(a.a), pre, a.m, int(m_pad), a.k, a.l, a.sm_count, stream)
                  : launch_pre_pass<predecode_a>(int64_t(a.l) * m_pad * (Sched::k_pad(a) / kBK) * 2, a.sm_count, stream,
                                    reinterpret_cast<const uint8_t*>(a.a), reinterpret_cast<const uint8_t*>(a.sfa), reinterpret_cast<uint4*>(pre),
                                    int(a.m), int(m_pad), int(a.k), int(a.l));
      if (e != cudaSuccess) return {int32_t(cutlass::Status::kErrorInternal), int32_t(e), 0};
    }
    Params p{a.m, a.n, a.k, a.l, a.split_k,
             reinterpret_cast<const uint8_t*>(a.a), reinterpret_cast<const uint8_t*>(a.sfa),
             reinterpret_cast<const uint8_t*>(a.b), reinterpret_cast<const uint8_t*>(a.sfb),
             reinterpret_cast<const void*>(a.c), reinterpret_cast<void*>(a.d), a.alpha, a.beta,
             static_cast<uint32_t*>(workspace),
             reinterpret_cast<float*>(static_cast<uint8_t*>(workspace) + (a.split_k > 1 ? Sched::kCountersBytes : 0)),
             reinterpret_cast<uint8_t*>(a.sfd), a.norm_constant, a.b_layout == int32_t(WeightLayout::Prepacked), !given};
    const dim3 grid(unsigned(tiles(a)), unsigned(a.split_k));
    const bool cluster = Sched::cluster_reducible(a);
    const KernelLaunch launch(grid, T::kLaunchThreads, cluster ? a.split_k : 1, T::kSmem, stream, T::kProgrammatic);
    const cudaError_t e = cluster ? launch_kernel<kKernel<T, OutT, SplitReduce>>(launch, p, map_a, map_b)
                                  : launch_kernel<kKernel<T, OutT, ReduceGlobal>>(launch, p, map_a, map_b);
    return {int32_t(e == cudaSuccess ? cutlass::Status::kSuccess : cutlass::Status::kErrorInternal), int32_t(e), 0};
  }

  // The layout the kernels index scales with, for the host-side agreement test.
  static int64_t sf_offsets(int32_t m, int32_t n, int32_t k, int32_t l, SfOperand which, int64_t* out, size_t len) {
    return sf_offsets_of(which == SfOperand::A ? m : n, k, l, out, len);
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

// W4A16 (cpp/configs.def's BSG_W4A16): the same tile with dense activations of type act_type
// (cutlass::half_t or cutlass::bfloat16_t).
#define BSG_SM90_W4A16_KERNEL(fn, tm, tn, out_type, schedule, act_type)                                          \
  bsg::KernelEntry fn() {                                                                                      \
    return bsg::sm90::Gemm<bsg::sm90::Tile<tm, tn, bsg::sm90::schedule, bsg::sm90::ActDense<act_type>>,          \
                           typename bsg::sm90::OutType<out_type>::type>::entry();                              \
  }

// Used by the generated translation units. The SM90 tile is tm x tn x 64 on one SM, no cluster in
// the table (the kernel forms its own for split-K); the schedule is the tag the table's
// BSG_SM90_SCHEDULE lines give the config (MainloopSmemDecode where none does).
#define BSG_SM90_KERNEL(fn, sms, tm, tn, tk, cm, cn, out_type, schedule)                                                          \
  static_assert((sms) == 1 && (tk) == 64 && (cm) == 1 && (cn) == 1, "SM90 tile");                                                 \
  bsg::KernelEntry fn() {                                                                                                         \
    return bsg::sm90::Gemm<bsg::sm90::Tile<tm, tn, bsg::sm90::schedule>, typename bsg::sm90::OutType<out_type>::type>::entry(); \
  }
