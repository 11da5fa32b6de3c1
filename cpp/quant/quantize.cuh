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
#include <type_traits>

#include "blockscaled_gemm/kernel_abi.h"
#include "common/decoded_act.cuh"
#include "common/moe_rows.cuh"
#include "common/ptx.cuh"
#include "common/nvfp4.cuh"
#include "common/scale_layout.cuh"
#include "quant/swiglu.cuh"

namespace bsg::quant {

// Threads of one quantizer block: kWarps warps, one row each at a time.
constexpr int kThreads = 128, kWarps = kThreads / 32;
// Rows a warp quantizes in a dense launch without SwiGLU (the grid's y is sized for it): enough
// for the next row's loads to overlap this row's arithmetic, few enough to fill the GPU.
constexpr int kRowsPerWarp = 4;

// Raw 16-byte words holding n consecutive inputs.
template <class T, int n>
struct Raw {
  uint4 w[n * sizeof(T) / 16];
};

// Values j*16 .. j*16+15 of a Raw as f32, exactly.
template <class T, int n>
__device__ __forceinline__ void to_float16(const Raw<T, n>& r, int j, float (&v)[16]) {
  const uint32_t* u = reinterpret_cast<const uint32_t*>(r.w) + j * 16 * sizeof(T) / 4;
#pragma unroll
  for (int i = 0; i < 16 * int(sizeof(T)) / 4; ++i) {
    if constexpr (sizeof(T) == 4) {
      v[i] = __uint_as_float(u[i]);
    } else if constexpr (std::is_same_v<T, __half>) {
      v[2 * i] = __half2float(__ushort_as_half(uint16_t(u[i] & 0xFFFF))), v[2 * i + 1] = __half2float(__ushort_as_half(uint16_t(u[i] >> 16)));
    } else {
      // A bf16 value is the high half of its f32: one shift or one mask (converting each half
      // through 16 bits cost a shift more for the high one).
      v[2 * i] = __uint_as_float(u[i] << 16), v[2 * i + 1] = __uint_as_float(u[i] & 0xFFFF0000u);
    }
  }
}

template <class T, int n>
__device__ __forceinline__ Raw<T, n> load_raw(const T* p) {
  Raw<T, n> r;
#pragma unroll
  for (int i = 0; i < int(sizeof(r.w) / 16); ++i) r.w[i] = reinterpret_cast<const uint4*>(p)[i];
  return r;
}

// The global scale as quantize16 takes it: g, and for g in [2^-100, 2^126) its reciprocal, with
// which the block scale's second division goes by quotient_by_reciprocal too.
struct GlobalScale {
  float g, rcp;
  bool by_reciprocal;
};
__device__ __forceinline__ GlobalScale global_scale(float g) { return GlobalScale{g, __frcp_rn(g), g >= 0x1p-100f && g < 0x1p126f}; }

// RN(RN(bamax / 6) / g), the value a block's scale rounds. By quotient_by_reciprocal where its
// intermediate values stay normal: bamax 0 or at least 2^-87, g in range, the result finite (a
// quotient that overflows comes out NaN or infinite there); otherwise, and for infinite bamax,
// the two IEEE divisions. Host checks (C, against IEEE division, bit for bit): the first quotient
// for every bamax in [2^-100, FLT_MAX]; the second for every mantissa of g, every 4-significant-bit
// pattern (the e4m3 rounding midpoints, normal and subnormal, and the satfinite edge 464) and
// every t within 24 ulps of it, 6.6e9 cases; a result below 2^-11 becomes the scale 0 either way.
__device__ __forceinline__ float block_scale_quotient(float bamax, const GlobalScale& gs) {
  const float t = quotient_by_reciprocal(quotient_by_reciprocal(bamax, 6.f, 0x1.555556p-3f), gs.g, gs.rcp);
  if (gs.by_reciprocal && (bamax == 0.f || bamax >= 0x1p-87f) && t <= FLT_MAX) return t;
  return bamax / 6.f / gs.g;
}

// A block's largest magnitude as fmaxf(0, |v_i|, ...) gives it (NaN skipped), and whether a NaN
// is among its values: one maximum a value that lets a NaN through (max.NaN.f32), or for 16-bit
// inputs two a value on the raw words (integer maxima of the magnitudes' bits, which order like
// the values with NaN above infinity; __vmaxu2, as Bf16RangeAcc, which ptxas fuses in pairs into
// VIMNMX3.U16x2); the NaN-skipping maximum only where a NaN is present.
struct BlockMax {
  float amax;
  bool nan;
};

__device__ __forceinline__ float fmax_abs16(const float (&v)[16]) {
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) m = fmaxf(m, fabsf(v[i]));
  return m;
}

__device__ __forceinline__ BlockMax block_max(const float (&v)[16]) {
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) asm("max.NaN.f32 %0, %0, %1;\n" : "+f"(m) : "f"(fabsf(v[i])));
  if (isnan(m)) return BlockMax{fmax_abs16(v), true};
  return BlockMax{m, false};
}

template <class T, int n>
__device__ __forceinline__ BlockMax block_max(const Raw<T, n>& r, int j, const float (&v)[16]) {
  if constexpr (sizeof(T) == 4) {
    return block_max(v);
  } else {
    const uint32_t* u = reinterpret_cast<const uint32_t*>(r.w) + j * 8;
    uint32_t m = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) m = __vmaxu2(m, u[i] & 0x7FFF7FFFu);
    const uint32_t mb = max(m & 0xFFFFu, m >> 16);
    constexpr bool kHalf = std::is_same_v<T, __half>;
    if (mb > (kHalf ? 0x7C00u : 0x7F80u)) return BlockMax{fmax_abs16(v), true};
    return BlockMax{kHalf ? __half2float(__ushort_as_half(uint16_t(mb))) : __uint_as_float(mb << 16), false};
  }
}

// Where quantize16 sends a block to the redo: GateBlock once per block, from its maximum (bm);
// GateValue per value from its quotient, the fast path's codes computed first (the SwiGLU
// transform: its values come late from the exp and division, and the per-block test then sits on
// the critical path, 0.1 us more at 128 rows; bench/DESIGN.md section 13).
struct GateBlock {};
struct GateValue {};

// One block of 16 (bm: its largest magnitude, with GateBlock also whether a NaN is among them):
// its ue4m3 scale, and its codes packed into 8 bytes (element 2i low nibble): the code of
// RN(x / step) with x's sign, as e2m1_code_of_quotient gives it. Branch-free per value by
// quotient_by_reciprocal where step is in [2^-90, 2^126) (every intermediate value of a quotient
// that can reach 0.25 then stays normal) and every corrected quotient is below 2^100, where
// e2m1_code_by_binade holds (GateBlock: no value is NaN and RN(amax * rcp) < 2^99, which an
// infinite value fails; GateValue: each quotient tested, NaN failing); otherwise the block is
// redone value by value with e2m1_code_of_quotient. Host check (C): for every mantissa of step,
// every e2m1 rounding midpoint and every x within 24 ulps of it (the only x whose code a wrong
// last bit could change), the corrected quotient equals IEEE x / step bit for bit, 2.9e9 cases
// (the uncorrected product is wrong in 7.9e8 of them and gives 1.5e7 wrong codes).
template <class Gate = GateBlock>
__device__ __forceinline__ uint32_t quantize16(const float (&v)[16], const BlockMax& bm, const GlobalScale& gs, uint2& packed) {
  constexpr bool kPerValue = std::is_same_v<Gate, GateValue>;
  const uint32_t sf = sf_from_float<cutlass::float_ue4m3_t>(block_scale_quotient(bm.amax, gs));
  const float step = sf_to_float<cutlass::float_ue4m3_t>(uint8_t(sf)) * gs.g;
  uint32_t p[2] = {0, 0};
  if (step > 0.f) {
    const bool in_range = step >= 0x1p-90f && step < 0x1p126f;
    const float rcp = in_range ? __frcp_rn(step) : 0.f;
    bool redo = !in_range;
    if constexpr (!kPerValue) redo = redo || bm.nan || !(__fmul_rn(bm.amax, rcp) < 0x1p99f);
    if (!redo) {
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const float q = quotient_by_reciprocal(v[i], step, rcp);
        if constexpr (kPerValue) redo |= !(fabsf(q) < 0x1p100f);
        p[i / 8] |= (((__float_as_uint(v[i]) >> 28) & 8u) | e2m1_code_by_binade(q)) << (4 * (i % 8));
      }
    }
    if (redo) {
      // The fast path's reciprocal is not reused here: one reciprocal for both paths was slower
      // (bench/DESIGN.md section 13). Below 2^-126 the reciprocal overflows (a computed g of
      // FLT_MIN and a subnormal scale make such steps): a NaN rcp sends every quotient to the
      // division (NaN * x is the canonical NaN, whose low mantissa bits e2m1_code_of_quotient
      // flags).
      const float rcp2 = step >= 0x1p-126f ? __frcp_rn(step) : __int_as_float(0x7FFFFFFF);
      p[0] = p[1] = 0;
#pragma unroll
      for (int i = 0; i < 16; ++i) p[i / 8] |= e2m1_code_of_quotient(v[i], step, rcp2) << (4 * (i % 8));
    }
  }
  packed = make_uint2(p[0], p[1]);
  return sf;
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
    to_float16(load_raw<T, 16>(x + i), 0, v);
#pragma unroll
    for (int j = 0; j < 16; ++j) m = fmaxf(m, fabsf(v[j]));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  if ((threadIdx.x & 31) == 0) atomicMax(amax_bits, __float_as_uint(m));
}

// Scale layouts the quantizer writes: the dense tiled layout of (L, M, K/16), scale row = input
// row; or the grouped GEMM's layout of a mixture-of-experts layer's stacked rows (L = 1): row r
// of expert e at scale row sf_row[e] + r - row[e] (common/moe_rows.cuh), into a buffer the launch
// zeroed first with a memset (the padding rows are scattered single bytes of the tiled layout;
// zeroing them here, one thread per expert, took most of the time at decode sizes).
struct DenseScales {};
struct MoeScales {};

// Outputs besides codes and scales: none, or (dense layout) the decoded activations of
// common/decoded_act.cuh, which the SM90 GEMM then reads instead of decoding A in a pre-pass.
struct CodesOnly {};
struct WithDecoded {};

// What is quantized: x's values, or the SwiGLU of each row's two halves (x rows 2K long, gate
// first; quant/swiglu.cuh).
struct Identity {};
struct SwigluHalves {};

// The MoE form's expert table, in shared memory (only its instantiations reference it, so the
// dense ones hold none).
__device__ __forceinline__ MoeRows& moe_table() {
  __shared__ MoeRows table;
  return table;
}

// A row's 16 inputs of one lane (SwiGLU: its gate and up values), as loaded.
template <class T, class Transform>
struct RowInputs {
  static constexpr int kParts = std::is_same_v<Transform, SwigluHalves> ? 2 : 1;
  Raw<T, 16> part[kParts];
};

// One warp: one row, 32 consecutive scale columns (lane j: column 32 blockIdx.x + j, its 16
// inputs), so a warp's loads and code stores are contiguous (16 x 32 bytes of bf16 in, 256 bytes of
// codes out); four lanes' scale bytes are one 32-bit word of the tiled layout, stored by the first
// of them. Warps stride over the rows (about kRowsPerWarp each in a dense launch), each loading its
// next row's inputs before quantizing this row (not for SwiGLU), so a load stays in flight while it
// computes. The rows are the dense layout's padded rows (ceil(M/128) * 128: rows past M write zero
// scales), or the MoE form's stacked rows (rows no expert holds write nothing). Columns past K/16
// up to the padded count write zero scales. WithDecoded: rows up to decoded_rows too (at least
// m), each lane's decode beside its codes (zeros past m and K). grid: (padded columns / 32
// rounded up, row groups, L). g_given is used when amax_bits is null. The launch lets the next
// kernel start at once (programmatic launch): this crate's kernels that follow wait for it before
// they read its outputs.
template <class T, class Layout, class Transform, class Extra = CodesOnly>
__global__ void __launch_bounds__(kThreads) quantize_kernel(const T* x, uint8_t* codes, uint8_t* scales, int m, int k, float g_given, const uint32_t* amax_bits,
                                                         const int32_t* offsets, int experts, uint4* decoded, int decoded_rows) {
  constexpr bool kMoe = std::is_same_v<Layout, MoeScales>, kSwiglu = std::is_same_v<Transform, SwigluHalves>;
  constexpr bool kDecoded = std::is_same_v<Extra, WithDecoded>;
  static_assert(!(kMoe && kDecoded), "decoded activations: dense layout only");
  griddep_launch_dependents();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, l = blockIdx.z;
  const int cols = k / 16, cg = blockIdx.x * 32 + lane;
  const int64_t sp = sf_cols_padded(k);
  if constexpr (kMoe) moe_table().prepare(offsets, experts, m, threadIdx.x);
  const GlobalScale gs = global_scale(amax_bits ? global_from_amax(__uint_as_float(*amax_bits)) : g_given);
  const int sf_end = kMoe ? m : (m + 127) / 128 * 128, stride = gridDim.y * kWarps;
  const int row_end = kDecoded ? max(sf_end, decoded_rows) : sf_end;
  const int64_t batch_sf = kMoe ? 0 : l * sf_batch_bytes(m, sp);
  // Input element of row r's first value of this lane (rows of 2K for SwiGLU).
  auto first = [&](int r) { return (int64_t(l) * m + r) * k * RowInputs<T, Transform>::kParts + int64_t(cg) * 16; };
  auto load = [&](int r) {
    RowInputs<T, Transform> in;
    if (r < m && cg < cols) {
#pragma unroll
      for (int j = 0; j < in.kParts; ++j) in.part[j] = load_raw<T, 16>(x + first(r) + j * int64_t(k));
    }
    return in;
  };
  // SwiGLU loads its row where it quantizes it: its exp and division hold twice the inputs in
  // registers, and a row ahead cost it occupancy (bench/DESIGN.md section 13).
  int r = blockIdx.y * kWarps + warp;
  RowInputs<T, Transform> next{};
  if constexpr (!kSwiglu) next = load(r);
  for (; r < row_end; r += stride) {
    RowInputs<T, Transform> ahead{};  // this row's inputs, loaded an iteration ago
    if constexpr (!kSwiglu) ahead = next, next = load(r + stride);
    int srow = r;  // the scale row
    if constexpr (kMoe) {
      const MoeRows& table = moe_table();
      const int e = table.expert_of_row(experts, r);
      if (e < 0) continue;  // the whole warp: one row
      srow = table.sf_row[e] + r - table.row[e];
    }
    uint32_t sf = 0;
    uint2 packed = make_uint2(0, 0);
    if (r < m && cg < cols) {
      float v[16];
      if constexpr (kSwiglu) {
        const RowInputs<T, Transform> in = load(r);
        float gv[16], uv[16];
        to_float16(in.part[0], 0, gv);
        to_float16(in.part[1], 0, uv);
#pragma unroll
        for (int i = 0; i < 16; ++i) v[i] = swiglu_as<T>(gv[i], uv[i]);
      } else {
        to_float16(ahead.part[0], 0, v);
      }
      if constexpr (kSwiglu) sf = quantize16<GateValue>(v, BlockMax{fmax_abs16(v), false}, gs, packed);
      else sf = quantize16(v, block_max(ahead.part[0], 0, v), gs, packed);
      *reinterpret_cast<uint2*>(codes + ((int64_t(l) * m + r) * k + int64_t(cg) * 16) / 2) = packed;
    }
    const uint32_t word = sf | __shfl_down_sync(0xFFFFFFFFu, sf, 1) << 8 | __shfl_down_sync(0xFFFFFFFFu, sf, 2) << 16 |
                          __shfl_down_sync(0xFFFFFFFFu, sf, 3) << 24;
    if (lane % 4 == 0 && cg < sp && r < sf_end) *reinterpret_cast<uint32_t*>(scales + batch_sf + sf_offset(srow, cg, sp)) = word;
    if constexpr (kDecoded) {
      if (r < decoded_rows && cg < sp) store_decoded_group(decoded + (int64_t(l) * decoded_rows + r) * (sp / 4) * 8, cg, packed, sf);
    }
  }
}

// Row-major ue4m3 scales (batch, rows, cols), as checkpoints store them, into the 128x4 tiled
// layout (common/scale_layout.cuh) with its padding zeroed: one thread per 32-bit word of the
// output (one row's four scale columns of a chunk), so the stores run side by side; the reads are
// 4 bytes of a row each.
__global__ void tile_scales_kernel(const uint8_t* src, uint32_t* dst, int rows, int cols, int64_t words_per_batch, int64_t words) {
  const int64_t sp = (int64_t(cols) + 3) / 4 * 4;
  for (int64_t w = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; w < words; w += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = w / words_per_batch, in_batch = w % words_per_batch;
    const int64_t chunk = in_batch / 128, q = in_batch % 128;  // 512-byte chunk, its word
    const int64_t row = chunk / (sp / 4) * 128 + (q % 4) * 32 + q / 4, col0 = chunk % (sp / 4) * 4;
    uint32_t v = 0;
    if (row < rows) {
      const uint8_t* s = src + (b * rows + row) * cols;
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (col0 + j < cols) v |= uint32_t(s[col0 + j]) << (8 * j);
    }
    dst[w] = v;
  }
}

// Packed e2m1 values between the standard layout (batch, rows, K / 2 bytes) and the prepacked one
// (kernel_abi.h: batch, chunks, rows, BSG_PREPACK_CHUNK_BYTES), in 16-byte units (K / 2 is a
// multiple of 16, so a unit lies wholly inside or past the row). One thread per output unit:
// Prepack writes every unit of the prepacked buffer (zeros past K), Unpack every unit of the
// standard one.
struct Prepack {};
struct Unpack {};
template <class Dir>
__global__ void prepack_values_kernel(const uint4* src, uint4* dst, int rows, int row_units, int chunks, int64_t units) {
  constexpr int kChunkUnits = BSG_PREPACK_CHUNK_BYTES / 16;
  for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < units; o += int64_t(gridDim.x) * blockDim.x) {
    if constexpr (std::is_same_v<Dir, Prepack>) {
      const int64_t per_chunk = int64_t(rows) * kChunkUnits;
      const int64_t lc = o / per_chunk, in_chunk = o % per_chunk;  // (batch, chunk), its unit
      const int64_t l = lc / chunks, c = lc % chunks, r = in_chunk / kChunkUnits;
      const int64_t col = c * kChunkUnits + in_chunk % kChunkUnits;
      dst[o] = col < row_units ? src[(l * rows + r) * row_units + col] : make_uint4(0, 0, 0, 0);
    } else {
      const int64_t lr = o / row_units, col = o % row_units;  // (batch, row), its unit
      const int64_t l = lr / rows, r = lr % rows, c = col / kChunkUnits;
      dst[o] = src[((l * chunks + c) * rows + r) * kChunkUnits + col % kChunkUnits];
    }
  }
}

}  // namespace bsg::quant
