#include "kernels/cuda/lora.h"

#include "kernels/cuda/device_utils.cuh"

namespace paged::cuda {

namespace {

constexpr int kKeepThreads = 256;

// grid: ceil(total / kKeepThreads); block: kKeepThreads; an element of v [rows][cols] a thread.
__global__ void __launch_bounds__(kKeepThreads)
    lora_keep_kernel(const float* __restrict__ v, bf16* __restrict__ v16, const int32_t* __restrict__ row_slot,
                     const float* __restrict__ scales, int64_t total, int cols, int rank) {
  const int64_t i = int64_t{blockIdx.x} * kKeepThreads + threadIdx.x;
  if (i >= total) return;
  const int64_t t = i / cols;
  const int c = static_cast<int>(i - t * cols);
  v16[i] = __float2bfloat16_rn(c / rank == row_slot[t] ? v[i] * scales[c] : 0.0f);
}

}  // namespace

cudaError_t lora_keep_slot(bf16* v16, const float* v, int rows, const LoraArgs& args, cudaStream_t stream) {
  const int cols = args.slots * args.rank;
  const int64_t total = int64_t{rows} * cols;
  if (total <= 0) return cudaSuccess;
  lora_keep_kernel<<<static_cast<unsigned>((total + kKeepThreads - 1) / kKeepThreads), kKeepThreads, 0, stream>>>(
      v, v16, args.row_slot, args.scales, total, cols, args.rank);
  return cudaGetLastError();
}

}  // namespace paged::cuda
