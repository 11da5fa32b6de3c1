// Host helpers that need CUDA and CUTLASS headers, kept out of the host-compiled bridge.
#include <cuda_runtime_api.h>

#include "blockscaled_gemm/kernel_abi.h"
#include "cutlass/cutlass.h"

static_assert(BSG_STATUS_SUCCESS == int(cutlass::Status::kSuccess), "kernel_abi.h status values are cutlass::Status's");
static_assert(BSG_STATUS_INVALID_PROBLEM == int(cutlass::Status::kErrorInvalidProblem), "kernel_abi.h status values");
static_assert(BSG_STATUS_WORKSPACE_NULL == int(cutlass::Status::kErrorWorkspaceNull), "kernel_abi.h status values");

const char* bsg_cutlass_status_name(int32_t code) {
  return cutlass::cutlassGetStatusString(static_cast<cutlass::Status>(code));
}

const char* bsg_cuda_error_name(int32_t code) {
  return cudaGetErrorName(static_cast<cudaError_t>(code));
}
