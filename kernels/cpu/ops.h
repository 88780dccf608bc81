// CPU reference operators of the Llama forward pass, float32. Each CUDA kernel in kernels/cuda has its twin here and
// a test comparing them. Shapes are written beside every pointer; all arrays are dense row-major.
//
// Paged KV cache layout (shared with the CUDA backend), one K and one V array per layer:
//   cache[num_blocks][num_kv_heads][block_size][head_dim]
// A token's slot is block * block_size + offset; slot -1 marks padding and is skipped.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace paged {
struct LoraPair;  // model/lora/lora_adapter.h
}

namespace paged::cpu {

/// out = x / sqrt(mean(x^2) + eps) * weight, per row.
void rms_norm(float* out,           // [rows][dim]
              const float* x,       // [rows][dim]
              const float* weight,  // [dim]
              int rows, int dim, float eps);

/// residual += x, then out = rms_norm(residual). The fused form the decode loop uses between sublayers.
void add_rms_norm(float* out,           // [rows][dim]
                  float* residual,      // [rows][dim], updated in place
                  const float* x,       // [rows][dim]
                  const float* weight,  // [dim]
                  int rows, int dim, float eps);

/// out = x * w^T (+ bias): an HF Linear layer. out may not alias x.
void linear(float* out,         // [m][n]
            const float* x,     // [m][k]
            const float* w,     // [n][k]
            const float* bias,  // [n] or nullptr
            int m, int n, int k);

/// Rotary embedding, HF layout, in place on q and k: the first rotary_dim elements of each head rotate (element i
/// pairs with i + rotary_dim / 2; rotary_dim = head_dim unless partial_rotary_factor), the rest pass through; cos and
/// sin are multiplied by attention_factor (LongRoPE's scaling, 1 otherwise).
void rope(float* q,                  // [tokens][num_heads][head_dim]
          float* k,                  // [tokens][num_kv_heads][head_dim]
          const int32_t* positions,  // [tokens]
          const float* inv_freq,     // [rotary_dim / 2]
          int tokens, int num_heads, int num_kv_heads, int head_dim, int rotary_dim, float attention_factor);

/// Writes each token's K and V into its cache slot; tokens whose slot is -1 are skipped.
void reshape_and_cache(const float* k,               // [tokens][num_kv_heads][head_dim]
                       const float* v,               // [tokens][num_kv_heads][head_dim]
                       float* k_cache,               // [num_blocks][num_kv_heads][block_size][head_dim]
                       float* v_cache,               // same
                       const int64_t* slot_mapping,  // [tokens]
                       int tokens, int num_kv_heads, int head_dim, int block_size);

/// Causal attention of a ragged batch over the paged cache. Sequence s owns queries
/// [query_start[s], query_start[s+1]); they sit at positions context_len[s] - q_len .. context_len[s] - 1 and each
/// attends to every cached position up to and including its own (the cache already holds their K/V).
/// Covers decode (q_len 1), prefill, chunked prefill and a cached prefix alike. Query head h reads KV head
/// h / (num_heads / num_kv_heads) (GQA). A sliding window > 0 limits a query at position p to the keys
/// p - window + 1 .. p (Hugging Face's sliding_window mask); 0 = no limit.
void paged_attention(float* out,                   // [total_q][num_heads][head_dim]
                     const float* q,               // [total_q][num_heads][head_dim]
                     const float* k_cache,         // [num_blocks][num_kv_heads][block_size][head_dim]
                     const float* v_cache,         // same
                     const int32_t* block_tables,  // [num_seqs][max_blocks_per_seq]
                     const int32_t* query_start,   // [num_seqs + 1]
                     const int32_t* context_lens,  // [num_seqs]
                     int num_seqs, int max_blocks_per_seq, int num_heads, int num_kv_heads, int head_dim,
                     int block_size, float scale, int window);

/// out = silu(gate) * up.
void silu_and_mul(float* out,            // [tokens][inter]
                  const float* gate_up,  // [tokens][2 * inter]: gate in the first half of a row, up in the second
                  int tokens, int inter);

/// out = gelu_tanh(gate) * up, with HF's gelu_pytorch_tanh: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
void gelu_tanh_and_mul(float* out,            // [tokens][inter]
                       const float* gate_up,  // [tokens][2 * inter]: gate in the first half of a row, up after it
                       int tokens, int inter);

/// x = cap * tanh(x / cap), in place (Gemma's final_logit_softcapping); cap > 0.
void soft_cap(float* x,  // [n]
              int64_t n, float cap);

/// Copies whole blocks inside one cache array (copy-on-write): for each (src, dst), block dst := block src.
void copy_blocks(float* cache,  // [num_blocks][block_elems]
                 std::span<const std::pair<int32_t, int32_t>> src_dst, int64_t block_elems);

/// out[p.out_offset + i] += p.scale * (B (A x))[i] for each LoRA pair p of a fused linear layer, over one token's row:
/// x its k inputs, out its output row. `ax` is scratch (kept by the caller: this runs per token and layer). The twin of
/// kernels/cuda/lora.h's add_lora.
void add_lora_pairs(float* out, const float* x, int k, const std::vector<LoraPair>& pairs, std::vector<float>& ax);

}  // namespace paged::cpu
