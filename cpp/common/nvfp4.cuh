// Every NVFP4 conversion the kernels do, in one place, with its algebra.
//
// Decode (e2m1 x ue4m3 -> FP16, exact):
//   An e2m1 nibble s|e1 e0 m, re-placed as the e4m3 byte s<<7 | (e1 e0 m)<<2, has the same
//   exponent and mantissa bits shifted into e4m3's fields (bias 7 instead of 1), so it is
//   exactly value * 2^-6, subnormal codes (0, 0.5) included. One cvt.rn.f16x2.e4m3x2 turns two
//   such bytes into FP16; one HMUL2 by sf * 2^6 (at most 448 * 64 = 28672, an FP16 number) gives
//   value * sf. value * sf has at most 6 significant bits (2 of e2m1 times 4 of e4m3) and lies in
//   [2^-10, 2688], so FP16 holds it exactly, and FP16 x FP16 products are exact in FP32.
//   decode8<kLowScale = true> multiplies by sf alone (no 2^6): the results are value * sf * 2^-6,
//   still exact (at least 2^-16, 6 significant bits); the caller multiplies its FP32 sums by 64.
//
// Decode to BF16 (W4A16 with bf16 activations; exact): an e2m1 nibble s|e1 e0 m placed as the
//   BF16 bits s<<15 | (e1 e0 m)<<6 is exactly value * 2^-126: e1 e0 fill the exponent field's two
//   low bits (bias 127 against e2m1's 1), m the top mantissa bit, and e1 e0 = 0 gives the
//   subnormal m * 2^-127 (0.5 * 2^-126) or +-0. A 32-bit word's nibbles j and j + 4 go to the two
//   halves with one shift for the signs and one for the magnitudes (both halves move alike); a byte
//   permute first puts decode8's pairs (elements 0 and 2, 1 and 3, 4 and 6, 5 and 7) at nibbles j,
//   j + 4. One HMUL2.BF16 by sf * 2^119 (at most 448 * 2^119 < 2^128, exact in BF16: 4 significant
//   bits) gives value * sf * 2^-7: 6 significant bits in [2^-17, 21], exact in BF16, so the sums
//   carry 2^-7 (kBf16WeightUnscale undoes it). bf16 x bf16 products have at most 16 significant
//   bits, as do FP16 x FP16 ones: exact in FP32 wherever they lie in its normal range (with the
//   2^-7, products below 2^-119 in true magnitude fall under it, where the tensor cores may flush).
//
// Encode (FP4 output, CUTLASS example 72b's LinCombBlockScaleFactor): written as CUTLASS's host
//   reference does it (gett.hpp, compute_1d_scaling_factor_and_quantized_output) so results match
//   it bit for bit: IEEE operations one at a time, NaN-propagating min/max (the epilogue takes
//   the maximum by the bits: the same value, a NaN's payload aside, which the next multiplication
//   drops), float_ue4m3_t / float_ue8m0_t from float, round-to-nearest-even onto e2m1.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cutlass/float8.h"

namespace bsg {

// ---- decode ----

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

// a times the low half of s in both halves: HMUL2 reads s.H0_H0, so no permute builds the pair.
__device__ __forceinline__ uint32_t hmul2_lo(uint32_t a, uint32_t s) {
  const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&a), __low2half2(*reinterpret_cast<const __half2*>(&s)));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// The low nibble of each byte of w as the e4m3 byte s<<7 | (e1 e0 m)<<2: value * 2^-6.
__device__ __forceinline__ uint32_t e2m1_lo_to_e4m3(uint32_t w) { return ((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u); }

// Two scales in FP16 times 2^6: the scale operand decode8 takes, undoing the placement's 2^-6.
__device__ __forceinline__ uint32_t decode8_scales(uint32_t two_scales_f16) { return hmul2(two_scales_f16, 0x54005400u); }

// 8 e2m1 values (one 32-bit word, element 2i in the low nibble of byte i) times scale2, as 8 FP16
// values in the order 0 2 1 3 4 6 5 7. Both MMA operands are decoded alike, so each dot product is
// unchanged, and the byte permutes and shifts that would restore element order are saved (the
// high half of a word goes to the conversion as it is: F2FP reads R.H1). scale2: one scale of
// decode8_scales in both halves; with kLowScale, any FP16 factor in the low half.
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

// What the FP32 sums of BF16 weights (decode8_bf16) carry, undone after the loop: 2^-7.
inline constexpr float kBf16WeightUnscale = 128.f;

// One scale (the e4m3 byte in the low byte of sf) as BF16 sf * 2^119 in both halves: the scale
// operand of decode8_bf16. Through FP32: FP16 and FP32 hold every e4m3 value and the power of
// two exactly (NaN stays NaN).
__device__ __forceinline__ uint32_t decode8_bf16_scale(uint32_t sf) {
  const float f = __half2float(__ushort_as_half(uint16_t(e4m3x2_to_f16x2(sf) & 0xFFFFu))) * 0x1p119f;
  const __nv_bfloat162 r = __float2bfloat162_rn(f);
  return *reinterpret_cast<const uint32_t*>(&r);
}

// Two scales in FP16 times 2^-1: decode8 with them gives value * sf * 2^-7 in FP16 (at least
// 2^-17 with 6 significant bits, so its last bit is at least 2^-22: exact), the products of
// decode8_bf16 for bf16 activations taken as FP16.
__device__ __forceinline__ uint32_t decode8_scales_bf16_sums(uint32_t two_scales_f16) { return hmul2(two_scales_f16, 0x38003800u); }

// Nibbles j and j + 4 of p placed as BF16 value * 2^-126 in the low and high half (the algebra
// above): the sign from bit 4j + 3 to bit 15, the magnitude from bits 4j + 2 .. 4j to 8 .. 6.
template <int J>
__device__ __forceinline__ uint32_t e2m1_nibbles_to_bf16(uint32_t p) {
  constexpr int kMag = 6 - 4 * J, kSign = 12 - 4 * J;
  const uint32_t mag = (kMag >= 0 ? p << (kMag > 0 ? kMag : 0) : p >> (kMag < 0 ? -kMag : 0)) & 0x01C001C0u;
  return ((p << kSign) & 0x80008000u) | mag;
}

__device__ __forceinline__ uint32_t hmul2_bf16(uint32_t a, uint32_t b) {
  const __nv_bfloat162 r = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// decode8 in BF16: the same 8 values in the same order, each value * sf * 2^-7 exactly. scale2:
// decode8_bf16_scale's.
__device__ __forceinline__ uint4 decode8_bf16(uint32_t w, uint32_t scale2) {
  const uint32_t p = __byte_perm(w, 0, 0x3120);  // bytes 0 2 1 3: nibbles 0..7 hold elements 0 1 4 5 2 3 6 7
  uint4 r;
  r.x = hmul2_bf16(e2m1_nibbles_to_bf16<0>(p), scale2);  // elements 0, 2
  r.y = hmul2_bf16(e2m1_nibbles_to_bf16<1>(p), scale2);  // 1, 3
  r.z = hmul2_bf16(e2m1_nibbles_to_bf16<2>(p), scale2);  // 4, 6
  r.w = hmul2_bf16(e2m1_nibbles_to_bf16<3>(p), scale2);  // 5, 7
  return r;
}

// BF16 activations as FP16 where FP16 holds them exactly (W4A16 with bf16 activations; the stream
//   tiles then decode the weights to FP16, 17 instructions for 8 weights against decode8_bf16's 20):
//   a BF16 number is exact in FP16 when it is +-0 or its magnitude is in [2^-17, 2^16). Its last
//   significant bit (8 bits) is 2^(e - 7) >= 2^-24, FP16's subnormal step, and its largest,
//   (2 - 2^-7) 2^15 = 65280, is below FP16's 65504; NaN and infinities fail the test. Over the pairs
//   of magnitudes m = bits & 0x7FFF a caller keeps the largest (at most 0x477F passes) and the
//   smallest of m - 1 (zero wraps to 0xFFFF and drops out; at least 0x36FF passes), two halves an
//   instruction.
struct Bf16RangeAcc {
  uint32_t hi = 0, lo = 0xFFFFFFFFu;
  __device__ __forceinline__ void add(uint32_t two_bf16) {
    const uint32_t m = two_bf16 & 0x7FFF7FFFu;
    hi = __vmaxu2(hi, m);
    lo = __vminu2(lo, __vsub2(m, 0x00010001u));
  }
  __device__ __forceinline__ bool exact_in_f16() const {
    return max(hi & 0xFFFFu, hi >> 16) <= 0x477Fu && min(lo & 0xFFFFu, lo >> 16) >= 0x36FFu;
  }
};

// Two BF16 numbers (low half first) as FP16, exactly where Bf16RangeAcc passes them: each widened to
// FP32 (its bits shifted up), then one conversion of the pair.
__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t two_bf16) {
  const __half2 h = __floats2half2_rn(__uint_as_float(two_bf16 << 16), __uint_as_float(two_bf16 & 0xFFFF0000u));
  return *reinterpret_cast<const uint32_t*>(&h);
}

// ---- encode (FP4 output) ----

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

// ---- encode (quantizer) ----

// The e2m1 code of a magnitude m >= 0, rounded to nearest even and saturating at 7 (6.0), by
// integer operations on m's bits (no conversion unit). Below 1 the e2m1 magnitudes are the
// multiples of 0.5 (codes 0, 1, 2): adding C = 1.5 * 2^22, whose ulp is 0.5, rounds m onto that
// grid to nearest even (0.25 -> 0.0, 0.75 -> 1.0), and bits(m + C) - bits(C) counts the halves.
// From 1 on, e2m1 keeps one mantissa bit: adding 2^21 - 1 plus that bit to m's bits rounds the
// mantissa to it to nearest even (a carry moves into the exponent: 1.75 -> 2.0), and then
// (bits >> 22) = 2 * biased exponent + kept bit = code + 252 (1.0: 254, code 2; 1.5: 255,
// code 3; 6.0: 259, code 7), saturated at 7. Ties land where e2m1_from_float's compares put
// them (1.25 -> 1.0, 2.5 -> 2.0, 3.5 -> 4.0, 5.0 -> 4.0), so this equals those compares on every
// non-negative float; NaN and infinity (exponent all ones) take the second path and give 7.
__device__ __forceinline__ uint32_t e2m1_magnitude_code(float m) {
  if (m < 1.f) return __float_as_uint(__fadd_rn(m, 0x1.8p22f)) - __float_as_uint(0x1.8p22f);
  const uint32_t b = __float_as_uint(m);
  return min(((b + 0x1FFFFFu + ((b >> 22) & 1u)) >> 22) - 252u, 7u);
}

// The e2m1 code of RN(x / step) (step > 0), sign kept (zeros too), NaN as +6 (0x7), without a
// division per value: rcp = RN(1 / step), and x * rcp lies within 2 ulp of x / step, so both have
// the same code unless x * rcp is within a few ulp of a rounding threshold (0.25, 0.75, 1.25, 1.75,
// 2.5, 3.5, 5: three significant bits, the low 20 mantissa bits zero); those few take the IEEE
// division.
__device__ __forceinline__ uint32_t e2m1_code_of_quotient(float x, float step, float rcp) {
  float q = x * rcp;
  if (((__float_as_uint(q) + 16u) & 0xFFFFFu) < 32u) q = x / step;
  const uint32_t sign = isnan(q) ? 0u : (__float_as_uint(q) >> 28) & 8u;
  return sign | e2m1_magnitude_code(fabsf(q));
}

// The e2m1 code of |q| for finite |q| < 2^100, rounded to nearest even, saturating at 7 (6.0), by
// one addition whatever q's binade. The grid of e2m1 magnitudes has step h = 0.5 below 2, 1 in
// [2, 4), 2 in [4, 8): h = 2^(E' - 128), E' = max(biased exponent of q, 127). C = 2^(E' - 105) has
// ulp h and |q| < 4h, so RN(|q| + C) rounds |q| to a multiple of h, to nearest even, and
// bits(RN(|q| + C)) - bits(C) counts the steps: the code below 2 (E' = 127), code - 2 in [2, 4),
// code - 4 in [4, 8), each count even exactly when its code is, so 2 E' - 254 adds the offset;
// from 8 on the count saturates. Equal to e2m1_magnitude_code(|q|) on every such q (checked
// exhaustively on the host). Written from C's bits alone: cb = max(bits(E) + 0x0B000000,
// 0x4A800000) is one add-and-max, and (E' << 1) - 254 = (cb >> 22) - 298, exactly, because cb's
// low 22 bits are zero (0x0B000000 >> 22 = 44).
__device__ __forceinline__ uint32_t e2m1_code_by_binade(float q) {
  const uint32_t cb = max((__float_as_uint(q) & 0x7F800000u) + 0x0B000000u, 0x4A800000u);
  const uint32_t r = __float_as_uint(__fadd_rn(fabsf(q), __uint_as_float(cb)));
  return min(r - cb + (cb >> 22) - 298u, 7u);
}

// e2m1_from_float(q) for finite |q| < 2^100 in about a third of its instructions: q's sign and
// e2m1_code_by_binade (equal on every such q, both signs: checked exhaustively on the host).
__device__ __forceinline__ uint32_t e2m1_code_signed(float q) { return ((__float_as_uint(q) >> 28) & 8u) | e2m1_code_by_binade(q); }

// RN(x / step) without a division (rcp = RN(1 / step)): q0 = RN(x * rcp) is within about two ulps
// of x / step, and one Markstein correction, RN(q0 + r * rcp) with the residual r = x - step * q0
// by one FMA, gives the correctly rounded quotient. That it always does is not proven here (the
// theorem wants q0 within one ulp); the callers rely on exhaustive host checks instead, made where
// a wrong last bit would change their result (quantize.cuh) and valid at every scale where no
// intermediate value is subnormal or overflows, which their gates on the operands keep.
// Infinite or NaN x gives NaN.
__device__ __forceinline__ float quotient_by_reciprocal(float x, float step, float rcp) {
  const float q0 = __fmul_rn(x, rcp);
  return __fmaf_rn(rcp, __fmaf_rn(-step, q0, x), q0);
}

// ---- 16-bit and f32 outputs ----

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

}  // namespace bsg
