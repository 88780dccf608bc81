#include "kernels/cuda/rope_cache.h"

#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/kv_fp8.h"

namespace paged::cuda {

namespace {

constexpr int kRopeWarps = 4;
// A token's heads spread over blocks of 8 where a step has few tokens (decode); from kRopeWholeTokenRows tokens on
// (prefill) one block takes all of a token's heads, so that its cosines and sines are computed once a token (H100,
// 16,384 rows of the Llama-3-8B shape: 192 -> 165 us).
constexpr int kRopeHeadsPerBlock = 8;
constexpr int kRopeWholeTokenRows = 1024;

// Loads / stores the E (2 or 4) bf16 elements a lane owns as floats.
template <int E>
__device__ __forceinline__ void load_lane(const bf16* p, float (&v)[E]) {
  if constexpr (E == 4) {
    const uint2 w = *reinterpret_cast<const uint2*>(p);
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w.y));
    v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
  } else {
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
    v[0] = a.x, v[1] = a.y;
  }
}
template <int E>
__device__ __forceinline__ void store_lane(bf16* p, const float (&v)[E]) {
  if constexpr (E == 4) {
    const __nv_bfloat162 a = __floats2bfloat162_rn(v[0], v[1]), b = __floats2bfloat162_rn(v[2], v[3]);
    uint2 w;
    w.x = *reinterpret_cast<const uint32_t*>(&a);
    w.y = *reinterpret_cast<const uint32_t*>(&b);
    *reinterpret_cast<uint2*>(p) = w;
  } else {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(v[0], v[1]);
  }
}

// grid: (tokens, ceil((num_heads + 2 * num_kv_heads) / heads_per_block)); block: 32 * kRopeWarps.
// The heads of a token are numbered q heads, k heads, v heads, as in the row; block (t, y) takes heads
// [h y, h y + h) (h = heads_per_block), warp w the heads w, w + 4, ... of them, one at a time: lane l holds
// elements [l * E, l * E + E) of the head (E = HEAD_DIM / 32), scaled (FP8 product) and normalised (q/k norms, a warp
// sum) in registers; a rotation pair meets through the warp's row in shared memory. The block's cosines and sines are
// computed once, for all its heads.
// kFp8Cache: keys and values go to the FP8 cache, a head row quantised by its warp.
template <int HEAD_DIM, bool kFp8Cache>
__global__ void __launch_bounds__(32 * kRopeWarps)
    rope_and_cache_kernel(bf16* __restrict__ qkv, bf16* __restrict__ k_cache, bf16* __restrict__ v_cache,
                          const int32_t* __restrict__ positions, const int64_t* __restrict__ slot_mapping,
                          const float* __restrict__ inv_freq, int num_heads, int num_kv_heads, int rotary_dim,
                          float attention_factor, int log2_block_size, int64_t qkv_stride, int heads_per_block,
                          const RopeExtras x) {
  constexpr int E = HEAD_DIM / 32;
  __shared__ float cos_a[HEAD_DIM / 2], sin_a[HEAD_DIM / 2];
  __shared__ float head_row[kRopeWarps][HEAD_DIM];
  wait_for_previous_grid();  // launched early (launch_early): the QKV projection's results
  allow_dependent_launch();  // the attention may launch now and wait for these results itself
  const int token = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int half = rotary_dim / 2;
  {
    const float pos = static_cast<float>(positions[token]);
    // Full-precision sincosf: positions reach 10^5, where the fast intrinsics lose the angle.
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
      float s, c;
      sincosf(pos * inv_freq[i], &s, &c);
      sin_a[i] = s * attention_factor;
      cos_a[i] = c * attention_factor;
    }
  }
  __syncthreads();
  const int64_t slot = slot_mapping[token];
  const bool caches = kFp8Cache || k_cache != nullptr;  // else every head goes back in place
  const int rotated_heads = num_heads + num_kv_heads, total_heads = rotated_heads + num_kv_heads;
  const int head_end = min(static_cast<int>(blockIdx.y + 1) * heads_per_block, total_heads);
  const int d0 = lane * E;
  bf16* row = qkv + token * qkv_stride;
  const float sx = x.product.x_scale ? x.product.x_scale[token] : 1.f;
  int64_t block = 0, offset = 0;
  if (slot >= 0) block = slot >> log2_block_size, offset = slot & ((1 << log2_block_size) - 1);
  for (int head = blockIdx.y * heads_per_block + warp; head < head_end; head += kRopeWarps) {
    const bool is_query = head < num_heads, is_value = head >= rotated_heads;
    if (!is_query && caches && slot < 0) continue;                 // padding: no cache row to write
    if (is_value && !caches && !x.product.x_scale) continue;       // in place, nothing changes a value head
    bf16* src = row + static_cast<int64_t>(head) * HEAD_DIM + d0;
    float v[E];
    load_lane<E>(src, v);
    if (x.product.x_scale) {
      const int col = head * HEAD_DIM + d0;
#pragma unroll
      for (int e = 0; e < E; ++e)
        v[e] = round_bf16(scale_fp8_element(v[e], sx, x.product.w_scale[col + e],
                                            x.product.bias ? __bfloat162float(x.product.bias[col + e]) : 0.f));
    }
    if (!is_value) {
      if (x.q_norm) {
        float sum_sq = 0.f;
#pragma unroll
        for (int e = 0; e < E; ++e) sum_sq += v[e] * v[e];
        const float inv = 1.0f / sqrtf(warp_sum(sum_sq) / HEAD_DIM + x.norm_eps);
        const bf16* w = (is_query ? x.q_norm : x.k_norm) + d0;
#pragma unroll
        for (int e = 0; e < E; ++e) v[e] = round_bf16((__bfloat162float(w[e]) + x.norm_offset) * (v[e] * inv));
      }
      // RoPE: each element meets its partner (i +- rotary_dim / 2) through the warp's row.
#pragma unroll
      for (int e = 0; e < E; ++e) head_row[warp][d0 + e] = v[e];
      __syncwarp();
      float r[E];
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const int i = d0 + e;
        if (i < half)
          r[e] = rope_lo(v[e], head_row[warp][i + half], cos_a[i], sin_a[i]);
        else if (i < rotary_dim)
          r[e] = rope_hi(head_row[warp][i - half], v[e], cos_a[i - half], sin_a[i - half]);
        else
          r[e] = v[e];
      }
      __syncwarp();  // the row is read before the warp's next head overwrites it
#pragma unroll
      for (int e = 0; e < E; ++e) v[e] = round_bf16(r[e]);
    }
    if (is_query || !caches) {
      store_lane<E>(src, v);
      continue;
    }
    const int kv_head = is_value ? head - rotated_heads : head - num_heads;
    const int64_t head_row_index = (static_cast<int64_t>(kv_head) << log2_block_size) + offset;  // in the block
    if constexpr (kFp8Cache) {
      const int block_size = 1 << log2_block_size;
      uint8_t* base = (is_value ? x.v_fp8 : x.k_fp8) + block * kv_fp8_block_bytes(num_kv_heads, block_size, HEAD_DIM);
      float* scales = reinterpret_cast<float*>(base + kv_fp8_scales_offset(num_kv_heads, block_size, HEAD_DIM));
      quantize_warp_row<E>(v, base + head_row_index * HEAD_DIM, scales + head_row_index);
    } else {
      // int64: the cache of one layer can exceed 2^31 elements.
      const int64_t at = ((block * num_kv_heads << log2_block_size) + head_row_index) * HEAD_DIM + d0;
      store_lane<E>((is_value ? v_cache : k_cache) + at, v);
    }
  }
}

}  // namespace

cudaError_t rope_and_cache(bf16* qkv, bf16* k_cache, bf16* v_cache, const int32_t* positions,
                           const int64_t* slot_mapping, const float* inv_freq, int tokens, int num_heads,
                           int num_kv_heads, int head_dim, int rotary_dim, float attention_factor, int block_size,
                           int64_t qkv_stride, cudaStream_t stream, const RopeExtras& extras) {
  if (!is_supported_block_size(block_size))
    return launch_failure(cudaErrorInvalidValue,
                          "rope_and_cache: block_size " + std::to_string(block_size) + " is not supported (8, 16, 32)");
  if (qkv_stride % 8 != 0 || qkv_stride < static_cast<int64_t>(num_heads + 2 * num_kv_heads) * head_dim)
    return launch_failure(cudaErrorInvalidValue, "rope_and_cache: qkv_stride must be a multiple of 8 and hold "
                                                 "(num_heads + 2 * num_kv_heads) * head_dim");
  if (rotary_dim < 4 || rotary_dim > head_dim || rotary_dim % 4 != 0)
    return launch_failure(cudaErrorInvalidValue, "rope_and_cache: rotary_dim " + std::to_string(rotary_dim) +
                                                     " must be a multiple of 4 in [4, head_dim]");
  const bool fp8_cache = extras.k_fp8 || extras.v_fp8;
  if ((k_cache == nullptr) != (v_cache == nullptr) || (extras.k_fp8 == nullptr) != (extras.v_fp8 == nullptr) ||
      (fp8_cache && k_cache))
    return launch_failure(cudaErrorInvalidValue,
                          "rope_and_cache: give both bf16 caches, or both FP8 caches (extras), or no cache");
  if ((extras.q_norm == nullptr) != (extras.k_norm == nullptr) || (extras.product.x_scale && !extras.product.w_scale))
    return launch_failure(cudaErrorInvalidValue,
                          "rope_and_cache: the head norms come as a pair, an FP8 product with both scale vectors");
  if (tokens <= 0) return cudaSuccess;
  const int log2_bs = log2_of(block_size);
  const int total_heads = num_heads + 2 * num_kv_heads;
  const int heads_per_block = tokens >= kRopeWholeTokenRows ? total_heads : kRopeHeadsPerBlock;
  const dim3 grid(tokens, (total_heads + heads_per_block - 1) / heads_per_block);
  const auto launch = [&](auto kernel) {
    return launch_early(kernel, grid, dim3(32 * kRopeWarps), 0, stream, qkv, k_cache, v_cache, positions,
                        slot_mapping, inv_freq, num_heads, num_kv_heads, rotary_dim, attention_factor, log2_bs,
                        qkv_stride, heads_per_block, extras);
  };
  PAGED_DISPATCH_HEAD_DIM("rope_and_cache", head_dim,
                          return fp8_cache ? launch(rope_and_cache_kernel<HEAD_DIM, true>)
                                           : launch(rope_and_cache_kernel<HEAD_DIM, false>));
}

}  // namespace paged::cuda
