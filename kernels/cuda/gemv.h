// Decode-sized linear layers (at most kGemvMaxRows input rows) with their neighbouring row operations fused in:
// y = f(x) * W^T where f is the identity or RMSNorm, and the result is stored (+ bias), added to the residual stream,
// or gated by SiLU-and-mul. One warp streams each weight row once in 16-byte vectors for all input rows, so the
// kernel runs at the weight-read bandwidth, and one launch replaces two or three (norm, GEMM, add / activation).
// The rounding points are those of the unfused sequence (bf16 normalised input, bf16 product, bf16 sum), so only
// the float32 summation order differs from rms_norm -> Gemm::linear -> add_rms_norm / silu_and_mul.
// CPU twins: cpu::rms_norm, cpu::linear, cpu::silu_and_mul composed as below (tests/gpu/test_gemv.cpp).
#pragma once

#include "kernels/cuda/launch.h"

namespace paged::cuda {

/// The most input rows gemv() takes: beyond it cuBLASLt's tensor-core GEMMs win.
inline constexpr int kGemvMaxRows = 4;

enum class GemvInput {
  kPlain,    // the input row is x
  kRmsNorm,  // the input row is rms_norm(x) * norm_weight, rounded to bf16 (the rms_norm kernel's bits)
};

enum class GemvOutput {
  kStore,          // y[r][c] = p + bias[c]
  kAddToResidual,  // y[r][c] = y[r][c] + bf16(p): y is the residual stream, updated in place
  kSiluMul,        // y[r][c] = silu(bf16(p[c])) * bf16(p[c + n/2]) for c < n/2: W holds gate rows, then up rows
};

struct GemvArgs {
  const bf16* x = nullptr;            // [m][k]
  const bf16* norm_weight = nullptr;  // [k], kRmsNorm only
  float eps = 1e-5f;                  // kRmsNorm only
  const bf16* w = nullptr;            // [n][k]
  const bf16* bias = nullptr;         // [n] or nullptr; kStore only
  bf16* y = nullptr;                  // [m][n], or [m][n/2] with kSiluMul; may not alias x
  int m = 0, n = 0, k = 0;
  GemvInput input = GemvInput::kPlain;
  GemvOutput output = GemvOutput::kStore;
};

/// Enqueues the product on `stream`. m in [1, kGemvMaxRows]; n and k multiples of 8 (n of 16 with kSiluMul);
/// x, w and norm_weight 16-byte aligned. Anything else returns cudaErrorInvalidValue with a message
/// (describe_launch_error).
cudaError_t gemv(const GemvArgs& args, cudaStream_t stream);

}  // namespace paged::cuda
