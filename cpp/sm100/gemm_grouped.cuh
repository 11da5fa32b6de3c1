// SM100 grouped NVFP4 x NVFP4 GEMM for mixture-of-experts layers: CUTLASS's pointer-array
// block-scaled kernel (the grouped path of CUTLASS example 75), one group per expert. The
// per-expert arguments (shape, operand addresses, strides, scale layouts, alpha) are built on the
// device from the expert offsets by a one-CTA kernel queued ahead of the GEMM, so the host never
// reads the routing and the call can be captured in a CUDA graph. The rows and scale rows of each
// expert are those every kernel here agrees on (common/moe_rows.cuh).
#pragma once

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>
#include <vector>

#include "common/moe_rows.cuh"
#include "common/scale_layout.cuh"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "sm100/gemm.cuh"

namespace bsg::sm100 {

using namespace cute;

template <int Sms, int TileM, int TileN, int TileK, int ClusterM, int ClusterN, class Out>
struct GroupedGemm {
  static_assert(Sms == 1 || Sms == 2, "1-SM or 2-SM UMMA");
  using Traits = OutputTraits<Out>;
  static constexpr bool kFp4Out = !std::is_void_v<typename Traits::Sf>;
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;  // (M, N, K) per expert
  using ElementAB = cutlass::nv_float4_t<cutlass::float_e2m1_t>;
  using ElementD = typename Traits::ElementD;
  static constexpr int kAlignAB = 32;  // 16 bytes of e2m1
  static constexpr int kAlignD = 128 / cutlass::sizeof_bits<ElementD>::value;
  using MmaTile = Shape<Int<TileM>, Int<TileN>, Int<TileK>>;
  using Cluster = Shape<Int<ClusterM>, Int<ClusterN>, _1>;
  using MainloopSchedule =
      std::conditional_t<Sms == 2, cutlass::gemm::KernelPtrArrayTmaWarpSpecialized2SmNvf4Sm100,
                         cutlass::gemm::KernelPtrArrayTmaWarpSpecialized1SmNvf4Sm100>;
  using EpilogueSchedule = std::conditional_t<Sms == 2, cutlass::epilogue::PtrArrayTmaWarpSpecialized2Sm,
                                              cutlass::epilogue::PtrArrayTmaWarpSpecialized1Sm>;

  // The dense path's epilogue types (C of D's type, f32 for FP4 output) with no C given (null
  // pointers, beta 0): the same arithmetic as the dense GEMM to the bit (its beta * C + alpha *
  // acc turns -0 into +0, which a C-less epilogue would keep), and for FP4 output the same
  // 32-column epilogue tile, whose stores stay inside N/16 scale columns. FP4 output: example
  // 72b's scale-factor generation, one SFD pointer per group.
  using ElementC = typename Traits::ElementC;
  static constexpr int kAlignC = 128 / cutlass::sizeof_bits<ElementC>::value;
  using Fusion = typename Traits::Fusion;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, MmaTile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, cutlass::layout::RowMajor*,
      kAlignC, ElementD, cutlass::layout::RowMajor*, kAlignD, EpilogueSchedule, Fusion>::CollectiveOp;

  // A (T, K) row-major, B (N, K) per expert: column-major in CUTLASS's (K, N) view.
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm100, cutlass::arch::OpClassBlockScaledTensorOp, ElementAB, cutlass::layout::RowMajor*,
      kAlignAB, ElementAB, cutlass::layout::ColumnMajor*, kAlignAB, float, MmaTile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      MainloopSchedule>::CollectiveOp;
  static_assert(BlockScaledMainloop<typename Mainloop::DispatchPolicy>::value == 2,
                "mainloop must be MainloopSm100ArrayTmaUmmaWarpSpecializedBlockScaled");

  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Adapter = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using SfConfig = typename Mainloop::Sm1xxBlkScaledConfig;
  static_assert(SfConfig::SFVecSize == 16, "NVFP4: one scale per 16 elements");

  // The element types of the per-expert arrays, as the arguments name them.
  using MainArgs = typename Mainloop::Arguments;
  using EpiArgs = typename Epilogue::Arguments;
  template <class P>
  using Pointee = std::remove_pointer_t<P>;
  using Shape3 = typename ProblemShape::UnderlyingProblemShape;
  using PtrA = Pointee<decltype(MainArgs::ptr_A)>;
  using PtrB = Pointee<decltype(MainArgs::ptr_B)>;
  using PtrSfA = Pointee<decltype(MainArgs::ptr_SFA)>;
  using PtrSfB = Pointee<decltype(MainArgs::ptr_SFB)>;
  using PtrD = Pointee<decltype(EpiArgs::ptr_D)>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideD = typename Kernel::InternalStrideD;
  using LayoutSfA = typename Mainloop::InternalLayoutSFA;
  using LayoutSfB = typename Mainloop::InternalLayoutSFB;
  using PtrSfD = std::conditional_t<kFp4Out, typename Traits::Sf, uint8_t>*;
  using SfdConfig = cutlass::detail::Sm1xxBlockScaledOutputConfig<16>;

  // One entry per expert, the kernel's grouped arguments: carved from the front of the workspace
  // (each array 128-byte aligned), CUTLASS's own workspace after them.
  struct Arrays {
    Shape3* shape;
    PtrA* a;
    PtrB* b;
    PtrSfA* sfa;
    PtrSfB* sfb;
    PtrD* d;
    StrideA* stride_a;
    StrideB* stride_b;
    StrideD* stride_d;
    LayoutSfA* layout_sfa;
    LayoutSfB* layout_sfb;
    float* alpha;
    PtrSfD* sfd;  // FP4 output: each expert's scale factors
    float* norm;  // FP4 output: the normalization constant (CUTLASS reads it from memory)
  };
  static constexpr size_t kArrayAlign = 128;
  static constexpr size_t kArrays = 14;
  // Bytes of each array's entry (per expert), and of the norm slot (one).
  static constexpr size_t kElemBytes[kArrays] = {sizeof(Shape3),  sizeof(PtrA),      sizeof(PtrB),      sizeof(PtrSfA),
                                                 sizeof(PtrSfB),  sizeof(PtrD),      sizeof(StrideA),   sizeof(StrideB),
                                                 sizeof(StrideD), sizeof(LayoutSfA), sizeof(LayoutSfB), sizeof(float),
                                                 sizeof(PtrSfD),  sizeof(float)};
  // Byte offset of each array, and (last) their total.
  static void array_offsets(int experts, size_t (&at)[kArrays + 1]) {
    at[0] = 0;
    for (size_t i = 0; i < kArrays; ++i) {
      const size_t count = i + 1 == kArrays ? 1 : size_t(experts);
      at[i + 1] = at[i] + (count * kElemBytes[i] + kArrayAlign - 1) / kArrayAlign * kArrayAlign;
    }
  }
  static size_t arrays_bytes(int experts) {
    size_t at[kArrays + 1];
    array_offsets(experts, at);
    return at[kArrays];
  }
  static Arrays carve(uint8_t* base, int experts) {
    size_t at[kArrays + 1];
    array_offsets(experts, at);
    return Arrays{reinterpret_cast<Shape3*>(base + at[0]),     reinterpret_cast<PtrA*>(base + at[1]),
                  reinterpret_cast<PtrB*>(base + at[2]),       reinterpret_cast<PtrSfA*>(base + at[3]),
                  reinterpret_cast<PtrSfB*>(base + at[4]),     reinterpret_cast<PtrD*>(base + at[5]),
                  reinterpret_cast<StrideA*>(base + at[6]),    reinterpret_cast<StrideB*>(base + at[7]),
                  reinterpret_cast<StrideD*>(base + at[8]),    reinterpret_cast<LayoutSfA*>(base + at[9]),
                  reinterpret_cast<LayoutSfB*>(base + at[10]), reinterpret_cast<float*>(base + at[11]),
                  reinterpret_cast<PtrSfD*>(base + at[12]),    reinterpret_cast<float*>(base + at[13])};
  }

  // Expert e: m rows of the stacked A and D from row0, its scales from scale row sf_row0 (a
  // multiple of 128, so its part of the buffer is the tiled layout of its own rows), batch e of
  // B and of B's scales. Run by the device builder, and by `describe` on the host.
  CUTE_HOST_DEVICE static void fill(const GroupedArgs& p, int e, int row0, int m, int sf_row0, float alpha,
                                    const Arrays& w) {
    const uint64_t n = uint64_t(p.n), k = uint64_t(p.k);
    const int64_t sp = sf_cols_padded(p.k);  // common/scale_layout.cuh
    // Placement new: the arrays are raw bytes (the workspace, or a host buffer), and CuTe's tuples
    // have constructors.
    new (&w.shape[e]) Shape3{m, p.n, p.k};
    w.a[e] = reinterpret_cast<PtrA>(p.a + uint64_t(row0) * k / 2);
    w.b[e] = reinterpret_cast<PtrB>(p.b + uint64_t(e) * n * k / 2);
    w.sfa[e] = reinterpret_cast<PtrSfA>(p.sfa + uint64_t(sf_row0) * sp);
    w.sfb[e] = reinterpret_cast<PtrSfB>(p.sfb + uint64_t(e) * sf_batch_bytes(p.n, sp));
    w.d[e] = reinterpret_cast<PtrD>(p.d + uint64_t(row0) * n * cutlass::sizeof_bits<ElementD>::value / 8);
    // FP4 output: the expert's scale factors from its first scale row, as its A scales (the MoE
    // layout over (T, N/16)).
    w.sfd[e] = kFp4Out ? reinterpret_cast<PtrSfD>(p.sfd + uint64_t(sf_row0) * sf_cols_padded(p.n)) : nullptr;
    new (&w.stride_a[e]) StrideA(cutlass::make_cute_packed_stride(StrideA{}, {m, p.k, 1}));
    new (&w.stride_b[e]) StrideB(cutlass::make_cute_packed_stride(StrideB{}, {p.n, p.k, 1}));
    new (&w.stride_d[e]) StrideD(cutlass::make_cute_packed_stride(StrideD{}, {m, p.n, 1}));
    new (&w.layout_sfa[e]) LayoutSfA(SfConfig::tile_atom_to_shape_SFA(make_shape(m, p.n, p.k, 1)));
    new (&w.layout_sfb[e]) LayoutSfB(SfConfig::tile_atom_to_shape_SFB(make_shape(m, p.n, p.k, 1)));
    w.alpha[e] = alpha;
  }

  static typename Adapter::Arguments arguments(const GroupedArgs& p, const Arrays& w) {
    typename Adapter::Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    args.problem_shape = {p.experts, w.shape, nullptr};  // shapes on the device only
    args.mainloop = {w.a, w.stride_a, w.b, w.stride_b, w.sfa, w.layout_sfa, w.sfb, w.layout_sfb};
    auto& fusion = args.epilogue.thread;
    fusion.alpha = 0.0f;
    fusion.alpha_ptr = w.alpha;  // alpha_ptr[e] for expert e
    fusion.dAlpha = {_0{}, _0{}, 1};
    fusion.beta = 0.0f;
    if constexpr (kFp4Out) {
      fusion.block_scale_factor_ptr = w.sfd;
      fusion.norm_constant_ptr = w.norm;
    }
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = nullptr;
    args.epilogue.ptr_D = w.d;
    args.epilogue.dD = w.stride_d;
    args.hw_info.device_id = p.device_id;
    args.hw_info.sm_count = p.sm_count;
    return args;
  }
  // The arguments of a query that launches nothing: arrays at a stand-in address.
  static typename Adapter::Arguments query_arguments(const GroupedArgs& p) {
    return arguments(p, carve(reinterpret_cast<uint8_t*>(uintptr_t(1) << 20), p.experts));
  }

  // CuTe's scale-factor layouts hold int32 strides: one expert's scales (at most T rows) and one
  // expert's B scales must span fewer than 2^31 bytes. sf_batch_bytes in 64-bit row arithmetic
  // (its int rows + 127 could wrap for the extents checked here).
  static int64_t sf_span(int64_t rows, int k) { return (rows + 127) / 128 * 128 * sf_cols_padded(k); }

  static bool can_implement(const GroupedArgs& p) {
    if (p.rows < 1 || p.n < 1 || p.k < 32 || p.k % 32 != 0 || p.experts < 1 || p.experts > BSG_MAX_GROUPS) return false;
    if (p.n % kAlignD != 0 || p.sm_count < 0) return false;  // every expert's D rows start 16-byte aligned
    if (int64_t(p.rows) + 127 * int64_t(p.experts) > INT32_MAX) return false;  // scale rows are int
    if (sf_span(p.rows, p.k) > INT32_MAX || sf_span(p.n, p.k) > INT32_MAX) return false;
    if (kFp4Out && (p.sfd == 0 || p.sfd % 16 != 0 || !(p.norm_constant > 0.f) || p.norm_constant > FLT_MAX || sf_span(p.rows, p.n) > INT32_MAX)) return false;
    return Adapter::can_implement(query_arguments(p)) == cutlass::Status::kSuccess;
  }

  static size_t workspace_size(const GroupedArgs& p) {
    if (p.experts < 1 || p.experts > BSG_MAX_GROUPS) return 0;
    return arrays_bytes(p.experts) + Adapter::get_workspace_size(query_arguments(p));
  }

  // Every check comes before the first launch, so a refused call leaves memory as it was; the
  // builder writes only the workspace.
  static KernelStatus run(const GroupedArgs& p);

  // The host side of the builder, for tests: p's offsets and expert_alpha are host addresses.
  // Writes, for expert `e`: m, n, k, the addresses of A, B, SFA, SFB and D, alpha's bits, the
  // leading dimensions of A, B and D, SFD's address (0 unless FP4), then the byte address of
  // every scale of A (m x K/16, row fastest) and of B (N x K/16) as the kernel's layouts place
  // them, and for FP4 output of every generated scale factor (m x N/16). Returns the count of values;
  // writes only when `len` holds them all, -1 for a problem can_implement refuses or a bad e.
  static int64_t describe(const GroupedArgs& p, int32_t e, int64_t* out, size_t len) {
    if (!can_implement(p) || e < 0 || e >= p.experts) return -1;
    const int32_t* off = reinterpret_cast<const int32_t*>(p.offsets);
    const float* ea = reinterpret_cast<const float*>(p.expert_alpha);
    std::vector<int> row(p.experts + 1), sf_row(p.experts);
    int run = 0, sf = 0;
    for (int j = 0; j <= p.experts; ++j) run = std::max(run, std::min(std::max(off[j], 0), p.rows)), row[j] = run;
    for (int j = 0; j < p.experts; ++j) sf_row[j] = sf, sf += (row[j + 1] - row[j] + 127) / 128 * 128;
    const int m = row[e + 1] - row[e], sf_cols = p.k / 16, sfd_cols = kFp4Out ? p.n / 16 : 0;
    const size_t need = 13 + size_t(m + p.n) * sf_cols + size_t(m) * sfd_cols;
    if (len < need) return int64_t(need);
    std::vector<uint8_t> storage(arrays_bytes(p.experts) + kArrayAlign);
    uint8_t* base = reinterpret_cast<uint8_t*>((uintptr_t(storage.data()) + kArrayAlign - 1) / kArrayAlign * kArrayAlign);
    const Arrays w = carve(base, p.experts);
    fill(p, e, row[e], m, sf_row[e], ea ? p.alpha * ea[e] : p.alpha, w);
    float alpha = w.alpha[e];
    uint32_t alpha_bits;
    std::memcpy(&alpha_bits, &alpha, 4);
    size_t i = 0;
    for (int64_t v : {int64_t(get<0>(w.shape[e])), int64_t(get<1>(w.shape[e])), int64_t(get<2>(w.shape[e])),
                      int64_t(uintptr_t(w.a[e])), int64_t(uintptr_t(w.b[e])), int64_t(uintptr_t(w.sfa[e])),
                      int64_t(uintptr_t(w.sfb[e])), int64_t(uintptr_t(w.d[e])), int64_t(alpha_bits),
                      int64_t(get<0>(w.stride_a[e])), int64_t(get<0>(w.stride_b[e])), int64_t(get<0>(w.stride_d[e])),
                      int64_t(uintptr_t(w.sfd[e]))})
      out[i++] = v;
    for (int s = 0; s < sf_cols; ++s)
      for (int r = 0; r < m; ++r) out[i++] = int64_t(uintptr_t(w.sfa[e])) + int64_t(w.layout_sfa[e](make_coord(r, s * 16, 0)));
    for (int s = 0; s < sf_cols; ++s)
      for (int r = 0; r < p.n; ++r) out[i++] = int64_t(uintptr_t(w.sfb[e])) + int64_t(w.layout_sfb[e](make_coord(r, s * 16, 0)));
    // FP4 output: where the epilogue's layout (CUTLASS's, from the expert's shape) puts each
    // generated scale factor.
    const auto layout_sfd = SfdConfig::tile_atom_to_shape_SFD(make_shape(m, p.n, p.k, 1));
    for (int s = 0; s < sfd_cols; ++s)
      for (int r = 0; r < m; ++r) out[i++] = int64_t(uintptr_t(w.sfd[e])) + int64_t(layout_sfd(make_coord(r, s * 16, 0)));
    return int64_t(need);
  }

  static GroupedEntry entry() { return GroupedEntry{&run, &can_implement, &workspace_size, &describe}; }
};

// The builder: one CTA reads the offsets (common/moe_rows.cuh) and fills every expert's entry.
template <class G>
__global__ void __launch_bounds__(256) build_groups(GroupedArgs p, typename G::Arrays w) {
  __shared__ MoeRows rows;
  rows.prepare(reinterpret_cast<const int32_t*>(p.offsets), p.experts, p.rows, int(threadIdx.x));
  const float* ea = reinterpret_cast<const float*>(p.expert_alpha);
  for (int e = threadIdx.x; e < p.experts; e += blockDim.x)
    G::fill(p, e, rows.row[e], rows.rows_of(e), rows.sf_row[e], ea ? p.alpha * ea[e] : p.alpha, w);
  if (threadIdx.x == 0) *w.norm = p.norm_constant;
}

template <int Sms, int TileM, int TileN, int TileK, int ClusterM, int ClusterN, class Out>
KernelStatus GroupedGemm<Sms, TileM, TileN, TileK, ClusterM, ClusterN, Out>::run(const GroupedArgs& p) {
  if (!can_implement(p) || p.sm_count < 1) return KernelStatus{BSG_STATUS_INVALID_PROBLEM, 0, 0};
  const size_t need = workspace_size(p);
  if (need > p.workspace_bytes) return KernelStatus{BSG_STATUS_WORKSPACE_NULL, 0, uint64_t(need)};
  auto* base = reinterpret_cast<uint8_t*>(p.workspace);
  const Arrays w = carve(base, p.experts);
  auto stream = reinterpret_cast<cudaStream_t>(p.stream);
  (void)cudaGetLastError();  // a stale error of another library is not this call's (see Gemm::run)
  // CUTLASS's host setup first (its TMA descriptors from placeholders, replaced per expert on the
  // device; no device memory read), so a failure there launches nothing.
  Adapter gemm;
  cutlass::Status st = gemm.initialize(arguments(p, w), base + arrays_bytes(p.experts), stream);
  if (st != cutlass::Status::kSuccess) return KernelStatus{static_cast<int32_t>(st), static_cast<int32_t>(cudaGetLastError()), 0};
  if constexpr (kFp4Out) {
    // CUTLASS's epilogue leaves the padding of the scale-factor tiles unwritten: the whole MoE
    // scale buffer (room for any routing) is zeroed in stream order first.
    const size_t bytes = size_t((int64_t(p.rows) + 127 * int64_t(p.experts)) / 128 * 128) * size_t(sf_cols_padded(p.n));
    if (const cudaError_t e = cudaMemsetAsync(reinterpret_cast<void*>(p.sfd), 0, bytes, stream); e != cudaSuccess)
      return KernelStatus{int32_t(cutlass::Status::kErrorInternal), int32_t(e), 0};
  }
  // Launched without programmatic dependence: CUTLASS's scheduler reads the shapes before its
  // grid-dependency wait.
  build_groups<GroupedGemm><<<1, 256, 0, stream>>>(p, w);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess)
    return KernelStatus{int32_t(cutlass::Status::kErrorInternal), int32_t(e), 0};
  st = gemm.run(stream);
  const cudaError_t e = st == cutlass::Status::kSuccess ? cudaSuccess : cudaGetLastError();
  return KernelStatus{static_cast<int32_t>(st), static_cast<int32_t>(e), 0};
}

}  // namespace bsg::sm100

// Used by the generated translation units: the exported grouped entry of one instantiation.
#define BSG_SM100_GROUPED_KERNEL(fn, sms, tm, tn, tk, cm, cn, out_type)                        \
  bsg::GroupedEntry fn() {                                                                      \
    return bsg::sm100::GroupedGemm<sms, tm, tn, tk, cm, cn, out_type>::entry();                 \
  }
