// Plain C++ interface between the nvcc-built kernel translation units and the cxx bridge.
// No CUTLASS or CUDA headers here: the bridge is compiled by the host C++ compiler.
#pragma once
#include <cstddef>
#include <cstdint>

namespace bsg {

// One launch, already validated by Rust (shapes, lengths, alignment, architecture).
struct KernelArgs {
  int32_t m, n, k, l;
  const void* a;    // packed e2m1, (L, M, K/2) bytes, K-major
  const void* sfa;  // ue4m3 scales, 128x4 tiled layout
  const void* b;    // packed e2m1, (L, N, K/2) bytes, K-major
  const void* sfb;
  const void* c;    // (L, M, N) row-major, D's type (f32 for FP4 output); d itself when beta == 0
  void* d;          // (L, M, N) row-major; FP4 output: packed e2m1, two per byte
  float alpha, beta;
  void* workspace;
  size_t workspace_bytes;
  void* stream;     // cudaStream_t / CUstream
  int32_t device_id;
  int32_t sm_count;
  int32_t split_k;  // K ranges reduced in the workspace (SM90 kernels; 1 for CUTLASS SM100)
  // FP4 output only (null otherwise): the generated scale factors, one per 16 outputs along N in
  // the 128x4 tiled layout over (M, N/16), and a device pointer to the normalization constant.
  void* sfd;
  const float* norm_constant;
};

// Output tag of the table (cpp/configs.def): D in e2m1 with generated scale factors of type Sf
// (cutlass::float_ue4m3_t: NVFP4; cutlass::float_ue8m0_t: CUTLASS example 72b).
template <class Sf>
struct Fp4Out {};

// CUTLASS status (cutlass::Status as int) and CUDA runtime error (cudaError_t as int).
struct KernelStatus {
  int32_t cutlass_status;
  int32_t cuda_error;
};

// Which scale-factor operand a layout query is about.
enum class SfOperand : int32_t { A = 0, B = 1 };

// Entry points one instantiation exports; the bridge holds a table of these.
struct KernelEntry {
  KernelStatus (*run)(const KernelArgs&);
  size_t (*workspace_size)(const KernelArgs&);
  bool (*can_implement)(const KernelArgs&);
  // Offsets CUTLASS's host-side SF layout gives for every (row, k/16, batch) of the problem,
  // row-fastest within k within batch; returns the layout's cosize (bytes of one buffer), or -1
  // when `len` does not equal rows * (k/16) * l.
  int64_t (*sf_offsets)(int32_t m, int32_t n, int32_t k, int32_t l, SfOperand which, int64_t* out,
                        size_t len);
};

}  // namespace bsg

// Names for status codes (cpp/status.cu).
const char* bsg_cutlass_status_name(int32_t code);
const char* bsg_cuda_error_name(int32_t code);
