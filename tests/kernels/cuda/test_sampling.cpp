// sample_tokens against the CPU sampler paged::sample_logits (model/sampler.h): the same random stream, the same
// cuts, the same token, over flat, peaked, tied and uniform logits.
#include <bit>
#include <numeric>
#include <span>

#include "kernels/cuda/penalty_rows.h"
#include "kernels/cuda/sampling.h"
#include "model/sampling/sampler.h"
#include "tests/kernels/cuda/gpu_test_util.h"

using namespace paged;
using namespace paged::gpu_test;

TEST_CASE("the GPU random stream is the CPU's, bit for bit", "[gpu][sampling]") {
  std::mt19937_64 rng(10);
  for (int i = 0; i < 10000; ++i) {
    const uint64_t seed = rng(), index = rng() % 100000;
    REQUIRE(cuda::sampling_uniform(seed, index) == random_uniform(seed, index));
  }
}

TEST_CASE("sample_tokens picks the CPU sampler's token", "[gpu][sampling]") {
  require_device();
  std::mt19937 rng(11);
  struct Params {
    float temperature;
    int top_k;
    float top_p, min_p;
  };
  std::vector<Params> grid;
  grid.push_back({0.0f, -1, 1.0f, 0.0f});
  for (float t : {0.6f, 1.0f, 1.5f})
    for (int k : {-1, 1, 40})
      for (float p : {1.0f, 0.9f, 0.3f})
        for (float mp : {0.0f, 0.1f}) grid.push_back({t, k, p, mp});

  const std::vector<int> vocabs = quick_mode() ? std::vector<int>{1000, 32000} : std::vector<int>{1000, 32000, 151936};
  for (const int vocab : vocabs) {
    // Row families: flat normal, peaked normal, integer logits (many exact ties), all zero (one big tie).
    for (int family = 0; family < 4; ++family) {
      const int rows = static_cast<int>(grid.size());
      std::vector<float> logits(static_cast<size_t>(rows) * vocab);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (auto& l : logits) {
        const float z = normal(rng);
        l = family == 0 ? z : family == 1 ? 6.0f * z : family == 2 ? std::round(2.0f * z) : 0.0f;
      }
      std::vector<cuda::SamplingRow> params(rows);
      std::vector<SamplingParams> cpu_params(rows);
      std::vector<std::vector<TokenId>> outputs(rows);
      for (int r = 0; r < rows; ++r) {
        params[r].temperature = cpu_params[r].temperature = grid[r].temperature;
        params[r].top_k = cpu_params[r].top_k = grid[r].top_k;
        params[r].top_p = cpu_params[r].top_p = grid[r].top_p;
        params[r].min_p = cpu_params[r].min_p = grid[r].min_p;
        params[r].seed = (static_cast<uint64_t>(rng()) << 32) | rng();
        params[r].index = rng() % 300;
        outputs[r].assign(params[r].index, 0);  // the CPU sampler reads the stream position from the output size
      }
      // Row r samples from logits row perm[r]: the indirection several samples of one sequence use.
      std::vector<int32_t> perm(rows);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      DeviceArray<float> d_logits(logits), d_logprobs(rows);
      DeviceArray<int32_t> d_tokens(rows), d_perm(perm);
      DeviceArray<cuda::SamplingRow> d_params(params);
      const size_t ws_bytes = cuda::sampling_workspace_bytes(rows, vocab);
      DeviceArray<char> ws(ws_bytes);
      CUDA_REQUIRE(cuda::sample_tokens(d_tokens.get(), d_logprobs.get(), d_logits.get(), d_perm.get(), d_params.get(), rows,
                                       vocab, ws.get(), ws_bytes, nullptr));
      const auto tokens = d_tokens.download();
      const auto logprobs = d_logprobs.download();
      for (int r = 0; r < rows; ++r) {
        std::vector<float> row(logits.begin() + static_cast<int64_t>(perm[r]) * vocab,
                               logits.begin() + static_cast<int64_t>(perm[r] + 1) * vocab);
        SampleSpec spec;
        spec.params = &cpu_params[r];
        spec.seed = params[r].seed;
        spec.output = &outputs[r];
        const auto want = sample_logits(row, spec);
        INFO("vocab " << vocab << " family " << family << " T " << grid[r].temperature << " top_k " << grid[r].top_k
                      << " top_p " << grid[r].top_p << " min_p " << grid[r].min_p);
        REQUIRE(want.size() == 1);
        CHECK(tokens[r] == want[0].token);
        CHECK(std::abs(logprobs[r] - want[0].logprob) <= 1e-4f * std::max(1.0f, std::abs(want[0].logprob)));
      }
    }
  }
}

TEST_CASE("apply_penalties processes logits bit for bit as apply_penalty_ops", "[gpu][sampling]") {
  require_device();
  std::mt19937 rng(12);
  for (const int vocab : {1000, 32000}) {
    const int rows = 24;
    std::vector<float> logits(static_cast<size_t>(rows) * vocab);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (auto& l : logits) l = normal(rng);
    std::vector<SamplingParams> params(rows);
    std::vector<std::vector<TokenId>> prompts(rows), outputs(rows), stops(rows);
    std::vector<cuda::PenaltyRow> packed;
    std::vector<int32_t> ids;
    std::vector<float> values;
    std::vector<float> want = logits;
    // Row r processes logits row perm[r] (each row once); every fourth row processes nothing.
    std::vector<int32_t> perm(rows);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int r = 0; r < rows; ++r) {
      SamplingParams& p = params[r];
      if (r % 4 != 3) {
        p.repetition_penalty = r % 3 == 0 ? 1.0f : (r % 2 ? 1.3f : 0.7f);
        p.presence_penalty = r % 5 == 0 ? 0.0f : 0.4f;
        p.frequency_penalty = r % 2 ? 0.3f : -0.2f;
        p.min_tokens = r % 2 ? 10 : 0;
        for (int b = 0; b < r % 4; ++b) p.logit_bias[static_cast<TokenId>(rng() % vocab)] = normal(rng);
      }
      for (int i = 0; i < 50 + r * 7; ++i) prompts[r].push_back(static_cast<TokenId>(rng() % 200));  // repeats
      for (int i = 0; i < r * 5; ++i) outputs[r].push_back(static_cast<TokenId>(rng() % 100));
      stops[r] = {1, 2, 2};
      const SampleSpec spec{.params = &p, .prompt = &prompts[r], .output = &outputs[r], .stop_ids = &stops[r]};
      const PenaltyOps ops = penalty_ops(spec, vocab);
      if (r % 4 == 3) CHECK(ops.empty());
      if (ops.empty()) continue;
      cuda::append_penalty_row(ops, perm[r], packed, ids, values);
      apply_penalty_ops(std::span<float>(want.data() + int64_t{perm[r]} * vocab, vocab), ops);
    }
    DeviceArray<float> d_logits(logits), d_values(values);
    DeviceArray<int32_t> d_ids(ids);
    DeviceArray<cuda::PenaltyRow> d_rows(packed);
    CUDA_REQUIRE(cuda::apply_penalties(d_logits.get(), d_rows.get(), d_ids.get(), d_values.get(),
                                       static_cast<int>(packed.size()), vocab, nullptr));
    const auto got = d_logits.download();
    size_t differing = 0;
    for (size_t i = 0; i < got.size(); ++i) differing += std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want[i]);
    CHECK(differing == 0);
    CHECK(want != logits);  // something was processed
  }
}
