// The CUDA runner's mixture-of-experts layers (runner_moe.cpp) on a small random Qwen3-MoE (16 experts, top-4,
// head_dim 64): one sequence's logits computed alone (single-token steps take the GEMV path, the experts' combination
// added into the residual, row tiles of 16), beside another sequence (the GEMM path) and replayed from decode graphs
// agree up to bf16 noise (their products differ, and a near-tie of the router may pick another expert), far below
// the difference to another sequence's logits. The kernels themselves are checked against their CPU twins in
// test_moe.cpp, the whole model against Hugging Face by tools/gpu/hf_parity.py.
#include "kernels/cuda/cuda_runner.h"
#include "tests/kernels/cuda/gpu_test_util.h"
#include "tests/kernels/cuda/small_llama.h"
#include "tests/kernels/step_chunks.h"

using namespace paged;
using namespace paged::gpu_test;
using paged::test::chunk_of;

TEST_CASE("the CUDA runner's MoE layers agree alone, batched and replayed from a graph", "[gpu][runner][moe]") {
  require_device();
  ModelConfig cfg = small_llama();
  cfg.model_type = "qwen3_moe";
  cfg.qk_norm = true;
  cfg.intermediate_size = 128;  // each expert's
  cfg.moe = {.num_experts = 16, .top_k = 4, .renormalize = true};
  CudaModelRunner runner(cfg, 11, small_runner_options(64, 4, 256));
  std::mt19937 rng(5);
  std::vector<TokenId> a(33), b(45);
  for (auto& t : a) t = static_cast<TokenId>(rng() % cfg.vocab_size);
  for (auto& t : b) t = static_cast<TokenId>(rng() % cfg.vocab_size);
  const int prompt = 30;  // a's prompt; a's last three tokens are fed as decode steps
  SamplingParams greedy;
  greedy.temperature = 0;
  const auto sampled = [&](SeqChunk c) {
    c.samples = {SampleSpec{.params = &greedy}};
    return c;
  };

  // Alone: a's prefill, then three single-token steps (the first captures the graph of batch 1, the others replay).
  std::vector<std::vector<float>> alone;
  StepBatch step;
  step.seqs = {sampled(chunk_of(0, a, 0, prompt, {0, 1, 2}))};
  alone.push_back(runner.forward(step).at(0));
  for (int i = prompt; i < 33; ++i) {
    step.seqs = {sampled(chunk_of(0, a, i, i + 1, {0, 1, 2}))};
    alone.push_back(runner.forward(step).at(0));
  }
  // Batched: a beside b, on other blocks, the same steps (graphs of batch 2).
  std::vector<std::vector<float>> batched, other;
  step.seqs = {sampled(chunk_of(1, b, 0, 42, {8, 9, 10})), sampled(chunk_of(0, a, 0, prompt, {4, 5, 6}))};
  std::vector<std::vector<float>> logits = runner.forward(step);
  other.push_back(logits.at(0));
  batched.push_back(logits.at(1));
  for (int i = 0; i < 3; ++i) {
    step.seqs = {sampled(chunk_of(1, b, 42 + i, 43 + i, {8, 9, 10})),
                 sampled(chunk_of(0, a, prompt + i, prompt + i + 1, {4, 5, 6}))};
    logits = runner.forward(step);
    other.push_back(logits.at(0));
    batched.push_back(logits.at(1));
  }
  for (size_t k = 0; k < alone.size(); ++k) {
    INFO("step " << k);
    bool finite = true;
    for (float x : alone[k]) finite = finite && std::isfinite(x);
    CHECK(finite);
    const double same = relative_l2(batched[k], alone[k]), different = relative_l2(other[k], alone[k]);
    INFO("alone vs batched " << same << ", vs the other sequence " << different);
    CHECK(same < 0.1);
    CHECK(different > 0.3);
  }
}
