// CUTLASS's own host reference for the FP4-output GEMM (example 72b's `verify`): Gemm3x with
// SfStrategy::SfDGen, and CUTLASS's host number conversions. Host code only; the Rust reference
// (src/fp4_out.rs) is held to these byte for byte by tests/cutlass_host.rs.
#include <cstdint>
#include <cstring>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/detail/sm100_blockscaled_layout.hpp"
#include "cutlass/float8.h"
#include "cutlass/float_subbyte.h"
#include "cutlass/util/reference/host/gett.hpp"

namespace {

using namespace cute;

template <class SfD>
void gemm_fp4(int32_t m, int32_t n, int32_t k, int32_t l, const uint8_t* a, const uint8_t* sfa, const uint8_t* b,
              const uint8_t* sfb, const float* c, float alpha, float beta, float norm_constant, uint8_t* d,
              uint8_t* sfd) {
  using E2m1 = cutlass::float_e2m1_t;
  using Sf = cutlass::float_ue4m3_t;
  auto shape = make_shape(m, n, k, l);
  auto rows = [](int32_t r, int32_t cols, int32_t batch) {  // (r, cols, batch), cols contiguous
    return make_layout(make_shape(r, cols, batch), make_stride(int64_t(cols), _1{}, int64_t(r) * cols));
  };
  // The reference only reads A, B, their scales and C; cute's subbyte iterators want mutable pointers.
  auto e2m1 = [](const uint8_t* p) { return recast_ptr<E2m1>(reinterpret_cast<E2m1*>(const_cast<uint8_t*>(p))); };
  using Config = cutlass::detail::Sm1xxBlockScaledConfig<16>;
  using OutConfig = cutlass::detail::Sm1xxBlockScaledOutputConfig<16>;
  auto tA = make_tensor(e2m1(a), rows(m, k, l));
  auto tB = make_tensor(e2m1(b), rows(n, k, l));
  auto tSFA = make_tensor(reinterpret_cast<Sf*>(const_cast<uint8_t*>(sfa)), Config::tile_atom_to_shape_SFA(shape));
  auto tSFB = make_tensor(reinterpret_cast<Sf*>(const_cast<uint8_t*>(sfb)), Config::tile_atom_to_shape_SFB(shape));
  auto tC = make_tensor(const_cast<float*>(c), rows(m, n, l));  // null: no C term
  auto tD = make_tensor(recast_ptr<E2m1>(reinterpret_cast<E2m1*>(d)), rows(m, n, l));
  auto tSFD = make_tensor(reinterpret_cast<SfD*>(sfd), OutConfig::tile_atom_to_shape_SFD(shape));

  cutlass::reference::host::GettBlockScalingMainloopParams<float, decltype(tA), decltype(tSFA), decltype(tB),
                                                            decltype(tSFB)>
      mainloop{tA, tSFA, tB, tSFB};
  cutlass::reference::host::GettBlockScalingEpilogueParams<float, float, float, decltype(tC), decltype(tD),
                                                            decltype(tSFD), Int<16>,
                                                            cutlass::reference::host::SfStrategy::SfDGen>
      epilogue{alpha, beta, tC, tD, tSFD, norm_constant};
  cutlass::reference::host::Gemm3x(mainloop, epilogue);
}

}  // namespace

// D (L, M, N/2 bytes) and SFD (the 128x4 tiled layout over (M, N/16)) of
// D = quantize(alpha * A Bᵀ + beta * C); c may be null. Buffers are the caller's, sized by Rust.
void bsg_host_gemm_fp4(int32_t m, int32_t n, int32_t k, int32_t l, const uint8_t* a, const uint8_t* sfa,
                       const uint8_t* b, const uint8_t* sfb, const float* c, float alpha, float beta,
                       float norm_constant, bool sfd_ue8m0, uint8_t* d, uint8_t* sfd) {
  if (sfd_ue8m0)
    gemm_fp4<cutlass::float_ue8m0_t>(m, n, k, l, a, sfa, b, sfb, c, alpha, beta, norm_constant, d, sfd);
  else
    gemm_fp4<cutlass::float_ue4m3_t>(m, n, k, l, a, sfa, b, sfb, c, alpha, beta, norm_constant, d, sfd);
}

// Bytes of the SFD layout CUTLASS builds for (M, N, L): its cosize without the zero strides.
int64_t bsg_host_sfd_cosize(int32_t m, int32_t n, int32_t l) {
  auto layout = cutlass::detail::Sm1xxBlockScaledOutputConfig<16>::tile_atom_to_shape_SFD(make_shape(m, n, 32, l));
  return int64_t(cosize(filter_zeros(layout)));
}

// CUTLASS's host conversions from float, as the reference uses them: kind 0 float_e2m1_t
// (NumericConverter, round to nearest), 1 float_ue4m3_t, 2 float_ue8m0_t (static_cast).
void bsg_host_convert(int32_t kind, const float* x, uint8_t* out, size_t len) {
  for (size_t i = 0; i < len; ++i) {
    if (kind == 0) {
      cutlass::float_e2m1_t v = cutlass::NumericConverter<cutlass::float_e2m1_t, float>{}(x[i]);
      out[i] = v.raw() & 0xF;
    } else if (kind == 1) {
      out[i] = static_cast<cutlass::float_ue4m3_t>(x[i]).raw();
    } else {
      out[i] = static_cast<cutlass::float_ue8m0_t>(x[i]).raw();
    }
  }
}
