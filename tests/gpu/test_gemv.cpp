// gemv (decode-sized linear layers with fused RMSNorm input, residual add or SiLU-and-mul output) against the CPU
// twins composed with the same bf16 rounding points: cpu::rms_norm -> cpu::linear -> add / cpu::silu_and_mul.
#include "kernels/cpu/ops.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/layer_ops.h"
#include "tests/gpu/gpu_test_util.h"

using namespace paged;
using namespace paged::gpu_test;

namespace {

std::vector<float> rounded(std::vector<float> v) {
  for (auto& x : v) x = round_bf16(x);
  return v;
}

}  // namespace

TEST_CASE("gemv matches rms_norm -> linear -> add / silu_and_mul on the CPU", "[gpu][gemv]") {
  require_device();
  std::mt19937 rng(21);
  std::vector<std::pair<int, int>> shapes = {{16, 8}, {144, 64}, {1008, 264}, {256, 4104}};
  if (!quick_mode()) shapes.insert(shapes.end(), {{6144, 4096}, {4096, 14336}});
  for (const auto& [n, k] : shapes) {
    for (int m = 1; m <= cuda::kGemvMaxRows; ++m) {
      for (const auto input : {cuda::GemvInput::kPlain, cuda::GemvInput::kRmsNorm}) {
        const bool norm = input == cuda::GemvInput::kRmsNorm;
        INFO("m " << m << " n " << n << " k " << k << (norm ? " rms_norm input" : " plain input"));
        const auto x = random_bf16_values(rng, static_cast<size_t>(m) * k, 2.0f);
        const auto w = random_bf16_values(rng, static_cast<size_t>(n) * k, 1.0f / std::sqrt(static_cast<float>(k)));
        const auto bias = random_bf16_values(rng, n);
        auto nw = random_bf16_values(rng, k, 0.3f);
        for (auto& v : nw) v = round_bf16(v + 1.0f);
        DeviceArray<bf16> d_x(to_bf16(x)), d_w(to_bf16(w)), d_b(to_bf16(bias)), d_nw(to_bf16(nw));

        std::vector<float> in = x;
        if (norm) {
          cpu::rms_norm(in.data(), x.data(), nw.data(), m, k, 1e-5f);
          in = rounded(in);
        }
        cuda::GemvArgs a;
        a.x = d_x.get();
        a.norm_weight = d_nw.get();
        a.eps = 1e-5f;
        a.w = d_w.get();
        a.m = m;
        a.n = n;
        a.k = k;
        a.input = input;

        // Store with bias.
        std::vector<float> p(static_cast<size_t>(m) * n);
        cpu::linear(p.data(), in.data(), w.data(), bias.data(), m, n, k);
        DeviceArray<bf16> d_y(p.size());
        a.y = d_y.get();
        a.bias = d_b.get();
        a.output = cuda::GemvOutput::kStore;
        CUDA_REQUIRE(cuda::gemv(a, nullptr));
        check_close(to_float(d_y.download()), p, "store + bias");

        // Residual add: residual + bf16(x W^T), in place.
        cpu::linear(p.data(), in.data(), w.data(), nullptr, m, n, k);
        const auto residual = random_bf16_values(rng, p.size());
        std::vector<float> want(p.size());
        for (size_t i = 0; i < p.size(); ++i) want[i] = round_bf16(residual[i] + round_bf16(p[i]));
        d_y.upload(to_bf16(residual));
        a.bias = nullptr;
        a.output = cuda::GemvOutput::kAddToResidual;
        CUDA_REQUIRE(cuda::gemv(a, nullptr));
        check_close(to_float(d_y.download()), want, "add to residual");

        // SiLU-and-mul of the (gate | up) halves.
        const auto p_rounded = rounded(p);
        std::vector<float> act(static_cast<size_t>(m) * n / 2);
        cpu::silu_and_mul(act.data(), p_rounded.data(), m, n / 2);
        DeviceArray<bf16> d_act(act.size());
        a.y = d_act.get();
        a.output = cuda::GemvOutput::kSiluMul;
        CUDA_REQUIRE(cuda::gemv(a, nullptr));
        check_close(to_float(d_act.download()), act, "silu_and_mul");
      }
    }
  }
}

TEST_CASE("gemv's fused RMSNorm input has the rms_norm kernel's bits", "[gpu][gemv]") {
  require_device();
  std::mt19937 rng(22);
  for (const int k : {64, 4096}) {
    const int m = 3;
    const auto x = random_bf16_values(rng, static_cast<size_t>(m) * k, 3.0f);
    auto nw = random_bf16_values(rng, k, 0.3f);
    for (auto& v : nw) v = round_bf16(v + 1.0f);
    std::vector<float> identity(static_cast<size_t>(k) * k, 0.f);
    for (int i = 0; i < k; ++i) identity[static_cast<size_t>(i) * k + i] = 1.f;
    DeviceArray<bf16> d_x(to_bf16(x)), d_nw(to_bf16(nw)), d_eye(to_bf16(identity)), d_ref(x.size()), d_y(x.size());
    CUDA_REQUIRE(cuda::rms_norm(d_ref.get(), d_x.get(), d_nw.get(), m, k, 1e-5f, nullptr));
    cuda::GemvArgs a;
    a.x = d_x.get();
    a.norm_weight = d_nw.get();
    a.w = d_eye.get();
    a.y = d_y.get();
    a.m = m;
    a.n = a.k = k;
    a.input = cuda::GemvInput::kRmsNorm;
    CUDA_REQUIRE(cuda::gemv(a, nullptr));
    // A product with the identity adds exact zeros to one exact bf16 value: the normalised input itself.
    REQUIRE(to_float(d_y.download()) == to_float(d_ref.download()));
  }
}

TEST_CASE("gemv names what it refuses", "[gpu][gemv]") {
  require_device();
  DeviceArray<bf16> buf(1024);
  cuda::GemvArgs a;
  a.x = a.w = buf.get();
  a.y = buf.get();
  a.m = cuda::kGemvMaxRows + 1;
  a.n = a.k = 16;
  cudaError_t e = cuda::gemv(a, nullptr);
  CHECK(e == cudaErrorInvalidValue);
  CHECK(cuda::describe_launch_error(e).find("m 5") != std::string::npos);
  a.m = 1;
  a.k = 12;
  e = cuda::gemv(a, nullptr);
  CHECK(e == cudaErrorInvalidValue);
  CHECK(cuda::describe_launch_error(e).find("k 12") != std::string::npos);
  a.k = 16;
  a.n = 24;
  a.output = cuda::GemvOutput::kSiluMul;
  CHECK(cuda::gemv(a, nullptr) == cudaErrorInvalidValue);
}
