// SM100 grouped NVFP4 x NVFP4 GEMM: CUTLASS's pointer-array block-scaled kernel (the grouped
// path of CUTLASS example 75), in two forms over the same kernel. The MoE form (GroupedArgs): one
// group per expert, the per-expert arguments (shape, operand addresses, strides, scale layouts,
// alpha) built on the device from the expert offsets by a one-CTA kernel queued ahead of the GEMM;
// the rows and scale rows of each expert are those every kernel here agrees on
// (common/moe_rows.cuh). The list form (GroupedListArgs, GroupedListGemm below): each group's
// arguments built on the device from the caller's arrays of sizes and addresses, one CTA a group.
// Either way the host never reads the groups, so a call can be captured in a CUDA graph.
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
struct GroupedGemm : Collectives<Sms, TileM, TileN, TileK, ClusterM, ClusterN, Out, PtrArrayKernel> {
  // The dense path's epilogue types (C of D's type, f32 for FP4 output; sm100/gemm.cuh) with no C
  // given in the MoE form (null pointers, beta 0): the same arithmetic as the dense GEMM to the
  // bit (its beta * C + alpha * acc turns -0 into +0, which a C-less epilogue would keep), and for
  // FP4 output the same 32-column epilogue tile, whose stores stay inside N/16 scale columns. FP4
  // output: example 72b's scale-factor generation, one SFD pointer per group.
  using C = Collectives<Sms, TileM, TileN, TileK, ClusterM, ClusterN, Out, PtrArrayKernel>;
  using typename C::ElementD, typename C::Mainloop, typename C::Epilogue, typename C::SfConfig, typename C::Traits;
  using C::kFp4Out, C::kAlignD, C::kAlignC;
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;  // (M, N, K) per group
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Adapter = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

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
  using PtrC = Pointee<decltype(EpiArgs::ptr_C)>;
  using PtrD = Pointee<decltype(EpiArgs::ptr_D)>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideC = typename Kernel::InternalStrideC;
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
    PtrSfD* sfd;  // FP4 output: each group's scale factors
    PtrC* c;      // the list form with beta: each group's C
    StrideC* stride_c;
    float* norm;  // FP4 output: the normalization constant (CUTLASS reads it from memory)
  };
  static constexpr size_t kArrayAlign = 128;
  static constexpr size_t kArrays = 16;
  // Bytes of each array's entry (per group), and of the norm slot (one).
  static constexpr size_t kElemBytes[kArrays] = {sizeof(Shape3),  sizeof(PtrA),      sizeof(PtrB),      sizeof(PtrSfA),
                                                 sizeof(PtrSfB),  sizeof(PtrD),      sizeof(StrideA),   sizeof(StrideB),
                                                 sizeof(StrideD), sizeof(LayoutSfA), sizeof(LayoutSfB), sizeof(float),
                                                 sizeof(PtrSfD),  sizeof(PtrC),      sizeof(StrideC),   sizeof(float)};
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
                  reinterpret_cast<PtrSfD*>(base + at[12]),    reinterpret_cast<PtrC*>(base + at[13]),
                  reinterpret_cast<StrideC*>(base + at[14]),   reinterpret_cast<float*>(base + at[15])};
  }

  // Group e's entry: its shape (m, n, k), the addresses of its operands (FP4 output: sfd; with
  // beta: c), strides, CuTe scale layouts and alpha. Placement new: the arrays are raw bytes (the
  // workspace, or a host buffer), and CuTe's tuples have constructors.
  CUTE_HOST_DEVICE static void fill_one(const Arrays& w, int e, int m, int n, int k, uint64_t a, uint64_t b, uint64_t sfa, uint64_t sfb,
                                        uint64_t d, uint64_t sfd, uint64_t c, float alpha) {
    new (&w.shape[e]) Shape3{m, n, k};
    w.a[e] = reinterpret_cast<PtrA>(a);
    w.b[e] = reinterpret_cast<PtrB>(b);
    w.sfa[e] = reinterpret_cast<PtrSfA>(sfa);
    w.sfb[e] = reinterpret_cast<PtrSfB>(sfb);
    w.d[e] = reinterpret_cast<PtrD>(d);
    w.sfd[e] = kFp4Out ? reinterpret_cast<PtrSfD>(sfd) : nullptr;
    w.c[e] = reinterpret_cast<PtrC>(c);
    new (&w.stride_a[e]) StrideA(cutlass::make_cute_packed_stride(StrideA{}, {m, k, 1}));
    new (&w.stride_b[e]) StrideB(cutlass::make_cute_packed_stride(StrideB{}, {n, k, 1}));
    new (&w.stride_c[e]) StrideC(cutlass::make_cute_packed_stride(StrideC{}, {m, n, 1}));
    new (&w.stride_d[e]) StrideD(cutlass::make_cute_packed_stride(StrideD{}, {m, n, 1}));
    new (&w.layout_sfa[e]) LayoutSfA(SfConfig::tile_atom_to_shape_SFA(make_shape(m, n, k, 1)));
    new (&w.layout_sfb[e]) LayoutSfB(SfConfig::tile_atom_to_shape_SFB(make_shape(m, n, k, 1)));
    w.alpha[e] = alpha;
  }

  // Expert e: m rows of the stacked A and D from row0, its scales from scale row sf_row0 (a
  // multiple of 128, so its part of the buffer is the tiled layout of its own rows), batch e of
  // B and of B's scales; FP4 output: its scale factors from its first scale row, as its A scales
  // (the MoE layout over (T, N/16)). Run by the device builder, and by `describe` on the host.
  CUTE_HOST_DEVICE static void fill(const GroupedArgs& p, int e, int row0, int m, int sf_row0, float alpha, const Arrays& w) {
    const uint64_t n = uint64_t(p.n), k = uint64_t(p.k);
    const int64_t sp = sf_cols_padded(p.k);  // common/scale_layout.cuh
    fill_one(w, e, m, p.n, p.k, p.a + uint64_t(row0) * k / 2, p.b + uint64_t(e) * n * k / 2, p.sfa + uint64_t(sf_row0) * sp,
             p.sfb + uint64_t(e) * sf_batch_bytes(p.n, sp), p.d + uint64_t(row0) * n * cutlass::sizeof_bits<ElementD>::value / 8,
             kFp4Out ? p.sfd + uint64_t(sf_row0) * sf_cols_padded(p.n) : 0, 0, alpha);
  }

  // The kernel's arguments over the arrays: `groups` groups, C read where beta is nonzero.
  static typename Adapter::Arguments arguments(int groups, float beta, int device_id, int sm_count, const Arrays& w) {
    typename Adapter::Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    args.problem_shape = {groups, w.shape, nullptr};  // shapes on the device only
    args.mainloop = {w.a, w.stride_a, w.b, w.stride_b, w.sfa, w.layout_sfa, w.sfb, w.layout_sfb};
    auto& fusion = args.epilogue.thread;
    fusion.alpha = 0.0f;
    fusion.alpha_ptr = w.alpha;  // alpha_ptr[g] for group g
    fusion.dAlpha = {_0{}, _0{}, 1};
    fusion.beta = beta;
    if constexpr (kFp4Out) {
      fusion.block_scale_factor_ptr = w.sfd;
      fusion.norm_constant_ptr = w.norm;
    }
    args.epilogue.ptr_C = beta != 0.f ? w.c : nullptr;
    args.epilogue.dC = beta != 0.f ? w.stride_c : nullptr;
    args.epilogue.ptr_D = w.d;
    args.epilogue.dD = w.stride_d;
    args.hw_info.device_id = device_id;
    args.hw_info.sm_count = sm_count;
    return args;
  }
  static typename Adapter::Arguments arguments(const GroupedArgs& p, const Arrays& w) { return arguments(p.experts, 0.f, p.device_id, p.sm_count, w); }
  // The arguments of a query that launches nothing: arrays at a stand-in address.
  static constexpr uintptr_t kStandIn = uintptr_t(1) << 20;
  static typename Adapter::Arguments query_arguments(const GroupedArgs& p) {
    return arguments(p, carve(reinterpret_cast<uint8_t*>(kStandIn), p.experts));
  }

  // CuTe's scale-factor layouts hold int32 strides: one expert's scales (at most T rows) and one
  // expert's B scales must span fewer than 2^31 bytes. sf_batch_bytes in 64-bit row arithmetic
  // (its int rows + 127 could wrap for the extents checked here).
  CUTE_HOST_DEVICE static int64_t sf_span(int64_t rows, int k) { return (rows + 127) / 128 * 128 * sf_cols_padded(k); }

  static bool can_implement(const GroupedArgs& p) {
    if (p.rows < 1 || p.n < 1 || p.k < 32 || p.k % 32 != 0 || p.experts < 1 || p.experts > BSG_MAX_GROUPS) return false;
    if (p.rows > BSG_MAX_EXTENT || p.n > BSG_MAX_EXTENT || p.k > BSG_MAX_EXTENT) return false;
    if (p.b_layout != int32_t(WeightLayout::Standard)) return false;  // CUTLASS's K-major B only
    if (p.zero_uncovered != 0 && p.zero_uncovered != 1) return false;
    if (p.n % kAlignD != 0 || p.sm_count < 0) return false;  // every expert's D rows start 16-byte aligned
    if (p.workspace % kArrayAlign != 0) return false;  // the per-expert arrays (and CUTLASS's tensor maps) are carved from it
    if (moe_sf_rows(p.rows, p.experts) > INT32_MAX) return false;  // scale rows are int
    if (sf_span(p.rows, p.k) > INT32_MAX || sf_span(p.n, p.k) > INT32_MAX) return false;
    if (kFp4Out && (p.sfd == 0 || p.sfd % 16 != 0 || !(p.norm_constant > 0.f) || p.norm_constant > FLT_MAX || sf_span(p.rows, p.n) > INT32_MAX)) return false;
    return Adapter::can_implement(query_arguments(p)) == cutlass::Status::kSuccess;
  }

  static size_t workspace_size(const GroupedArgs& p) {
    if (p.experts < 1 || p.experts > BSG_MAX_GROUPS) return 0;
    return arrays_bytes(p.experts) + Adapter::get_workspace_size(query_arguments(p));
  }

  // Every check comes before the first launch, so a refused call leaves memory as it was. The
  // launches then are: the SFD padding memset (FP4), D's memset (zero_uncovered), the builder
  // (the workspace only) and the GEMM; should a later one fail to launch, the memsets' zeros
  // stay.
  static KernelStatus run(const GroupedArgs& p);

  // Group e's built entry flattened, for the host tests: m, n, k, the addresses of A, B, SFA, SFB
  // and D, alpha's bits, the leading dimensions of A, B and D, SFD's address (0 unless FP4), C's
  // address and leading dimension (0 and 0 without C), then the byte address of every scale of A
  // (m x K/16, row fastest) and of B (N x K/16) as the kernel's layouts place them, and for FP4
  // output of every generated scale factor (m x N/16). Returns the count of values; writes only
  // when `len` holds them all.
  static constexpr size_t kDescribed = 15;
  static int64_t emit(const Arrays& w, int e, bool with_c, int64_t* out, size_t len) {
    const int m = get<0>(w.shape[e]), n = get<1>(w.shape[e]), k = get<2>(w.shape[e]);
    const int sf_cols = k / 16, sfd_cols = kFp4Out ? n / 16 : 0;
    const size_t need = kDescribed + size_t(m + n) * sf_cols + size_t(m) * sfd_cols;
    if (len < need) return int64_t(need);
    float alpha = w.alpha[e];
    uint32_t alpha_bits;
    std::memcpy(&alpha_bits, &alpha, 4);
    size_t i = 0;
    for (int64_t v : {int64_t(m), int64_t(n), int64_t(k), int64_t(uintptr_t(w.a[e])), int64_t(uintptr_t(w.b[e])),
                      int64_t(uintptr_t(w.sfa[e])), int64_t(uintptr_t(w.sfb[e])), int64_t(uintptr_t(w.d[e])), int64_t(alpha_bits),
                      int64_t(get<0>(w.stride_a[e])), int64_t(get<0>(w.stride_b[e])), int64_t(get<0>(w.stride_d[e])),
                      int64_t(uintptr_t(w.sfd[e])), with_c ? int64_t(uintptr_t(w.c[e])) : 0, with_c ? int64_t(get<0>(w.stride_c[e])) : 0})
      out[i++] = v;
    for (int s = 0; s < sf_cols; ++s)
      for (int r = 0; r < m; ++r) out[i++] = int64_t(uintptr_t(w.sfa[e])) + int64_t(w.layout_sfa[e](make_coord(r, s * 16, 0)));
    for (int s = 0; s < sf_cols; ++s)
      for (int r = 0; r < n; ++r) out[i++] = int64_t(uintptr_t(w.sfb[e])) + int64_t(w.layout_sfb[e](make_coord(r, s * 16, 0)));
    // FP4 output: where the epilogue's layout (CUTLASS's, from the group's shape) puts each
    // generated scale factor.
    const auto layout_sfd = SfdConfig::tile_atom_to_shape_SFD(make_shape(m, n, k, 1));
    for (int s = 0; s < sfd_cols; ++s)
      for (int r = 0; r < m; ++r) out[i++] = int64_t(uintptr_t(w.sfd[e])) + int64_t(layout_sfd(make_coord(r, s * 16, 0)));
    return int64_t(need);
  }

  // Host arrays for one built entry, aligned as the workspace's.
  struct HostArrays {
    std::vector<uint8_t> storage;
    Arrays w;
    explicit HostArrays(int groups) : storage(arrays_bytes(groups) + kArrayAlign) {
      w = carve(reinterpret_cast<uint8_t*>((uintptr_t(storage.data()) + kArrayAlign - 1) / kArrayAlign * kArrayAlign), groups);
    }
  };

  // The host side of the builder, for tests: p's offsets and expert_alpha are host addresses.
  // Expert e's entry as `emit` flattens it; -1 for a problem can_implement refuses or a bad e.
  static int64_t describe(const GroupedArgs& p, int32_t e, int64_t* out, size_t len) {
    if (!can_implement(p) || e < 0 || e >= p.experts) return -1;
    const int32_t* off = reinterpret_cast<const int32_t*>(p.offsets);
    const float* ea = reinterpret_cast<const float*>(p.expert_alpha);
    std::vector<int> row(p.experts + 1), sf_row(p.experts);
    int run = 0, sf = 0;
    for (int j = 0; j <= p.experts; ++j) run = std::max(run, std::min(std::max(off[j], 0), p.rows)), row[j] = run;
    for (int j = 0; j < p.experts; ++j) sf_row[j] = sf, sf += (row[j + 1] - row[j] + 127) / 128 * 128;
    HostArrays h(p.experts);
    fill(p, e, row[e], row[e + 1] - row[e], sf_row[e], ea ? p.alpha * ea[e] : p.alpha, h.w);
    return emit(h.w, e, false, out, len);
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
    // CUTLASS's epilogue leaves the padding of the scale-factor tiles unwritten: the scale rows
    // any routing's blocks can reach (common/moe_rows.cuh) are zeroed in stream order first; the
    // rest of the buffer, which no grouped GEMM of these offsets reads, is left as it was.
    const size_t bytes = size_t(moe_used_sf_rows(p.rows, p.experts)) * size_t(sf_cols_padded(p.n));
    if (const cudaError_t e = cudaMemsetAsync(reinterpret_cast<void*>(p.sfd), 0, bytes, stream); e != cudaSuccess)
      return KernelStatus{int32_t(cutlass::Status::kErrorInternal), int32_t(e), 0};
  }
  if (p.zero_uncovered) {
    // CUTLASS's kernel writes the experts' rows only: the rows no expert covers are zeros
    // because all of D is, in stream order first.
    const size_t bytes = size_t(p.rows) * size_t(p.n) * cutlass::sizeof_bits<ElementD>::value / 8;
    if (const cudaError_t e = cudaMemsetAsync(reinterpret_cast<void*>(p.d), 0, bytes, stream); e != cudaSuccess)
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

// The list form over the same kernel (GroupedListArgs): G independent GEMMs, each group's sizes
// and operand addresses read from the caller's arrays by the builder, one CTA a group. A group
// the rules below refuse (those of the SM90 list form, kernel_abi.h, with N a multiple of D's and
// C's 16-byte alignment, plus CuTe's int32 scale strides) gets M = 0: no tile, nothing of it read
// or written; its addresses point at the workspace, which nothing reads either.
template <class G>
struct GroupedListGemm {
  using Arrays = typename G::Arrays;
  static constexpr bool kFp4Out = G::kFp4Out;
  static constexpr int kNMultiple = G::kAlignD > G::kAlignC ? G::kAlignD : G::kAlignC;

  // Address `g` of one of the args' arrays (device or host addresses, as the caller's).
  CUTE_HOST_DEVICE static uint64_t at(uint64_t array, int g) { return array ? reinterpret_cast<const uint64_t*>(array)[g] : 0; }

  // Group g's sizes, and whether the rules accept it.
  CUTE_HOST_DEVICE static bool group_ok(const GroupedListArgs& a, int g, int& m, int& n, int& k) {
    const int32_t* pr = reinterpret_cast<const int32_t*>(a.problems) + 3 * int64_t(g);
    m = pr[0], n = pr[1], k = pr[2];
    if (m < 0 || m > a.max_m || n < 1 || n > a.max_n || n % kNMultiple != 0 || k < 32 || k > a.max_k || k % 32 != 0) return false;
    const bool c = a.beta != 0.f;
    const uint64_t addr[7] = {at(a.a, g), at(a.sfa, g), at(a.b, g), at(a.sfb, g), at(a.d, g), c ? at(a.c, g) : 16, G::kFp4Out ? at(a.sfd, g) : 16};
    for (uint64_t v : addr)
      if (v == 0 || v % 16 != 0) return false;
    return G::sf_span(m, k) <= INT32_MAX && G::sf_span(n, k) <= INT32_MAX && (!G::kFp4Out || G::sf_span(m, n) <= INT32_MAX);
  }

  // Group g's entry (alpha times its own factor where given); `placeholder` stands for every
  // address of a refused group.
  CUTE_HOST_DEVICE static void fill(const GroupedListArgs& a, int g, uint64_t placeholder, const Arrays& w) {
    const float alpha = a.alphas ? a.alpha * reinterpret_cast<const float*>(a.alphas)[g] : a.alpha;
    int m, n, k;
    if (group_ok(a, g, m, n, k)) {
      G::fill_one(w, g, m, n, k, at(a.a, g), at(a.b, g), at(a.sfa, g), at(a.sfb, g), at(a.d, g), G::kFp4Out ? at(a.sfd, g) : 0,
                  a.beta != 0.f ? at(a.c, g) : 0, alpha);
    } else {
      const uint64_t x = placeholder;
      G::fill_one(w, g, 0, kNMultiple, 32, x, x, x, x, x, G::kFp4Out ? x : 0, a.beta != 0.f ? x : 0, alpha);
    }
  }

  static typename G::Adapter::Arguments arguments(const GroupedListArgs& a, const Arrays& w) {
    return G::arguments(a.groups, a.beta, a.device_id, a.sm_count, w);
  }
  static typename G::Adapter::Arguments query_arguments(const GroupedListArgs& a) {
    return arguments(a, G::carve(reinterpret_cast<uint8_t*>(G::kStandIn), a.groups));
  }

  static bool can_implement(const GroupedListArgs& a) {
    if (a.groups < 1 || a.groups > BSG_MAX_GROUPS || a.max_m < 0 || a.max_n < 1 || a.max_k < 32 || a.max_k % 32 != 0) return false;
    if (a.max_m > BSG_MAX_EXTENT || a.max_n > BSG_MAX_EXTENT || a.max_k > BSG_MAX_EXTENT || a.sm_count < 0) return false;
    if (a.b_layout != int32_t(WeightLayout::Standard)) return false;  // CUTLASS's K-major B only
    if (!a.problems || !a.a || !a.sfa || !a.b || !a.sfb || !a.d || (a.beta != 0.f && !a.c)) return false;
    if (G::kFp4Out && (a.sfd == 0 || !(a.norm_constant > 0.f) || a.norm_constant > FLT_MAX)) return false;
    if (a.workspace % G::kArrayAlign != 0) return false;
    return G::Adapter::can_implement(query_arguments(a)) == cutlass::Status::kSuccess;
  }

  static size_t workspace_size(const GroupedListArgs& a) {
    if (a.groups < 1 || a.groups > BSG_MAX_GROUPS) return 0;
    return G::arrays_bytes(a.groups) + G::Adapter::get_workspace_size(query_arguments(a));
  }

  // Every check comes before the first launch, so a refused call leaves memory as it was. Should
  // the GEMM's launch fail after the builder ran, the workspace and the FP4 padding bytes are
  // written (zeros, as a successful call leaves them).
  static KernelStatus run(const GroupedListArgs& a);

  // The host side of the builder, for tests: the args' arrays (problems, addresses, alphas) are
  // host addresses. Group g's entry as GroupedGemm::emit flattens it (a refused group: M = 0 and
  // the placeholder 16 for its addresses); -1 for a call can_implement refuses or a bad g.
  static int64_t describe(const GroupedListArgs& a, int32_t g, int64_t* out, size_t len) {
    if (!can_implement(a) || g < 0 || g >= a.groups) return -1;
    typename G::HostArrays h(a.groups);
    fill(a, g, 16, h.w);
    return G::emit(h.w, g, a.beta != 0.f, out, len);
  }

  static GroupedListEntry entry() { return GroupedListEntry{&run, &can_implement, &workspace_size, &describe}; }
};

// The list form's builder: CTA g fills group g's entry, and for FP4 output zeroes the padding of
// the group's scale-factor tiles, which CUTLASS's epilogue leaves unwritten (the dense path
// zeroes the whole buffer; here only the host knows no group's size), so each group's SFD bytes
// are those of the dense GEMM.
template <class L>
__global__ void __launch_bounds__(256) build_list_groups(GroupedListArgs a, typename L::Arrays w, uint64_t placeholder) {
  const int g = blockIdx.x;
  if (threadIdx.x == 0) L::fill(a, g, placeholder, w);
  if (g == 0 && threadIdx.x == 0) *w.norm = a.norm_constant;
  if constexpr (L::kFp4Out) {
    int m, n, k;
    if (!L::group_ok(a, g, m, n, k)) return;
    uint8_t* sfd = reinterpret_cast<uint8_t*>(L::at(a.sfd, g));
    const int64_t sp = sf_cols_padded(n), cols = n / 16, rows = (int64_t(m) + 127) / 128 * 128;
    // The padding rows by whole 4-column words (a row's four scale columns of a chunk are one
    // aligned word), then the padding columns of the real rows byte by byte (at most 3 a row).
    const int64_t below = (rows - m) * (sp / 4), beside = int64_t(m) * (sp - cols);
    for (int64_t i = threadIdx.x; i < below + beside; i += blockDim.x) {
      if (i < below) {
        *reinterpret_cast<uint32_t*>(sfd + sf_offset(m + i / (sp / 4), i % (sp / 4) * 4, sp)) = 0;
      } else {
        const int64_t j = i - below;
        sfd[sf_offset(j / (sp - cols), cols + j % (sp - cols), sp)] = 0;
      }
    }
  }
}

template <class G>
KernelStatus GroupedListGemm<G>::run(const GroupedListArgs& a) {
  if (!can_implement(a) || a.sm_count < 1) return KernelStatus{BSG_STATUS_INVALID_PROBLEM, 0, 0};
  const size_t need = workspace_size(a);
  if (need > a.workspace_bytes) return KernelStatus{BSG_STATUS_WORKSPACE_NULL, 0, uint64_t(need)};
  auto* base = reinterpret_cast<uint8_t*>(a.workspace);
  const Arrays w = G::carve(base, a.groups);
  auto stream = reinterpret_cast<cudaStream_t>(a.stream);
  (void)cudaGetLastError();  // a stale error of another library is not this call's (see Gemm::run)
  typename G::Adapter gemm;
  cutlass::Status st = gemm.initialize(arguments(a, w), base + G::arrays_bytes(a.groups), stream);
  if (st != cutlass::Status::kSuccess) return KernelStatus{static_cast<int32_t>(st), static_cast<int32_t>(cudaGetLastError()), 0};
  build_list_groups<GroupedListGemm><<<a.groups, 256, 0, stream>>>(a, w, uint64_t(uintptr_t(base)));
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
// The list form of the same instantiation, in the same translation unit (one kernel compiled).
#define BSG_SM100_GROUPED_LIST_KERNEL(fn, sms, tm, tn, tk, cm, cn, out_type)                                          \
  bsg::GroupedListEntry fn() {                                                                                         \
    return bsg::sm100::GroupedListGemm<bsg::sm100::GroupedGemm<sms, tm, tn, tk, cm, cn, out_type>>::entry();          \
  }
