// Gemm::linear (cuBLASLt) against cpu::linear: decode- and prefill-sized m, with and without bias, bf16 and
// float32 outputs.
#include "kernels/cpu/ops.h"
#include "kernels/cuda/gemm.h"
#include "tests/kernels/cuda/gpu_test_util.h"

using namespace paged;
using namespace paged::gpu_test;

TEST_CASE("Gemm::linear matches cpu::linear", "[gpu][gemm]") {
  require_device();
  std::mt19937 rng(9);
  cuda::Gemm gemm;
  const std::vector<int> ms = quick_mode() ? std::vector<int>{1, 64} : std::vector<int>{1, 7, 64, 300};
  for (const int m : ms) {
    for (const auto& [n, k] : {std::pair{256, 512}, std::pair{1024, 1024}, std::pair{136, 64}}) {
      const auto x = random_bf16_values(rng, static_cast<size_t>(m) * k);
      const auto w = random_bf16_values(rng, static_cast<size_t>(n) * k, 0.05f);
      const auto bias = random_bf16_values(rng, n);
      DeviceArray<bf16> d_x(to_bf16(x)), d_w(to_bf16(w)), d_b(to_bf16(bias)), d_y(static_cast<size_t>(m) * n);
      DeviceArray<float> d_y32(static_cast<size_t>(m) * n);
      std::vector<float> ref(static_cast<size_t>(m) * n);
      INFO("m " << m << " n " << n << " k " << k);

      cpu::linear(ref.data(), x.data(), w.data(), bias.data(), m, n, k);
      CUDA_REQUIRE(gemm.linear(d_y.get(), d_x.get(), d_w.get(), d_b.get(), m, n, k, false, nullptr));
      check_close(to_float(d_y.download()), ref, "bf16 out, bias");

      cpu::linear(ref.data(), x.data(), w.data(), nullptr, m, n, k);
      CUDA_REQUIRE(gemm.linear(d_y32.get(), d_x.get(), d_w.get(), nullptr, m, n, k, true, nullptr));
      // float32 output of identical inputs: only the summation order differs.
      check_close(d_y32.download(), ref, "f32 out", 1e-5, 1e-5);
    }
  }
}

TEST_CASE("Gemm::tune_linear plans a shape over several weights; its products still match cpu::linear",
          "[gpu][gemm]") {
  require_device();
  std::mt19937 rng(11);
  cuda::Gemm gemm;
  const int m = 96, n = 512, k = 256;
  const auto x = random_bf16_values(rng, static_cast<size_t>(m) * k);
  const auto bias = random_bf16_values(rng, n);
  std::vector<std::vector<float>> ws;
  for (int i = 0; i < 3; ++i) ws.push_back(random_bf16_values(rng, static_cast<size_t>(n) * k, 0.05f));
  DeviceArray<bf16> d_w0(to_bf16(ws[0])), d_w1(to_bf16(ws[1])), d_w2(to_bf16(ws[2]));
  const std::vector<const bf16*> ptrs{d_w0.get(), d_w1.get(), d_w2.get()};
  DeviceArray<bf16> d_x(to_bf16(x)), d_b(to_bf16(bias)), d_y(static_cast<size_t>(m) * n);
  DeviceArray<float> d_y32(static_cast<size_t>(m) * n);
  CUDA_REQUIRE(gemm.tune_linear(d_y.get(), d_x.get(), ptrs, d_b.get(), m, n, k, false, nullptr));
  CUDA_REQUIRE(gemm.tune_linear(d_y32.get(), d_x.get(), ptrs, nullptr, m, n, k, true, nullptr));
  // Tuning again replaces the plan.
  CUDA_REQUIRE(gemm.tune_linear(d_y32.get(), d_x.get(), ptrs, nullptr, m, n, k, true, nullptr));
  std::vector<float> ref(static_cast<size_t>(m) * n);
  for (int i = 0; i < 3; ++i) {
    INFO("weight " << i);
    cpu::linear(ref.data(), x.data(), ws[i].data(), bias.data(), m, n, k);
    CUDA_REQUIRE(gemm.linear(d_y.get(), d_x.get(), ptrs[i], d_b.get(), m, n, k, false, nullptr));
    check_close(to_float(d_y.download()), ref, "bf16 out, bias");
    cpu::linear(ref.data(), x.data(), ws[i].data(), nullptr, m, n, k);
    CUDA_REQUIRE(gemm.linear(d_y32.get(), d_x.get(), ptrs[i], nullptr, m, n, k, true, nullptr));
    check_close(d_y32.download(), ref, "f32 out", 1e-5, 1e-5);
  }
  const cudaError_t bad = gemm.tune_linear(d_y.get(), d_x.get(), ptrs, nullptr, m, n, k + 4, false, nullptr);
  CHECK(bad == cudaErrorInvalidValue);
  CHECK(cuda::describe_launch_error(bad).find("multiples of 8") != std::string::npos);
}

TEST_CASE("Gemm's tuned plan of a narrow product over a long k (split over k by cuBLASLt) matches cpu::linear",
          "[gpu][gemm]") {
  require_device();
  std::mt19937 rng(13);
  // 16 x 128 outputs are one tile: cuBLASLt splits k (16,384) so that more than one SM works on it (12 parts on an
  // H100), its partial sums added in float.
  const int m = 16, n = 128, k = 16384;
  const auto x = random_bf16_values(rng, static_cast<size_t>(m) * k);
  const auto w = random_bf16_values(rng, static_cast<size_t>(n) * k, 0.05f);
  DeviceArray<bf16> d_x(to_bf16(x)), d_w(to_bf16(w)), d_y(static_cast<size_t>(m) * n);
  DeviceArray<float> d_y32(static_cast<size_t>(m) * n);
  std::vector<float> ref(static_cast<size_t>(m) * n);
  cpu::linear(ref.data(), x.data(), w.data(), nullptr, m, n, k);
  cuda::Gemm gemm;
  CHECK(gemm.plan_splits(m, n, k, false, false) == 0);
  const std::vector<const bf16*> ptrs{d_w.get()};
  CUDA_REQUIRE(gemm.tune_linear(d_y.get(), d_x.get(), ptrs, nullptr, m, n, k, false, nullptr));
  CUDA_REQUIRE(gemm.tune_linear(d_y32.get(), d_x.get(), ptrs, nullptr, m, n, k, true, nullptr));
  INFO("the bf16 plan takes " << gemm.plan_splits(m, n, k, false, false) << " parts, the float32 one "
                              << gemm.plan_splits(m, n, k, true, false));
  CHECK(gemm.plan_splits(m, n, k, false, false) >= 1);
  CHECK(gemm.plan_splits(m, n, k, true, false) >= 1);
  CUDA_REQUIRE(gemm.linear(d_y.get(), d_x.get(), d_w.get(), nullptr, m, n, k, false, nullptr));
  check_close(to_float(d_y.download()), ref, "bf16 out");
  CUDA_REQUIRE(gemm.linear(d_y32.get(), d_x.get(), d_w.get(), nullptr, m, n, k, true, nullptr));
  check_close(d_y32.download(), ref, "f32 out", 1e-4, 1e-4);
}
