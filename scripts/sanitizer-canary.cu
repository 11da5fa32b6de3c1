// Planted defects for `run.sh sanitize`: each compute-sanitizer tool must report its own before
// its "0 errors" over the crate's kernels is believed (under gVisor, for one, the tools see
// nothing and still print a clean summary).
//   sanitizer-canary oob | race | sync
#include <cstdio>
#include <cstring>
#include <cuda_runtime.h>

__global__ void oob(int* p, int n) { p[n + threadIdx.x] = 1; }  // past the allocation's end

__global__ void race(int* out) {
  __shared__ int s[64];
  s[threadIdx.x] = threadIdx.x;
  // No barrier: warp 0 reads what warp 1 writes.
  out[threadIdx.x] = static_cast<volatile int*>(s)[63 - threadIdx.x];
}

__global__ void divergent_barrier(int* out) {
  if (threadIdx.x < 16) __syncthreads();  // half a warp at a block barrier
  out[threadIdx.x] = threadIdx.x;
}

int main(int argc, char** argv) {
  const char* what = argc > 1 ? argv[1] : "";
  int* p = nullptr;
  if (cudaMalloc(&p, 256 * sizeof(int)) != cudaSuccess) return 2;
  if (!strcmp(what, "oob")) oob<<<1, 32>>>(p, 256);
  else if (!strcmp(what, "race")) race<<<1, 64>>>(p);
  else if (!strcmp(what, "sync")) divergent_barrier<<<1, 64>>>(p);
  else { fprintf(stderr, "usage: sanitizer-canary oob|race|sync\n"); return 2; }
  printf("%s: %s\n", what, cudaGetErrorString(cudaDeviceSynchronize()));
  return 0;
}
