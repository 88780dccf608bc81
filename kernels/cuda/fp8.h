// FP8 e4m3 quantisation on the GPU: each row of a bf16 matrix as e4m3 codes and one float32 scale (absmax / 448),
// for the weights of `--quantization fp8` (per output channel, once at load) and the activations that enter their
// products (per token, every step). Gemm::linear_fp8 and the FP8 GEMV take what it makes; scale_fp8_product applies
// the two scale vectors to a product of codes; act_and_mul_fp8 fuses that pass, the gated activation and the
// quantisation of its output for the MLP's down projection.
// CPU twin: paged::cpu::quantize_rows_fp8 (kernels/cpu/fp8.h), the same codes bit for bit.
#pragma once

#include <cstdint>

#include "kernels/cuda/launch.h"

namespace paged::cuda {

/// q = e4m3(x * (448 / absmax)) and scale = absmax / 448 per row (1 for a zero row), round to nearest even,
/// saturated. grid: rows; cols a positive multiple of 8, x 16-byte aligned, q 8-byte aligned; else
/// cudaErrorInvalidValue with a message.
cudaError_t quantize_rows_fp8(const bf16* x,  // [rows][cols]
                              int64_t rows, int cols,
                              uint8_t* q,      // [rows][cols]
                              float* scale,    // [rows]
                              cudaStream_t stream);

/// y[i][j] = y[i][j] * x_scale[i] * w_scale[j] (+ bias[j]), in place, rounded to bf16 once: the scales of a product
/// of row-quantised FP8 operands (Gemm::linear_fp8 computes the product of the codes, then this). n a multiple of 8,
/// y 16-byte aligned; else cudaErrorInvalidValue with a message.
cudaError_t scale_fp8_product(bf16* y,               // [m][n]
                              const float* x_scale,  // [m]
                              const float* w_scale,  // [n]
                              const bf16* bias,      // [n] or nullptr
                              int m, int n, cudaStream_t stream);

/// A gated MLP's activation on its FP8 gate/up product, ready for the down projection: per token t, the gate and up
/// halves of gate_up (a product of codes not yet scaled, as Gemm::product_fp8 leaves it) scaled by x_scale[t] and
/// w_scale (no bias), act(gate) * up (SiLU, or with gelu_tanh GELU-tanh) rounded to bf16, and that row quantised into
/// q and scale: the codes and scales of scale_fp8_product, silu_and_mul (or gelu_tanh_and_mul) and quantize_rows_fp8
/// in sequence, in one pass that never writes the bf16 row (it stays in shared memory). scale may alias x_scale.
/// inter a positive multiple of 8 of at most 116,224 (a row in 227 KB); gate_up, w_scale 16-byte and q 8-byte
/// aligned.
cudaError_t act_and_mul_fp8(uint8_t* q,             // [tokens][inter]
                            float* scale,           // [tokens]
                            const bf16* gate_up,    // [tokens][2 * inter]: gate, then up
                            const float* x_scale,   // [tokens]
                            const float* w_scale,   // [2 * inter]
                            int tokens, int inter, bool gelu_tanh, cudaStream_t stream);

}  // namespace paged::cuda
