// Attention over the paged KV cache: a decode kernel (one query token per sequence, long contexts split across
// thread blocks flash-decoding style and merged by a reduction kernel) and a prefill kernel (many query tokens per
// sequence, causal, over a cached prefix: prefill, chunked prefill and decode alike).
// CPU twin: paged::cpu::paged_attention (kernels/cpu/ops.h), whose semantics both kernels follow: sequence s owns
// queries query_start[s] .. query_start[s+1]-1 at positions context_lens[s] - q_len .. context_lens[s] - 1, and each
// attends to every cached position up to and including its own (its own K/V is already in the cache), or, with a
// sliding window W > 0, to the positions pos - W + 1 .. pos only (the older ones are masked and mostly not read).
// Query head h reads KV head h / (num_heads / num_kv_heads). Inputs and output bf16, arithmetic float32.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/launch.h"

namespace paged::cuda {

/// Everything both attention kernels read, passed to the kernels by value. Pointers are device pointers.
struct PagedAttentionArgs {
  bf16* out;                    // [total_q][num_heads][head_dim]
  const bf16* q;                // [total_q][q_stride]: query head h at h * head_dim (the fused QKV buffer works)
  int64_t q_stride;             // elements from one query token to the next, >= num_heads * head_dim, multiple of 8
  const bf16* k_cache;          // [num_blocks][num_kv_heads][block_size][head_dim]
  const bf16* v_cache;          // same
  // The FP8 cache (kernels/cuda/kv_fp8.h) instead, when set: blocks of e4m3 codes and per-token, per-head scales;
  // k_cache and v_cache are then not read. The kernels take codes * scale as the key and the value.
  const uint8_t* k_fp8 = nullptr;
  const uint8_t* v_fp8 = nullptr;
  const int32_t* block_tables;  // [num_seqs][max_blocks_per_seq]
  const int32_t* query_start;   // [num_seqs + 1]; prefill only: decode has query s for sequence s
  const int32_t* context_lens;  // [num_seqs], each >= 1 (and >= that sequence's query count)
  int num_seqs = 0, max_blocks_per_seq = 0;
  int num_heads = 0, num_kv_heads = 0, head_dim = 0, block_size = 0;
  float scale = 1.0f;           // usually 1 / sqrt(head_dim)
  int window = 0;               // the layer's sliding window (keys a query sees, its own included); 0 = none
};

/// Decode: query s is sequence s's last token (position context_lens[s] - 1). Grid (num_kv_heads, num_seqs,
/// partitions): each thread block reads one KV head's blocks of one partition of partition_size tokens once, for all
/// the query heads of its group, on tensor cores. Sequences with more than one partition merge partial results: in
/// the thread block cluster of their partitions where the device has clusters (sm_90), the grid has at most 8
/// partitions and all its blocks are resident at once (one wave), else through `workspace` and a second kernel (the
/// workspace is sized for the second way). Requirements: every context_lens[s] <= max_context_len; partition_size a
/// multiple of block_size and at most kMaxDecodePartition; num_heads / num_kv_heads <= 16 (GQA group); head_dim and
/// block_size supported. Probabilities enter the P.V product rounded to bf16 (as in flash attention). The grid depends only on (num_seqs, max_context_len, partition_size), so a CUDA graph captured with a
/// fixed max_context_len replays for any contexts up to it.
inline constexpr int kMaxDecodePartition = 4096;
/// The most partitions that merge in one thread block cluster (the portable cluster size).
inline constexpr int kMaxDecodeCluster = 8;

/// Whole sequences (one partition each) are taken where they give at least this many thread blocks an SM.
inline constexpr int kDecodeWholeBlocksPerSm = 4;

/// The partition size the runner gives paged_attention_decode for `batch` sequences of up to max_context tokens
/// on sm_count SMs (8B shape, 8 KV heads, 132 SMs). Three cases, first match:
/// - One wave of one block an SM holds the grid with at most kMaxDecodeCluster partitions of up to 512 tokens: the
///   smallest such partition. The partitions merge in a thread block cluster, no reduction kernel after them (H200,
///   one sequence: 8 x 128 8.2 us a layer at context 640 against 16 x 64 and the reduction 10.1; 8 x 256 10.5 us at
///   2,000 against 16 x 128 12.6 and 32 x 64 14.2).
/// - Whole sequences, one partition of up to kMaxDecodePartition tokens each, give at least whole_blocks_per_sm
///   blocks an SM: that partition (no partial results to write and merge, no reduction kernel). H200,
///   bench_cuda_attention, one layer: 900 sequences x 576 tokens bf16 515.6 us (96% of 4.3 TB/s) against 613.4 at
///   512, FP8 cache 383.9 against 491.4; 400 x 1,500 bf16 588.1 against 631.6, FP8 406.3 against 469.6; 160 x 600
///   bf16 114.0 against 122.1, FP8 80.4 against 94.5. End to end (same call): ShareGPT-like bf16 12,905 output
///   tok/s against 12,484, fixed 512/128 7,075 against 6,859, FP8 + FP8 KV 1000/1000 13,441 against 12,678.
/// - Else the largest of 512, 256, 128, 64 that gives at least one block for every two SMs: past that, more and
///   shorter partitions cost more than they spread (H100, batch 8 at 2,000: 4 x 512 31.3 us, 8 x 256 36.6, 32 x 64
///   47.7).
inline int decode_partition(int batch, int kv_heads, int max_context, int sm_count, int block_size,
                            int whole_blocks_per_sm = kDecodeWholeBlocksPerSm) {
  const auto parts = [&](int p) { return (max_context + p - 1) / p; };
  const auto blocks = [&](int p) { return int64_t{kv_heads} * batch * parts(p); };
  for (int p = 64; p <= 512; p *= 2)
    if (p >= block_size && parts(p) > 1 && parts(p) <= kMaxDecodeCluster && blocks(p) <= sm_count) return p;
  int whole = std::max(64, block_size);
  while (whole < max_context && whole < kMaxDecodePartition) whole *= 2;
  if (whole_blocks_per_sm > 0 && whole > 512 && blocks(whole) >= int64_t{whole_blocks_per_sm} * sm_count)
    return whole;
  int p = 512;
  while (p > 64 && p / 2 >= block_size && 2 * blocks(p) < sm_count) p /= 2;
  return std::max(p, block_size);
}

/// Bytes of workspace paged_attention_decode needs (0 when max_context_len <= partition_size).
size_t paged_attention_decode_workspace(int num_seqs, int num_heads, int head_dim, int max_context_len,
                                        int partition_size);

cudaError_t paged_attention_decode(const PagedAttentionArgs& args, int max_context_len, int partition_size,
                                   void* workspace, size_t workspace_bytes, cudaStream_t stream);

/// Chunks of more (query, head) rows a KV head than this (max_q_len * group) take the prefill kernel with two m-tiles
/// a warp (128 rows a block), shorter ones the kernel with one (64 rows).
inline constexpr int kPrefillTwoTileRows = 1024;

/// Prefill (any number of queries per sequence, causal). Grid (ceil(max_q_len * group / rows), num_kv_heads,
/// num_seqs): a thread block takes 64 or 128 (query, head) rows (kPrefillTwoTileRows) of one KV head's group and
/// streams the KV tiles up to its last query's position through shared memory with an online softmax. max_q_len >=
/// every sequence's query count.
cudaError_t paged_attention_prefill(const PagedAttentionArgs& args, int max_q_len, cudaStream_t stream);

}  // namespace paged::cuda
