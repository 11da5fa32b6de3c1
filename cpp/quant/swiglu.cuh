// SwiGLU, silu(gate) * up, for the fused quantizer: every step one IEEE f32 operation (or a
// fused multiply-add) through the intrinsics that nvcc never contracts or approximates, in the
// order src/swiglu.rs computes them, so host and device agree bit for bit (its module docs give
// the algebra):
//   exp(x):  n = rint(x log2 e), r = (x - n * 0.693359375) + n * 2.12194440e-4 (two FMAs; the
//            first product is exact), p = Cephes expf's degree-5 polynomial in r (Horner, FMAs),
//            y = (p r^2 + r) + 1, e^x = y * 2^(n/2) * 2^(n - n/2) (powers of two built from bits);
//            +Inf above 88.72283, +0 below -103.27893, NaN for NaN;
//   silu(x) = x / (1 + exp(-x));
//   swiglu(g, u) = round_T(silu(g) * u), T the input type (nearest, ties to even).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace bsg::quant {

__device__ __forceinline__ float pow2_bits(int k) { return __int_as_float((k + 127) << 23); }  // k in [-126, 127]

__device__ __forceinline__ float exp_exact_order(float x) {
  if (x != x) return x;
  if (x > 88.72283f) return __int_as_float(0x7F800000);
  if (x < -103.27893f) return 0.f;
  const float n = rintf(__fmul_rn(x, 1.44269504088896341f));
  const float r = __fmaf_rn(n, 2.12194440e-4f, __fmaf_rn(n, -0.693359375f, x));
  const float z = __fmul_rn(r, r);
  float p = __fmaf_rn(1.9875691500e-4f, r, 1.3981999507e-3f);
  p = __fmaf_rn(p, r, 8.3334519073e-3f);
  p = __fmaf_rn(p, r, 4.1665795894e-2f);
  p = __fmaf_rn(p, r, 1.6666665459e-1f);
  p = __fmaf_rn(p, r, 5.0000001201e-1f);
  const float y = __fadd_rn(__fmaf_rn(p, z, r), 1.f);
  const int ni = int(n), n1 = ni / 2;
  return __fmul_rn(__fmul_rn(y, pow2_bits(n1)), pow2_bits(ni - n1));
}

__device__ __forceinline__ float silu_exact_order(float x) { return __fdiv_rn(x, __fadd_rn(1.f, exp_exact_order(-x))); }

// silu(g) * u rounded to T, returned as f32 (exact).
template <class T>
__device__ __forceinline__ float swiglu_as(float g, float u) {
  const float h = __fmul_rn(silu_exact_order(g), u);
  if constexpr (std::is_same_v<T, __half>) return __half2float(__float2half_rn(h));
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(__float2bfloat16_rn(h));
  else return h;
}

}  // namespace bsg::quant
