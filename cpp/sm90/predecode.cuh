// The swapped tiles' activation pre-pass: A (packed e2m1, tiled ue4m3 scales) decoded once per
// GEMM to FP16 a * sf, (L, m_pad, k_pad) with k_pad = K rounded up to 64, each 64-K block in the
// order the swapped main loop's MMA steps read (act_chunks) so that TMA's 128-byte swizzle lays
// it out as an in-CTA decode would; K past the end is 0, and so are rows M .. m_pad - 1 (the
// dense GEMM pads M to its tile's rows: boxes reaching past the buffer's rows, filled by TMA,
// made the swapped tiles slow at ragged M, bench/DESIGN.md §3).
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/decoded_act.cuh"
#include "common/launch.h"
#include "common/nvfp4.cuh"
#include "common/ptx.cuh"
#include "common/scale_layout.cuh"
#include "cute/config.hpp"

namespace bsg::sm90 {

// One row's 64-K block (packed bytes q0 | q1, its four scales sf4) for thread parity hh = shift / 4:
// chunk st (8 halves) holds MMA step st's K positions 8 hh .. 8 hh + 7, i.e. for each scale group
// c the values 4 st + hh and 4 st + hh + 2 (mainloop_swapped.cuh says why this order): act_group's
// word st of group c is the chunk's word c. Decoded as decode8 does.
__device__ __forceinline__ void act_chunks(uint4 q0, uint4 q1, uint32_t sf4, int shift, uint4 (&ch)[4]) {
  const uint32_t s01 = decode8_scales(e4m3x2_to_f16x2(sf4)), s23 = decode8_scales(e4m3x2_hi_to_f16x2(sf4));
  const uint32_t sc[4] = {__byte_perm(s01, s01, 0x1010), __byte_perm(s01, s01, 0x3232), __byte_perm(s23, s23, 0x1010),
                          __byte_perm(s23, s23, 0x3232)};
  const uint2 w[4] = {{q0.x, q0.y}, {q0.z, q0.w}, {q1.x, q1.y}, {q1.z, q1.w}};  // per group
  uint32_t g[4][4];  // [group][step]
  CUTE_UNROLL
  for (int c = 0; c < 4; ++c) act_group(w[c], sc[c], shift, g[c]);
  CUTE_UNROLL
  for (int st = 0; st < 4; ++st) ch[st] = make_uint4(g[0][st], g[1][st], g[2][st], g[3][st]);
}

constexpr int kPreThreads = 1024;       // predecode_a's launch bound
constexpr int kPreSmem = 120 * 1024;    // reserved, unused: keeps one pre-pass CTA per SM

// One 64-K block kb of one row for thread parity hh: the row's packed values at a_row, its
// scales in the 128x4 tiled layout from sf_rows (the first byte of the 128-row block that holds
// it; rb is the row inside that block), or none (sf_rows null: the row decodes to zeros); decoded
// into the row's output at out_row as the swapped main loop reads it.
__device__ __forceinline__ void predecode_item(const uint8_t* a_row, const uint8_t* sf_rows, int rb, uint4* out_row, int kb, int hh, int k) {
  const bool whole = kb * 64 + 64 <= k;  // else 32 K (K % 32 == 0): groups 2 and 3 are past K
  const uint8_t* src = a_row + kb * 32;
  const uint4 q0 = *reinterpret_cast<const uint4*>(src);
  const uint4 q1 = whole ? *reinterpret_cast<const uint4*>(src + 16) : make_uint4(0, 0, 0, 0);
  uint32_t sf4 = sf_rows ? *reinterpret_cast<const uint32_t*>(sf_rows + sf_offset(rb, 4 * kb, sf_cols_padded(k))) : 0u;
  if (!whole) sf4 &= 0xFFFFu;  // 0 * 0, whatever the padding scales hold
  uint4 ch[4];
  act_chunks(q0, q1, sf4, 4 * hh, ch);
  uint4* dst = out_row + kb * 8;  // 8 chunks of 16 bytes per 64-K block
  CUTE_UNROLL
  for (int st = 0; st < 4; ++st) dst[2 * st + hh] = ch[st];
}

// Calls f(idx) for each work item idx < items this thread takes, strided over the grid. The index
// is 32-bit unsigned where the items allow (a 64-bit division is a call of about 90 instructions,
// ahead of each item's loads; below 2^31 items plus a stride under 2^18, which launch_pre_pass
// keeps, it cannot wrap), else 64-bit.
template <class F>
__device__ __forceinline__ void for_items(int64_t items, F&& f) {
  auto loop = [&](auto n) {
    using I = decltype(n);
    for (I idx = I(blockIdx.x) * blockDim.x + threadIdx.x; idx < n; idx += I(gridDim.x) * blockDim.x) f(idx);
  };
  if (items <= INT32_MAX) loop(uint32_t(items));
  else loop(items);
}

// Work item idx of (batch, output row, 64-K block, parity); rows m .. m_pad - 1 of each batch are
// written as zeros.
template <class I>
__device__ __forceinline__ void predecode_row_item(const uint8_t* a, const uint8_t* sfa, uint4* out, int m, int m_pad, int k, I idx) {
  const int kb_n = (k + 63) / 64;
  const I rowp = idx / 2 / I(kb_n);  // batch * m_pad + row
  const I batch = rowp / I(m_pad);
  const int row = int(rowp - batch * I(m_pad)), kb = int((idx / 2) % I(kb_n)), hh = int(idx % 2);
  uint4* const out_row = out + int64_t(rowp) * kb_n * 8;
  if (row >= m) {
    CUTE_UNROLL
    for (int st = 0; st < 4; ++st) out_row[kb * 8 + 2 * st + hh] = make_uint4(0, 0, 0, 0);
    return;
  }
  const int64_t sp = sf_cols_padded(k);
  const uint8_t* sf_rows = sfa + int64_t(batch) * sf_batch_bytes(m, sp) + sf_offset(row / 128 * 128, 0, sp);
  predecode_item(a + (int64_t(batch) * m + row) * (k / 2), sf_rows, row % 128, out_row, kb, hh, k);
}

// One work item per (batch, output row, 64-K block, parity), strided over the grid. Launched
// programmatically behind the previous kernel: nothing is read or written before griddep_wait
// returns; then the GEMM may be scheduled, and it issues its first weights while this runs.
// Static: every translation unit that includes this keeps its own.
static __global__ void __launch_bounds__(kPreThreads)
    predecode_a(const uint8_t* a, const uint8_t* sfa, uint4* out, int m, int m_pad, int k, int l) {
  griddep_wait();
  griddep_launch_dependents();
  for_items(int64_t(l) * m_pad * ((k + 63) / 64) * 2, [&](auto idx) { predecode_row_item(a, sfa, out, m, m_pad, k, idx); });
}

// W4A16: dense 16-bit activations (L, M, K) re-ordered, not decoded, into the same layout: chunk
// (st, hh) of a 64-K block holds, for each group c, the values 16c + 4st + hh and
// 16c + 4st + hh + 2 (act_chunks's order, which the weights' decode8 order matches); K past the end
// is 0. One thread per output chunk o = 2 st + hh, so eight threads write a block's 128 bytes side
// by side. Input word i of a block holds values (2i, 2i + 1): group c's pair for step st is words
// 8c + 2st and 8c + 2st + 1, i.e. 16-byte chunk 2c + st / 2 at words 2 (st % 2) and 2 (st % 2) + 1.
__device__ __forceinline__ void reorder_chunk(const uint16_t* a, uint4* out, int64_t rowb, int64_t rowp, int kb, int o, int k, int kb_n) {
  const bool whole = kb * 64 + 64 <= k;  // else 32 K (K % 32 == 0): groups 2 and 3 are past K
  const uint4* src = reinterpret_cast<const uint4*>(a + rowb * k + kb * 64);
  const int st = o / 2;
  const uint32_t sel = o % 2 ? 0x7632 : 0x5410;
  uint32_t w[4];
  CUTE_UNROLL
  for (int c = 0; c < 4; ++c) {
    const uint4 q = c < 2 || whole ? src[2 * c + st / 2] : make_uint4(0, 0, 0, 0);
    w[c] = st % 2 ? __byte_perm(q.z, q.w, sel) : __byte_perm(q.x, q.y, sel);
  }
  out[(rowp * kb_n + kb) * 8 + o] = make_uint4(w[0], w[1], w[2], w[3]);
}

// One thread per (batch, output row, 64-K block, output chunk), strided over the grid; rows m ..
// m_pad - 1 of each batch zeros; launched like predecode_a. (A thread per whole block, each
// reading and writing 128 bytes alone, was far slower: bench/DESIGN.md §15.)
template <class I>
__device__ __forceinline__ void reorder_row_item(const uint16_t* a, uint4* out, int m, int m_pad, int k, I idx) {
  const int kb_n = (k + 63) / 64;
  const I rowp = idx / 8 / I(kb_n);
  const int kb = int((idx / 8) % I(kb_n)), o = int(idx % 8);
  int64_t rowb = rowp;
  if (m_pad != m) {  // uniform: no division where nothing is padded (bench/DESIGN.md §3)
    const I batch = rowp / I(m_pad);
    const int row = int(rowp - batch * I(m_pad));
    if (row >= m) {
      out[(int64_t(rowp) * kb_n + kb) * 8 + o] = make_uint4(0, 0, 0, 0);
      return;
    }
    rowb = int64_t(batch) * m + row;
  }
  reorder_chunk(a, out, rowb, rowp, kb, o, k, kb_n);
}
__device__ __forceinline__ void reorder_rows(const uint16_t* a, uint4* out, int m, int m_pad, int k, int l) {
  for_items(int64_t(l) * m_pad * ((k + 63) / 64) * 8, [&](auto idx) { reorder_row_item(a, out, m, m_pad, k, idx); });
}
static __global__ void __launch_bounds__(kPreThreads) reorder_a(const uint16_t* a, uint4* out, int m, int m_pad, int k, int l) {
  griddep_wait();
  griddep_launch_dependents();
  reorder_rows(a, out, m, m_pad, k, l);
}

// ---- host side: the pre-pass launches the dense and grouped adapters share ----

// Raises a pre-pass kernel's shared-memory reservation (in the adapters' SmemLimitOnce).
template <class Kernel>
cudaError_t reserve_pre_pass_smem(Kernel kernel) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kPreSmem);
}

// A pre-pass of `items` work items: programmatic, one CTA per SM at most (the reserved shared
// memory keeps two off one SM and off an SM a GEMM CTA holds). CTAs of half the launch bound
// while that still gives every item a thread: the decode spreads over twice the SMs, each
// storing half as much (bench/DESIGN.md §3).
template <auto Kernel, class... Args>
cudaError_t launch_pre_pass(int64_t items, int sm_count, cudaStream_t stream, Args... args) {
  // At most kMaxPreCtas CTAs, whatever SM count the caller passed: for_items' stride stays under
  // 2^18.
  constexpr int64_t kMaxPreCtas = 255;
  const int threads = items <= int64_t(kPreThreads / 2) * sm_count ? kPreThreads / 2 : kPreThreads;
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>({(items + threads - 1) / threads, int64_t(sm_count), kMaxPreCtas}));
  const KernelLaunch launch(dim3(unsigned(blocks)), threads, 1, kPreSmem, stream, true);
  return launch_kernel<Kernel>(launch, args...);
}

// The dense activations' re-order (W4A16) of l batches of m rows into `out`, m_pad rows a batch.
inline cudaError_t launch_reorder_a(const void* a, void* out, int m, int m_pad, int k, int l, int sm_count, cudaStream_t stream) {
  return launch_pre_pass<reorder_a>(int64_t(l) * m_pad * ((k + 63) / 64) * 8, sm_count, stream, static_cast<const uint16_t*>(a),
                         static_cast<uint4*>(out), m, m_pad, k, l);
}

}  // namespace bsg::sm90
