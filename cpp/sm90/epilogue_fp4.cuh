// SM90 epilogue for FP4 output (CUTLASS example 72b's LinCombBlockScaleFactor): per 16 outputs
// along N, v = alpha * acc + beta * C, SFD = Sf(max|v| * (st / 6)) and D = e2m1(v * min(st /
// float(SFD), FLT_MAX)), in the order and roundings of CUTLASS's host reference (conversions in
// common/nvfp4.cuh), from the FP32 tile in shared memory (summing split-K in the cluster: the
// slice's sums over the peers' tiles, gathered into a tile of this CTA's own).
#pragma once

#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "common/nvfp4.cuh"
#include "common/scale_layout.cuh"
#include "sm90/epilogue.cuh"

namespace bsg::sm90 {

// The norm constants FP4 output takes (every adapter's can_implement asks): positive and finite,
// so the scale below is >= 0, which the code gate in fp4_encode relies on.
__host__ __device__ inline bool fp4_norm_constant_ok(float st) { return st > 0.f && st <= FLT_MAX; }

// Where one tile's FP4 output goes, and its constants.
struct Fp4Dest {
  const float* c;
  uint8_t* d;
  uint8_t* sfd;
  int64_t sp;
  float st, st_scaled_down;
};
__device__ __forceinline__ Fp4Dest fp4_dest(const Params& p, int64_t batch) {
  const int64_t sp = sf_cols_padded(p.n);
  return {static_cast<const float*>(p.c) + batch * p.m * int64_t(p.n), static_cast<uint8_t*>(p.d) + batch * p.m * int64_t(p.n) / 2,
          p.sfd + batch * sf_batch_bytes(p.m, sp), sp, p.norm_constant,
          __fmul_rn(p.norm_constant, 1.0f / 6.0f)};  // constant, rounded to nearest
}

// N (4 or 16) consecutive outputs of row mm from column nn (inside D): v = alpha * sums + beta * C.
template <int N>
__device__ __forceinline__ void fp4_values(const Params& p, const Fp4Dest& o, const float4 (&sums)[N / 4], int64_t idx, float (&v)[N]) {
  CUTE_UNROLL
  for (int e = 0; e < N / 4; ++e) {
    v[4 * e] = __fmul_rn(p.alpha, sums[e].x);
    v[4 * e + 1] = __fmul_rn(p.alpha, sums[e].y);
    v[4 * e + 2] = __fmul_rn(p.alpha, sums[e].z);
    v[4 * e + 3] = __fmul_rn(p.alpha, sums[e].w);
    if (p.beta != 0.f) {
      const float4 cv = *reinterpret_cast<const float4*>(o.c + idx + 4 * e);
      v[4 * e] = __fadd_rn(__fmul_rn(p.beta, cv.x), v[4 * e]);
      v[4 * e + 1] = __fadd_rn(__fmul_rn(p.beta, cv.y), v[4 * e + 1]);
      v[4 * e + 2] = __fadd_rn(__fmul_rn(p.beta, cv.z), v[4 * e + 2]);
      v[4 * e + 3] = __fadd_rn(__fmul_rn(p.beta, cv.w), v[4 * e + 3]);
    }
  }
}

// The largest |v|'s bits, NaN if a value is (CUTLASS's NaN-propagating max): non-negative floats
// order as their bits and a NaN's exceed every other's (its payload does not matter: the next
// multiplication makes it the canonical NaN).
template <int N>
__device__ __forceinline__ uint32_t abs_max_bits(const float (&v)[N]) {
  uint32_t m = 0;
  CUTE_UNROLL
  for (int e = 0; e < N; ++e) m = max(m, __float_as_uint(v[e]) & 0x7FFFFFFFu);
  return m;
}

// The group's scale factor from its largest |v|, and the codes of v (element e in nibble e).
template <class Sf, int N>
__device__ __forceinline__ uint8_t fp4_encode(const Fp4Dest& o, const float (&v)[N], float amax, uint32_t (&packed)[(N + 7) / 8]) {
  const uint8_t sf = sf_from_float<Sf>(__fmul_rn(amax, o.st_scaled_down));
  // 1.0f / x rounded to nearest is the correctly rounded reciprocal: __frcp_rn, no division.
  const float scale = min_nan(__fmul_rn(o.st, __frcp_rn(sf_to_float<Sf>(sf))), FLT_MAX);
  CUTE_UNROLL
  for (int i = 0; i < (N + 7) / 8; ++i) packed[i] = 0;
  if (__fmul_rn(amax, scale) < 0x1p99f) {
    // scale >= 0 (fp4_norm_constant_ok, checked by can_implement), so every |v * scale| is at most
    // RN(amax * scale) (rounding is monotonic): finite and below 2^100, where e2m1_code_signed
    // equals e2m1_from_float. A NaN among v makes amax NaN and fails the test.
    CUTE_UNROLL
    for (int e = 0; e < N; ++e) packed[e / 8] |= e2m1_code_signed(__fmul_rn(v[e], scale)) << (4 * (e % 8));
  } else {
    CUTE_UNROLL
    for (int e = 0; e < N; ++e) packed[e / 8] |= e2m1_from_float(__fmul_rn(v[e], scale)) << (4 * (e % 8));
  }
  return sf;
}

// A group of 16 outputs (row mm, columns nn..nn + 15 of D, inside D) by one thread.
template <class Sf>
__device__ __forceinline__ void fp4_group(const Params& p, const Fp4Dest& o, const float4 (&sums)[4], int mm, int nn) {
  const int64_t idx = int64_t(mm) * p.n + nn;
  float v[16];
  fp4_values<16>(p, o, sums, idx, v);
  uint32_t packed[2];
  const uint8_t sf = fp4_encode<Sf>(o, v, __uint_as_float(abs_max_bits(v)), packed);
  *reinterpret_cast<uint2*>(o.d + idx / 2) = make_uint2(packed[0], packed[1]);
  o.sfd[sf_offset(mm, nn / 16, o.sp)] = sf;
}

// A quarter of a group (columns nn..nn + 3, inside D) by each of the four lanes 4i..4i + 3 of a
// warp, all calling together: they share the group's maximum by two shuffles, each writes its
// four codes (2 bytes), the first also the scale factor.
template <class Sf>
__device__ __forceinline__ void fp4_quarter(const Params& p, const Fp4Dest& o, float4 sums, int mm, int nn, int tid) {
  const int64_t idx = int64_t(mm) * p.n + nn;
  float v[4];
  fp4_values<4>(p, o, {sums}, idx, v);
  const uint32_t quad = 0xFu << (tid & 28);
  uint32_t amax_bits = abs_max_bits(v);
  amax_bits = max(amax_bits, __shfl_xor_sync(quad, amax_bits, 1));
  amax_bits = max(amax_bits, __shfl_xor_sync(quad, amax_bits, 2));
  uint32_t packed[1];
  const uint8_t sf = fp4_encode<Sf>(o, v, __uint_as_float(amax_bits), packed);
  *reinterpret_cast<uint16_t*>(o.d + idx / 2) = uint16_t(packed[0]);
  if ((nn & 15) == 0) o.sfd[sf_offset(mm, nn / 16, o.sp)] = sf;
}

// Rows [0, rows) of an FP32 tile in shared memory (pitch kLd floats; row r is row m0 + r of D)
// written out: four threads a group where the tile has at most one group a thread (the small
// stream tiles, where few groups make the dependency chains what counts), else one (the scale
// computed once a group rather than four times).
// kN: the threads that call it (tid below kN).
template <class Sf, int kBM, int BN, int kLd, int kN = kThreads>
__device__ __forceinline__ void fp4_from_tile(const Params& p, const Fp4Dest& o, const float* tile_s, int rows, int m0, int n0, int tid) {
  if constexpr (kBM * (BN / 16) <= kN) {
    for (int u = tid; u < rows * (BN / 4); u += kN) {
      const int r = u / (BN / 4), col = (u % (BN / 4)) * 4;
      // A group is inside D or outside it whole (N % 32 == 0), so its four threads agree.
      if (m0 + r < p.m && n0 + col < p.n) fp4_quarter<Sf>(p, o, *reinterpret_cast<const float4*>(tile_s + r * kLd + col), m0 + r, n0 + col, tid);
    }
  } else {
    for (int gi = tid; gi < rows * (BN / 16); gi += kN) {
      const int r = gi / (BN / 16), col = (gi % (BN / 16)) * 16;
      if (m0 + r >= p.m || n0 + col >= p.n) continue;
      float4 v[4];
      CUTE_UNROLL
      for (int e = 0; e < 4; ++e) v[e] = *reinterpret_cast<const float4*>(tile_s + r * kLd + col + 4 * e);
      fp4_group<Sf>(p, o, v, m0 + r, n0 + col);
    }
  }
}

// The SFD bytes no output tile covers are zeroed by the CTAs of the last tiles in M and in N, so
// the buffer feeds a next GEMM whole (the kernels read the 128x4-tiled layout): rows M up to the
// 128-row padding for this tile's scale columns (and the column padding, if last in N), and scale
// columns N/16 up to the 4-column padding for this tile's rows. No memset launch. kN: the threads
// that call it.
template <int kN = kThreads>
__device__ __forceinline__ void zero_sfd_padding(const Params& p, const Fp4Dest& o, int m0, int n0, int bm, int bn, int tid) {
  const int sp = int(o.sp), mp = (p.m + 127) / 128 * 128;
  uint8_t* sfd = o.sfd;
  const bool last_m = m0 + bm >= p.m, last_n = n0 + bn >= p.n;
  if (last_m) {
    const int c0 = n0 / 16, cols = (last_n ? sp : (n0 + bn) / 16) - c0;
    for (int i = tid; i < (mp - p.m) * cols; i += kN) sfd[sf_offset(p.m + i / cols, c0 + i % cols, sp)] = 0;
  }
  if (last_n) {
    const int rows = min(m0 + bm, p.m) - m0, cols = sp - p.n / 16;
    for (int i = tid; i < rows * cols; i += kN) sfd[sf_offset(m0 + i / cols, p.n / 16 + i % cols, sp)] = 0;
  }
}

template <class T, class Sf, class Reduce, class Threads>
struct Epilogue<T, Fp4Out<Sf>, Reduce, Threads> {
  static constexpr int kBM = T::kBM, BN = T::kBN, kLd = T::kEpiLd;
  static_assert(std::is_same_v<Threads, ComputeThreads<T>> || !std::is_same_v<Reduce, ReduceCluster>, "the cluster sum runs on the compute threads");

  __device__ __forceinline__ static void run(const Params& p, const TileWork& w, float* tile_s, int tid) {
    const Fp4Dest o = fp4_dest(p, w.batch);
    if constexpr (std::is_same_v<Reduce, ReduceCluster> && (BSG_SM90_ABLATE & 8) == 0) {
      // As the 16-bit epilogue, this CTA sums rows [r0, r1) of the cluster's partial tiles in split
      // order, one float4 per thread and step, consecutive threads on consecutive float4s. The sums
      // go to a slice tile of this CTA's own past its partial tile, which no peer reads, so only
      // this CTA's threads wait before reading them.
      cute::cluster_sync();
      const int r0 = w.split * kBM / p.split_k, r1 = (w.split + 1) * kBM / p.split_k;
      // float4s per thread for the at most kBM / 2 rows of a slice (split_k >= 2); small tiles
      // leave threads idle.
      constexpr int kUnits = ((kBM / 2) * (BN / 4) + kThreads - 1) / kThreads;
      float* slice_s = tile_s + kBM * kLd;
      static_assert((kBM + kBM / 2) * kLd * 4 <= T::kSmem - 1024, "the partial tile and a slice fit the shared memory");
      float4 sum[kUnits];
      CUTE_UNROLL
      for (int j = 0; j < kUnits; ++j) {
        const int u = tid + j * kThreads, r = r0 + u / (BN / 4), col = (u % (BN / 4)) * 4;
        if (r < r1 && w.m0 + r < p.m && w.n0 + col < p.n) {
          float4 v[1];
          cluster_sum(tile_s + r * kLd + col, p.split_k, v);
          sum[j] = v[0];
        }
      }
      CUTE_UNROLL
      for (int j = 0; j < kUnits; ++j) {
        const int u = tid + j * kThreads, r = r0 + u / (BN / 4), col = (u % (BN / 4)) * 4;
        if (r < r1 && w.m0 + r < p.m && w.n0 + col < p.n) *reinterpret_cast<float4*>(slice_s + (r - r0) * kLd + col) = sum[j];
      }
      // No CTA leaves while a peer still reads its shared memory; relaxed, as in the 16-bit
      // epilogue (each peer load's value feeds a store issued before the arrive).
      cute::cluster_arrive_relaxed();
      compute_sync<T>();
      fp4_from_tile<Sf, kBM, BN, kLd>(p, o, slice_s, r1 - r0, w.m0 + r0, w.n0, tid);
      if (w.split == 0) zero_sfd_padding(p, o, w.m0, w.n0, kBM, BN, tid);
      cute::cluster_wait();
    } else {
      Threads::sync();
      fp4_from_tile<Sf, kBM, BN, kLd, Threads::kCount>(p, o, tile_s, kBM, w.m0, w.n0, tid);
      if (w.split == 0 || !std::is_same_v<Reduce, ReduceCluster>) zero_sfd_padding<Threads::kCount>(p, o, w.m0, w.n0, kBM, BN, tid);
    }
  }
};

}  // namespace bsg::sm90
