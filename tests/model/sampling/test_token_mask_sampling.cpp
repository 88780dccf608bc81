// The CPU sampler under a token mask (structured outputs): every draw is an allowed token, greedy takes the best
// allowed one, and the logprobs are those of the logits with the refused tokens at -inf (renormalised over the
// allowed ones), each computed here on its own.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "model/sampling/sampler.h"

namespace paged {

namespace {

// A fixed set of allowed tokens.
struct AllowedSet final : TokenMaskSource {
  std::vector<uint32_t> bits;
  void fill_mask(std::span<const TokenId>, std::span<uint32_t> mask) const override { std::copy(bits.begin(), bits.end(), mask.begin()); }
};

}  // namespace

TEST_CASE("sample_logits draws only allowed tokens, with logprobs renormalised over them", "[sampling]") {
  std::mt19937 rng(3);
  const int vocab = 1000;
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> logits(vocab);
    for (float& l : logits) l = normal(rng);
    AllowedSet allowed;
    allowed.bits.assign((vocab + 31) / 32, 0);
    std::vector<TokenId> ids;
    for (TokenId id = 0; id < vocab; ++id)
      if (rng() % (trial + 2) == 0 || id == 17) {
        allowed.bits[id / 32] |= 1u << (id % 32);
        ids.push_back(id);
      }
    // The expected greedy token and logprobs over the allowed tokens, in double.
    TokenId best = ids[0];
    double sum = 0;
    for (TokenId id : ids) {
      if (logits[id] > logits[best]) best = id;
      sum += std::exp(static_cast<double>(logits[id]));
    }
    SamplingParams greedy, sampled;
    greedy.temperature = 0;
    sampled.temperature = 1.3f;
    for (const SamplingParams* p : {&greedy, &sampled}) {
      for (uint64_t seed = 0; seed < 10; ++seed) {
        std::vector<float> row = logits;
        const SampleSpec spec{.params = p, .seed = seed, .num_logprobs = 3, .mask_source = &allowed};
        const SampledToken t = sample_logits(row, spec)[0];
        CHECK(((allowed.bits[t.token / 32] >> (t.token % 32)) & 1));
        if (p == &greedy) CHECK(t.token == best);
        CHECK(t.logprob == Approx(logits[t.token] - std::log(sum)).margin(1e-4));
        for (const auto& [id, lp] : t.top_logprobs)
          if (ids.size() >= 3) CHECK(((allowed.bits[id / 32] >> (id % 32)) & 1));
      }
    }
  }
}

}  // namespace paged
