// The CUDA runner's sampling of one step whose rows split between the GPU (greedy rows; rows with logits
// processing alone on their logits row, processed by apply_penalties; logprob alternatives scored after sampling)
// and the CPU sampler (processed rows shared by two samples, from their downloaded logits): against
// paged::sample_logits on the runner's own logits (CudaModelRunner::forward of the same step) every sample gets its
// token, CPU samples exactly their logprobs, GPU samples within float rounding of the CPU's double sums, whether a
// few rows go to the CPU (each downloaded alone) or most of them (all downloaded at once); rows with a token mask
// (structured outputs: apply_token_bitmask on the GPU when alone on their row) likewise, each within its mask.
#include <algorithm>

#include "kernels/cuda/cuda_runner.h"
#include "model/sampling/sampler.h"
#include "tests/kernels/cuda/gpu_test_util.h"
#include "tests/kernels/cuda/small_llama.h"
#include "tests/kernels/step_chunks.h"

using namespace paged;
using namespace paged::gpu_test;
using paged::test::chunk_of;

TEST_CASE("a step's samples, on the GPU or the CPU, get sample_logits of the runner's own logits", "[gpu][runner]") {
  require_device();
  const ModelConfig cfg = small_llama();
  CudaRunnerOptions opt = small_runner_options(64, 8, 256);
  CudaModelRunner runner(cfg, 11, opt);
  std::mt19937 rng(5);
  const int n = 8;
  std::vector<std::vector<TokenId>> prompts(n), outputs(n), stops(n, std::vector<TokenId>{7, 9});
  for (int s = 0; s < n; ++s) {
    prompts[s].resize(3 + 4 * s);
    for (auto& t : prompts[s]) t = static_cast<TokenId>(rng() % cfg.vocab_size);
    outputs[s] = {prompts[s][0], prompts[s][1], prompts[s][1]};  // repeated, and counted twice
  }
  SamplingParams greedy, processed, sampled;
  greedy.temperature = 0;
  processed.temperature = 0;
  processed.repetition_penalty = 1.3f;
  processed.presence_penalty = 0.5f;
  processed.frequency_penalty = 0.25f;
  processed.min_tokens = 8;  // masks the stop ids
  processed.logit_bias = {{3, 2.5f}, {11, -1.0f}};
  sampled = processed;
  sampled.temperature = 0.8f;
  sampled.top_p = 0.9f;
  // Rows: 0 greedy; 1 greedy with logprobs; 2 processed; 3 processed and sampled with logprobs; the rows of
  // `shared` carry two processed samples (the CPU's); the others cycle through the first four kinds.
  for (const std::vector<int>& shared : {std::vector<int>{5}, std::vector<int>{0, 1, 2, 3, 5, 6, 7}}) {
    INFO(shared.size() << " rows of two samples (on the CPU)");
    StepBatch step;
    for (int s = 0; s < n; ++s) {
      step.seqs.push_back(chunk_of(s, prompts[s], 0, static_cast<int>(prompts[s].size()), {2 * s, 2 * s + 1}));
      SampleSpec spec{.params = &greedy, .seed = 100u + s, .prompt = &prompts[s], .output = &outputs[s],
                      .stop_ids = &stops[s]};
      if (std::count(shared.begin(), shared.end(), s)) {
        spec.params = &processed;
        spec.num_logprobs = 2;
        SampleSpec second = spec;
        second.params = &sampled;
        second.seed += 1000;
        step.seqs.back().samples = {spec, second};
        continue;
      }
      const int kind = s % 4;
      if (kind >= 2) spec.params = kind == 2 ? &processed : &sampled;
      if (kind == 1 || kind == 3) spec.num_logprobs = 3 + s % 2;
      step.seqs.back().samples = {spec};
    }
    // The same step twice rewrites the same K/V: forward's logits are the ones execute samples from.
    const std::vector<std::vector<float>> logits = runner.forward(step);
    const StepResult r = runner.execute(step);
    REQUIRE(r.samples.size() == static_cast<size_t>(n));
    for (int s = 0; s < n; ++s) {
      const bool on_cpu = std::count(shared.begin(), shared.end(), s) > 0;
      for (size_t k = 0; k < step.seqs[s].samples.size(); ++k) {
        INFO("row " << s << " sample " << k);
        const SampleSpec& spec = step.seqs[s].samples[k];
        std::vector<float> row = logits[s];
        const SampledToken want = sample_logits(row, spec)[0];
        const SampledToken& got = r.samples[s][k][0];
        const size_t asked = static_cast<size_t>(spec.num_logprobs);
        CHECK(got.token == want.token);
        REQUIRE(got.top_logprobs.size() == asked);
        REQUIRE(want.top_logprobs.size() == asked);
        if (on_cpu) {
          CHECK(got.logprob == want.logprob);
          CHECK(got.top_logprobs == want.top_logprobs);
          continue;
        }
        CHECK(got.logprob == Approx(want.logprob).margin(1e-4));
        for (size_t a = 0; a < asked; ++a) {
          CHECK(got.top_logprobs[a].first == want.top_logprobs[a].first);
          CHECK(got.top_logprobs[a].second == Approx(want.top_logprobs[a].second).margin(1e-4));
        }
      }
    }
  }
}

// A token mask that is always the same.
struct FixedMask final : TokenMaskSource {
  explicit FixedMask(std::vector<uint32_t> bits) : bits(std::move(bits)) {}
  void fill_mask(std::span<const TokenId>, std::span<uint32_t> mask) const override { std::copy(bits.begin(), bits.end(), mask.begin()); }
  std::vector<uint32_t> bits;
};

// Every sample of `step` got sample_logits' token of the runner's own `logits` row, its logprob within float rounding
// and the same alternatives.
void check_like_sample_logits(const StepBatch& step, const std::vector<std::vector<float>>& logits,
                              const StepResult& r) {
  REQUIRE(r.samples.size() == step.seqs.size());
  for (size_t s = 0; s < step.seqs.size(); ++s)
    for (size_t k = 0; k < step.seqs[s].samples.size(); ++k) {
      INFO("row " << s << " sample " << k);
      std::vector<float> row = logits[s];
      const SampledToken want = sample_logits(row, step.seqs[s].samples[k])[0];
      const SampledToken& got = r.samples[s][k][0];
      CHECK(got.token == want.token);
      CHECK(got.logprob == Approx(want.logprob).margin(1e-4));
      REQUIRE(got.top_logprobs.size() == want.top_logprobs.size());
      for (size_t a = 0; a < want.top_logprobs.size(); ++a)
        CHECK(got.top_logprobs[a].first == want.top_logprobs[a].first);
    }
}

TEST_CASE("rows with a token mask (structured outputs) sample within it as sample_logits does", "[gpu][runner][structured]") {
  require_device();
  const ModelConfig cfg = small_llama();
  CudaRunnerOptions opt = small_runner_options(64, 8, 256);
  CudaModelRunner runner(cfg, 12, opt);
  std::mt19937 rng(18);
  const int n = 8;
  const size_t words = (static_cast<size_t>(cfg.vocab_size) + 31) / 32;
  std::vector<std::vector<TokenId>> prompts(n), outputs(n), stops(n, std::vector<TokenId>{7});
  std::vector<std::vector<uint32_t>> masks(n, std::vector<uint32_t>(words, 0));
  for (int s = 0; s < n; ++s) {
    prompts[s].resize(4 + 3 * s);
    for (auto& t : prompts[s]) t = static_cast<TokenId>(rng() % cfg.vocab_size);
    outputs[s] = {prompts[s][0]};
    // About one token in 16 allowed (row 0: exactly one), never the whole vocabulary.
    for (TokenId id = 0; id < cfg.vocab_size; ++id)
      if (s == 0 ? id == 5 : rng() % 16 == 0) masks[s][id / 32] |= 1u << (id % 32);
  }
  std::vector<FixedMask> sources;
  for (const auto& m : masks) sources.push_back(FixedMask{m});
  SamplingParams greedy, sampled, processed;
  greedy.temperature = 0;
  sampled.temperature = 1.0f;
  processed.temperature = 0.7f;
  processed.repetition_penalty = 1.2f;
  processed.logit_bias = {{5, 3.0f}};
  // Rows: greedy, sampled with logprobs, processed, unmasked (in turn); row 6 carries two masked samples (the CPU's).
  StepBatch step;
  for (int s = 0; s < n; ++s) {
    step.seqs.push_back(chunk_of(s, prompts[s], 0, static_cast<int>(prompts[s].size()), {2 * s, 2 * s + 1}));
    const int kind = s % 4;
    SampleSpec spec{.params = kind == 1 ? &sampled : kind == 2 ? &processed : &greedy, .seed = 50u + s,
                    .prompt = &prompts[s], .output = &outputs[s], .stop_ids = &stops[s],
                    .num_logprobs = kind == 1 ? 3 : 0, .mask_source = kind == 3 ? nullptr : &sources[s]};
    step.seqs.back().samples = {spec};
    if (s == 6) {
      SampleSpec second = spec;
      second.params = &sampled;
      second.seed += 1000;
      step.seqs.back().samples.push_back(second);
    }
  }
  const std::vector<std::vector<float>> logits = runner.forward(step);
  const StepResult r = runner.execute(step);
  check_like_sample_logits(step, logits, r);
  for (int s = 0; s < n; ++s)
    for (size_t k = 0; k < step.seqs[s].samples.size(); ++k)
      if (const TokenId t = r.samples[s][k][0].token; step.seqs[s].samples[k].mask_source)
        CHECK(((masks[s][t / 32] >> (t % 32)) & 1));
}

TEST_CASE("rows with allowed_token_ids or bad words sample as sample_logits does", "[gpu][runner][token_masks]") {
  require_device();
  const ModelConfig cfg = small_llama();
  CudaRunnerOptions opt = small_runner_options(64, 8, 256);
  CudaModelRunner runner(cfg, 13, opt);
  std::mt19937 rng(23);
  const int n = 8;
  const size_t words = (static_cast<size_t>(cfg.vocab_size) + 31) / 32;
  std::vector<std::vector<TokenId>> prompts(n), outputs(n), stops(n, std::vector<TokenId>{7});
  for (int s = 0; s < n; ++s) {
    prompts[s].resize(5 + 2 * s);
    for (auto& t : prompts[s]) t = static_cast<TokenId>(rng() % cfg.vocab_size);
    outputs[s] = {prompts[s][0], prompts[s][1]};
  }
  // allowed_token_ids: a tenth of the vocabulary; within a mask of the even tokens for the structured rows.
  SamplingParams allowed_greedy, allowed_sampled, banned_greedy, banned_sampled;
  for (TokenId id = 0; id < cfg.vocab_size; ++id)
    if (rng() % 10 == 0) allowed_greedy.allowed_token_ids.push_back(id);
  allowed_greedy.temperature = 0;
  allowed_sampled = allowed_greedy;
  allowed_sampled.temperature = 1.0f;
  FixedMask evens{std::vector<uint32_t>(words, 0x55555555u)};
  // Bad words: the greedy choice of every row (found below) as a one-token word, and two-token words whose first
  // token ends some rows' outputs.
  SamplingParams greedy;
  greedy.temperature = 0;
  const std::vector<std::vector<float>> plain = [&] {
    StepBatch step;  // forward gives the logits of the chunks that sample
    for (int s = 0; s < n; ++s) {
      step.seqs.push_back(chunk_of(s, prompts[s], 0, static_cast<int>(prompts[s].size()), {2 * s, 2 * s + 1}));
      step.seqs.back().samples = {SampleSpec{.params = &greedy}};
    }
    return runner.forward(step);
  }();
  REQUIRE(plain.size() == static_cast<size_t>(n));
  for (int s = 0; s < n; ++s) {
    const auto best = std::max_element(plain[s].begin(), plain[s].end()) - plain[s].begin();
    if (s % 2 == 0) banned_greedy.bad_words_token_ids.push_back({static_cast<TokenId>(best)});
    else banned_greedy.bad_words_token_ids.push_back({outputs[s].back(), static_cast<TokenId>(best)});
  }
  banned_greedy.temperature = 0;
  banned_sampled = banned_greedy;
  banned_sampled.temperature = 0.9f;
  // Rows: allowed greedy, allowed sampled with logprobs, allowed within the even mask, bad words greedy, bad words
  // sampled (in turn); row 6 carries two samples (the CPU's).
  StepBatch step;
  for (int s = 0; s < n; ++s) {
    step.seqs.push_back(chunk_of(s, prompts[s], 0, static_cast<int>(prompts[s].size()), {2 * s, 2 * s + 1}));
    const int kind = s % 5;
    const SamplingParams* params[] = {&allowed_greedy, &allowed_sampled, &allowed_greedy, &banned_greedy,
                                      &banned_sampled};
    SampleSpec spec{.params = params[kind], .seed = 70u + s, .prompt = &prompts[s], .output = &outputs[s],
                    .stop_ids = &stops[s], .num_logprobs = kind == 1 ? 3 : 0,
                    .mask_source = kind == 2 ? &evens : nullptr};
    step.seqs.back().samples = {spec};
    if (s == 6) {
      SampleSpec second = spec;
      second.params = &banned_sampled;
      second.seed += 1000;
      step.seqs.back().samples.push_back(second);
    }
  }
  const std::vector<std::vector<float>> logits = runner.forward(step);
  const StepResult r = runner.execute(step);
  check_like_sample_logits(step, logits, r);
  int banned_best = 0;
  for (int s = 0; s < n; ++s)
    for (size_t k = 0; k < step.seqs[s].samples.size(); ++k) {
      INFO("row " << s << " sample " << k);
      const SampleSpec& spec = step.seqs[s].samples[k];
      const SampledToken& got = r.samples[s][k][0];
      const auto& allowed = spec.params->allowed_token_ids;
      if (!allowed.empty()) CHECK(std::count(allowed.begin(), allowed.end(), got.token) == 1);
      if (spec.mask_source) CHECK(got.token % 2 == 0);
      if (!spec.params->bad_words_token_ids.empty()) {
        const auto best = std::max_element(plain[s].begin(), plain[s].end()) - plain[s].begin();
        CHECK(got.token != best);  // the row's greedy choice is banned: alone (even rows) or after its last token
        ++banned_best;
      }
    }
  CHECK(banned_best >= 3);
}
