#include "kernels/cuda/fp8.h"

#include <cuda_fp8.h>

#include <string>

#include "kernels/cuda/device_utils.cuh"

namespace paged::cuda {

namespace {

constexpr int kThreads = 256;
constexpr float kFp8Max = 448.0f;

// grid: (rows); block: kThreads. A row's absmax over the block, then every element scaled and rounded.
__global__ void __launch_bounds__(kThreads)
    quantize_rows_fp8_kernel(const bf16* __restrict__ x, int cols, uint8_t* __restrict__ q,
                             float* __restrict__ scale) {
  __shared__ float scratch[kThreads / 32];
  const int64_t row = blockIdx.x;
  const bf16* in = x + row * cols;
  uint8_t* out = q + row * cols;
  float absmax = 0.f;
  for (int c = threadIdx.x * 8; c < cols; c += kThreads * 8) {
    float f[8];
    bf16x8_to_float(load_bf16x8(in + c), f);
#pragma unroll
    for (int i = 0; i < 8; ++i) absmax = fmaxf(absmax, fabsf(f[i]));
  }
  absmax = warp_max(absmax);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = absmax;
  __syncthreads();
  absmax = 0.f;
  for (int w = 0; w < kThreads / 32; ++w) absmax = fmaxf(absmax, scratch[w]);
  // IEEE divisions (not the fast reciprocal): the CPU twin computes the same two numbers.
  const float inv = absmax > 0.f ? __fdiv_rn(kFp8Max, absmax) : 1.f;
  if (threadIdx.x == 0) scale[row] = absmax > 0.f ? __fdiv_rn(absmax, kFp8Max) : 1.f;
  for (int c = threadIdx.x * 8; c < cols; c += kThreads * 8) {
    float f[8];
    bf16x8_to_float(load_bf16x8(in + c), f);
    uint2 packed;
    uint8_t* b = reinterpret_cast<uint8_t*>(&packed);
#pragma unroll
    for (int i = 0; i < 8; ++i) b[i] = __nv_cvt_float_to_fp8(f[i] * inv, __NV_SATFINITE, __NV_E4M3);
    *reinterpret_cast<uint2*>(out + c) = packed;
  }
}

// grid: (ceil(n / (8 * kThreads)), m); block: kThreads; 8 columns a thread.
__global__ void __launch_bounds__(kThreads)
    scale_fp8_product_kernel(bf16* __restrict__ y, const float* __restrict__ x_scale,
                             const float* __restrict__ w_scale, const bf16* __restrict__ bias, int n) {
  const int64_t row = blockIdx.y;
  const int c = (blockIdx.x * kThreads + threadIdx.x) * 8;
  if (c >= n) return;
  bf16* out = y + row * n + c;
  float f[8];
  bf16x8_to_float(load_bf16x8(out), f);
  const float sx = x_scale[row];
  float b[8] = {};
  if (bias) bf16x8_to_float(load_bf16x8(bias + c), b);
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = f[i] * sx * w_scale[c + i] + b[i];
  store_bf16x8(out, float_to_bf16x8(f));
}

}  // namespace

cudaError_t scale_fp8_product(bf16* y, const float* x_scale, const float* w_scale, const bf16* bias, int m, int n,
                              cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  if (n <= 0 || n % 8 != 0 || reinterpret_cast<uintptr_t>(y) % 16 != 0 ||
      (bias && reinterpret_cast<uintptr_t>(bias) % 16 != 0))
    return launch_failure(cudaErrorInvalidValue, "scale_fp8_product: n " + std::to_string(n) +
                                                     " must be a positive multiple of 8, y and bias 16-byte aligned");
  const dim3 grid((n + 8 * kThreads - 1) / (8 * kThreads), m);
  scale_fp8_product_kernel<<<grid, kThreads, 0, stream>>>(y, x_scale, w_scale, bias, n);
  return cudaGetLastError();
}

cudaError_t quantize_rows_fp8(const bf16* x, int64_t rows, int cols, uint8_t* q, float* scale, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (cols <= 0 || cols % 8 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(q) % 8 != 0)
    return launch_failure(cudaErrorInvalidValue, "quantize_rows_fp8: cols " + std::to_string(cols) +
                                                     " must be a positive multiple of 8, x 16- and q 8-byte aligned");
  quantize_rows_fp8_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, cols, q, scale);
  return cudaGetLastError();
}

}  // namespace paged::cuda
