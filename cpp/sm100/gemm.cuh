// SM100 NVFP4 x NVFP4 GEMM, the path of CUTLASS example 72a/72b: GemmUniversalAdapter over the
// block-scaled collective builders; the generated translation unit of a config instantiates it
// once per output.
#pragma once

#include <climits>

#include <type_traits>

#include "blockscaled_gemm/kernel_abi.h"
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/sm100_blockscaled_layout.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

namespace bsg::sm100 {

using namespace cute;

// Guards the product promise: every config must resolve to the block-scaled UMMA mainloop, the
// pointer-array one for the grouped GEMM (sm100/gemm_grouped.cuh). kind: 0 neither, 1 dense,
// 2 pointer-array.
template <class T>
struct BlockScaledMainloop : std::integral_constant<int, 0> {};
template <int S, int SS, int AS, class C>
struct BlockScaledMainloop<cutlass::gemm::MainloopSm100TmaUmmaWarpSpecializedBlockScaled<S, SS, AS, C>>
    : std::integral_constant<int, 1> {};
template <int S, int SS, int AS, class C>
struct BlockScaledMainloop<cutlass::gemm::MainloopSm100ArrayTmaUmmaWarpSpecializedBlockScaled<S, SS, AS, C>>
    : std::integral_constant<int, 2> {};

// What an output tag of the table means to the epilogue: element types and the fusion.
template <class Out>
struct OutputTraits {
  using ElementD = Out;
  using ElementC = Out;
  using Sf = void;
  // The collective builder's default fusion, spelled out.
  using Fusion = cutlass::epilogue::fusion::LinearCombination<Out, float, Out, float>;
};
// CUTLASS example 72b: e2m1 D with one generated scale factor per 16 outputs along N, C in f32.
template <class SfD>
struct OutputTraits<Fp4Out<SfD>> {
  using ElementD = cutlass::float_e2m1_t;
  using ElementC = float;
  using Sf = SfD;
  using Fusion = cutlass::epilogue::fusion::LinCombBlockScaleFactor<16, ElementD, float, SfD,
                                                                     cutlass::layout::RowMajor, ElementC>;
};

// The two kinds of kernel built here, as tags: one GEMM (batched), or CUTLASS's pointer-array
// grouped GEMM (per-group pointers, strides and shapes; sm100/gemm_grouped.cuh).
struct DenseKernel {};
struct PtrArrayKernel {};

// The CUTLASS collectives of one config and output, for either kind: element types, alignments,
// schedules, the block-scaled main loop and the epilogue (CUTLASS example 72 for the dense kind,
// 75 for the pointer-array one). A is M x K, K contiguous; B is stored N x K, K contiguous
// (column-major in CUTLASS's K x N view); C and D row-major; the pointer-array kind takes each
// layout's stride per group.
template <int Sms, int TileM, int TileN, int TileK, int ClusterM, int ClusterN, class Out, class Kind>
struct Collectives {
  static_assert(Sms == 1 || Sms == 2, "1-SM or 2-SM UMMA");
  static constexpr bool kPtrArray = std::is_same_v<Kind, PtrArrayKernel>;
  template <class L>
  using Layout = std::conditional_t<kPtrArray, L*, L>;
  using Traits = OutputTraits<Out>;
  static constexpr bool kFp4Out = !std::is_void_v<typename Traits::Sf>;
  using ElementAB = cutlass::nv_float4_t<cutlass::float_e2m1_t>;
  using ElementD = typename Traits::ElementD;
  using ElementC = typename Traits::ElementC;
  static constexpr int kAlignAB = 32;  // 16 bytes of e2m1
  static constexpr int kAlignC = 128 / cutlass::sizeof_bits<ElementC>::value;
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;
  using MmaTile = Shape<Int<TileM>, Int<TileN>, Int<TileK>>;
  using Cluster = Shape<Int<ClusterM>, Int<ClusterN>, _1>;
  using MainloopSchedule = std::conditional_t<
      kPtrArray,
      std::conditional_t<Sms == 2, cutlass::gemm::KernelPtrArrayTmaWarpSpecialized2SmNvf4Sm100, cutlass::gemm::KernelPtrArrayTmaWarpSpecialized1SmNvf4Sm100>,
      std::conditional_t<Sms == 2, cutlass::gemm::KernelTmaWarpSpecialized2SmNvf4Sm100, cutlass::gemm::KernelTmaWarpSpecialized1SmNvf4Sm100>>;
  using EpilogueSchedule = std::conditional_t<
      kPtrArray, std::conditional_t<Sms == 2, cutlass::epilogue::PtrArrayTmaWarpSpecialized2Sm, cutlass::epilogue::PtrArrayTmaWarpSpecialized1Sm>,
      std::conditional_t<Sms == 2, cutlass::epilogue::TmaWarpSpecialized2Sm, cutlass::epilogue::TmaWarpSpecialized1Sm>>;

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, MmaTile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, Layout<cutlass::layout::RowMajor>, kAlignC,
      ElementD, Layout<cutlass::layout::RowMajor>, kAlignD, EpilogueSchedule, typename Traits::Fusion>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, ElementAB, Layout<cutlass::layout::RowMajor>,
      kAlignAB, ElementAB, Layout<cutlass::layout::ColumnMajor>, kAlignAB, float, MmaTile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;
  static_assert(BlockScaledMainloop<typename Mainloop::DispatchPolicy>::value == (kPtrArray ? 2 : 1),
                "the block-scaled UMMA main loop (MainloopSm100[Array]TmaUmmaWarpSpecializedBlockScaled)");
  using SfConfig = typename Mainloop::Sm1xxBlkScaledConfig;
  static_assert(SfConfig::SFVecSize == 16, "NVFP4: one scale per 16 elements");
};

template <int Sms, int TileM, int TileN, int TileK, int ClusterM, int ClusterN, class Out>
struct Gemm : Collectives<Sms, TileM, TileN, TileK, ClusterM, ClusterN, Out, DenseKernel> {
  using C = Collectives<Sms, TileM, TileN, TileK, ClusterM, ClusterN, Out, DenseKernel>;
  using typename C::ElementAB, typename C::ElementC, typename C::ElementD, typename C::Mainloop, typename C::Epilogue,
      typename C::SfConfig, typename C::Traits;
  using C::kFp4Out;
  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue, void>;
  using Adapter = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

  static typename Adapter::Arguments arguments(const KernelArgs& p) {
    using StrideA = typename Kernel::StrideA;
    using StrideB = typename Kernel::StrideB;
    using StrideC = typename Kernel::StrideC;
    using StrideD = typename Kernel::StrideD;
    auto shape = make_shape(p.m, p.n, p.k, p.l);
    typename Adapter::Arguments args{
        p.l > 1 ? cutlass::gemm::GemmUniversalMode::kBatched : cutlass::gemm::GemmUniversalMode::kGemm,
        {p.m, p.n, p.k, p.l},
        {reinterpret_cast<const typename ElementAB::DataType*>(p.a),
         cutlass::make_cute_packed_stride(StrideA{}, {p.m, p.k, p.l}),
         reinterpret_cast<const typename ElementAB::DataType*>(p.b),
         cutlass::make_cute_packed_stride(StrideB{}, {p.n, p.k, p.l}),
         reinterpret_cast<const typename ElementAB::ScaleFactorType*>(p.sfa),
         SfConfig::tile_atom_to_shape_SFA(shape),
         reinterpret_cast<const typename ElementAB::ScaleFactorType*>(p.sfb),
         SfConfig::tile_atom_to_shape_SFB(shape)},
        {{p.alpha, p.beta},
         reinterpret_cast<const ElementC*>(p.c),
         cutlass::make_cute_packed_stride(StrideC{}, {p.m, p.n, p.l}),
         reinterpret_cast<ElementD*>(p.d),
         cutlass::make_cute_packed_stride(StrideD{}, {p.m, p.n, p.l})}};
    if constexpr (kFp4Out) {
      args.epilogue.thread.block_scale_factor_ptr = reinterpret_cast<typename Traits::Sf*>(p.sfd);
      args.epilogue.thread.norm_constant_ptr = reinterpret_cast<const float*>(p.norm_constant_ptr);
    }
    args.hw_info.device_id = p.device_id;
    args.hw_info.sm_count = p.sm_count;
    return args;
  }

  // Bytes of `l` batches of a tiled scale buffer over rows x cols/16 (common/scale_layout.cuh's
  // sf_batch_bytes; that folder is not one of the dense SM100 kernels' parts).
  static int64_t sf_span(int64_t rows, int64_t cols, int64_t l) { return (rows + 127) / 128 * 128 * ((cols / 16 + 3) / 4 * 4) * l; }

  static bool can_implement(const KernelArgs& p) {
    if (p.split_k != 1) return false;  // CUTLASS's own schedulers; no split-K here
    if (p.m < 1 || p.n < 1 || p.k < 1 || p.l < 1) return false;
    if (p.m > BSG_MAX_EXTENT || p.n > BSG_MAX_EXTENT || p.k > BSG_MAX_EXTENT) return false;
    if (p.b_layout != int32_t(WeightLayout::Standard)) return false;  // CUTLASS's K-major B only
    if (kFp4Out && (!p.sfd || !p.norm_constant_ptr)) return false;
    // CuTe's scale-factor layouts are built from int extents: every scale buffer spans fewer
    // than 2^31 bytes (Problem::check_sm100 in Rust).
    if (sf_span(p.m, p.k, p.l) > INT32_MAX || sf_span(p.n, p.k, p.l) > INT32_MAX || (kFp4Out && sf_span(p.m, p.n, p.l) > INT32_MAX)) return false;
    // CUTLASS's SM100 tile scheduler puts the tiles along N in y (it rasterizes along M, tiles
    // along M in x, wherever the other order would pass y's limit) and L in z: both hold at most
    // 65535 (the configs' clusters are 1 along N).
    const int64_t tiles_n = (int64_t(p.n) + TileN - 1) / TileN;
    if (tiles_n > 65535 || p.l > 65535) return false;
    return Adapter::can_implement(arguments(p)) == cutlass::Status::kSuccess;
  }

  static size_t workspace_size(const KernelArgs& p) {
    return Adapter::get_workspace_size(arguments(p));
  }

  // Every check comes before the first write or launch, so a refused call leaves memory as it
  // was. A CUDA error another library left pending on this thread is cleared first: CUTLASS reads
  // cudaGetLastError after its launch, and would report that one as this launch's failure.
  static KernelStatus run(const KernelArgs& p) {
    if (!can_implement(p)) return KernelStatus{BSG_STATUS_INVALID_PROBLEM, 0, 0};
    Adapter gemm;
    auto args = arguments(p);
    const size_t need = Adapter::get_workspace_size(args);
    if (need > p.workspace_bytes) return KernelStatus{BSG_STATUS_WORKSPACE_NULL, 0, uint64_t(need)};
    auto stream = reinterpret_cast<cudaStream_t>(p.stream);
    (void)cudaGetLastError();
    // CUTLASS's setup first (host work and the workspace only), so a refusal there leaves SFD as
    // it was; then SFD zeroed, as the epilogue leaves the padding of its tiles unwritten.
    cutlass::Status st = gemm.initialize(args, reinterpret_cast<void*>(p.workspace), stream);
    if (st == cutlass::Status::kSuccess && p.sfd_bytes) {
      if (cudaError_t e = cudaMemsetAsync(reinterpret_cast<void*>(p.sfd), 0, p.sfd_bytes, stream); e != cudaSuccess)
        return KernelStatus{int32_t(cutlass::Status::kErrorInternal), int32_t(e), 0};
    }
    if (st == cutlass::Status::kSuccess) st = gemm.run(stream);
    const cudaError_t e = st == cutlass::Status::kSuccess ? cudaSuccess : cudaGetLastError();
    return KernelStatus{static_cast<int32_t>(st), static_cast<int32_t>(e), 0};
  }

  static int64_t sf_offsets(int32_t m, int32_t n, int32_t k, int32_t l, SfOperand which,
                            int64_t* out, size_t len) {
    auto shape = make_shape(m, n, k, l);
    int32_t rows = which == SfOperand::A ? m : n;
    int32_t sf_cols = k / int32_t(SfConfig::SFVecSize);
    if (len != size_t(rows) * size_t(sf_cols) * size_t(l)) return -1;
    auto fill = [&](auto layout) {
      size_t i = 0;
      for (int32_t b = 0; b < l; ++b)
        for (int32_t s = 0; s < sf_cols; ++s)
          for (int32_t r = 0; r < rows; ++r)
            out[i++] = int64_t(layout(make_coord(r, s * int32_t(SfConfig::SFVecSize), b)));
      return int64_t(cosize(filter_zeros(layout)));
    };
    return which == SfOperand::A ? fill(SfConfig::tile_atom_to_shape_SFA(shape))
                                 : fill(SfConfig::tile_atom_to_shape_SFB(shape));
  }

  static KernelEntry entry() {
    return KernelEntry{&run, &workspace_size, &can_implement, &sf_offsets};
  }
};

}  // namespace bsg::sm100

// Used by the generated translation units: defines the exported entry of one instantiation.
#define BSG_SM100_KERNEL(fn, sms, tm, tn, tk, cm, cn, out_type)                               \
  bsg::KernelEntry fn() {                                                                      \
    return bsg::sm100::Gemm<sms, tm, tn, tk, cm, cn, out_type>::entry();                       \
  }
