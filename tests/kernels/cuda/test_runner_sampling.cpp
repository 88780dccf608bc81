// The CUDA runner's sampling of one step whose rows split between the GPU sampler (greedy; with logprob
// alternatives scored on the GPU after sampling) and the CPU sampler (rows with a penalty, sampled from their
// downloaded logits): against paged::sample_logits on the runner's own logits (CudaModelRunner::forward of the same
// step), every CPU row gets exactly its answer, every GPU row its token and, where asked, its alternatives (logprobs
// within float rounding of the CPU's double sums), whether a few rows go to the CPU (each downloaded alone) or most
// of them (all downloaded at once).
#include <algorithm>

#include "kernels/cuda/cuda_runner.h"
#include "model/sampling/sampler.h"
#include "tests/kernels/cuda/gpu_test_util.h"
#include "tests/kernels/step_chunks.h"

using namespace paged;
using namespace paged::gpu_test;
using paged::test::chunk_of;

TEST_CASE("a step's CPU-sampled rows get sample_logits of their own logits, the rest the GPU's argmax",
          "[gpu][runner]") {
  require_device();
  ModelConfig cfg;
  cfg.model_type = "llama";
  cfg.hidden_size = 256;
  cfg.num_layers = 2;
  cfg.num_heads = 4;
  cfg.num_kv_heads = 2;
  cfg.head_dim = 64;
  cfg.intermediate_size = 512;
  cfg.vocab_size = 1000;
  cfg.max_position_embeddings = 256;
  cfg.rms_norm_eps = 1e-5;
  cfg.torch_dtype = "bfloat16";
  CudaRunnerOptions opt;
  opt.block_size = 16;
  opt.num_blocks = 64;
  opt.max_num_seqs = 8;
  opt.max_num_batched_tokens = 256;
  opt.max_model_len = 256;
  opt.swap_space_gib = 0.01;
  CudaModelRunner runner(cfg, 11, opt);
  std::mt19937 rng(5);
  const int n = 8;
  std::vector<std::vector<TokenId>> prompts(n), outputs(n);
  for (int s = 0; s < n; ++s) {
    prompts[s].resize(3 + 4 * s);
    for (auto& t : prompts[s]) t = static_cast<TokenId>(rng() % cfg.vocab_size);
  }
  SamplingParams greedy, penalised;
  greedy.temperature = 0;
  penalised.temperature = 0;
  penalised.repetition_penalty = 1.3f;  // logits processing: the CPU sampler's
  const std::vector<int> scored_rows = {2, 4, 5};  // GPU rows that ask alternatives
  for (const std::vector<int>& cpu_rows : {std::vector<int>{1, 6}, std::vector<int>{0, 1, 2, 3, 5, 6, 7}}) {
    INFO(cpu_rows.size() << " rows sampled on the CPU");
    StepBatch step;
    for (int s = 0; s < n; ++s) {
      step.seqs.push_back(chunk_of(s, prompts[s], 0, static_cast<int>(prompts[s].size()), {2 * s, 2 * s + 1}));
      const bool on_cpu = std::count(cpu_rows.begin(), cpu_rows.end(), s) > 0;
      SampleSpec spec{.params = on_cpu ? &penalised : &greedy, .prompt = &prompts[s], .output = &outputs[s]};
      if (on_cpu || std::count(scored_rows.begin(), scored_rows.end(), s)) spec.num_logprobs = 3 + s % 2;
      step.seqs.back().samples = {spec};
    }
    // The same step twice rewrites the same K/V: forward's logits are the ones execute samples from.
    std::vector<std::vector<float>> logits = runner.forward(step);
    const StepResult r = runner.execute(step);
    REQUIRE(r.samples.size() == static_cast<size_t>(n));
    for (int s = 0; s < n; ++s) {
      INFO("row " << s);
      const SampledToken& got = r.samples[s][0][0];
      const SampledToken want = sample_logits(logits[s], step.seqs[s].samples[0])[0];
      const size_t asked = static_cast<size_t>(step.seqs[s].samples[0].num_logprobs);
      CHECK(got.token == want.token);
      REQUIRE(got.top_logprobs.size() == asked);
      REQUIRE(want.top_logprobs.size() == asked);
      if (std::count(cpu_rows.begin(), cpu_rows.end(), s)) {
        CHECK(got.logprob == want.logprob);
        CHECK(got.top_logprobs == want.top_logprobs);
      } else {
        CHECK(got.logprob == Approx(want.logprob).margin(1e-4));
        for (size_t k = 0; k < asked; ++k) {
          CHECK(got.top_logprobs[k].first == want.top_logprobs[k].first);
          CHECK(got.top_logprobs[k].second == Approx(want.top_logprobs[k].second).margin(1e-4));
        }
      }
    }
  }
}
