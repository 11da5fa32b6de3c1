// Host adapter of the quantizer (quantize.cuh): picks the input type, launches the amax pass
// when the global scale is to be computed, then the quantizer, on the caller's stream. Rust has
// checked every argument (shape, lengths, alignment, device); launches return their own error,
// so a stale error another library left on the thread is not reported as ours.
#include <cuda_runtime.h>

#include <algorithm>

#include "blockscaled_gemm/kernel_abi.h"
#include "quant/quantize.cuh"

namespace {

// The limits Rust applies first (src/matrix.rs check_quantizer_dims, src/quantize.rs), repeated
// so that no call through this entry point counts past the kernels' 32-bit rows and grid: with
// them a row plus the grid's stride, the MoE form's padded scale rows and the decode's rows stay
// in int. Also the argument combinations the kernels do not have.
static_assert(bsg::moe_sf_rows(BSG_QUANT_MAX_ROWS, BSG_MAX_GROUPS) <= INT32_MAX, "the MoE form's padded scale rows are int");
bool can_quantize(const bsg::QuantizeArgs& a) {
  const bool swiglu = a.transform == bsg::QuantTransform::SwigluHalves, moe = a.offsets != 0, decoded = a.decoded != 0;
  if (a.transform != bsg::QuantTransform::None && !swiglu) return false;
  if (a.m < 1 || a.m > BSG_QUANT_MAX_ROWS || a.l < 1 || a.l > BSG_QUANT_MAX_BATCH) return false;
  if (a.k < 16 || a.k % 16 != 0 || (swiglu && a.k > INT32_MAX / 2)) return false;
  if (a.x == 0 || a.codes == 0 || a.scales == 0) return false;
  if (swiglu && a.amax_slot != 0) return false;  // given scales only
  if (moe && (a.l != 1 || a.experts < 1 || a.experts > BSG_MAX_GROUPS)) return false;
  if (decoded && (moe || a.amax_slot != 0 || a.decoded_rows < a.m || a.decoded_rows > BSG_QUANT_MAX_ROWS + 128)) return false;
  return true;
}

template <class T>
bsg::KernelStatus run(const bsg::QuantizeArgs& a) {
  const auto stream = reinterpret_cast<cudaStream_t>(a.stream);
  const T* x = reinterpret_cast<const T*>(a.x);
  auto* codes = reinterpret_cast<uint8_t*>(a.codes);
  auto* scales = reinterpret_cast<uint8_t*>(a.scales);
  auto* amax = reinterpret_cast<uint32_t*>(a.amax_slot);
  bsg::KernelStatus st{0, 0, 0};
  const bool swiglu = a.transform == bsg::QuantTransform::SwigluHalves, moe = a.offsets != 0, decoded = a.decoded != 0;
  if (amax) {
    if (cudaError_t e = cudaMemsetAsync(amax, 0, sizeof(uint32_t), stream)) {
      st.cuda_error = e;
      return st;
    }
    const int64_t n = int64_t(a.l) * a.m * a.k;
    const int blocks = int(std::min<int64_t>((n / 16 + 255) / 256, 4 * 1024));
    const T* xa = x;
    int64_t na = n;
    uint32_t* slot = amax;
    void* args[] = {&xa, &na, &slot};
    if (cudaError_t e = cudaLaunchKernel(reinterpret_cast<const void*>(&bsg::quant::amax_kernel<T>), dim3(blocks), dim3(256), args, 0, stream)) {
      st.cuda_error = e;
      return st;
    }
  }
  // Row groups of kWarps rows, kRowsPerWarp rows a warp (SwiGLU: one) where that still leaves
  // about 1024 blocks (below, a row a warp), as many as the grid's y takes (warps stride over the rest); the
  // MoE form's blocks each build the expert table first, so about 2048 blocks in all there.
  const int64_t rows = moe ? a.m : std::max<int64_t>((int64_t(a.m) + 127) / 128 * 128, decoded ? a.decoded_rows : 0);
  const int64_t col_blocks = (bsg::sf_cols_padded(a.k) + 31) / 32;
  constexpr int64_t kW = bsg::quant::kWarps;
  const int64_t kR = swiglu ? 1 : bsg::quant::kRowsPerWarp;
  const int64_t spread = std::max((rows + kW * kR - 1) / (kW * kR), std::min((rows + kW - 1) / kW, (1024 + col_blocks - 1) / col_blocks));
  const int64_t groups = std::min<int64_t>({spread, 65535, moe ? (2048 + col_blocks - 1) / col_blocks : 65535});
  const dim3 grid(unsigned(col_blocks), unsigned(std::max<int64_t>(groups, 1)), unsigned(a.l));
  int m = a.m, k = a.k, experts = a.experts, decoded_rows = a.decoded_rows;
  float g = a.global_scale;
  const uint32_t* slot = amax;
  const int32_t* offsets = reinterpret_cast<const int32_t*>(a.offsets);
  auto* dec = reinterpret_cast<uint4*>(a.decoded);
  void* args[] = {&x, &codes, &scales, &m, &k, &g, &slot, &offsets, &experts, &dec, &decoded_rows};
  using bsg::quant::DenseScales, bsg::quant::MoeScales, bsg::quant::Identity, bsg::quant::SwigluHalves, bsg::quant::WithDecoded, bsg::quant::quantize_kernel;
  const void* const kernels[3][2] = {
      {reinterpret_cast<const void*>(&quantize_kernel<T, DenseScales, Identity>), reinterpret_cast<const void*>(&quantize_kernel<T, DenseScales, SwigluHalves>)},
      {reinterpret_cast<const void*>(&quantize_kernel<T, MoeScales, Identity>), reinterpret_cast<const void*>(&quantize_kernel<T, MoeScales, SwigluHalves>)},
      {reinterpret_cast<const void*>(&quantize_kernel<T, DenseScales, Identity, WithDecoded>),
       reinterpret_cast<const void*>(&quantize_kernel<T, DenseScales, SwigluHalves, WithDecoded>)}};
  const void* kernel = kernels[decoded ? 2 : moe][swiglu];
  if (moe) {
    // The scale rows the experts' blocks can reach zeroed in stream order (the padding of each
    // expert's blocks); the kernel writes the experts' rows. Only experts with rows have blocks,
    // at most min(E, T) of them, so at most T + 127 min(E, T) rows: at decode sizes a few of the
    // buffer's T + 127 E (zeroing all of it took most of the time: bench/DESIGN.md section 13).
    const size_t rows = size_t(bsg::moe_used_sf_rows(a.m, a.experts));
    if (cudaError_t e = cudaMemsetAsync(scales, 0, rows * size_t(bsg::sf_cols_padded(a.k)), stream)) {
      st.cuda_error = e;
      return st;
    }
  }
  st.cuda_error = cudaLaunchKernel(kernel, grid, dim3(bsg::quant::kThreads), args, 0, stream);
  return st;
}

}  // namespace

// Checked by Rust: lengths (batch * rows * cols bytes in, the tiled layout's bytes out), sizes
// within int64.
bsg::KernelStatus bsg_tile_scales(const uint8_t* src, uint8_t* dst, int32_t rows, int32_t cols, int32_t batch, uint64_t stream) {
  const int64_t sp = (int64_t(cols) + 3) / 4 * 4;
  const int64_t per = (int64_t(rows) + 127) / 128 * 128 * sp / 4, words = per * batch;
  const int blocks = int(std::min<int64_t>((words + 255) / 256, 8 * 1024));
  auto* out = reinterpret_cast<uint32_t*>(dst);
  int r = rows, c = cols;
  int64_t p = per, w = words;
  void* args[] = {&src, &out, &r, &c, &p, &w};
  bsg::KernelStatus st{0, 0, 0};
  st.cuda_error = cudaLaunchKernel(reinterpret_cast<const void*>(&bsg::quant::tile_scales_kernel), dim3(std::max(blocks, 1)), dim3(256), args, 0,
                                   reinterpret_cast<cudaStream_t>(stream));
  return st;
}

// Checked by Rust: K a multiple of 32, lengths (the standard layout's batch * rows * K / 2 bytes,
// the prepacked one's batch * ceil(K / 256) * rows * 128), 16-byte alignment, sizes within int64.
bsg::KernelStatus bsg_prepack_values(const uint8_t* src, uint8_t* dst, int32_t rows, int32_t k, int32_t batch, bool unpack,
                                     uint64_t stream) {
  const int row_units = k / 32;
  const int chunks = int((int64_t(k) / 2 + BSG_PREPACK_CHUNK_BYTES - 1) / BSG_PREPACK_CHUNK_BYTES);
  const int64_t units = int64_t(batch) * rows * (unpack ? row_units : chunks * (BSG_PREPACK_CHUNK_BYTES / 16));
  const int blocks = int(std::min<int64_t>((units + 255) / 256, 8 * 1024));
  const auto* in = reinterpret_cast<const uint4*>(src);
  auto* out = reinterpret_cast<uint4*>(dst);
  int r = rows, u = row_units, c = chunks;
  int64_t n = units;
  void* args[] = {&in, &out, &r, &u, &c, &n};
  const void* kernel = unpack ? reinterpret_cast<const void*>(&bsg::quant::prepack_values_kernel<bsg::quant::Unpack>)
                              : reinterpret_cast<const void*>(&bsg::quant::prepack_values_kernel<bsg::quant::Prepack>);
  bsg::KernelStatus st{0, 0, 0};
  st.cuda_error = cudaLaunchKernel(kernel, dim3(std::max(blocks, 1)), dim3(256), args, 0, reinterpret_cast<cudaStream_t>(stream));
  return st;
}

bsg::KernelStatus bsg_quantize(const bsg::QuantizeArgs& a) {
  if (!can_quantize(a)) return bsg::KernelStatus{BSG_STATUS_INVALID_PROBLEM, 0, 0};
  switch (a.input) {
    case bsg::InKind::F32: return run<float>(a);
    case bsg::InKind::F16: return run<__half>(a);
    case bsg::InKind::Bf16: return run<__nv_bfloat16>(a);
  }
  return bsg::KernelStatus{BSG_STATUS_INVALID_PROBLEM, 0, 0};
}
