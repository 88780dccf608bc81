// Helpers of the GPU tests: device buffers, bf16 rounding of host data, seeded random inputs and the normalised
// error measures every kernel test compares with.
#pragma once

#include <catch2/catch.hpp>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/launch.h"

namespace paged::gpu_test {

using cuda::bf16;

/// REQUIREs success of a CUDA call or launcher, printing the launcher's reason on failure.
#define CUDA_REQUIRE(expr)                                                  \
  do {                                                                      \
    const cudaError_t cuda_require_status = (expr);                         \
    INFO(#expr << ": " << ::paged::cuda::describe_launch_error(cuda_require_status)); \
    REQUIRE(cuda_require_status == cudaSuccess);                            \
  } while (0)

/// PAGED_GPU_TESTS_QUICK=1 (the sanitizer runs): the same cases over smaller vocabularies and contexts.
inline bool quick_mode() {
  const char* v = std::getenv("PAGED_GPU_TESTS_QUICK");
  return v != nullptr && std::string(v) == "1";
}

/// A trained checkpoint of the shared test data ("stories-distill-9M"): $PAGED_GPU_MODELS/<name>, which
/// tools/gpu/run_gpu_checks.sh sets to its binaries' folder; empty when absent (the caller skips with a WARN).
inline std::string trained_model_dir(const std::string& name) {
  const char* dir = std::getenv("PAGED_GPU_MODELS");
  if (dir == nullptr || *dir == '\0') return "";
  const std::string path = std::string(dir) + "/" + name;
  return std::ifstream(path + "/config.json") ? path : "";
}

/// The checkpoints the runner tests run on that are present: the trained Llama (trained_model_dir
/// "stories-distill-9M": long contexts, GQA) and the tiny Gemma 3 of tests/models (sliding layers, post norms); a WARN
/// names an absent one.
inline std::vector<std::string> runner_test_models() {
  std::vector<std::string> dirs;
  const std::string llama = trained_model_dir("stories-distill-9M");
  if (llama.empty())
    WARN("skipped stories-distill-9M: it needs $PAGED_GPU_MODELS (tools/gpu/run_gpu_checks.sh)");
  else
    dirs.push_back(llama);
  const std::string gemma = std::string(PAGED_SOURCE_DIR) + "/tests/models/gemma3";
  if (std::ifstream(gemma + "/config.json"))
    dirs.push_back(gemma);
  else
    WARN("skipped the tiny Gemma 3: " << gemma << " is absent");
  return dirs;
}

/// Fails the test unless a CUDA device is present (the gpu label keeps this binary off machines without one).
inline void require_device() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  INFO("cudaGetDeviceCount: " << cudaGetErrorString(e));
  REQUIRE(e == cudaSuccess);
  REQUIRE(n > 0);
}

/// A device array of n elements; freed with the object.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    void* p = nullptr;
    CUDA_REQUIRE(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
    ptr_ = static_cast<T*>(p);
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return ptr_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    REQUIRE(host.size() == n_);
    CUDA_REQUIRE(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    CUDA_REQUIRE(cudaDeviceSynchronize());
    CUDA_REQUIRE(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

inline float round_bf16(float x) { return __bfloat162float(__float2bfloat16(x)); }

inline std::vector<bf16> to_bf16(const std::vector<float>& x) {
  std::vector<bf16> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = __float2bfloat16(x[i]);
  return out;
}

inline std::vector<float> to_float(const std::vector<bf16>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = __bfloat162float(x[i]);
  return out;
}

/// n normal(0, stddev) values already rounded to bf16, so that the CPU twin sees exactly the GPU's inputs.
inline std::vector<float> random_bf16_values(std::mt19937& rng, size_t n, float stddev = 1.0f) {
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> out(n);
  for (auto& x : out) x = round_bf16(dist(rng));
  return out;
}

/// RoPE frequencies of Llama-3's style: base^(-2i/d), the low frequencies divided by 8 (any float32 table would do:
/// the kernels take inv_freq as given).
inline std::vector<float> test_inv_freq(int rotary_dim) {
  std::vector<float> f(rotary_dim / 2);
  for (int i = 0; i < rotary_dim / 2; ++i) {
    const double base = std::pow(500000.0, -2.0 * i / rotary_dim);
    f[i] = static_cast<float>(i >= rotary_dim / 4 ? base / 8.0 : base);
  }
  return f;
}

/// sqrt(sum (a - b)^2 / sum b^2): the relative L2 error of `got` against the reference.
inline double relative_l2(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (static_cast<double>(got[i]) - ref[i]) * (static_cast<double>(got[i]) - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

/// max |a - b| / max |b|: the worst element, normalised by the reference's scale.
inline double max_normalised(const std::vector<float>& got, const std::vector<float>& ref) {
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(got[i]) - ref[i]));
    scale = std::max(scale, std::abs(static_cast<double>(ref[i])));
  }
  return scale > 0 ? worst / scale : worst;
}

/// Error bounds for bf16 results computed in float32: the output rounding alone gives a relative L2 error of
/// about 2^-9 / sqrt(3) ~ 1e-3; a kernel that mixes up elements gives errors of order 1.
constexpr double kBf16RelL2 = 6e-3;
constexpr double kBf16MaxNorm = 2e-2;

inline void check_close(const std::vector<float>& got, const std::vector<float>& ref, const std::string& what,
                        double rel_l2 = kBf16RelL2, double max_norm = kBf16MaxNorm) {
  REQUIRE(got.size() == ref.size());
  bool finite = true;
  for (float x : got) finite = finite && std::isfinite(x);
  const double l2 = relative_l2(got, ref), mx = max_normalised(got, ref);
  INFO(what << ": relative L2 " << l2 << ", max normalised " << mx);
  CHECK(finite);
  CHECK(l2 <= rel_l2);
  CHECK(mx <= max_norm);
}

}  // namespace paged::gpu_test
