// Prompt logprobs on the CPU runner: a prompt prefilled in chunks, batched beside another sequence, scores every
// prompt token as a forward pass over that token's prefix does, computed here from scratch (log-sum-exp, rank and
// top by sorting the whole vocabulary); and the scores agree with Hugging Face's logits in the golden file.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/cpu/cpu_runner.h"
#include "model/loader/config.h"
#include "model/loader/safetensors.h"
#include "model/sampling/sampler.h"
#include "tests/kernels/step_chunks.h"
#include "tests/test_data.h"

using namespace paged;
using namespace paged::test;

namespace {

struct Expected {
  double logprob;
  int rank;
  std::vector<TokenId> top;  // descending, ties by lower id
};

// The score of `token` under `logits`, by brute force.
Expected brute_force(const std::vector<float>& logits, TokenId token, int num_top) {
  long double sum = 0;
  const float mx = *std::max_element(logits.begin(), logits.end());
  for (float l : logits) sum += std::exp(static_cast<long double>(l) - mx);
  const double lse = mx + static_cast<double>(std::log(sum));
  std::vector<TokenId> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](TokenId a, TokenId b) { return logits[a] > logits[b]; });
  int rank = 0;
  for (float l : logits) rank += l >= logits[token];
  order.resize(num_top);
  return {logits[token] - lse, rank, order};
}

std::vector<int32_t> blocks(int first, int count) {
  std::vector<int32_t> t(count);
  std::iota(t.begin(), t.end(), first);
  return t;
}

}  // namespace

TEST_CASE("prompt logprobs of a chunked prefill equal a forward pass over each prefix", "[model][prompt_logprobs]") {
  const ModelConfig cfg = load_model_config(kModel);
  const SafeTensors weights(kModel);
  const auto golden = read_json(kGolden).at("cases").as_array();
  std::vector<TokenId> prompt = ids_of(golden[1].at("prompt_ids"));
  const auto more = ids_of(golden[1].at("greedy_ids"));
  prompt.insert(prompt.end(), more.begin(), more.begin() + 20);
  const int L = static_cast<int>(prompt.size()), num_top = 5;
  const int B = 8, per_seq = (L + B) / B + 1;
  SamplingParams greedy;
  greedy.temperature = 0;

  // Three chunks as the scheduler cuts them: each scores its positions below L - 1; the last one also samples.
  CpuModelRunner runner(cfg, weights, {.block_size = B, .num_blocks = 2 * per_seq});
  std::vector<PromptLogprob> scored;
  const std::vector<TokenId> other = ids_of(golden[0].at("prompt_ids"));
  const std::vector<std::pair<int, int>> cuts = {{0, 7}, {7, 19}, {19, L}};
  for (size_t k = 0; k < cuts.size(); ++k) {
    const auto [from, to] = cuts[k];
    StepBatch step;
    // Another sequence first (its prefill again each step), so that the scored rows do not start at row 0.
    step.seqs.push_back(chunk_of(1, other, 0, static_cast<int>(other.size()), blocks(per_seq, per_seq)));
    SeqChunk c = chunk_of(0, prompt, from, to, blocks(0, per_seq));
    c.prompt_logprobs.count = std::min(to, L - 1) - from;
    c.prompt_logprobs.num_top = num_top;
    if (to < L) c.prompt_logprobs.next_token = prompt[to];
    if (to == L) c.samples = {SampleSpec{.params = &greedy}};
    step.seqs.push_back(std::move(c));
    const StepResult r = runner.execute(step);
    REQUIRE(r.prompt_logprobs.size() == 1);
    CHECK(r.prompt_logprobs[0].seq == 0);
    CHECK(r.prompt_logprobs[0].first_pos == from + 1);
    REQUIRE(r.prompt_logprobs[0].tokens.size() == static_cast<size_t>(std::min(to, L - 1) - from));
    scored.insert(scored.end(), r.prompt_logprobs[0].tokens.begin(), r.prompt_logprobs[0].tokens.end());
  }
  REQUIRE(scored.size() == static_cast<size_t>(L - 1));

  // Each prefix [0, i) on its own runner: the logits at its last position score prompt[i].
  for (int i = 1; i < L; ++i) {
    CpuModelRunner fresh(cfg, weights, {.block_size = B, .num_blocks = per_seq});
    StepBatch step;
    step.seqs.push_back(chunk_of(0, prompt, 0, i, blocks(0, per_seq)));
    step.seqs.back().samples = {SampleSpec{.params = &greedy}};
    const std::vector<float> logits = fresh.forward(step).at(0);
    const Expected want = brute_force(logits, prompt[i], num_top);
    const PromptLogprob& got = scored[i - 1];
    INFO("prompt position " << i);
    CHECK(got.token == prompt[i]);
    CHECK(std::abs(got.logprob - want.logprob) < 1e-4);
    CHECK(got.rank == want.rank);
    REQUIRE(got.top_logprobs.size() == static_cast<size_t>(num_top));
    for (int j = 0; j < num_top; ++j) {
      CHECK(got.top_logprobs[j].first == want.top[j]);
      CHECK(got.top_logprobs[j].second <= 0.0f);
    }
    CHECK(got.top_logprobs[0].second >= got.logprob);
  }
}

TEST_CASE("a prompt token's logprob follows Hugging Face's logits", "[model][prompt_logprobs]") {
  // The golden prompt followed by HF's greedy token: that token scores rank 1 with HF's top 5 behind it, and the
  // logprob gaps between them are HF's logit gaps.
  const ModelConfig cfg = load_model_config(kModel);
  const SafeTensors weights(kModel);
  const boost::json::value golden = read_json(kGolden);
  for (const auto& c : golden.at("cases").as_array()) {
    std::vector<TokenId> prompt = ids_of(c.at("prompt_ids"));
    prompt.push_back(ids_of(c.at("greedy_ids"))[0]);
    const int L = static_cast<int>(prompt.size());
    CpuModelRunner runner(cfg, weights, {.block_size = 16, .num_blocks = 4});
    StepBatch step;
    step.seqs.push_back(chunk_of(0, prompt, 0, L - 1, blocks(0, 4)));
    step.seqs.back().prompt_logprobs = {.count = L - 1, .num_top = 5, .next_token = prompt[L - 1]};
    const StepResult r = runner.execute(step);
    REQUIRE(r.seqs.empty());
    REQUIRE(r.prompt_logprobs.size() == 1);
    const PromptLogprob& last = r.prompt_logprobs[0].tokens.back();
    const auto top_ids = ids_of(c.at("last_logits_top5").at("ids"));
    const auto& values = c.at("last_logits_top5").at("values").as_array();
    INFO("prompt " << c.at("prompt").as_string());
    CHECK(last.token == top_ids[0]);
    CHECK(last.rank == 1);
    for (size_t j = 0; j < 5; ++j) {
      CHECK(last.top_logprobs[j].first == top_ids[j]);
      const double hf_gap = values[j].to_number<double>() - values[0].to_number<double>();
      CHECK(std::abs((last.top_logprobs[j].second - last.top_logprobs[0].second) - hf_gap) < 1e-3);
    }
  }
}
