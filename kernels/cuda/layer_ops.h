// Row-wise kernels of the Llama layer on bf16 activations: embedding lookup / row gather (scaled: Gemma's
// embeddings), RMSNorm (alone and fused with the residual add; Gemma's (1 + weight) through weight_offset 1; both can
// also quantise their rows for an FP8 product), SiLU-and-mul and GeGLU (tanh GELU-and-mul), and the soft-cap of
// float32 logits. Arithmetic in float32, results rounded to bf16 once. (Qwen3's and Gemma 3's per-head q/k norms are
// rope_and_cache's: kernels/cuda/rope_cache.h.)
// CPU twins: kernels/cpu/ops.h (rms_norm, add_rms_norm with the weights plus weight_offset, silu_and_mul,
// gelu_tanh_and_mul, soft_cap); gather_rows is a row copy times scale.
// Every launcher enqueues on `stream` and returns the launch status; widths must be multiples of 8 (16-byte vectors)
// and pointers 16-byte aligned, otherwise cudaErrorInvalidValue with a message (describe_launch_error).
#pragma once

#include <cstdint>

#include "kernels/cuda/launch.h"

namespace paged::cuda {

/// out[i] = table[rows[i]] * scale for i < n, rounded to bf16 (scale 1: a copy); an index outside [0, table_rows)
/// gives a zero row. The embedding lookup (table = embed_tokens, rows = token ids, scale = Gemma's sqrt(hidden) as
/// bf16 rounds it, else 1) and the pick of the rows to sample before the LM head.
cudaError_t gather_rows(bf16* out,            // [n][width]
                        const bf16* table,    // [table_rows][width]
                        const int32_t* rows,  // [n]
                        int n, int width, int table_rows, float scale, cudaStream_t stream);

/// Where a norm also puts its output as the FP8 input of a product (q null: nowhere): each row's e4m3 codes and
/// scale, the bits quantize_rows_fp8 (kernels/cuda/fp8.h) gives for `out`. q 8-byte aligned. With FP8 rows `out` may
/// be null: the codes alone, when nothing reads the bf16 rows (a sixth of the pass's bytes fewer).
struct Fp8Rows {
  uint8_t* q = nullptr;     // [rows][hidden]
  float* scale = nullptr;  // [rows]
};

/// What add_rms_norm's x is when it is a product of FP8 codes not yet scaled (Gemm::product_fp8; x_scale null: a
/// plain x): each element becomes x * x_scale[row] * w_scale[col] + bias[col], rounded to bf16, the bits
/// scale_fp8_product (kernels/cuda/fp8.h) would have left. x_scale may be the Fp8Rows' scale of the same call (a
/// row's is read before it is written).
struct Fp8Product {
  const float* x_scale = nullptr;  // [rows]
  const float* w_scale = nullptr;  // [hidden]
  const bf16* bias = nullptr;      // [hidden] or nullptr
};

/// out = x / sqrt(mean(x^2) + eps) * (weight + weight_offset), per row (weight_offset: 0, or Gemma's 1).
cudaError_t rms_norm(bf16* out,           // [rows][hidden], may not alias x
                     const bf16* x,       // [rows][hidden]
                     const bf16* weight,  // [hidden]
                     int rows, int hidden, float eps, float weight_offset, cudaStream_t stream, Fp8Rows fp8 = {});

/// residual += x, rounded to bf16 (the residual stream is bf16, as in HF), then
/// out = rms_norm(residual) * (weight + weight_offset). out may not alias residual or x.
cudaError_t add_rms_norm(bf16* out,           // [rows][hidden]
                         bf16* residual,      // [rows][hidden], updated in place
                         const bf16* x,       // [rows][hidden]
                         const bf16* weight,  // [hidden]
                         int rows, int hidden, float eps, float weight_offset, cudaStream_t stream,
                         Fp8Rows fp8 = {}, Fp8Product x_product = {});

/// out = silu(gate) * up.
cudaError_t silu_and_mul(bf16* out,            // [tokens][inter]
                         const bf16* gate_up,  // [tokens][2 * inter]: gate in the first half of a row, up after it
                         int tokens, int inter, cudaStream_t stream);

/// out = gelu_tanh(gate) * up (HF's gelu_pytorch_tanh: Gemma's GeGLU).
cudaError_t gelu_tanh_and_mul(bf16* out,            // [tokens][inter]
                              const bf16* gate_up,  // [tokens][2 * inter]: gate, then up, in each row
                              int tokens, int inter, cudaStream_t stream);

/// x = cap * tanh(x / cap), in place (Gemma's final_logit_softcapping on the LM head's output). cap > 0; any n.
cudaError_t soft_cap(float* x,  // [n]
                     int64_t n, float cap, cudaStream_t stream);

}  // namespace paged::cuda
