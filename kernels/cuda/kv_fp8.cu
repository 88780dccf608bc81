#include "kernels/cuda/kv_fp8.h"

#include <cuda_fp8.h>

#include <string>

#include "kernels/cuda/device_utils.cuh"

namespace paged::cuda {

namespace {

constexpr int kWarps = 4;

// grid: (tokens, ceil(2 * num_kv_heads / kWarps)); block: 32 * kWarps; launched early (programmatic dependent
// launch, as rope_and_cache: the one normal launch of a one-stream layer with the FP8 cache otherwise). Warp w of
// block (t, y) takes head row y * kWarps + w of token t's K heads then V heads: its absmax over the warp, then each
// lane's HEAD_DIM / 32 codes.
template <int HEAD_DIM>
__global__ void __launch_bounds__(32 * kWarps)
    cache_kv_fp8_kernel(const bf16* __restrict__ qkv, uint8_t* __restrict__ k_cache, uint8_t* __restrict__ v_cache,
                        const int64_t* __restrict__ slot_mapping, int num_heads, int num_kv_heads,
                        int log2_block_size, int64_t qkv_stride) {
  constexpr int kPerLane = HEAD_DIM / 32;  // 2 or 4
  const int token = blockIdx.x, lane = threadIdx.x % 32;
  const int item = blockIdx.y * kWarps + threadIdx.x / 32;
  wait_for_previous_grid();  // launched early (launch_early): the QKV product's results
  allow_dependent_launch();  // the attention may launch now and wait for these codes itself
  const int64_t slot = slot_mapping[token];
  if (item >= 2 * num_kv_heads || slot < 0) return;
  const bool is_value = item >= num_kv_heads;
  const int head = item % num_kv_heads;
  const bf16* src = qkv + token * qkv_stride + static_cast<int64_t>(num_heads + item) * HEAD_DIM + lane * kPerLane;
  float f[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; i += 2) {
    const float2 p = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(src + i));
    f[i] = p.x;
    f[i + 1] = p.y;
  }
  const int64_t block = slot >> log2_block_size, offset = slot & ((1 << log2_block_size) - 1);
  const int64_t row = (static_cast<int64_t>(head) << log2_block_size) + offset;  // the head's row in the block
  const int block_size = 1 << log2_block_size;
  uint8_t* base = (is_value ? v_cache : k_cache) + block * kv_fp8_block_bytes(num_kv_heads, block_size, HEAD_DIM);
  float* scales = reinterpret_cast<float*>(base + kv_fp8_scales_offset(num_kv_heads, block_size, HEAD_DIM));
  quantize_warp_row<kPerLane>(f, base + row * HEAD_DIM, scales + row);
}

}  // namespace

cudaError_t cache_kv_fp8(const bf16* qkv, uint8_t* k_cache, uint8_t* v_cache, const int64_t* slot_mapping,
                         int tokens, int num_heads, int num_kv_heads, int head_dim, int block_size,
                         int64_t qkv_stride, cudaStream_t stream) {
  if (!is_supported_block_size(block_size))
    return launch_failure(cudaErrorInvalidValue,
                          "cache_kv_fp8: block_size " + std::to_string(block_size) + " is not supported (8, 16, 32)");
  if (qkv_stride % 8 != 0 || qkv_stride < static_cast<int64_t>(num_heads + 2 * num_kv_heads) * head_dim)
    return launch_failure(cudaErrorInvalidValue, "cache_kv_fp8: qkv_stride must be a multiple of 8 and hold "
                                                 "(num_heads + 2 * num_kv_heads) * head_dim");
  if (tokens <= 0) return cudaSuccess;
  const dim3 grid(tokens, (2 * num_kv_heads + kWarps - 1) / kWarps);
  PAGED_DISPATCH_HEAD_DIM("cache_kv_fp8", head_dim,
                          return launch_early(cache_kv_fp8_kernel<HEAD_DIM>, grid, dim3(32 * kWarps), 0, stream,
                                              qkv, k_cache, v_cache, slot_mapping, num_heads, num_kv_heads,
                                              log2_of(block_size), qkv_stride));
}

}  // namespace paged::cuda
