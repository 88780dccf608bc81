// Decode-sized linear layers (at most kGemvMaxRows input rows) with the row operation after them fused in:
// y = x * W^T stored (+ bias), added to the residual stream, or gated by SiLU-and-mul. The weights are streamed once
// in 16-byte vectors for all input rows, so the kernel runs at the weight-read bandwidth, and one launch replaces
// two (GEMM, then add / activation). It is launched with programmatic dependent launch: it starts reading weights
// while the previous kernel finishes.
// The rounding points are those of the unfused sequence (bf16 product, bf16 sum), so only the float32 summation
// order differs from Gemm::linear followed by add_rms_norm's add or silu_and_mul.
// CPU twins: cpu::linear followed by the add or cpu::silu_and_mul (tests/gpu/test_gemv.cpp).
#pragma once

#include "kernels/cuda/launch.h"

namespace paged::cuda {

/// The most input rows gemv() takes: beyond it cuBLASLt's tensor-core GEMMs win.
inline constexpr int kGemvMaxRows = 4;

enum class GemvOutput {
  kStore,          // y[r][c] = p + bias[c]
  kAddToResidual,  // y[r][c] = y[r][c] + bf16(p): y is the residual stream, updated in place
  kSiluMul,        // y[r][c] = silu(bf16(p[c])) * bf16(p[c + n/2]) for c < n/2: W holds gate rows, then up rows
};

struct GemvArgs {
  const bf16* x = nullptr;            // [m][k]
  const bf16* w = nullptr;            // [n][k]
  const bf16* bias = nullptr;         // [n] or nullptr; kStore only
  bf16* y = nullptr;                  // [m][n], or [m][n/2] with kSiluMul; may not alias x
  int m = 0, n = 0, k = 0;
  GemvOutput output = GemvOutput::kStore;
};

/// Enqueues the product on `stream`. m in [1, kGemvMaxRows]; n and k multiples of 8 (n of 16 with kSiluMul);
/// x and w 16-byte aligned. Anything else returns cudaErrorInvalidValue with a message
/// (describe_launch_error).
cudaError_t gemv(const GemvArgs& args, cudaStream_t stream);

}  // namespace paged::cuda
