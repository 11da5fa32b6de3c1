// The decoded-activation layout that the SM90 tiles of MainloopSwappedRegisterDecode read (kPreA):
// A's codes times their scales as FP16, (L, rows, K rounded up to 64) halves, each 64-K block of
// a row as 8 chunks of 16 bytes, chunk 2 st + hh holding MMA step st's K positions for thread
// parity hh (sm90/predecode.cuh's act_chunks, mainloop_swapped.cuh says why this order). Two
// kernels write it and must agree bit for bit: the GEMM's pre-pass (sm90/predecode.cuh) and the
// quantizer beside its codes (quant/quantize.cuh); both build it from act_group.
#pragma once

#include <cstdint>

#include "common/nvfp4.cuh"
#include "cute/config.hpp"

namespace bsg {

// One scale group's part of a 64-K block for thread parity hh = shift / 4: its 16 values' packed
// words w (values 0-7, 8-15), times sc (its decode8_scales scale in both halves), as the pairs
// (4 st + hh, 4 st + hh + 2) that MMA step st's chunk holds for the group: the word at st.
__device__ __forceinline__ void act_group(uint2 w, uint32_t sc, int shift, uint32_t (&st)[4]) {
  CUTE_UNROLL
  for (int wd = 0; wd < 2; ++wd) {
    const uint32_t e = e2m1_lo_to_e4m3((wd ? w.y : w.x) >> shift);  // this parity's values
    st[2 * wd] = hmul2(e4m3x2_to_f16x2(e), sc);
    st[2 * wd + 1] = hmul2(e4m3x2_hi_to_f16x2(e), sc);
  }
}

// act_group's scale operand of one ue4m3 scale (the low byte of sf).
__device__ __forceinline__ uint32_t act_group_scale(uint32_t sf) {
  const uint32_t s = decode8_scales(e4m3x2_to_f16x2(sf));
  return __byte_perm(s, s, 0x1010);
}

// Scale group `group` of a row (its 16 codes, packed as the quantizer stores them, and its
// ue4m3 scale) into that row's decoded output at out_row: word group % 4 of the 8 chunks of 64-K
// block group / 4, both parities.
__device__ __forceinline__ void store_decoded_group(uint4* out_row, int group, uint2 packed, uint32_t sf) {
  const uint32_t sc = act_group_scale(sf);
  uint32_t* const block = reinterpret_cast<uint32_t*>(out_row + (group / 4) * 8) + group % 4;
  CUTE_UNROLL
  for (int hh = 0; hh < 2; ++hh) {
    uint32_t st[4];
    act_group(packed, sc, 4 * hh, st);
    CUTE_UNROLL
    for (int s = 0; s < 4; ++s) block[(2 * s + hh) * 4] = st[s];
  }
}

}  // namespace bsg
