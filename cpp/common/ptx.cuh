// PTX wrappers the SM90 parts share: bulk and tensor copies into shared memory, distributed
// shared memory, the GMMA 128-byte swizzle on byte addresses, mma.sync, programmatic launch.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "cutlass/numeric_types.h"

namespace bsg {

// 3-D tensor tile (k byte, row, batch) into shared memory, completing on an mbarrier (TMA).
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
// 4-D tensor tile (k byte in its chunk, row, chunk, batch): the weights' map, over K-chunks of the
// prepacked layout or (one chunk of the whole row) the standard one.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, int c3, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
// Contiguous bytes into shared memory, completing on an mbarrier.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst), "l"(src),
               "r"(bytes), "r"(bar)
               : "memory");
}

// L2 prefetches of a 4-D tensor tile and of contiguous bytes: hints that move no data into the SM.
// L2 is the GPU's point of coherence, so a later load still reads what the previous kernel wrote,
// and a prefetch may be issued before griddepcontrol.wait.
__device__ __forceinline__ void tma_prefetch_l2_4d(const CUtensorMap* map, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global.tile [%0, {%1, %2, %3, %4}];\n" ::"l"(reinterpret_cast<uint64_t>(map)), "r"(c0),
               "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}

// Address of the same shared-memory location in the CTA of rank `rank` of this cluster.
__device__ __forceinline__ uint32_t peer_smem(const void* local, uint32_t rank) {
  uint32_t out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(static_cast<uint32_t>(__cvta_generic_to_shared(local))), "r"(rank));
  return out;
}
__device__ __forceinline__ float4 ld_peer(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr) : "memory");
  return v;
}

// Byte offset of the 16-byte chunk `chunk` (8 halves, 0..7) of row `row` in a K-major FP16 tile of
// 64-half rows with the GMMA 128-byte swizzle (8-row, 1024-byte atoms stacked along the rows):
// the layout of GMMA::Layout_K_SW128_Atom tiled by tile_to_shape, on byte addresses.
__device__ __forceinline__ uint32_t sw128_offset(int row, int chunk) {
  return uint32_t((row >> 3) * 1024 + (row & 7) * 128 + ((chunk ^ (row & 7)) << 4));
}

// d += A B for one m16n8k16 MMA: A (16 x 16, row-major) and B (16 x 8, column-major) of element
// type E (cutlass::half_t or bfloat16_t) in the registers of the PTX fragment layout, FP32
// accumulators.
template <class E>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  static_assert(std::is_same_v<E, cutlass::half_t> || std::is_same_v<E, cutlass::bfloat16_t>, "FP16 or BF16 operands");
  if constexpr (std::is_same_v<E, cutlass::bfloat16_t>)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Lets the stream's next kernel, if launched programmatically, be scheduled; it waits for this
// grid's completion (griddep_wait) before it touches memory.
__device__ __forceinline__ void griddep_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
// Waits until the grid this one depends on programmatically has completed and its writes are
// visible; a no-op without such a dependency.
__device__ __forceinline__ void griddep_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

}  // namespace bsg
