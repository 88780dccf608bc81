#include "kernels/cuda/rope_cache.h"

#include "kernels/cuda/device_utils.cuh"

namespace paged::cuda {

namespace {

constexpr int kRopeThreads = 128;
constexpr int kRopeHeadsPerBlock = 8;  // a token's heads spread over several blocks: a decode step has few tokens

// grid: (tokens, ceil((num_heads + 2 * num_kv_heads) / kRopeHeadsPerBlock)); block: kRopeThreads.
// The heads of a token are numbered q heads, k heads, v heads, as in the row; block (t, y) takes heads
// [8y, 8y + 8) of token t: q and k heads are rotated (two rotation pairs per thread and step, bf16x2 loads), k into
// the cache with its elements past rotary_dim as they are, v heads are copied to the cache in 16-byte vectors.
template <int HEAD_DIM>
__global__ void __launch_bounds__(kRopeThreads)
    rope_and_cache_kernel(bf16* __restrict__ qkv, bf16* __restrict__ k_cache, bf16* __restrict__ v_cache,
                          const int32_t* __restrict__ positions, const int64_t* __restrict__ slot_mapping,
                          const float* __restrict__ inv_freq, int num_heads, int num_kv_heads, int rotary_dim,
                          float attention_factor, int log2_block_size, int64_t qkv_stride) {
  wait_for_previous_grid();  // launched early (launch_early): the QKV projection's results
  allow_dependent_launch();  // the attention may launch now and wait for these results itself
  const int half = rotary_dim / 2;
  const int pairs2 = half / 2;  // bf16x2 rotation units per head
  const int token = blockIdx.x;
  const int head0 = blockIdx.y * kRopeHeadsPerBlock;
  const int rotated_heads = num_heads + num_kv_heads;
  const int head_end = min(head0 + kRopeHeadsPerBlock, rotated_heads + num_kv_heads);
  const float pos = static_cast<float>(positions[token]);
  const int64_t slot = slot_mapping[token];
  bf16* row = qkv + token * qkv_stride;
  // Cache offset of this token's KV head 0; int64: the cache of one layer can exceed 2^31 elements.
  int64_t cache_base = -1;
  if (slot >= 0) {
    const int64_t block = slot >> log2_block_size, offset = slot & ((1 << log2_block_size) - 1);
    cache_base = (block * num_kv_heads << log2_block_size) * HEAD_DIM + offset * HEAD_DIM;
  }
  const int64_t head_stride_cache = static_cast<int64_t>(HEAD_DIM) << log2_block_size;  // one KV head of a block

  const bool to_cache = k_cache != nullptr;  // else the keys are rotated in place and nothing else is written
  const int rotated_end = min(head_end, rotated_heads);
  for (int item = threadIdx.x; item < (rotated_end - head0) * pairs2; item += blockDim.x) {
    const int head = head0 + item / pairs2;
    const int i = (item % pairs2) * 2;
    const bool is_key = head >= num_heads;
    if (is_key && to_cache && slot < 0) continue;
    bf16* h = row + head * HEAD_DIM;  // k heads follow the q heads in the row
    // Full-precision sincosf: positions reach 10^5, where the fast intrinsics lose the angle.
    float s0, c0, s1, c1;
    sincosf(pos * inv_freq[i], &s0, &c0);
    sincosf(pos * inv_freq[i + 1], &s1, &c1);
    s0 *= attention_factor;
    c0 *= attention_factor;
    s1 *= attention_factor;
    c1 *= attention_factor;
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(h + i));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(h + i + half));
    const __nv_bfloat162 lo = __floats2bfloat162_rn(a.x * c0 - b.x * s0, a.y * c1 - b.y * s1);
    const __nv_bfloat162 hi = __floats2bfloat162_rn(b.x * c0 + a.x * s0, b.y * c1 + a.y * s1);
    bf16* dst = h;
    if (is_key && to_cache) dst = k_cache + cache_base + (head - num_heads) * head_stride_cache;
    *reinterpret_cast<__nv_bfloat162*>(dst + i) = lo;
    *reinterpret_cast<__nv_bfloat162*>(dst + i + half) = hi;
  }
  if (slot < 0 || !to_cache) return;
  // Partial rotary: the key elements past rotary_dim go to the cache unrotated (bf16x2 at a time).
  const int pass2 = (HEAD_DIM - rotary_dim) / 2;
  const int k_first = max(head0, num_heads);  // k heads of this block: [k_first, rotated_end)
  for (int item = threadIdx.x; item < (rotated_end - k_first) * pass2; item += blockDim.x) {
    const int head = k_first + item / pass2, d = rotary_dim + (item % pass2) * 2;
    *reinterpret_cast<__nv_bfloat162*>(k_cache + cache_base + (head - num_heads) * head_stride_cache + d) =
        *reinterpret_cast<const __nv_bfloat162*>(row + head * HEAD_DIM + d);
  }
  const int v_first = max(head0, rotated_heads);  // v heads of this block: [v_first, head_end)
  for (int c = threadIdx.x * 8; c < (head_end - v_first) * HEAD_DIM; c += blockDim.x * 8) {
    const int head = v_first + c / HEAD_DIM, d = c % HEAD_DIM;
    store_bf16x8(v_cache + cache_base + (head - rotated_heads) * head_stride_cache + d,
                 load_bf16x8(row + head * HEAD_DIM + d));
  }
}

}  // namespace

cudaError_t rope_and_cache(bf16* qkv, bf16* k_cache, bf16* v_cache, const int32_t* positions,
                           const int64_t* slot_mapping, const float* inv_freq, int tokens, int num_heads,
                           int num_kv_heads, int head_dim, int rotary_dim, float attention_factor, int block_size,
                           int64_t qkv_stride, cudaStream_t stream) {
  if (!is_supported_block_size(block_size))
    return launch_failure(cudaErrorInvalidValue,
                          "rope_and_cache: block_size " + std::to_string(block_size) + " is not supported (8, 16, 32)");
  if (qkv_stride % 8 != 0 || qkv_stride < static_cast<int64_t>(num_heads + 2 * num_kv_heads) * head_dim)
    return launch_failure(cudaErrorInvalidValue, "rope_and_cache: qkv_stride must be a multiple of 8 and hold "
                                                 "(num_heads + 2 * num_kv_heads) * head_dim");
  if (rotary_dim < 4 || rotary_dim > head_dim || rotary_dim % 4 != 0)
    return launch_failure(cudaErrorInvalidValue, "rope_and_cache: rotary_dim " + std::to_string(rotary_dim) +
                                                     " must be a multiple of 4 in [4, head_dim]");
  if (tokens <= 0) return cudaSuccess;
  const int log2_bs = log2_of(block_size);
  const dim3 grid(tokens, (num_heads + 2 * num_kv_heads + kRopeHeadsPerBlock - 1) / kRopeHeadsPerBlock);
  PAGED_DISPATCH_HEAD_DIM("rope_and_cache", head_dim,
                          return launch_early(rope_and_cache_kernel<HEAD_DIM>, grid, dim3(kRopeThreads), 0, stream,
                                              qkv, k_cache, v_cache, positions, slot_mapping, inv_freq, num_heads,
                                              num_kv_heads, rotary_dim, attention_factor, log2_bs, qkv_stride));
}

}  // namespace paged::cuda
