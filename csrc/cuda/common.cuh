// Shared by every CUDA module of streammem-kernels.
//
// Each csrc/cuda/<op>.cu is built by setup.py (nvcc alone: no torch headers)
// into a plain shared library streammem_kernels/_cuda_<op>.so that Python
// loads with ctypes (streammem_kernels/_cuda.py).  The ABI is C: raw device
// pointers, int64 sizes, the caller's cudaStream_t (torch's current stream),
// and a cudaError_t return code.  Launchers never allocate, never synchronise
// and never copy to the host, so every op can be captured in a CUDA graph;
// the Python side allocates outputs with torch on the tensors' device.
//
// Build flags a module needs beyond the defaults are declared on a line of its
// own in the .cu file:   // streammem-nvcc: --fmad=false
// (read by setup.py and tests/test_cuda_compile.py).  Modules whose decisions
// must be identical to the torch reference are built without FMA contraction
// and without fast math (IEEE sqrt and division are nvcc's defaults).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#define STREAMMEM_EXPORT extern "C" __attribute__((visibility("default")))

// Every module exports its own copy (each library is loaded privately).
#define STREAMMEM_CUDA_MODULE_COMMON()                                            \
  STREAMMEM_EXPORT const char* streammem_cuda_error_string(int code) {            \
    return cudaGetErrorString(static_cast<cudaError_t>(code));                    \
  }                                                                               \
  STREAMMEM_EXPORT int streammem_cuda_device_count(int* count) {                  \
    return static_cast<int>(cudaGetDeviceCount(count));                           \
  }

namespace streammem {

// Sum of each of N values over a block of `threads` threads (a multiple of 32);
// thread 0 writes the N totals to `out`.  Fixed order: deterministic.
template <int N, int kThreads>
__device__ void block_sum(float (&vals)[N], float* out) {
  static_assert(kThreads % 32 == 0, "block size must be a multiple of the warp size");
  __shared__ float partial[N][kThreads / 32];
  const int tid = threadIdx.y * blockDim.x + threadIdx.x;
#pragma unroll
  for (int k = 0; k < N; ++k)
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) vals[k] += __shfl_down_sync(0xffffffffu, vals[k], off);
  if ((tid & 31) == 0)
#pragma unroll
    for (int k = 0; k < N; ++k) partial[k][tid >> 5] = vals[k];
  __syncthreads();
  if (tid == 0)
#pragma unroll
    for (int k = 0; k < N; ++k) {
      float t = 0.0f;
      for (int w = 0; w < kThreads / 32; ++w) t += partial[k][w];
      out[k] = t;
    }
}

}  // namespace streammem
