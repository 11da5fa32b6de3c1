// The rows of a mixture-of-experts layer's stacked activations, as the kernels that read them
// agree on: expert e's rows are [row[e], row[e + 1]) where row is the device offsets' running
// maximum clamped to [0, T] (valid offsets as they are; others as disjoint, possibly empty
// ranges inside [0, T]), and its scales start at scale row sf_row[e], the sum over j < e of its
// rows rounded up to 128 (vLLM's layout). Built in shared memory by each CTA that needs it.
#pragma once

#include <cstdint>

#include "blockscaled_gemm/kernel_abi.h"

namespace bsg {

// Warp 0 (lane = its lane): the inclusive prefix sums of f(0), ..., f(n - 1) into out[0..n), each
// lane a contiguous chunk, then across lanes by shuffles. Returns the total (every lane).
template <class F>
__device__ __forceinline__ int warp_inclusive_scan(int lane, int n, F f, int* out) {
  const int per = (n + 31) / 32, e0 = min(lane * per, n), e1 = min(e0 + per, n);
  int sum = 0;
  for (int e = e0; e < e1; ++e) sum += f(e);
  int incl = sum;
  for (int d = 1; d < 32; d *= 2) {
    const int v = __shfl_up_sync(0xffffffffu, incl, d);
    if (lane >= d) incl += v;
  }
  int run = incl - sum;
  for (int e = e0; e < e1; ++e) run += f(e), out[e] = run;
  return __shfl_sync(0xffffffffu, incl, 31);
}

// The first of the n inclusive prefix sums incl[0..n) that exceeds `value` (value < incl[n - 1]):
// the group a work item or row belongs to.
__device__ __forceinline__ int first_exceeding(const int* incl, int n, int value) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (incl[mid] > value) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

// Scale rows of a mixture-of-experts layer's stacked activations whatever the routing: T rows
// over E experts, each expert's rows padded to 128, fit in floor((T + 127 E) / 128) * 128.
__host__ __device__ constexpr int64_t moe_sf_rows(int64_t rows, int64_t experts) { return (rows + 127 * experts) / 128 * 128; }

// The first scale rows that hold every expert's blocks whatever the routing: only experts with
// rows have blocks, at most min(E, T) of them.
__host__ __device__ constexpr int64_t moe_used_sf_rows(int64_t rows, int64_t experts) {
  return moe_sf_rows(rows, experts < rows ? experts : rows);
}

struct MoeRows {
  static constexpr int kMaxGroups = BSG_MAX_GROUPS;
  int row[kMaxGroups + 1];
  int sf_row[kMaxGroups];

  // Every thread of the CTA (offsets: experts + 1 int32, rows: T); ends with a CTA barrier.
  __device__ void prepare(const int32_t* offsets, int experts, int rows, int tid) {
    for (int e = tid; e <= experts; e += blockDim.x) row[e] = min(max(offsets[e], 0), rows);
    __syncthreads();
    if (tid < 32) {
      // Running maximum over row[0..experts]: each lane a chunk, then across lanes.
      const int per = (experts + 1 + 31) / 32, b0 = min(tid * per, experts + 1), b1 = min(b0 + per, experts + 1);
      int mx = 0;
      for (int e = b0; e < b1; ++e) mx = max(mx, row[e]);
      for (int d = 1; d < 32; d *= 2) {
        const int v = __shfl_up_sync(0xffffffffu, mx, d);
        if (tid >= d) mx = max(mx, v);
      }
      int run = __shfl_up_sync(0xffffffffu, mx, 1);
      if (tid == 0) run = 0;
      for (int e = b0; e < b1; ++e) run = max(run, row[e]), row[e] = run;
      __syncwarp();
      // sf_row: the exclusive sums of the padded row counts (inclusive ones, less each).
      warp_inclusive_scan(tid, experts, [&](int e) { return padded(e); }, sf_row);
      __syncwarp();
      for (int e = tid; e < experts; e += 32) sf_row[e] -= padded(e);
    }
    __syncthreads();
  }

  __device__ __forceinline__ int rows_of(int e) const { return row[e + 1] - row[e]; }
  __device__ __forceinline__ int padded(int e) const { return (rows_of(e) + 127) / 128 * 128; }

  // The expert whose rows hold row r, or -1 where none does.
  __device__ __forceinline__ int expert_of_row(int experts, int r) const {
    if (r < row[0] || r >= row[experts]) return -1;
    return first_exceeding(row + 1, experts, r);
  }
};

}  // namespace bsg
