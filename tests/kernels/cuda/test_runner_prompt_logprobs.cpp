// The CUDA runner's prompt logprobs (CudaModelRunner::execute): a prompt scored in two chunks, beside another
// sequence and in passes of max_num_seqs rows, scores every token as the runner's own logits over each prefix
// (CudaModelRunner::forward, the sampling path's LM head) do, scored on the CPU by paged::score_token: equal up to
// bf16 noise (the prefix runs take other GEMM shapes), far below what a row scored against the wrong position
// gives. Small random Llama model (head_dim 64).
#include "kernels/cuda/cuda_runner.h"
#include "model/sampling/sampler.h"
#include "tests/kernels/cuda/gpu_test_util.h"
#include "tests/kernels/cuda/small_llama.h"
#include "tests/kernels/step_chunks.h"

using namespace paged;
using namespace paged::gpu_test;
using paged::test::chunk_of;

TEST_CASE("the CUDA runner's prompt logprobs equal its own logits over each prefix", "[gpu][runner]") {
  require_device();
  const ModelConfig cfg = small_llama();
  // max_num_seqs 4: scored rows go through the LM head 4 at a time
  CudaRunnerOptions opt = small_runner_options(32, 4, 64);
  CudaModelRunner runner(cfg, 7, opt);
  std::mt19937 rng(3);
  std::vector<TokenId> prompt(37), other(9);
  for (auto& t : prompt) t = static_cast<TokenId>(rng() % cfg.vocab_size);
  for (auto& t : other) t = static_cast<TokenId>(rng() % cfg.vocab_size);
  const int L = static_cast<int>(prompt.size()), num_top = 4;
  SamplingParams greedy;
  greedy.temperature = 0;

  std::vector<PromptLogprob> scored;
  for (const auto [from, to] : {std::pair{0, 20}, std::pair{20, L}}) {
    StepBatch step;
    step.seqs.push_back(chunk_of(1, other, 0, static_cast<int>(other.size()), {8}));
    step.seqs.back().samples = {SampleSpec{.params = &greedy}};
    SeqChunk c = chunk_of(0, prompt, from, to, {0, 1, 2});
    c.prompt_logprobs = {.count = std::min(to, L - 1) - from, .num_top = num_top,
                         .next_token = to < L ? prompt[to] : -1};
    if (to == L) c.samples = {SampleSpec{.params = &greedy}};
    step.seqs.push_back(std::move(c));
    const StepResult r = runner.execute(step);
    REQUIRE(r.prompt_logprobs.size() == 1);
    CHECK(r.prompt_logprobs[0].first_pos == from + 1);
    scored.insert(scored.end(), r.prompt_logprobs[0].tokens.begin(), r.prompt_logprobs[0].tokens.end());
  }
  REQUIRE(scored.size() == static_cast<size_t>(L - 1));

  double error_sum = 0.0, wrong_position_sum = 0.0;
  std::vector<float> previous_logits;
  for (int i = 1; i < L; ++i) {
    StepBatch step;
    step.seqs.push_back(chunk_of(2, prompt, 0, i, {3, 4, 5}));
    step.seqs.back().samples = {SampleSpec{.params = &greedy}};
    const std::vector<float> logits = runner.forward(step).at(0);
    const PromptLogprob want = score_token(logits, prompt[i], num_top);
    const PromptLogprob& got = scored[i - 1];
    INFO("prompt position " << i);
    CHECK(got.token == prompt[i]);
    CHECK(std::abs(got.logprob - want.logprob) < 0.25);
    error_sum += std::abs(got.logprob - want.logprob);
    if (!previous_logits.empty())
      wrong_position_sum += std::abs(got.logprob - score_token(previous_logits, prompt[i], 0).logprob);
    CHECK(std::abs(got.rank - want.rank) <= std::max(2, want.rank / 10));
    REQUIRE(got.top_logprobs.size() == static_cast<size_t>(num_top));
    if (want.top_logprobs[0].second - want.top_logprobs[1].second > 0.1f)
      CHECK(got.top_logprobs[0].first == want.top_logprobs[0].first);
    CHECK(got.top_logprobs[0].second >= got.logprob);
    previous_logits = logits;
  }
  const double mean_error = error_sum / (L - 1), mean_wrong = wrong_position_sum / (L - 2);
  INFO("mean |logprob error| " << mean_error << ", scored against the position before: " << mean_wrong);
  CHECK(mean_error < 0.05);
  CHECK(mean_wrong > 10 * mean_error);
}
