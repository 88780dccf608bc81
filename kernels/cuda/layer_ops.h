// Row-wise kernels of the Llama layer on bf16 activations: embedding lookup / row gather, RMSNorm (alone, fused
// with the residual add, and per attention head: Qwen3's q/k norms), SiLU-and-mul. Arithmetic in float32, results
// rounded to bf16 once.
// CPU twins: kernels/cpu/ops.h (rms_norm, add_rms_norm, silu_and_mul; head_rms_norm is rms_norm over rows of
// head_dim); gather_rows is a plain row copy.
// Every launcher enqueues on `stream` and returns the launch status; widths must be multiples of 8 (16-byte vectors)
// and pointers 16-byte aligned, otherwise cudaErrorInvalidValue with a message (describe_launch_error).
#pragma once

#include <cstdint>

#include "kernels/cuda/launch.h"

namespace paged::cuda {

/// out[i] = table[rows[i]] for i < n; an index outside [0, table_rows) gives a zero row. The embedding lookup
/// (table = embed_tokens, rows = token ids) and the pick of the rows to sample before the LM head.
cudaError_t gather_rows(bf16* out,            // [n][width]
                        const bf16* table,    // [table_rows][width]
                        const int32_t* rows,  // [n]
                        int n, int width, int table_rows, cudaStream_t stream);

/// out = x / sqrt(mean(x^2) + eps) * weight, per row.
cudaError_t rms_norm(bf16* out,           // [rows][hidden]
                     const bf16* x,       // [rows][hidden]
                     const bf16* weight,  // [hidden]
                     int rows, int hidden, float eps, cudaStream_t stream);

/// residual += x, rounded to bf16 (the residual stream is bf16, as in HF), then out = rms_norm(residual) * weight.
/// out may not alias residual or x.
cudaError_t add_rms_norm(bf16* out,           // [rows][hidden]
                         bf16* residual,      // [rows][hidden], updated in place
                         const bf16* x,       // [rows][hidden]
                         const bf16* weight,  // [hidden]
                         int rows, int hidden, float eps, cudaStream_t stream);

/// Qwen3's q_norm / k_norm, in place on the fused QKV rows: every query head x of a token becomes
/// x / sqrt(mean(x^2) + eps) * q_weight, every key head likewise with k_weight; value heads are left alone. Grid
/// (tokens, ceil((num_heads + num_kv_heads) / 8)), one warp per head. head_dim even and at most 256.
cudaError_t head_rms_norm(bf16* qkv,              // [tokens][qkv_stride]: q heads, k heads, v heads of head_dim
                          const bf16* q_weight,   // [head_dim]
                          const bf16* k_weight,   // [head_dim]
                          int tokens, int num_heads, int num_kv_heads, int head_dim, int64_t qkv_stride, float eps,
                          cudaStream_t stream);

/// out = silu(gate) * up.
cudaError_t silu_and_mul(bf16* out,            // [tokens][inter]
                         const bf16* gate_up,  // [tokens][2 * inter]: gate in the first half of a row, up after it
                         int tokens, int inter, cudaStream_t stream);

}  // namespace paged::cuda
