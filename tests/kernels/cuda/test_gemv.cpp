// gemv (decode-sized linear layers with a fused residual add or SiLU-and-mul output) against the CPU twins composed
// with the same bf16 rounding points: cpu::linear -> add / cpu::silu_and_mul.
#include "kernels/cpu/ops.h"
#include "kernels/cuda/gemv.h"
#include "tests/kernels/cuda/gpu_test_util.h"

using namespace paged;
using namespace paged::gpu_test;

namespace {

std::vector<float> rounded(std::vector<float> v) {
  for (auto& x : v) x = round_bf16(x);
  return v;
}

}  // namespace

TEST_CASE("gemv matches linear -> add / silu_and_mul on the CPU", "[gpu][gemv]") {
  require_device();
  std::mt19937 rng(21);
  std::vector<std::pair<int, int>> shapes = {{16, 8}, {144, 64}, {1008, 264}, {256, 4104}};
  if (!quick_mode()) shapes.insert(shapes.end(), {{6144, 4096}, {4096, 14336}, {28672, 4096}});
  // Every tile of kGemvTiles (-1: the default) on every shape.
  for (int tile = -1; tile < static_cast<int>(cuda::kGemvTiles.size()); ++tile)
  for (const auto& [n, k] : shapes) {
    INFO("n " << n << " k " << k << " tile " << tile);
    const auto x = random_bf16_values(rng, k, 2.0f);
    const auto w = random_bf16_values(rng, static_cast<size_t>(n) * k, 1.0f / std::sqrt(static_cast<float>(k)));
    const auto bias = random_bf16_values(rng, n);
    DeviceArray<bf16> d_x(to_bf16(x)), d_w(to_bf16(w)), d_b(to_bf16(bias));
    cuda::GemvArgs a;
    a.x = d_x.get();
    a.w = d_w.get();
    a.n = n;
    a.k = k;

    // Store with bias.
    std::vector<float> p(n);
    cpu::linear(p.data(), x.data(), w.data(), bias.data(), 1, n, k);
    DeviceArray<bf16> d_y(p.size());
    a.y = d_y.get();
    a.bias = d_b.get();
    a.output = cuda::GemvOutput::kStore;
    CUDA_REQUIRE(cuda::gemv(a, nullptr, tile));
    check_close(to_float(d_y.download()), p, "store + bias");

    // Residual add: residual + bf16(x W^T), in place.
    cpu::linear(p.data(), x.data(), w.data(), nullptr, 1, n, k);
    const auto residual = random_bf16_values(rng, p.size());
    std::vector<float> want(p.size());
    for (size_t i = 0; i < p.size(); ++i) want[i] = round_bf16(residual[i] + round_bf16(p[i]));
    d_y.upload(to_bf16(residual));
    a.bias = nullptr;
    a.output = cuda::GemvOutput::kAddToResidual;
    CUDA_REQUIRE(cuda::gemv(a, nullptr, tile));
    check_close(to_float(d_y.download()), want, "add to residual");

    // SiLU-and-mul of the (gate | up) halves.
    const auto p_rounded = rounded(p);
    std::vector<float> act(n / 2);
    cpu::silu_and_mul(act.data(), p_rounded.data(), 1, n / 2);
    DeviceArray<bf16> d_act(act.size());
    a.y = d_act.get();
    a.output = cuda::GemvOutput::kSiluMul;
    CUDA_REQUIRE(cuda::gemv(a, nullptr, tile));
    check_close(to_float(d_act.download()), act, "silu_and_mul");
  }
}

TEST_CASE("gemv names what it refuses", "[gpu][gemv]") {
  require_device();
  DeviceArray<bf16> buf(1024);
  cuda::GemvArgs a;
  a.x = a.w = buf.get();
  a.y = buf.get();
  a.n = 16;
  a.k = 12;
  cudaError_t e = cuda::gemv(a, nullptr);
  CHECK(e == cudaErrorInvalidValue);
  CHECK(cuda::describe_launch_error(e).find("k 12") != std::string::npos);
  a.k = 16;
  a.n = 24;
  a.output = cuda::GemvOutput::kSiluMul;
  e = cuda::gemv(a, nullptr);
  CHECK(e == cudaErrorInvalidValue);
  CHECK(cuda::describe_launch_error(e).find("n 24") != std::string::npos);
  a.n = 32;
  a.bias = buf.get();
  CHECK(cuda::gemv(a, nullptr) == cudaErrorInvalidValue);
  a.bias = nullptr;
  e = cuda::gemv(a, nullptr, static_cast<int>(cuda::kGemvTiles.size()));
  CHECK(e == cudaErrorInvalidValue);
  CHECK(cuda::describe_launch_error(e).find("no tile") != std::string::npos);
}
