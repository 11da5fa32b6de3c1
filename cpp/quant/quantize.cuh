// The NVFP4 quantizer: (L, M, K) f32 / f16 / bf16, row-major, to packed e2m1 codes (L, M, K/2)
// and ue4m3 block scales in the 128x4 tiled layout (padding written with zeros), by ModelOpt's
// rules as the CPU quantizer (src/matrix.rs, Nvfp4Matrix::quantize) states them, one IEEE f32
// operation at a time in the same order, so the two agree bit for bit:
//   scale = ue4m3_rn_satfinite(block_amax / 6 / g),  s = float(scale) * g,
//   code  = s > 0 ? e2m1_rn_satfinite(x / s) : 0,
// g the global scale, given or derived from the tensor's amax (amax / 2688, at least FLT_MIN; 1
// when amax is 0). f32 division here is IEEE round-to-nearest (nvcc's default -prec-div=true).
// Inputs are not checked: NaN does not raise a block's amax and encodes as +6 (0x7); +-Inf gives
// its block the scale 448 and codes +-6.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <cstdint>

#include "common/nvfp4.cuh"
#include "common/scale_layout.cuh"

namespace bsg::quant {

// Threads of one block: the 128 rows of one scale chunk.
constexpr int kRows = 128;

// 16 consecutive inputs (32-byte aligned for 16-bit types, 64-byte for f32) as f32, exactly.
template <class T>
__device__ __forceinline__ void load16(const T* p, float (&v)[16]) {
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 q = reinterpret_cast<const float4*>(p)[i];
      v[4 * i] = q.x, v[4 * i + 1] = q.y, v[4 * i + 2] = q.z, v[4 * i + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint4 q = reinterpret_cast<const uint4*>(p)[i];
      const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint16_t lo = uint16_t(w[j] & 0xFFFF), hi = uint16_t(w[j] >> 16);
        if constexpr (std::is_same_v<T, __half>) {
          v[8 * i + 2 * j] = __half2float(__ushort_as_half(lo)), v[8 * i + 2 * j + 1] = __half2float(__ushort_as_half(hi));
        } else {
          v[8 * i + 2 * j] = __bfloat162float(__ushort_as_bfloat16(lo)), v[8 * i + 2 * j + 1] = __bfloat162float(__ushort_as_bfloat16(hi));
        }
      }
    }
  }
}

// The global scale a tensor of largest magnitude amax gets (the CPU quantizer's rule).
__device__ __forceinline__ float global_from_amax(float amax) { return amax > 0.f ? fmaxf(amax / 2688.f, FLT_MIN) : 1.f; }

// Largest |x| of n values into *amax_bits (as the bits of a non-negative float, which order like
// unsigned integers; the caller zeroes it first). NaN is skipped, as fmaxf skips it.
template <class T>
__global__ void amax_kernel(const T* x, int64_t n, uint32_t* amax_bits) {
  float m = 0.f;
  for (int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 16; i < n; i += int64_t(gridDim.x) * blockDim.x * 16) {
    float v[16];
    load16(x + i, v);
#pragma unroll
    for (int j = 0; j < 16; ++j) m = fmaxf(m, fabsf(v[j]));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  if ((threadIdx.x & 31) == 0) atomicMax(amax_bits, __float_as_uint(m));
}

// One thread: one row (of a 128-row chunk) and four scale columns, 64 inputs: 32 code bytes and
// the four scale bytes, which lie side by side in the chunk (one 32-bit store). Rows past M and
// columns past K/16 write zero scales (the layout's padding). grid: (padded columns / 4,
// padded rows / 128, L). g_given is used when amax_bits is null.
template <class T>
__global__ void __launch_bounds__(kRows) quantize_kernel(const T* x, uint8_t* codes, uint8_t* scales, int m, int k, float g_given, const uint32_t* amax_bits) {
  const int row = blockIdx.y * kRows + threadIdx.x, c4 = blockIdx.x, l = blockIdx.z;
  const int64_t sp = sf_cols_padded(k);
  const int cols = k / 16;
  const float g = amax_bits ? global_from_amax(__uint_as_float(*amax_bits)) : g_given;
  uint32_t four = 0;
  if (row < m) {
    const int64_t base = (int64_t(l) * m + row) * k;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int s = c4 * 4 + j;
      if (s >= cols) break;
      float v[16];
      load16(x + base + s * 16, v);
      float bamax = 0.f;
#pragma unroll
      for (int i = 0; i < 16; ++i) bamax = fmaxf(bamax, fabsf(v[i]));
      const uint8_t sf = sf_from_float<cutlass::float_ue4m3_t>(bamax / 6.f / g);
      const float step = sf_to_float<cutlass::float_ue4m3_t>(sf) * g;
      uint32_t packed[2] = {0, 0};
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const float q = v[i] / step;
        const uint32_t code = step > 0.f ? (isnan(q) ? 7u : e2m1_from_float(q)) : 0u;
        packed[i / 8] |= code << (4 * (i % 8));
      }
      *reinterpret_cast<uint2*>(codes + base / 2 + s * 8) = make_uint2(packed[0], packed[1]);
      four |= uint32_t(sf) << (8 * j);
    }
  }
  *reinterpret_cast<uint32_t*>(scales + l * sf_batch_bytes(m, sp) + sf_offset(row, int64_t(c4) * 4, sp)) = four;
}

}  // namespace bsg::quant
