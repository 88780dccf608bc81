// score_tokens (prompt logprobs on the GPU) against its CPU twin paged::score_token (model/sampling/sampler.h): the
// same rank and top ids, logprobs within float rounding, over flat, peaked, tied and constant logits.
#include "kernels/cuda/sampling.h"
#include "model/sampling/sampler.h"
#include "tests/kernels/cuda/gpu_test_util.h"

using namespace paged;
using namespace paged::gpu_test;

TEST_CASE("score_tokens gives the CPU's rank, top tokens and logprobs", "[gpu][sampling]") {
  require_device();
  std::mt19937 rng(12);
  const std::vector<int> vocabs =
      quick_mode() ? std::vector<int>{7, 1000, 32000} : std::vector<int>{7, 1000, 32000, 151936};
  for (const int vocab : vocabs)
    for (const int num_top : {0, 1, 5, 20}) {
      // Row families: flat normal, peaked normal, integer logits (many exact ties), all zero (one tie of all).
      const int rows = 4 * 8;
      std::vector<float> logits(static_cast<size_t>(rows) * vocab);
      std::vector<int32_t> targets(rows);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (int r = 0; r < rows; ++r) {
        const int family = r % 4;
        for (int i = 0; i < vocab; ++i) {
          const float z = normal(rng);
          logits[static_cast<size_t>(r) * vocab + i] =
              family == 0 ? z : family == 1 ? 6.0f * z : family == 2 ? std::round(2.0f * z) : 0.0f;
        }
        targets[r] = static_cast<int32_t>(rng() % vocab);
      }
      DeviceArray<float> d_logits(logits), d_logprobs(rows), d_top_logprobs(std::max(1, rows * num_top));
      DeviceArray<int32_t> d_targets(targets), d_ranks(rows), d_top_ids(std::max(1, rows * num_top));
      CUDA_REQUIRE(cuda::score_tokens(d_logprobs.get(), d_ranks.get(), d_top_ids.get(), d_top_logprobs.get(),
                                      d_logits.get(), d_targets.get(), rows, vocab, num_top, nullptr));
      const auto logprobs = d_logprobs.download();
      const auto ranks = d_ranks.download();
      const auto top_ids = d_top_ids.download();
      const auto top_logprobs = d_top_logprobs.download();
      for (int r = 0; r < rows; ++r) {
        INFO("vocab " << vocab << " num_top " << num_top << " row " << r);
        const std::span<const float> row(logits.data() + static_cast<size_t>(r) * vocab, vocab);
        const PromptLogprob want = score_token(row, targets[r], num_top);
        CHECK(ranks[r] == want.rank);
        CHECK(std::abs(logprobs[r] - want.logprob) <= 1e-5f * std::max(1.0f, std::abs(want.logprob)));
        REQUIRE(want.top_logprobs.size() == static_cast<size_t>(std::min(num_top, vocab)));
        for (size_t j = 0; j < want.top_logprobs.size(); ++j) {
          CHECK(top_ids[r * num_top + j] == want.top_logprobs[j].first);
          CHECK(std::abs(top_logprobs[r * num_top + j] - want.top_logprobs[j].second) <=
                1e-5f * std::max(1.0f, std::abs(want.top_logprobs[j].second)));
        }
      }
    }
}

TEST_CASE("score_tokens refuses a top beyond what it supports", "[gpu][sampling]") {
  require_device();
  DeviceArray<float> logits(std::vector<float>(8, 0.0f)), out(1);
  DeviceArray<int32_t> targets(std::vector<int32_t>{0}), ranks(1);
  CHECK(cuda::score_tokens(out.get(), ranks.get(), ranks.get(), out.get(), logits.get(), targets.get(), 1, 8, 65,
                           nullptr) == cudaErrorInvalidValue);
}
