#include "kernels/cuda/gemm.h"

#include "kernels/cuda/fp8.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace paged::cuda {

namespace {

cudaError_t cublas_failure(const char* call, cublasStatus_t status) {
  return launch_failure(cudaErrorUnknown, std::string(call) + ": " + cublasGetStatusString(status));
}

// Why a shape cannot be taken (n and k multiples of `multiple`; a bias only with a bf16 output), or cudaSuccess.
cudaError_t shape_error(const char* call, int n, int k, int multiple, bool bias = false, bool y_f32 = false) {
  if (n % multiple == 0 && k % multiple == 0 && !(bias && y_f32)) return cudaSuccess;
  return launch_failure(cudaErrorInvalidValue, std::string(call) + ": n " + std::to_string(n) + " and k " +
                                                   std::to_string(k) + " must be multiples of " +
                                                   std::to_string(multiple) + "; a bias needs a bf16 output");
}

}  // namespace

Gemm::Gemm(size_t workspace_bytes, GemmTuning tuning) : workspace_bytes_(workspace_bytes), tuning_(tuning) {
  if (cublasStatus_t s = cublasLtCreate(&handle_); s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cublasLtCreate: ") + cublasGetStatusString(s));
  if (cudaError_t e = cudaMalloc(&workspace_, workspace_bytes_); e != cudaSuccess) {
    cublasLtDestroy(handle_);
    throw std::runtime_error(std::string("cuBLASLt workspace: ") + cudaGetErrorString(e));
  }
}

Gemm::~Gemm() {
  for (auto& [key, p] : plans_) destroy(p);
  cudaFree(workspace_);
  cublasLtDestroy(handle_);
}

// cuBLASLt is column-major. Row-major y[m][n] is column-major y^T (n x m), and
// y^T = W * x^T where row-major W[n][k] is the column-major k x n matrix W^T (hence TRANSA = T) and row-major
// x[m][k] is the column-major k x m matrix x^T (TRANSB = N). That is also the "TN" layout FP8 products require; their
// scale vectors have the rows of op(A) (W's n rows) and the columns of B (x's m rows).
cudaError_t Gemm::plan(const Key& key, Plan& p, void* y, const void* x, std::span<const void* const> weights,
                       const Extras& extras, bool timed, cudaStream_t stream) {
  const cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  const cudaDataType_t scale_type = CUDA_R_32F, y_type = key.y_f32 ? CUDA_R_32F : CUDA_R_16BF;
  const cudaDataType_t in_type = key.fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  cublasStatus_t s = cublasLtMatmulDescCreate(&p.op, compute, scale_type);
  if (s != CUBLAS_STATUS_SUCCESS) return cublas_failure("cublasLtMatmulDescCreate", s);
  const cublasOperation_t trans_w = CUBLAS_OP_T, trans_x = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_w, sizeof trans_w);
  cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_x, sizeof trans_x);
  if (key.fp8) {
    // FP8 products accumulate over the whole k in the tensor cores' own accumulator, without cuBLASLt's periodic
    // promotion to float32 (what vLLM's CUTLASS FP8 kernels and TensorRT-LLM run).
    const int8_t fast = 1;
    cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast);
  }
  if (tuning_.sm_count_target > 0)
    cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &tuning_.sm_count_target,
                                   sizeof tuning_.sm_count_target);
  if (key.bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bias_type = CUDA_R_16BF;
    cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue);
    cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type);
  }
  if ((s = cublasLtMatrixLayoutCreate(&p.w, in_type, key.k, key.n, key.k)) != CUBLAS_STATUS_SUCCESS ||
      (s = cublasLtMatrixLayoutCreate(&p.x, in_type, key.k, key.m, key.k)) != CUBLAS_STATUS_SUCCESS ||
      (s = cublasLtMatrixLayoutCreate(&p.y, y_type, key.n, key.m, key.n)) != CUBLAS_STATUS_SUCCESS)
    return cublas_failure("cublasLtMatrixLayoutCreate", s);

  cublasLtMatmulPreference_t pref = nullptr;
  if ((s = cublasLtMatmulPreferenceCreate(&pref)) != CUBLAS_STATUS_SUCCESS)
    return cublas_failure("cublasLtMatmulPreferenceCreate", s);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                       sizeof workspace_bytes_);
  // Callers pass 16-byte aligned sub-buffers (e.g. one layer's slice of a weight arena), not only the 256-byte
  // aligned starts of allocations that the default preference assumes.
  const uint32_t alignment = 16;
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    cublasLtMatmulPreferenceSetAttribute(pref, attr, &alignment, sizeof alignment);
  if (key.accumulate) {
    // Split-K partial sums in float only: reduced in place or in the output type, they would be added to y in bf16
    // one part at a time (several roundings where linear_add promises one).
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes);
  }
  // Candidates cannot be timed on an accumulating y without adding to it.
  timed = timed && !key.accumulate && !weights.empty();
  const int wanted = timed ? std::max(1, tuning_.candidates) : 1;
  std::vector<cublasLtMatmulHeuristicResult_t> results(wanted);
  int found = 0;
  s = cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.w, p.x, p.y, p.y, pref, wanted, results.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (s != CUBLAS_STATUS_SUCCESS) return cublas_failure("cublasLtMatmulAlgoGetHeuristic", s);
  if (found == 0) return cublas_failure("cublasLtMatmulAlgoGetHeuristic (no algorithm)", CUBLAS_STATUS_NOT_SUPPORTED);
  p.algo = results[0].algo;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaError_t e = cudaStreamIsCapturing(stream, &capture); e != cudaSuccess) return e;
  if (found == 1 || capture != cudaStreamCaptureStatusNone) return cudaSuccess;

  // Each candidate runs over the weights in turn: a warm-up pass (which also skips a candidate that fails to launch),
  // then passes timed together, at least kTimedRuns products (every product only overwrites y).
  set_extras(p, key, extras);
  constexpr size_t kTimedRuns = 4;
  const size_t passes = (kTimedRuns + weights.size() - 1) / weights.size();
  cudaEvent_t start = nullptr, stop = nullptr;
  if (cudaError_t e = cudaEventCreate(&start); e != cudaSuccess) return e;
  if (cudaError_t e = cudaEventCreate(&stop); e != cudaSuccess) {
    cudaEventDestroy(start);
    return e;
  }
  const float alpha = 1.0f, beta = 0.0f;
  float best_ms = 0.f;
  bool have_best = false;
  for (int i = 0; i < found; ++i) {
    auto pass = [&] {
      for (const void* w : weights)
        if (cublasLtMatmul(handle_, p.op, &alpha, w, p.w, x, p.x, &beta, y, p.y, y, p.y, &results[i].algo,
                           workspace_, workspace_bytes_, stream) != CUBLAS_STATUS_SUCCESS)
          return false;
      return true;
    };
    if (!pass()) continue;
    bool ok = cudaEventRecord(start, stream) == cudaSuccess;
    for (size_t r = 0; r < passes && ok; ++r) ok = pass();
    ok = ok && cudaEventRecord(stop, stream) == cudaSuccess && cudaEventSynchronize(stop) == cudaSuccess;
    float ms = 0.f;
    if (!ok || cudaEventElapsedTime(&ms, start, stop) != cudaSuccess) continue;
    if (!have_best || ms < best_ms) {
      best_ms = ms;
      have_best = true;
      p.algo = results[i].algo;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGetLastError();  // a failed candidate must not leave its error for the next launcher to report
  return cudaSuccess;
}

int Gemm::plan_splits(int m, int n, int k, bool y_f32, bool bias) const {
  const auto it = plans_.find({m, n, k, y_f32, bias, false, false});
  if (it == plans_.end()) return 0;
  int32_t splits = 1;
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&it->second.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits,
                                       &written);
  return splits;
}

void Gemm::destroy(Plan& p) {
  if (p.w) cublasLtMatrixLayoutDestroy(p.w);
  if (p.x) cublasLtMatrixLayoutDestroy(p.x);
  if (p.y) cublasLtMatrixLayoutDestroy(p.y);
  if (p.op) cublasLtMatmulDescDestroy(p.op);
  p = {};
}

void Gemm::set_extras(Plan& p, const Key& key, const Extras& extras) {
  if (key.bias)  // the pointer changes per layer; the plan does not
    cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &extras.bias, sizeof extras.bias);
}

cudaError_t Gemm::run(const Key& key, void* y, const void* x, const void* w, const Extras& extras,
                      cudaStream_t stream) {
  auto it = plans_.find(key);
  if (it == plans_.end()) {
    Plan p;
    const bool timed = key.m <= tuning_.max_rows;
    if (cudaError_t e = plan(key, p, y, x, std::span<const void* const>(&w, 1), extras, timed, stream);
        e != cudaSuccess) {
      destroy(p);
      return e;
    }
    it = plans_.emplace(key, p).first;
  }
  Plan& p = it->second;
  set_extras(p, key, extras);
  const float alpha = 1.0f, beta = key.accumulate ? 1.0f : 0.0f;
  const cublasStatus_t s = cublasLtMatmul(handle_, p.op, &alpha, w, p.w, x, p.x, &beta, y, p.y, y, p.y, &p.algo,
                                          workspace_, workspace_bytes_, stream);
  if (s != CUBLAS_STATUS_SUCCESS) return cublas_failure("cublasLtMatmul", s);
  return cudaSuccess;
}

cudaError_t Gemm::tune(const Key& key, void* y, const void* x, std::span<const void* const> weights,
                       const Extras& extras, cudaStream_t stream) {
  if (key.m <= 0 || weights.empty()) return cudaSuccess;
  Plan p;
  if (cudaError_t e = plan(key, p, y, x, weights, extras, true, stream); e != cudaSuccess) {
    destroy(p);
    return e;
  }
  if (auto it = plans_.find(key); it != plans_.end()) {
    destroy(it->second);
    it->second = p;
  } else {
    plans_.emplace(key, p);
  }
  return cudaSuccess;
}

cudaError_t Gemm::linear(void* y, const bf16* x, const bf16* w, const bf16* bias, int m, int n, int k, bool y_f32,
                         cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  if (cudaError_t e = shape_error("Gemm::linear", n, k, 8, bias, y_f32); e != cudaSuccess) return e;
  return run({m, n, k, y_f32, bias != nullptr, false, false}, y, x, w, {.bias = bias}, stream);
}

cudaError_t Gemm::linear_add(bf16* y, const bf16* x, const bf16* w, int m, int n, int k, cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  if (cudaError_t e = shape_error("Gemm::linear_add", n, k, 8); e != cudaSuccess) return e;
  return run({m, n, k, false, false, false, true}, y, x, w, {}, stream);
}

cudaError_t Gemm::linear_fp8(bf16* y, const uint8_t* x, const float* x_scale, const uint8_t* w, const float* w_scale,
                             const bf16* bias, int m, int n, int k, cudaStream_t stream) {
  if (m > 0 && (!x_scale || !w_scale))
    return launch_failure(cudaErrorInvalidValue, "Gemm::linear_fp8: both scale vectors are needed");
  // The product of the codes (cuBLASLt 13.1 on the H200 found no algorithm for its outer-vector scale mode with these
  // operands), then the scales and the bias in one pass over y.
  if (cudaError_t e = product_fp8(y, x, w, m, n, k, stream); e != cudaSuccess || m <= 0) return e;
  return scale_fp8_product(y, x_scale, w_scale, bias, m, n, stream);
}

cudaError_t Gemm::product_fp8(bf16* y, const uint8_t* x, const uint8_t* w, int m, int n, int k, cudaStream_t stream) {
  if (m <= 0) return cudaSuccess;
  if (cudaError_t e = shape_error("Gemm::product_fp8", n, k, 16); e != cudaSuccess) return e;
  return run({m, n, k, false, false, true, false}, y, x, w, {}, stream);
}

cudaError_t Gemm::tune_linear(void* y, const bf16* x, std::span<const bf16* const> weights, const bf16* bias, int m,
                              int n, int k, bool y_f32, cudaStream_t stream) {
  if (cudaError_t e = shape_error("Gemm::tune_linear", n, k, 8, bias, y_f32); e != cudaSuccess) return e;
  const std::vector<const void*> ws(weights.begin(), weights.end());
  return tune({m, n, k, y_f32, bias != nullptr, false, false}, y, x, ws, {.bias = bias}, stream);
}

cudaError_t Gemm::tune_product_fp8(bf16* y, const uint8_t* x, std::span<const uint8_t* const> weights, int m, int n,
                                   int k, cudaStream_t stream) {
  if (cudaError_t e = shape_error("Gemm::tune_product_fp8", n, k, 16); e != cudaSuccess) return e;
  const std::vector<const void*> ws(weights.begin(), weights.end());
  return tune({m, n, k, false, false, true, false}, y, x, ws, {}, stream);
}

}  // namespace paged::cuda
