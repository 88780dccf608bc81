// Linear layers of one token (one-stream decode) with the row operation after them fused in: y = x * W^T stored
// (+ bias), added to the residual stream, or gated by SiLU-and-mul. The weights are streamed once in 16-byte vectors
// at the weight-read bandwidth (4.1-4.3 TB/s on the H200 for the Llama-3-8B projections, where cuBLASLt reaches
// 2.8-4.1 at one row), and one launch replaces two (GEMM, then add / activation). From two rows on, cuBLASLt's
// tensor-core GEMMs were faster in the same measurement (tools/bench_cuda_runner ops --batch 2), so the runner takes
// this path for single-token steps only. It is launched with programmatic dependent launch: it starts reading weights
// while the previous kernel finishes.
// The rounding points are those of the unfused sequence (bf16 product, bf16 sum), so only the float32 summation
// order differs from Gemm::linear followed by add_rms_norm's add or silu_and_mul.
// CPU twins: cpu::linear followed by the add or cpu::silu_and_mul (tests/gpu/test_gemv.cpp).
#pragma once

#include "kernels/cuda/launch.h"

namespace paged::cuda {

enum class GemvOutput {
  kStore,          // y[c] = p[c] + bias[c]
  kAddToResidual,  // y[c] = y[c] + bf16(p[c]): y is the residual stream, updated in place
  kSiluMul,        // y[c] = silu(bf16(p[c])) * bf16(p[c + n/2]) for c < n/2: W holds gate rows, then up rows
};

struct GemvArgs {
  const bf16* x = nullptr;            // [k]
  const bf16* w = nullptr;            // [n][k]
  const bf16* bias = nullptr;         // [n] or nullptr; kStore only
  bf16* y = nullptr;                  // [n], or [n/2] with kSiluMul; may not alias x
  int n = 0, k = 0;
  GemvOutput output = GemvOutput::kStore;
};

/// Enqueues the product on `stream`. n and k positive multiples of 8 (n of 16 with kSiluMul); x and w 16-byte
/// aligned. Anything else returns cudaErrorInvalidValue with a message (describe_launch_error).
cudaError_t gemv(const GemvArgs& args, cudaStream_t stream);

}  // namespace paged::cuda
