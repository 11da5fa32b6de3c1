// SM90 epilogue for FP4 output (CUTLASS example 72b's LinCombBlockScaleFactor): per 16 outputs
// along N, v = alpha * acc + beta * C, SFD = Sf(max|v| * (st / 6)) and D = e2m1(v * min(st /
// float(SFD), FLT_MAX)), in the order and roundings of CUTLASS's host reference (conversions in
// common/nvfp4.cuh), from the FP32 tile in shared memory; one thread per row and 16 columns
// writes 8 bytes of D and one scale factor.
#pragma once

#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "common/nvfp4.cuh"
#include "common/scale_layout.cuh"
#include "sm90/epilogue.cuh"

namespace bsg::sm90 {

template <class Sf, int BN>
__device__ __forceinline__ void fp4_epilogue(const Params& p, const float* tile_s, int ld, int m0, int n0, int64_t batch, int r_begin,
                                             int r_end) {
  const float st = p.norm_constant;
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

// The SFD bytes no output tile covers are zeroed by the CTAs of the last tiles in M and in N, so
// the buffer feeds a next GEMM whole (the kernels read the 128x4-tiled layout): rows M up to the
// 128-row padding for this tile's scale columns (and the column padding, if last in N), and scale
// columns N/16 up to the 4-column padding for this tile's rows. No memset launch.
__device__ __forceinline__ void zero_sfd_padding(const Params& p, int m0, int n0, int bm, int bn, int64_t batch, int tid) {
  const int sp = int(sf_cols_padded(p.n)), mp = (p.m + 127) / 128 * 128;
  uint8_t* sfd = p.sfd + batch * sf_batch_bytes(p.m, sp);
  const bool last_m = m0 + bm >= p.m, last_n = n0 + bn >= p.n;
  if (last_m) {
    const int c0 = n0 / 16, cols = (last_n ? sp : (n0 + bn) / 16) - c0;
    for (int i = tid; i < (mp - p.m) * cols; i += kThreads) sfd[sf_offset(p.m + i / cols, c0 + i % cols, sp)] = 0;
  }
  if (last_n) {
    const int rows = min(m0 + bm, p.m) - m0, cols = sp - p.n / 16;
    for (int i = tid; i < rows * cols; i += kThreads) sfd[sf_offset(m0 + i / cols, p.n / 16 + i % cols, sp)] = 0;
  }
}

template <class T, class Sf, class Reduce>
struct Epilogue<T, Fp4Out<Sf>, Reduce> {
  static constexpr int kBM = T::kBM, BN = T::kBN, kLd = T::kEpiLd;

  __device__ __forceinline__ static void run(const Params& p, const TileWork& w, float* tile_s, int tid) {
    int r0 = 0, r1 = kBM;  // the rows of the tile this CTA writes out
    if constexpr (std::is_same_v<Reduce, ReduceCluster> && (BSG_SM90_ABLATE & 8) == 0) {
      // As the 16-bit epilogue, but the FP4 epilogue reads the tile: the slice's sums go into
      // registers first and back into this CTA's tile once no peer reads it any more.
      cute::cluster_sync();
      r0 = w.split * kBM / p.split_k;
      r1 = (w.split + 1) * kBM / p.split_k;
      // float4s per thread for the at most kBM / 2 rows of a slice (split_k >= 2); small tiles
      // leave threads idle.
      constexpr int kUnits = ((kBM / 2) * (BN / 4) + kThreads - 1) / kThreads;
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
    compute_sync<T>();
    fp4_epilogue<Sf, BN>(p, tile_s, kLd, w.m0, w.n0, w.batch, r0, r1);
    if (w.split == 0 || !std::is_same_v<Reduce, ReduceCluster>) zero_sfd_padding(p, w.m0, w.n0, kBM, BN, w.batch, tid);
  }
};

}  // namespace bsg::sm90
