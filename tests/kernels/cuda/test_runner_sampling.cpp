// The CUDA runner's sampling of one step whose rows split between the GPU sampler (greedy, nothing else asked) and
// the CPU sampler (rows that ask logprobs, sampled from their downloaded logits): every CPU row gets exactly what
// paged::sample_logits gives on the runner's own logits (CudaModelRunner::forward of the same step), every GPU row
// the argmax, whether a few rows go to the CPU (each downloaded alone) or most of them (all downloaded at once).
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
  SamplingParams greedy;
  greedy.temperature = 0;
  for (const std::vector<int>& cpu_rows : {std::vector<int>{1, 6}, std::vector<int>{0, 1, 2, 3, 5, 6, 7}}) {
    INFO(cpu_rows.size() << " rows sampled on the CPU");
    StepBatch step;
    for (int s = 0; s < n; ++s) {
      step.seqs.push_back(chunk_of(s, prompts[s], 0, static_cast<int>(prompts[s].size()), {2 * s, 2 * s + 1}));
      SampleSpec spec{.params = &greedy, .prompt = &prompts[s], .output = &outputs[s]};
      if (std::count(cpu_rows.begin(), cpu_rows.end(), s)) spec.num_logprobs = 3;
      step.seqs.back().samples = {spec};
    }
    // The same step twice rewrites the same K/V: forward's logits are the ones execute samples from.
    std::vector<std::vector<float>> logits = runner.forward(step);
    const StepResult r = runner.execute(step);
    REQUIRE(r.samples.size() == static_cast<size_t>(n));
    for (int s = 0; s < n; ++s) {
      INFO("row " << s);
      const SampledToken& got = r.samples[s][0][0];
      if (std::count(cpu_rows.begin(), cpu_rows.end(), s)) {
        const SampledToken want = sample_logits(logits[s], step.seqs[s].samples[0])[0];
        CHECK(got.token == want.token);
        CHECK(got.logprob == want.logprob);
        CHECK(got.top_logprobs == want.top_logprobs);
        CHECK(got.top_logprobs.size() == 3);
      } else {
        CHECK(got.token == std::max_element(logits[s].begin(), logits[s].end()) - logits[s].begin());
      }
    }
  }
}
