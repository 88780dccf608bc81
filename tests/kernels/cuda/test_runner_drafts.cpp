// The CUDA runner's verification of drafts (speculative decoding, SeqChunk::num_drafts): a chunk of a sequence's
// newest token and its drafts samples each position, in its own logits row, as paged::sample_logits does on the
// runner's own logits over each prefix (CudaModelRunner::forward) with the drafts before the position taken as
// generated: greedy rows with penalties (processed on the GPU, alone on their rows), seeded sampled rows and rows
// with logprobs, beside a sequence without drafts; tokens equal wherever the best two processed logits are apart by
// more than bf16 noise. And a step samples at most as many positions as the runner holds logits rows for.
#include <algorithm>

#include "kernels/cuda/cuda_runner.h"
#include "model/sampling/sampler.h"
#include "tests/kernels/cuda/gpu_test_util.h"
#include "tests/kernels/cuda/small_llama.h"
#include "tests/kernels/step_chunks.h"

using namespace paged;
using namespace paged::gpu_test;
using paged::test::chunk_of;

TEST_CASE("a chunk with drafts samples each position as sample_logits does on the runner's logits of each prefix",
          "[gpu][runner][speculative]") {
  require_device();
  const ModelConfig cfg = small_llama();
  CudaRunnerOptions opt = small_runner_options(32, 8, 64);
  CudaModelRunner runner(cfg, 13, opt);
  std::mt19937 rng(9);
  std::vector<TokenId> seq(24), other(6), output, stops{7};
  for (auto& t : seq) t = static_cast<TokenId>(rng() % cfg.vocab_size);
  for (auto& t : other) t = static_cast<TokenId>(rng() % cfg.vocab_size);
  const int known = 20, drafts = 4;  // seq[0, 20) computed but for the newest, seq[20, 24) the drafts
  const std::vector<TokenId> prompt(seq.begin(), seq.begin() + 16);
  output.assign(seq.begin() + 16, seq.begin() + known);
  SamplingParams processed, sampled;
  processed.temperature = 0;
  processed.repetition_penalty = 1.3f;
  processed.frequency_penalty = 0.4f;
  processed.min_tokens = known - 16 + 2;  // masks the stop id at the first two positions only
  sampled.temperature = 0.8f;
  sampled.top_p = 0.9f;
  for (const SamplingParams* params : {&processed, &sampled}) {
    INFO((params == &processed ? "greedy with penalties" : "sampled"));
    // The prefix's KV, then the verification step beside another sequence's prefill.
    StepBatch prefill;
    prefill.seqs.push_back(chunk_of(0, seq, 0, known - 1, {0, 1}));
    runner.execute(prefill);
    StepBatch step;
    step.seqs.push_back(chunk_of(1, other, 0, static_cast<int>(other.size()), {5}));
    step.seqs.back().samples = {SampleSpec{.params = &processed, .prompt = &other}};
    SeqChunk c = chunk_of(0, seq, known - 1, known + drafts, {0, 1});
    c.num_drafts = drafts;
    c.samples = {SampleSpec{.params = params, .seed = 42, .prompt = &prompt, .output = &output, .stop_ids = &stops,
                            .num_logprobs = 2}};
    step.seqs.push_back(c);
    const StepResult r = runner.execute(step);
    REQUIRE(r.samples.size() == 2);
    REQUIRE(r.samples[1].size() == static_cast<size_t>(drafts + 1));
    CHECK(r.samples[0].size() == 1);
    int compared = 0;
    for (int k = 0; k <= drafts; ++k) {
      INFO("position " << k);
      StepBatch prefix;
      prefix.seqs.push_back(chunk_of(2, seq, 0, known + k, {2, 3}));
      prefix.seqs.back().samples = {SampleSpec{.params = &processed}};
      std::vector<float> logits = runner.forward(prefix).at(0);
      const SampleSpec spec = chunk_sample(step.seqs[1], static_cast<size_t>(k)).spec;
      CHECK(generated_count(spec) == output.size() + static_cast<size_t>(k));
      std::vector<float> processed_logits = logits;
      apply_penalties(processed_logits, spec);
      std::vector<float> top = processed_logits;
      std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<>());
      const SampledToken want = sample_logits(logits, spec)[0];
      const SampledToken& got = r.samples[1][k][0];
      CHECK(got.top_logprobs.size() == 2);
      if (params == &processed && top[0] - top[1] > 0.1f) {
        CHECK(got.token == want.token);
        CHECK(std::abs(got.logprob - want.logprob) < 0.1);
        ++compared;
      }
      if (params == &sampled) CHECK(got.token >= 0);
    }
    if (params == &processed) CHECK(compared >= 3);
  }
}

TEST_CASE("a step samples at most max_logits_rows positions (max_num_seqs without it)", "[gpu][runner][speculative]") {
  require_device();
  const ModelConfig cfg = small_llama();
  std::vector<TokenId> seq(12, 3);
  SamplingParams greedy;
  greedy.temperature = 0;
  StepBatch step;
  SeqChunk c = chunk_of(0, seq, 0, 12, {0});
  c.num_drafts = 4;  // 5 positions
  c.samples = {SampleSpec{.params = &greedy}};
  step.seqs.push_back(c);
  CudaRunnerOptions opt = small_runner_options(32, 4, 64);
  {
    CudaModelRunner runner(cfg, 13, opt);  // 4 rows
    CHECK_THROWS_WITH(runner.execute(step), Catch::Contains("max_num_seqs"));
  }
  opt.max_logits_rows = 5;
  CudaModelRunner runner(cfg, 13, opt);
  const StepResult r = runner.execute(step);
  REQUIRE(r.samples.size() == 1);
  CHECK(r.samples[0].size() == 5);
}
