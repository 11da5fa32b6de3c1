// The 128x4-tiled scale-factor layout (cuBLAS / CUTLASS / torch._scaled_mm), one place for the
// kernels and for the host-side agreement test. Per batch, rows are padded to 128 and scale
// columns (one per 16 elements of K, or of N for generated scales) to 4; a 128-row x 4-column
// chunk is 512 contiguous bytes, (row % 32) * 16 + (row % 128 / 32) * 4 + col inside it; chunks
// run along the columns first, then the 128-row blocks.
// int arguments: the kernels' extents are int32 and their index math stays 32-bit where it can.
#pragma once

#include <cstddef>
#include <cstdint>

namespace bsg {

// Offset of (row, scale column) inside one 128-row x 4-column chunk.
__host__ __device__ constexpr int sf_in_chunk(int row, int col) { return (row % 32) * 16 + ((row % 128) / 32) * 4 + col; }

// Scale columns of a K (or N) padded to 4, and the bytes of one batch of `rows` rows.
__host__ __device__ constexpr int64_t sf_cols_padded(int k) { return (k / 16 + 3) / 4 * 4; }
__host__ __device__ constexpr int64_t sf_batch_bytes(int rows, int64_t sp) { return int64_t((rows + 127) / 128) * 128 * sp; }

// Offset of scale (row, col) in one batch whose padded scale-column count is sp.
__host__ __device__ constexpr int64_t sf_offset(int64_t row, int64_t col, int64_t sp) {
  return (row / 128) * (sp / 4) * 512 + (col / 4) * 512 + sf_in_chunk(int(row % 128), int(col % 4));
}

// Every (row, k/16, batch) offset, row-fastest within a column within a batch, into out; returns
// one buffer's bytes, or -1 when len is not rows * (k/16) * l.
inline int64_t sf_offsets_of(int32_t rows, int32_t k, int32_t l, int64_t* out, size_t len) {
  const int64_t cols = k / 16, sp = sf_cols_padded(k), per = sf_batch_bytes(rows, sp);
  if (len != size_t(int64_t(rows) * cols * l)) return -1;
  size_t i = 0;
  for (int64_t b = 0; b < l; ++b)
    for (int64_t s = 0; s < cols; ++s)
      for (int64_t r = 0; r < rows; ++r) out[i++] = b * per + sf_offset(r, s, sp);
  return per * l;
}

}  // namespace bsg
