// The FP8 KV cache (--kv-cache-dtype fp8): K and V stored as e4m3 codes with one float32 scale per token and KV head
// (absmax / 448 of that head's row), written after RoPE (by rope_and_cache, or by cache_kv_fp8 after the one-stream
// QKV GEMV's RoPE) and read by both attention kernels
// (PagedAttentionArgs::k_fp8 / v_fp8). A block of one cache is [num_kv_heads][block_size][head_dim] codes followed
// by [num_kv_heads][block_size] scales, so that whole-block copies, swaps and tiers move it as bytes, unchanged.
// CPU twin: paged::cpu::quantize_rows_fp8 (kernels/cpu/fp8.h) on each head's row, the same codes and scales bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/launch.h"

namespace paged::cuda {

/// Bytes of one cache's block in the FP8 layout: codes and scales (about half the bf16 block's 2 * head_dim bytes
/// per token and head). Host and device code alike.
__host__ __device__ inline int64_t kv_fp8_block_bytes(int num_kv_heads, int block_size, int head_dim) {
  return static_cast<int64_t>(num_kv_heads) * block_size * (head_dim + 4);
}
/// Where a block's float32 scales start, after its codes: row (head * block_size + offset) at + 4 * row.
__host__ __device__ inline int64_t kv_fp8_scales_offset(int num_kv_heads, int block_size, int head_dim) {
  return static_cast<int64_t>(num_kv_heads) * block_size * head_dim;
}

/// For every token with slot >= 0 (slot = block * block_size + offset): its key heads and value heads in qkv (after
/// RoPE, in place: the QKV GEMV's kRope output without caches) quantised per head into the FP8 caches at the slot. Slot -1 is
/// padding. head_dim in kSupportedHeadDims, block_size in kSupportedBlockSizes, qkv_stride a multiple of 8.
cudaError_t cache_kv_fp8(const bf16* qkv,              // [tokens][qkv_stride]: q heads, then k heads, then v heads
                         uint8_t* k_cache,             // blocks of kv_fp8_block_bytes
                         uint8_t* v_cache,             // same
                         const int64_t* slot_mapping,  // [tokens]; -1 = padding
                         int tokens, int num_heads, int num_kv_heads, int head_dim, int block_size,
                         int64_t qkv_stride, cudaStream_t stream);

}  // namespace paged::cuda
