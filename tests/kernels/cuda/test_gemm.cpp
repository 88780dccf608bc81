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
