#include "kernels/cuda/fp8.h"

#include <cuda_fp8.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/device_utils.cuh"

namespace paged::cuda {

namespace {

constexpr int kThreads = 256;

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
  quantize_own_chunks(absmax, scratch, in, cols, out, scale + row);
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
  for (int i = 0; i < 8; ++i) f[i] = scale_fp8_element(f[i], sx, w_scale[c + i], b[i]);
  store_bf16x8(out, float_to_bf16x8(f));
}

// grid: (tokens); block: kThreads; dynamic shared memory: inter bf16. Row t of the gated MLP's FP8 product: its gate
// and up halves scaled as scale_fp8_product does (no bias) and rounded to bf16, act(gate) * up rounded to bf16 (as
// act_and_mul) into shared memory, then that row quantised as quantize_rows_fp8 does: the three passes in one, each
// value the same bits, and the bf16 row never written to global memory. Each thread reads back only the chunks it
// wrote. x_scale[t] is read before scale[t] is written (they may alias).
template <GateActivation kAct>
__global__ void __launch_bounds__(kThreads)
    act_and_mul_fp8_kernel(uint8_t* __restrict__ q, float* scale, const bf16* __restrict__ gate_up,
                           const float* x_scale, const float* __restrict__ w_scale, int inter) {
  extern __shared__ __align__(16) unsigned char row_bytes[];
  bf16* row = reinterpret_cast<bf16*>(row_bytes);
  __shared__ float scratch[kThreads / 32];
  const int64_t t = blockIdx.x;
  const bf16* in = gate_up + t * 2 * inter;
  const float sx = x_scale[t];
  float absmax = 0.f;
  for (int c = threadIdx.x * 8; c < inter; c += kThreads * 8) {
    // The product rows are read once (load_streaming): they must not push the weight scales out of L1.
    float g[8], u[8], wg[8], wu[8];
    bf16x8_to_float(load_streaming_bf16x8(in + c), g);
    bf16x8_to_float(load_streaming_bf16x8(in + inter + c), u);
    load_float8(w_scale + c, wg);
    load_float8(w_scale + inter + c, wu);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      g[i] = round_bf16(scale_fp8_element(g[i], sx, wg[i], 0.f));
      u[i] = round_bf16(scale_fp8_element(u[i], sx, wu[i], 0.f));
      g[i] = gate_times_up<kAct>(g[i], u[i]);
    }
    const Bf16x8 rounded = float_to_bf16x8(g);
    store_bf16x8(row + c, rounded);
    bf16x8_to_float(rounded, g);
#pragma unroll
    for (int i = 0; i < 8; ++i) absmax = fmaxf(absmax, fabsf(g[i]));
  }
  quantize_own_chunks(absmax, scratch, row, inter, q + t * inter, scale + t);
}

// The most shared memory a block may ask for on sm_90 (227 KB): act_and_mul_fp8's bound on inter.
constexpr int kMaxDynamicShared = 227 * 1024;

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

cudaError_t act_and_mul_fp8(uint8_t* q, float* scale, const bf16* gate_up, const float* x_scale, const float* w_scale,
                           int tokens, int inter, bool gelu_tanh, cudaStream_t stream) {
  const int64_t row_bytes = int64_t{inter} * sizeof(bf16);
  if (inter <= 0 || inter % 8 != 0 || row_bytes > kMaxDynamicShared ||
      reinterpret_cast<uintptr_t>(gate_up) % 16 != 0 || reinterpret_cast<uintptr_t>(w_scale) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(q) % 8 != 0)
    return launch_failure(cudaErrorInvalidValue, "act_and_mul_fp8: inter " + std::to_string(inter) +
                                                     " must be a positive multiple of 8 of at most " +
                                                     std::to_string(kMaxDynamicShared / sizeof(bf16)) +
                                                     ", gate_up and w_scale 16- and q 8-byte aligned");
  if (!scale || !x_scale || !w_scale)
    return launch_failure(cudaErrorInvalidValue, "act_and_mul_fp8: the scale vectors are needed");
  if (tokens <= 0) return cudaSuccess;
  // Shared memory for four blocks an SM, the rest L1: every row reads all 2 * inter weight scales (114 KB for the
  // Llama-3-8B MLP), which stay in L1 only when the blocks leave room (eight blocks of 28 KB did not).
  const int carveout = static_cast<int>(std::min<int64_t>(100, (4 * (row_bytes + 1024) * 100 + kMaxDynamicShared - 1) /
                                                                   kMaxDynamicShared));
  const auto launch = [&](auto kernel) {
    if (row_bytes > 48 * 1024) {
      const cudaError_t e =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(row_bytes));
      if (e != cudaSuccess) return e;
    }
    if (const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, carveout);
        e != cudaSuccess)
      return e;
    kernel<<<tokens, kThreads, row_bytes, stream>>>(q, scale, gate_up, x_scale, w_scale, inter);
    return cudaGetLastError();
  };
  return gelu_tanh ? launch(act_and_mul_fp8_kernel<GateActivation::kGeluTanh>)
                   : launch(act_and_mul_fp8_kernel<GateActivation::kSilu>);
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
