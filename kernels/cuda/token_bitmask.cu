#include "kernels/cuda/token_bitmask.h"

#include <cmath>

namespace paged::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void apply_token_bitmask_kernel(float* logits, const int32_t* rows, const uint32_t* masks, int vocab,
                                           int words) {
  const int id = blockIdx.x * kThreads + threadIdx.x;
  if (id >= vocab) return;
  const uint32_t word = masks[int64_t{blockIdx.y} * words + (id >> 5)];
  if (!((word >> (id & 31)) & 1u)) logits[int64_t{rows[blockIdx.y]} * vocab + id] = -INFINITY;
}

}  // namespace

cudaError_t apply_token_bitmask(float* logits, const int32_t* rows, const uint32_t* masks, int n, int vocab,
                                cudaStream_t stream) {
  if (vocab <= 0) return launch_failure(cudaErrorInvalidValue, "apply_token_bitmask: vocab must be positive");
  if (n < 0 || n > 65535) return launch_failure(cudaErrorInvalidValue, "apply_token_bitmask: n must be in [0, 65535]");
  if (n == 0) return cudaSuccess;
  const dim3 grid((vocab + kThreads - 1) / kThreads, n);
  apply_token_bitmask_kernel<<<grid, kThreads, 0, stream>>>(logits, rows, masks, vocab, (vocab + 31) / 32);
  return cudaGetLastError();
}

}  // namespace paged::cuda
