// gemv (decode-sized linear layers with a fused residual add or SiLU-and-mul output) against the CPU twins composed
// with the same bf16 rounding points: cpu::linear -> add / cpu::silu_and_mul; with a norm weight, cpu::rms_norm
// first (and the same bits as cuda::rms_norm followed by gemv).
#include <algorithm>
#include <cstring>

#include "kernels/cpu/fp8.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/layer_ops.h"
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
  for (const auto& [n, k] : shapes) {
    const auto x = random_bf16_values(rng, k, 2.0f);
    const auto w = random_bf16_values(rng, static_cast<size_t>(n) * k, 1.0f / std::sqrt(static_cast<float>(k)));
    const auto bias = random_bf16_values(rng, n);
    const auto residual = random_bf16_values(rng, n);
    DeviceArray<bf16> d_x(to_bf16(x)), d_w(to_bf16(w)), d_b(to_bf16(bias));
    // The CPU twins: the product with the bias, the residual plus the rounded product, SiLU-and-mul of its halves.
    std::vector<float> with_bias(n), p(n), added(n), act(n / 2);
    cpu::linear(with_bias.data(), x.data(), w.data(), bias.data(), 1, n, k);
    cpu::linear(p.data(), x.data(), w.data(), nullptr, 1, n, k);
    for (int i = 0; i < n; ++i) added[i] = round_bf16(residual[i] + round_bf16(p[i]));
    const auto p_rounded = rounded(p);
    cpu::silu_and_mul(act.data(), p_rounded.data(), 1, n / 2);
    // Every tile of kGemvTiles (-1: the default); the tensor-core tiles take FP8 weights only.
    for (int tile = -1; tile < static_cast<int>(cuda::kGemvTiles.size()); ++tile) {
      INFO("n " << n << " k " << k << " tile " << tile);
      cuda::GemvArgs a{.x = d_x.get(), .w = d_w.get(), .n = n, .k = k};
      DeviceArray<bf16> d_y(n), d_act(n / 2);
      if (tile >= 0 && cuda::kGemvTiles[tile].tensor_cores) {
        a.y = d_y.get();
        const cudaError_t e = cuda::gemv(a, nullptr, tile);
        CHECK(e == cudaErrorInvalidValue);
        CHECK(cuda::describe_launch_error(e).find("needs FP8 weights") != std::string::npos);
        continue;
      }
      a.y = d_y.get();
      a.bias = d_b.get();
      a.output = cuda::GemvOutput::kStore;
      CUDA_REQUIRE(cuda::gemv(a, nullptr, tile));
      check_close(to_float(d_y.download()), with_bias, "store + bias");

      d_y.upload(to_bf16(residual));  // the residual stream, updated in place
      a.bias = nullptr;
      a.output = cuda::GemvOutput::kAddToResidual;
      CUDA_REQUIRE(cuda::gemv(a, nullptr, tile));
      check_close(to_float(d_y.download()), added, "add to residual");

      a.y = d_act.get();
      a.output = cuda::GemvOutput::kSiluMul;
      CUDA_REQUIRE(cuda::gemv(a, nullptr, tile));
      check_close(to_float(d_act.download()), act, "silu_and_mul");
    }
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

TEST_CASE("gemv with a norm weight takes x through rms_norm first, the same bits as the norm kernel", "[gpu][gemv]") {
  require_device();
  std::mt19937 rng(23);
  std::vector<std::pair<int, int>> shapes = {{16, 64}, {144, 272}, {1008, 4096}};  // k of 16 for FP8
  if (!quick_mode()) shapes.insert(shapes.end(), {{6144, 4096}, {256, cuda::kMaxNormedK}});
  const float eps = 1e-5f;
  for (const auto& [n, k] : shapes) {
    const auto w = random_bf16_values(rng, static_cast<size_t>(n) * k, 1.0f / std::sqrt(static_cast<float>(k)));
    for (const float offset : {0.0f, 1.0f})  // Gemma's norms scale by 1 + weight
      for (const bool fp8 : {false, true}) {
        INFO("n " << n << " k " << k << " offset " << offset << (fp8 ? " FP8" : " bf16"));
        const auto x = random_bf16_values(rng, k, 3.0f);
        const auto norm_w = random_bf16_values(rng, k, 0.5f);
        // The CPU twin: the norm rounded to bf16, then the product.
        std::vector<float> normed(k), shifted(k);
        for (int i = 0; i < k; ++i) shifted[i] = norm_w[i] + offset;
        cpu::rms_norm(normed.data(), x.data(), shifted.data(), 1, k, eps);
        normed = rounded(normed);
        DeviceArray<bf16> d_x(to_bf16(x)), d_nw(to_bf16(norm_w)), d_w(to_bf16(w)), d_normed(k);
        std::vector<uint8_t> codes(static_cast<size_t>(n) * k);
        DeviceArray<uint8_t> d_q(codes);
        DeviceArray<float> d_scale(n);
        std::vector<float> p(n);
        if (fp8) {
          CUDA_REQUIRE(cuda::quantize_rows_fp8(d_w.get(), n, k, d_q.get(), d_scale.get(), nullptr));
          codes = d_q.download();
          const std::vector<float> scale = d_scale.download();
          for (int r = 0; r < n; ++r) {
            float acc = 0.0f;
            for (int c = 0; c < k; ++c) acc += cpu::e4m3_to_float(codes[size_t(r) * k + c]) * normed[c];
            p[r] = acc * scale[r];
          }
        } else {
          cpu::linear(p.data(), normed.data(), w.data(), nullptr, 1, n, k);
        }
        std::vector<float> act(n / 2);
        const auto p_rounded = rounded(p);
        cpu::silu_and_mul(act.data(), p_rounded.data(), 1, n / 2);
        for (const cuda::GemvOutput output : {cuda::GemvOutput::kStore, cuda::GemvOutput::kSiluMul}) {
          const bool silu = output == cuda::GemvOutput::kSiluMul;
          cuda::GemvArgs a{.x = d_x.get(), .w = fp8 ? nullptr : d_w.get(), .w_fp8 = fp8 ? d_q.get() : nullptr,
                           .w_scale = fp8 ? d_scale.get() : nullptr, .n = n, .k = k, .output = output};
          // Unfused: the norm kernel, then the product of what it wrote.
          DeviceArray<bf16> d_apart(silu ? n / 2 : n), d_fused(silu ? n / 2 : n);
          CUDA_REQUIRE(cuda::rms_norm(d_normed.get(), d_x.get(), d_nw.get(), 1, k, eps, offset, nullptr));
          a.x = d_normed.get();
          a.y = d_apart.get();
          CUDA_REQUIRE(cuda::gemv(a, nullptr));
          a.x = d_x.get();
          a.y = d_fused.get();
          a.norm_weight = d_nw.get();
          a.norm_eps = eps;
          a.norm_offset = offset;
          CUDA_REQUIRE(cuda::gemv(a, nullptr));
          const auto fused = d_fused.download(), apart = d_apart.download();
          CHECK(std::equal(fused.begin(), fused.end(), apart.begin(), [](bf16 l, bf16 r) {
            return std::memcmp(&l, &r, sizeof l) == 0;
          }));
          check_close(to_float(fused), silu ? act : p, silu ? "fused norm, silu_and_mul" : "fused norm, store");
        }
      }
  }
  DeviceArray<bf16> buf(cuda::kMaxNormedK + 8);
  cuda::GemvArgs too_wide{.x = buf.get(), .w = buf.get(), .y = buf.get(), .n = 8, .k = cuda::kMaxNormedK + 8,
                          .norm_weight = buf.get()};
  CHECK(cuda::gemv(too_wide, nullptr) == cudaErrorInvalidValue);
}
