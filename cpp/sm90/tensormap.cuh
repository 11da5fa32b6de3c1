// TMA descriptors made on the device (the list-form grouped GEMM, whose operand addresses and
// sizes live in device arrays): a descriptor the host encoded with the right element type, box
// and swizzle is copied into global memory and its address, sizes and strides replaced there
// (PTX tensormap.replace, as CUTLASS's pointer-array kernels do in
// cute/arch/copy_sm90_desc.hpp); the writer then releases it to the tensor-map proxy and the
// thread that issues loads through it acquires it before the first one.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "blockscaled_gemm/kernel_abi.h"

// tensormap.replace takes global strides in bytes from nvcc 12.5 (before, in 16-byte units).
#if defined(__CUDACC_VER_MAJOR__) && (__CUDACC_VER_MAJOR__ < 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ < 5))
#error "cpp/sm90/tensormap.cuh needs nvcc 12.5 or later"
#endif

namespace bsg::sm90 {

// `tmpl` copied to `dst` with its address replaced; returns dst as the replace instructions take it.
__device__ __forceinline__ uint64_t copy_tensormap(CUtensorMap* dst, const CUtensorMap& tmpl, const void* addr) {
  const uint4* src = reinterpret_cast<const uint4*>(&tmpl);
  uint4* out = reinterpret_cast<uint4*>(dst);
  for (int i = 0; i < int(sizeof(CUtensorMap) / 16); ++i) out[i] = src[i];
  const uint64_t d = reinterpret_cast<uint64_t>(dst);
  asm volatile("tensormap.replace.tile.global_address.global.b1024.b64 [%0], %1;" ::"l"(d), "l"(reinterpret_cast<uint64_t>(addr)) : "memory");
  return d;
}

// One thread: `dst` (64-byte aligned, global) becomes `tmpl` (encoded over (any, any, 1)) over
// (dim0, dim1, 1) at `addr` (16-byte aligned) with rows of `row_bytes` bytes (a multiple of 16).
// Ends with the release fence.
__device__ __forceinline__ void make_tensormap(CUtensorMap* dst, const CUtensorMap& tmpl, const void* addr, uint32_t dim0, uint32_t dim1,
                                               uint64_t row_bytes) {
  const uint64_t d = copy_tensormap(dst, tmpl, addr);
  asm volatile("tensormap.replace.tile.global_dim.global.b1024.b32 [%0], 0, %1;" ::"l"(d), "r"(dim0) : "memory");
  asm volatile("tensormap.replace.tile.global_dim.global.b1024.b32 [%0], 1, %1;" ::"l"(d), "r"(dim1) : "memory");
  // Dimension 1's stride in bytes (nvcc 12.5 on: the full value). The template's third
  // dimension is 1 already, so its stride is never applied.
  asm volatile("tensormap.replace.tile.global_stride.global.b1024.b64 [%0], 0, %1;" ::"l"(d), "l"(row_bytes) : "memory");
  asm volatile("fence.proxy.tensormap::generic.release.gpu;" ::: "memory");
}

// One thread: `dst` becomes the weights' map `tmpl` (Gemm::encode_b's, rank 4, batch 1) over n
// rows of k values at `addr`: standard (one chunk of k / 2 bytes a row) or prepacked (chunks of
// BSG_PREPACK_CHUNK_BYTES). Ends with the release fence.
__device__ __forceinline__ void make_tensormap_b(CUtensorMap* dst, const CUtensorMap& tmpl, const void* addr, int k, int n, bool prepacked) {
  const uint64_t row_bytes = uint64_t(k) / 2, chunk = prepacked ? BSG_PREPACK_CHUNK_BYTES : row_bytes;
  const uint32_t chunks = uint32_t((row_bytes + chunk - 1) / chunk);
  const uint64_t d = copy_tensormap(dst, tmpl, addr);
  asm volatile("tensormap.replace.tile.global_dim.global.b1024.b32 [%0], 0, %1;" ::"l"(d), "r"(uint32_t(chunk)) : "memory");
  asm volatile("tensormap.replace.tile.global_dim.global.b1024.b32 [%0], 1, %1;" ::"l"(d), "r"(uint32_t(n)) : "memory");
  asm volatile("tensormap.replace.tile.global_dim.global.b1024.b32 [%0], 2, %1;" ::"l"(d), "r"(chunks) : "memory");
  // Strides in bytes of dimensions 1 (rows: one chunk; standard, the chunk is the row) and 2
  // (chunks); the batch dimension is 1.
  asm volatile("tensormap.replace.tile.global_stride.global.b1024.b64 [%0], 0, %1;" ::"l"(d), "l"(chunk) : "memory");
  asm volatile("tensormap.replace.tile.global_stride.global.b1024.b64 [%0], 1, %1;" ::"l"(d), "l"(chunk * uint64_t(n)) : "memory");
  asm volatile("fence.proxy.tensormap::generic.release.gpu;" ::: "memory");
}

// The issuing thread, before its first load through a descriptor another grid made.
__device__ __forceinline__ void acquire_tensormap(const CUtensorMap* map) {
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

}  // namespace bsg::sm90
