// bf16 matrix products through cuBLASLt: the Linear layers of the model (x * W^T, HF layout), float32 accumulation.
// CPU twin: paged::cpu::linear (kernels/cpu/ops.h).
#pragma once

#include <cublasLt.h>

#include <compare>
#include <cstdint>
#include <cstddef>
#include <map>
#include <span>

#include "kernels/cuda/launch.h"

namespace paged::cuda {

/// How a Gemm picks the algorithm of a new shape: for m <= max_rows it times up to `candidates` of cuBLASLt's
/// heuristic choices and keeps the fastest; above, or with candidates <= 1, it takes the heuristic's first.
/// sm_count_target > 0 asks cuBLASLt for kernels that use that many SMs (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET), so
/// that a kernel on another stream runs beside them: its kernels otherwise take every SM.
struct GemmTuning {
  int max_rows = 64;
  int candidates = 8;
  int sm_count_target = 0;
};

/// One cuBLASLt handle, its workspace and the plans (descriptors + chosen algorithm) of every shape seen so far.
/// Not thread-safe: one owner (the executor) at a time. A plan is made on first use of a shape; for decode-sized
/// products (m <= tuning.max_rows) it times cuBLASLt's candidate algorithms on the call's own buffers and keeps the
/// fastest (the heuristic's first choice leaves up to a fifth of the bandwidth unused there), which synchronises
/// the stream once; under CUDA graph capture it takes the heuristic's choice. tune_linear / tune_product_fp8 plan a
/// shape ahead of its first use over many weights (a runner's decode buckets at start-up, at any m). Replaying a
/// captured linear() is fine (the workspace is fixed, cuBLASLt allocates nothing).
class Gemm {
 public:
  /// Creates the handle and a device workspace of `workspace_bytes` on the current device; throws
  /// std::runtime_error when CUDA or cuBLAS fails.
  explicit Gemm(size_t workspace_bytes = size_t{32} << 20, GemmTuning tuning = {});
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  /// y = x * w^T (+ bias), enqueued on `stream`. y is bf16, or float32 when y_f32 (the LM head's logits);
  /// bias only with a bf16 y. All pointers 16-byte aligned; k and n multiples of 8.
  /// A cuBLAS failure returns cudaErrorUnknown with the cuBLAS status in describe_launch_error().
  cudaError_t linear(void* y,            // [m][n] bf16, or float32 when y_f32
                     const bf16* x,      // [m][k]
                     const bf16* w,      // [n][k]
                     const bf16* bias,   // [n] or nullptr
                     int m, int n, int k, bool y_f32, cudaStream_t stream);

  /// y += x * w^T, y bf16: the float32 sums added to y's values and rounded once (cuBLASLt's beta 1), for the
  /// LoRA expand (cuda::add_lora). Same requirements as linear; the plan is cuBLASLt's heuristic choice (candidates
  /// cannot be timed on y without adding to it).
  cudaError_t linear_add(bf16* y, const bf16* x, const bf16* w, int m, int n, int k, cudaStream_t stream);
  /// y = (x * x_scale) (w * w_scale)^T (+ bias) from e4m3 operands quantised per row (cuda::quantize_rows_fp8): the
  /// FP8 tensor-core product of the codes, rounded to bf16 (product_fp8), then scaled per row of x and of w
  /// (scale_fp8_product). n and k multiples of 16; x, w 16-byte aligned. CPU twin: cpu::linear_fp8 (kernels/cpu/fp8.h).
  cudaError_t linear_fp8(bf16* y,                // [m][n]
                         const uint8_t* x,       // [m][k] e4m3
                         const float* x_scale,   // [m]
                         const uint8_t* w,       // [n][k] e4m3
                         const float* w_scale,   // [n]
                         const bf16* bias,       // [n] or nullptr
                         int m, int n, int k, cudaStream_t stream);

  /// y = x * w^T of the e4m3 codes alone, rounded to bf16: linear_fp8 without its scale pass, for a consumer that
  /// applies the scales itself (cuda::act_and_mul_fp8). Same requirements.
  cudaError_t product_fp8(bf16* y,           // [m][n]
                          const uint8_t* x,  // [m][k] e4m3
                          const uint8_t* w,  // [n][k] e4m3
                          int m, int n, int k, cudaStream_t stream);

  /// Plans linear(y, x, w, bias, m, n, k, y_f32) for every w of the shape ahead of its first use, whatever m:
  /// cuBLASLt's first tuning.candidates algorithms each run over `weights` in turn (a warm-up pass, then timed ones;
  /// weights that do not fit in L2 together time what a step walking its layers sees, not a product served from
  /// L2) and the fastest is kept (replacing the shape's plan if it had one). Synchronises the stream. The products
  /// overwrite y; x is read.
  cudaError_t tune_linear(void* y, const bf16* x, std::span<const bf16* const> weights, const bf16* bias, int m, int n,
                          int k, bool y_f32, cudaStream_t stream);
  /// The same for product_fp8.
  cudaError_t tune_product_fp8(bf16* y, const uint8_t* x, std::span<const uint8_t* const> weights, int m, int n, int k,
                               cudaStream_t stream);
  /// The number of K parts of the plan of linear(y, x, w, bias, m, n, k, y_f32) (1: not split; cuBLASLt's own
  /// choice, e.g. 12 for 16 x 128 outputs over k 16,384 on an H100), 0 before the shape has a plan.
  int plan_splits(int m, int n, int k, bool y_f32, bool bias) const;

 private:
  struct Key {
    int m, n, k;
    bool y_f32, bias, fp8, accumulate;  // accumulate: y += the product (beta 1)
    auto operator<=>(const Key&) const = default;
  };
  /// The pointers one product reads besides its operands (they change per call; the plan does not).
  struct Extras {
    const bf16* bias = nullptr;
  };
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t w = nullptr, x = nullptr, y = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  // Makes key's descriptors and picks its algorithm: cuBLASLt's first choice, or with `timed` the fastest of its
  // first tuning.candidates over `weights` in turn (not under graph capture).
  cudaError_t plan(const Key& key, Plan& out, void* y, const void* x, std::span<const void* const> weights,
                   const Extras& extras, bool timed, cudaStream_t stream);
  static void destroy(Plan& p);
  // A timed plan of `key` over `weights`, replacing the shape's plan.
  cudaError_t tune(const Key& key, void* y, const void* x, std::span<const void* const> weights, const Extras& extras,
                   cudaStream_t stream);
  // Sets the per-call pointers of `extras` on the plan's descriptor.
  static void set_extras(Plan& p, const Key& key, const Extras& extras);
  // The plan of `key` (made on first use), then y = the product, enqueued.
  cudaError_t run(const Key& key, void* y, const void* x, const void* w, const Extras& extras, cudaStream_t stream);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  GemmTuning tuning_;
  std::map<Key, Plan> plans_;
};

}  // namespace paged::cuda
