// Device-side helpers shared by the .cu files of kernels/cuda: 16-byte bf16 vectors, warp reductions, and the one
// switch that turns a runtime head size into a template parameter. CUDA translation units only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/launch.h"

namespace paged::cuda {

constexpr unsigned kFullMask = 0xffffffffu;

// Eight bf16 values: one 16-byte load or store, the unit every kernel here moves memory in.
struct alignas(16) Bf16x8 {
  __nv_bfloat162 h[4];
};

__device__ __forceinline__ void bf16x8_to_float(const Bf16x8& v, float (&f)[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = __bfloat1622float2(v.h[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

__device__ __forceinline__ Bf16x8 float_to_bf16x8(const float (&f)[8]) {
  Bf16x8 v;
#pragma unroll
  for (int i = 0; i < 4; ++i) v.h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return v;
}

__device__ __forceinline__ Bf16x8 load_bf16x8(const bf16* p) { return *reinterpret_cast<const Bf16x8*>(p); }
__device__ __forceinline__ void store_bf16x8(bf16* p, const Bf16x8& v) { *reinterpret_cast<Bf16x8*>(p) = v; }

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFullMask, v, off);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
}

// Sum over all threads of the block; every thread gets the result. `scratch` holds one T per warp; the block size
// is a multiple of 32. Contains two __syncthreads, so every thread of the block must call it.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T total = 0;
  for (int w = 0; w < warps; ++w) total += scratch[w];  // fixed order: every thread gets the same bits
  return total;
}

// Lets the next kernel of the stream start now if it was launched with programmatic dependent launch (the GEMVs of
// gemv.cu are): it prefetches its weights and waits for this grid's results itself (griddepcontrol.wait). A no-op
// for any other successor, which still starts after this grid completes.
__device__ __forceinline__ void allow_dependent_launch() { asm volatile("griddepcontrol.launch_dependents;"); }

inline bool is_supported_block_size(int block_size) {
  for (int b : kSupportedBlockSizes)
    if (b == block_size) return true;
  return false;
}

inline int log2_of(int power_of_two) {
  int l = 0;
  while ((1 << l) < power_of_two) ++l;
  return l;
}

inline cudaError_t unsupported_head_dim(const char* kernel, int head_dim) {
  return launch_failure(cudaErrorInvalidValue, std::string(kernel) + ": head_dim " + std::to_string(head_dim) +
                                                   " is not supported (supported: 64, 128)");
}

}  // namespace paged::cuda

// Runs the statements with HEAD_DIM bound to the compile-time head size; returns the launch failure from the
// enclosing launcher for any other size. The list of cases is kSupportedHeadDims.
#define PAGED_DISPATCH_HEAD_DIM(kernel_name, head_dim, ...)          \
  switch (head_dim) {                                                \
    case 64: {                                                       \
      constexpr int HEAD_DIM = 64;                                   \
      __VA_ARGS__;                                                   \
      break;                                                         \
    }                                                                \
    case 128: {                                                      \
      constexpr int HEAD_DIM = 128;                                  \
      __VA_ARGS__;                                                   \
      break;                                                         \
    }                                                                \
    default:                                                         \
      return ::paged::cuda::unsupported_head_dim(kernel_name, head_dim); \
  }
