#include "kernels/cuda/lora.h"

#include <string>

#include "kernels/cuda/device_utils.cuh"

namespace paged::cuda {

namespace {

constexpr int kShrinkThreads = 256, kExpandThreads = 256;

// grid: (rows); block: kShrinkThreads. Row t's v[t][r] = scale[r] * (A[r] . x[t]) for its slot's block, a warp per
// rank column; x and A read 8 elements at a time when k allows (rows of 16 bytes). Rows without a slot do nothing.
template <bool kVector>
__global__ void __launch_bounds__(kShrinkThreads)
    lora_shrink_kernel(const bf16* __restrict__ x, float* __restrict__ v, LoraArgs args) {
  const int t = blockIdx.x;
  const int slot = args.row_slot[t];
  if (slot < 0) return;
  const LoraBlock& b = args.block;
  const bf16* a = args.weights + slot * args.slot_weights + b.a;
  const float* scale = args.scales + slot * args.slot_scales + b.scale;
  const bf16* xr = x + static_cast<int64_t>(t) * b.k;
  const int lane = threadIdx.x % 32;
  for (int r = threadIdx.x / 32; r < b.rank; r += kShrinkThreads / 32) {
    const float s = scale[r];
    float sum = 0.f;
    if (s != 0.f) {
      const bf16* ar = a + static_cast<int64_t>(r) * b.k;
      if constexpr (kVector) {
        for (int i = lane * 8; i < b.k; i += 32 * 8) {
          float fa[8], fx[8];
          bf16x8_to_float(load_bf16x8(ar + i), fa);
          bf16x8_to_float(load_bf16x8(xr + i), fx);
#pragma unroll
          for (int j = 0; j < 8; ++j) sum += fa[j] * fx[j];
        }
      } else {
        for (int i = lane; i < b.k; i += 32) sum += __bfloat162float(ar[i]) * __bfloat162float(xr[i]);
      }
      sum = warp_sum(sum);
    }
    if (lane == 0) v[static_cast<int64_t>(t) * b.rank + r] = s * sum;
  }
}

// grid: (rows, ceil(n / kExpandThreads)); block: kExpandThreads. Row t's y[t][i] += sum_r B^T[r][i] v[t][r] for its
// slot's block (a thread per output column, B^T's rows read across the threads), rounded to bf16 once; rank columns
// with v 0 are skipped (the same for every thread of the block).
__global__ void __launch_bounds__(kExpandThreads)
    lora_expand_kernel(const float* __restrict__ v, bf16* __restrict__ y, LoraArgs args) {
  extern __shared__ float vs[];  // [rank]: row t's v
  const int t = blockIdx.x;
  const int slot = args.row_slot[t];
  if (slot < 0) return;
  const LoraBlock& b = args.block;
  for (int r = threadIdx.x; r < b.rank; r += kExpandThreads) vs[r] = v[static_cast<int64_t>(t) * b.rank + r];
  __syncthreads();
  const int i = blockIdx.y * kExpandThreads + threadIdx.x;
  if (i >= b.n) return;
  const bf16* bt = args.weights + slot * args.slot_weights + b.bt;
  float acc = 0.f;
  for (int r = 0; r < b.rank; ++r)
    if (vs[r] != 0.f) acc += __bfloat162float(bt[static_cast<int64_t>(r) * b.n + i]) * vs[r];
  bf16& out = y[static_cast<int64_t>(t) * b.n + i];
  out = __float2bfloat16_rn(__bfloat162float(out) + acc);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t add_lora(bf16* y, const bf16* x, float* v, int rows, const LoraArgs& args, cudaStream_t stream) {
  const LoraBlock& b = args.block;
  if (rows < 0 || b.rank < 0 || (b.rank > 0 && (b.n <= 0 || b.k <= 0)))
    return launch_failure(cudaErrorInvalidValue, "add_lora: rows " + std::to_string(rows) + ", block rank " +
                                                     std::to_string(b.rank) + " of " + std::to_string(b.n) + " x " +
                                                     std::to_string(b.k));
  if (rows == 0 || b.rank == 0) return cudaSuccess;
  // 16-byte loads when every row of x and of A starts on 16 bytes (block offsets are multiples of 8 elements).
  const bool vector = b.k % 8 == 0 && aligned16(x) && aligned16(args.weights) && args.slot_weights % 8 == 0;
  if (vector)
    lora_shrink_kernel<true><<<rows, kShrinkThreads, 0, stream>>>(x, v, args);
  else
    lora_shrink_kernel<false><<<rows, kShrinkThreads, 0, stream>>>(x, v, args);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  const dim3 grid(rows, (b.n + kExpandThreads - 1) / kExpandThreads);
  lora_expand_kernel<<<grid, kExpandThreads, b.rank * sizeof(float), stream>>>(v, y, args);
  return cudaGetLastError();
}

}  // namespace paged::cuda
