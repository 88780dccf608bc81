// RoPE fused with the write of K and V into the paged cache: the step between the QKV projection and attention
// (one-stream steps do the same in the QKV projection's epilogue: GemvOutput::kRope, kernels/cuda/gemv.h).
// CPU twins: paged::cpu::rope followed by paged::cpu::reshape_and_cache (kernels/cpu/ops.h).
#pragma once

#include <cstdint>

#include "kernels/cuda/launch.h"

namespace paged::cuda {

/// For every token: rotates its query heads in place and its key heads by the token's position (HF layout: of the
/// first rotary_dim elements of a head, element i pairs with i + rotary_dim / 2, the others pass through; angle =
/// position * inv_freq[i] in float32, so llama3 / LongRoPE scaling is whatever inv_freq carries; cos and sin times
/// attention_factor), then writes the rotated key and the value into the cache at the token's slot
/// (slot = block * block_size + offset). Slot -1 marks padding: nothing is written to the cache for that token.
/// The key heads in qkv are left unrotated (attention reads keys from the cache). With k_cache and v_cache null
/// (the FP8 cache, which cache_kv_fp8 writes next) the key heads are rotated in place and no cache is written.
/// head_dim in kSupportedHeadDims, rotary_dim a multiple of 4 in [4, head_dim], block_size in kSupportedBlockSizes,
/// qkv_stride a multiple of 8.
cudaError_t rope_and_cache(bf16* qkv,                     // [tokens][qkv_stride]: q heads, then k heads, then v
                                                          //   heads, each head head_dim wide
                           bf16* k_cache,                 // [num_blocks][num_kv_heads][block_size][head_dim]
                           bf16* v_cache,                 // same
                           const int32_t* positions,      // [tokens]
                           const int64_t* slot_mapping,   // [tokens]; -1 = padding
                           const float* inv_freq,         // [rotary_dim / 2]
                           int tokens, int num_heads, int num_kv_heads, int head_dim, int rotary_dim,
                           float attention_factor, int block_size, int64_t qkv_stride, cudaStream_t stream);

}  // namespace paged::cuda
