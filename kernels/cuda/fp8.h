// FP8 e4m3 quantisation on the GPU: each row of a bf16 matrix as e4m3 codes and one float32 scale (absmax / 448),
// for the weights of `--quantization fp8` (per output channel, once at load) and the activations that enter their
// products (per token, every step). Gemm::linear_fp8 and the FP8 GEMV take what it makes; scale_fp8_product applies
// the two scale vectors to a product of codes.
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

}  // namespace paged::cuda
