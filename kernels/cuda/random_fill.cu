#include "kernels/cuda/random_fill.h"

#include <algorithm>

#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/sampling.h"

namespace paged::cuda {

namespace {

constexpr int kFillThreads = 256;

// grid: (min(ceil(n / kFillThreads), 65536)); block: kFillThreads; grid-stride over the elements.
__global__ void __launch_bounds__(kFillThreads)
    fill_random_kernel(bf16* __restrict__ p, size_t n, uint64_t seed, float scale, float offset) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16_rn(offset + scale * static_cast<float>(2.0 * sampling_uniform(seed, i) - 1.0));
}

}  // namespace

cudaError_t fill_random_bf16(bf16* p, size_t n, uint64_t seed, float scale, float offset, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const size_t blocks = std::min<size_t>((n + kFillThreads - 1) / kFillThreads, 65536);
  fill_random_kernel<<<static_cast<unsigned>(blocks), kFillThreads, 0, stream>>>(p, n, seed, scale, offset);
  return cudaGetLastError();
}

}  // namespace paged::cuda
