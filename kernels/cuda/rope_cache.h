// RoPE fused with the write of K and V into the paged cache: the step between the QKV projection and attention
// (one-stream steps do the same in the QKV projection's epilogue: GemvOutput::kRope, kernels/cuda/gemv.h). On the
// way it can also apply an FP8 product's scales, Qwen3's / Gemma 3's per-head norms, and quantise into the FP8 cache:
// every pass between the projection and attention in one read of the row.
// CPU twins: paged::cpu::rope followed by paged::cpu::reshape_and_cache (kernels/cpu/ops.h); the extras are
// cpu::rms_norm over each head row and cpu::quantize_rows_fp8 over each cached head row (kernels/cpu/fp8.h).
#pragma once

#include <cstdint>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/layer_ops.h"

namespace paged::cuda {

/// What rope_and_cache may also do; each part optional.
struct RopeExtras {
  /// qkv holds a product of FP8 codes not yet scaled (Gemm::product_fp8): each element first becomes
  /// x * x_scale[token] * w_scale[column] (+ bias[column]) rounded to bf16, the bits scale_fp8_product leaves.
  Fp8Product product;
  /// Per-head RMSNorm before RoPE (both or neither): every query head x becomes x / sqrt(mean(x^2) + norm_eps) *
  /// (q_norm + norm_offset), every key head likewise with k_norm, rounded to bf16.
  const bf16* q_norm = nullptr;  // [head_dim]
  const bf16* k_norm = nullptr;  // [head_dim]
  float norm_eps = 0.0f, norm_offset = 0.0f;
  /// The FP8 cache (kernels/cuda/kv_fp8.h) in place of k_cache and v_cache (both null then): each rotated key head
  /// and value head quantised per head into it at the token's slot, the bits cache_kv_fp8 writes.
  uint8_t* k_fp8 = nullptr;
  uint8_t* v_fp8 = nullptr;
};

/// For every token: rotates its query heads in place and its key heads by the token's position (HF layout: of the
/// first rotary_dim elements of a head, element i pairs with i + rotary_dim / 2, the others pass through; angle =
/// position * inv_freq[i] in float32, so llama3 / LongRoPE scaling is whatever inv_freq carries; cos and sin times
/// attention_factor), then writes the rotated key and the value into the cache at the token's slot
/// (slot = block * block_size + offset). Slot -1 marks padding: nothing is written to the cache for that token.
/// The key and value heads in qkv are left as they were (attention reads keys and values from the cache). Without
/// any cache (k_cache, v_cache and the extras' FP8 caches all null) every head's result is written back in place
/// instead: keys rotated, values scaled when extras.product says so. head_dim in kSupportedHeadDims, rotary_dim a
/// multiple of 4 in [4, head_dim], block_size in kSupportedBlockSizes, qkv_stride a multiple of 8.
cudaError_t rope_and_cache(bf16* qkv,                     // [tokens][qkv_stride]: q heads, then k heads, then v
                                                          //   heads, each head head_dim wide
                           bf16* k_cache,                 // [num_blocks][num_kv_heads][block_size][head_dim]
                           bf16* v_cache,                 // same
                           const int32_t* positions,      // [tokens]
                           const int64_t* slot_mapping,   // [tokens]; -1 = padding
                           const float* inv_freq,         // [rotary_dim / 2]
                           int tokens, int num_heads, int num_kv_heads, int head_dim, int rotary_dim,
                           float attention_factor, int block_size, int64_t qkv_stride, cudaStream_t stream,
                           const RopeExtras& extras = {});

}  // namespace paged::cuda
