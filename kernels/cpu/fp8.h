// FP8 (OCP e4m3, "e4m3fn": 1 sign, 4 exponent bits of bias 7, 3 mantissa bits, no infinities, largest finite 448) on
// the CPU: the reference the CUDA FP8 kernels are tested against (kernels/cuda/fp8.h), bit for bit where they round
// the same. Rows are quantised with one float32 scale each (absmax / 448): weights per output channel, activations
// per token.
#pragma once

#include <cstdint>

#include "model/loader/safetensors.h"

namespace paged::cpu {

constexpr float kFp8Max = 448.0f;

/// `x` rounded to the nearest e4m3 value, ties to even, saturated to +-448 (CUDA's cvt.rn.satfinite); NaN stays NaN.
uint8_t float_to_e4m3(float x);
/// The value of e4m3 code `v` (0x7f / 0xff: NaN): the loader's decoding, which FP8 checkpoints go through too.
using paged::e4m3_to_float;

/// Each row of x as e4m3 codes and a scale: scale[r] = absmax(row) / 448 (1 for a zero row), q = e4m3(x * (448 /
/// absmax)), so that q * scale ~ x.
void quantize_rows_fp8(const float* x,  // [rows][cols]
                       int64_t rows, int cols,
                       uint8_t* q,      // [rows][cols]
                       float* scale);   // [rows]

/// Each row of x replaced by its quantised value, e4m3(x * (448 / absmax)) * absmax / 448: FP8's rounding, in
/// float32 (the CPU runner's emulation of --quantization fp8).
void fake_quantize_rows_fp8(float* x,  // [rows][cols], in place
                            int64_t rows, int cols);

/// out = (xq * scale_x) (wq * scale_w)^T, the product of two row-quantised matrices, summed in float32 (every
/// product of two e4m3 values is exact), then scaled by scale_x[m] * scale_w[n] (+ bias).
void linear_fp8(float* out,            // [m][n]
                const uint8_t* xq,     // [m][k]
                const float* scale_x,  // [m]
                const uint8_t* wq,     // [n][k]
                const float* scale_w,  // [n]
                const float* bias,     // [n] or nullptr
                int m, int n, int k);

}  // namespace paged::cpu
