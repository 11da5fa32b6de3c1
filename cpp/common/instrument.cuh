// Instrumentation for experiments: set through BSG_NVCC_DEFINES (build.rs), e.g.
// BSG_NVCC_DEFINES="BSG_SM90_ABLATE=1" cargo run --release --example bench. Product builds set
// none of them, so all of it compiles to nothing.
//   BSG_SM90_ABLATE: bit 1 skips the decode, 2 the wgmma, 4 the global loads, 8 the split-K
//     partials and reduction (each CTA writes its own partial as D), 16 A's decode only
//     (unswapped tiles), 32 the swapped tiles' pre-pass launch (the GEMM reads whatever the
//     workspace holds): what each stage costs.
//   BSG_SM90_RAW_K: K per raw (packed) stage.
//   BSG_SM90_TIMELINE: thread 0 of every CTA stamps %globaltimer at entry (slot 0), after the
//     first stage (1), after the main loop (2), at exit (3) and in the cluster reduction (5-7),
//     with its SM id in slot 4, into bsg_timeline[cta * 8].
//   BSG_SM90_TRACE: threads 0 and 128 of CTA (0, 0) stamp clock64 at six points of each of the
//     first 64 main-loop turns into bsg_trace[thread / 128][turn][6].
#pragma once

#include <cstdint>

#ifndef BSG_SM90_ABLATE
#define BSG_SM90_ABLATE 0
#endif
#ifndef BSG_SM90_RAW_K
#define BSG_SM90_RAW_K 128
#endif
#ifndef BSG_SM90_TIMELINE
#define BSG_SM90_TIMELINE 0
#endif
#ifndef BSG_SM90_TRACE
#define BSG_SM90_TRACE 0
#endif

namespace bsg {

#if BSG_SM90_TIMELINE
__device__ uint64_t* bsg_timeline;
__device__ __forceinline__ void stamp(int slot) {
  if (threadIdx.x != 0 || bsg_timeline == nullptr) return;
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  uint64_t* row = bsg_timeline + (uint64_t(blockIdx.y) * gridDim.x + blockIdx.x) * 8;
  row[slot] = t;
  if (slot == 0) {
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    row[4] = sm;
  }
}
#else
__device__ __forceinline__ void stamp(int) {}
#endif

}  // namespace bsg

#if BSG_SM90_TRACE
namespace bsg {
__device__ uint64_t* bsg_trace;  // [thread 0, 128][iteration < 64][6]
}
#define BSG_TRACE_INIT                                                                                               \
  uint64_t* trp = (blockIdx.x == 0 && blockIdx.y == 0 && (threadIdx.x == 0 || threadIdx.x == 128)) ? ::bsg::bsg_trace \
                                                                                                   : nullptr;        \
  if (trp) trp += (threadIdx.x / 128) * 64 * 6;
#define BSG_TRACE(i, slot) do { if (trp && (i) < 64) trp[(i) * 6 + (slot)] = clock64(); } while (0)
#else
#define BSG_TRACE_INIT
#define BSG_TRACE(i, slot) do {} while (0)
#endif
