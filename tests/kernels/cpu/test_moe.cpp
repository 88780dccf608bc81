// The CPU mixture-of-experts MLP (cpu::moe_mlp over grouped_linear and combine_experts) against a plain per-token
// evaluation of the formula written here: each token's router softmax, its top-k experts, their SwiGLU outputs
// weighted by the (renormalised) probabilities; and the tensor-parallel split of every expert's intermediate size.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "kernels/cpu/moe.h"

using namespace paged;

namespace {

std::vector<float> normal(std::mt19937& rng, size_t n, float stddev) {
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// One MoE layer's whole weights: router [E][H], gate_up [E][2I][H], down [E][H][I].
struct Experts {
  int E, k, I, H;
  std::vector<float> router, gate_up, down;
};

// The MLP of token row x by the formula, in double: p = softmax(router x), the k largest, w_j = p_j (/ their sum),
// out = sum_j w_j down_j(silu(gate_j x) * up_j x).
std::vector<double> reference(const Experts& m, const float* x, bool renormalize) {
  std::vector<double> p(m.E);
  for (int e = 0; e < m.E; ++e) {
    p[e] = 0;
    for (int c = 0; c < m.H; ++c) p[e] += double(m.router[e * m.H + c]) * x[c];
  }
  const double mx = *std::max_element(p.begin(), p.end());
  double z = 0;
  for (auto& v : p) z += v = std::exp(v - mx);
  for (auto& v : p) v /= z;
  std::vector<int> order(m.E);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
  double chosen = 0;
  for (int j = 0; j < m.k; ++j) chosen += p[order[j]];
  std::vector<double> out(m.H, 0.0);
  for (int j = 0; j < m.k; ++j) {
    const int e = order[j];
    const double w = renormalize ? p[e] / chosen : p[e];
    std::vector<double> act(m.I);
    for (int i = 0; i < m.I; ++i) {
      double g = 0, u = 0;
      for (int c = 0; c < m.H; ++c) {
        g += double(m.gate_up[(int64_t(e) * 2 * m.I + i) * m.H + c]) * x[c];
        u += double(m.gate_up[(int64_t(e) * 2 * m.I + m.I + i) * m.H + c]) * x[c];
      }
      act[i] = g / (1 + std::exp(-g)) * u;
    }
    for (int c = 0; c < m.H; ++c) {
      double y = 0;
      for (int i = 0; i < m.I; ++i) y += double(m.down[(int64_t(e) * m.H + c) * m.I + i]) * act[i];
      out[c] += w * y;
    }
  }
  return out;
}

// The rank's slice [begin, begin + ir) of every expert's intermediate size: gate and up rows, down columns.
Experts slice(const Experts& m, int begin, int ir) {
  Experts s{m.E, m.k, ir, m.H, m.router, {}, {}};
  for (int e = 0; e < m.E; ++e) {
    for (int half = 0; half < 2; ++half)
      for (int i = 0; i < ir; ++i) {
        const float* row = &m.gate_up[(int64_t(e) * 2 * m.I + half * m.I + begin + i) * m.H];
        s.gate_up.insert(s.gate_up.end(), row, row + m.H);
      }
    for (int c = 0; c < m.H; ++c) {
      const float* row = &m.down[(int64_t(e) * m.H + c) * m.I + begin];
      s.down.insert(s.down.end(), row, row + ir);
    }
  }
  return s;
}

std::vector<float> run(const Experts& m, const std::vector<float>& x, int tokens, bool renormalize) {
  std::vector<float> out(size_t(tokens) * m.H, -7.0f);  // stored over, not added to
  cpu::moe_mlp(out.data(), x.data(), tokens, m.H,
               {.router = m.router.data(), .gate_up = m.gate_up.data(), .down = m.down.data(), .num_experts = m.E,
                .top_k = m.k, .inter = m.I, .renormalize = renormalize});
  return out;
}

}  // namespace

TEST_CASE("moe_mlp equals the per-token formula (Mixtral and Qwen3-MoE routing)", "[moe][cpu]") {
  std::mt19937 rng(11);
  for (const auto& [E, k] : {std::pair{8, 2}, std::pair{16, 4}, std::pair{4, 1}, std::pair{6, 6}})
    for (const bool renormalize : {true, false}) {
      Experts m{E, k, 24, 32, {}, {}, {}};
      m.router = normal(rng, size_t(E) * m.H, 1.0f);
      m.gate_up = normal(rng, size_t(E) * 2 * m.I * m.H, 0.2f);
      m.down = normal(rng, size_t(E) * m.H * m.I, 0.2f);
      const int tokens = 13;
      const std::vector<float> x = normal(rng, size_t(tokens) * m.H, 1.0f);
      const std::vector<float> got = run(m, x, tokens, renormalize);
      INFO(E << " experts, top " << k << (renormalize ? ", renormalised" : ""));
      for (int t = 0; t < tokens; ++t) {
        const std::vector<double> want = reference(m, &x[size_t(t) * m.H], renormalize);
        for (int c = 0; c < m.H; ++c) REQUIRE(got[size_t(t) * m.H + c] == Approx(want[c]).margin(1e-5));
      }
    }
}

TEST_CASE("moe_mlp: two ranks' slices of every expert sum to the whole", "[moe][cpu][tp]") {
  std::mt19937 rng(12);
  Experts m{8, 2, 20, 16, {}, {}, {}};
  m.router = normal(rng, size_t(m.E) * m.H, 1.0f);
  m.gate_up = normal(rng, size_t(m.E) * 2 * m.I * m.H, 0.3f);
  m.down = normal(rng, size_t(m.E) * m.H * m.I, 0.3f);
  const int tokens = 9;
  const std::vector<float> x = normal(rng, size_t(tokens) * m.H, 1.0f);
  const std::vector<float> whole = run(m, x, tokens, true);
  const std::vector<float> r0 = run(slice(m, 0, 10), x, tokens, true), r1 = run(slice(m, 10, 10), x, tokens, true);
  for (size_t i = 0; i < whole.size(); ++i) REQUIRE(r0[i] + r1[i] == Approx(whole[i]).margin(1e-5));
}

TEST_CASE("grouped_linear skips empty experts; combine_experts accumulates when asked", "[moe][cpu]") {
  // Experts 0 and 2 empty; expert 1 owns rows 0..1 (gathered from x rows 2 and 0), expert 3 row 2 (x row 1).
  const int n = 2, k = 3;
  const std::vector<float> x{1, 0, 0, 0, 1, 0, 0, 0, 1};
  const std::vector<int32_t> rows{2, 0, 1}, offsets{0, 0, 2, 2, 3};
  std::vector<float> w(4 * n * k, 100.0f);  // experts 0 and 2 would write 100s
  const std::vector<float> w1{1, 2, 3, 4, 5, 6}, w3{-1, -2, -3, -4, -5, -6};
  std::copy(w1.begin(), w1.end(), w.begin() + 1 * n * k);
  std::copy(w3.begin(), w3.end(), w.begin() + 3 * n * k);
  std::vector<float> out(3 * n);
  cpu::grouped_linear(out.data(), x.data(), rows.data(), offsets.data(), w.data(), 4, n, k);
  CHECK(out == std::vector<float>{3, 6, 1, 4, -2, -5});
  // Two tokens, top 1: token 0's slot sits at sorted position 2 (weight 0.5), token 1's at position 0 (weight 2).
  const std::vector<int32_t> position{2, 0};
  const std::vector<float> weight{0.5f, 2.0f};
  std::vector<float> acc{10, 20, 30, 40};
  cpu::combine_experts(acc.data(), out.data(), position.data(), weight.data(), 2, 1, n, true);
  CHECK(acc == std::vector<float>{10 - 1, 20 - 2.5f, 30 + 6, 40 + 12});
  cpu::combine_experts(acc.data(), out.data(), position.data(), weight.data(), 2, 1, n, false);
  CHECK(acc == std::vector<float>{-1, -2.5f, 6, 12});
}
