// The CPU operators Gemma 3 adds: GeGLU with HF's gelu_pytorch_tanh and the soft-cap of the final logits, against
// values computed apart (the tanh formula in double precision, PyTorch's printed values, the exact erf GELU).
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "kernels/cpu/ops.h"

using namespace paged;

TEST_CASE("gelu_tanh_and_mul: HF's gelu_pytorch_tanh of the gate times up", "[ops][gemma]") {
  // x and gelu_pytorch_tanh(x), evaluated in double apart from the operator (PyTorch prints -0.1588, 0.8412, 1.9546).
  const std::vector<std::pair<float, double>> known = {
      {-3.0f, -0.0036373920817729943}, {-1.0f, -0.15880800939172324}, {-0.25f, -0.100324649298315},
      {0.0f, 0.0}, {0.5f, 0.34571400982514394}, {1.0f, 0.8411919906082768},
      {2.0f, 1.954597694087775}, {3.0f, 2.996362607918227}};
  const int inter = static_cast<int>(known.size());
  // Two tokens: up = 1 on the first, up = -2.5 on the second.
  std::vector<float> gate_up(2 * 2 * inter), out(2 * inter);
  for (int t = 0; t < 2; ++t)
    for (int i = 0; i < inter; ++i) {
      gate_up[t * 2 * inter + i] = known[i].first;
      gate_up[t * 2 * inter + inter + i] = t == 0 ? 1.0f : -2.5f;
    }
  cpu::gelu_tanh_and_mul(out.data(), gate_up.data(), 2, inter);
  for (int i = 0; i < inter; ++i) {
    INFO("x = " << known[i].first);
    CHECK(out[i] == Approx(known[i].second).margin(1e-6));
    CHECK(out[inter + i] == Approx(-2.5 * known[i].second).margin(3e-6));
    // The tanh form stays within 5e-4 of the exact GELU, x Phi(x), on this range.
    const double x = known[i].first, exact = 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    CHECK(std::abs(out[i] - exact) < 5e-4);
  }
}

TEST_CASE("soft_cap bends values to cap * tanh(x / cap): near x for small x, never beyond the cap", "[ops][gemma]") {
  std::vector<float> x = {-100.0f, -2.0f, -0.01f, 0.0f, 0.01f, 2.0f, 30.0f, 1e6f};
  const std::vector<float> in = x;
  cpu::soft_cap(x.data(), static_cast<int64_t>(x.size()), 30.0f);
  for (size_t i = 0; i < x.size(); ++i) {
    INFO("x = " << in[i]);
    CHECK(x[i] == Approx(30.0 * std::tanh(double(in[i]) / 30.0)).margin(1e-5));
    CHECK(std::abs(x[i]) <= 30.0f);
  }
  CHECK(x[2] == Approx(-0.01f).margin(1e-7));    // small values pass almost unchanged
  CHECK(x[6] == Approx(30.0 * 0.7615941559557649));  // tanh(1)
  CHECK(x[7] == Approx(30.0f));
}
