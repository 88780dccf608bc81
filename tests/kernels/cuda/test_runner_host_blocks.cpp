// The CUDA runner's host-block access (read_host_block / write_host_block, the disk tier's path): the KV of two
// device blocks swapped out, read, written into two other host blocks and swapped into two other device blocks
// continues the sequence with bit-identical logits; out-of-range blocks and sizes are refused. And the steps beside
// swaps: each waits for the copies whose blocks it uses. Small random Llama.
#include <cstddef>

#include "kernels/cuda/cuda_runner.h"
#include "tests/kernels/cuda/gpu_test_util.h"
#include "tests/kernels/cuda/small_llama.h"
#include "tests/kernels/step_chunks.h"

using namespace paged;
using namespace paged::gpu_test;
using paged::test::chunk_of;

namespace {

// 33 token ids of the model's vocabulary.
std::vector<TokenId> random_tokens(std::mt19937& rng, const ModelConfig& cfg) {
  std::vector<TokenId> tokens(33);
  for (auto& t : tokens) t = static_cast<TokenId>(rng() % cfg.vocab_size);
  return tokens;
}

}  // namespace

TEST_CASE("the CUDA runner's host blocks read and written back carry a sequence's KV exactly", "[gpu][runner]") {
  require_device();
  const ModelConfig cfg = small_llama();
  CudaRunnerOptions opt = small_runner_options(16, 4, 64);
  CudaModelRunner runner(cfg, 11, opt);
  REQUIRE(runner.num_swap_blocks() >= 4);
  std::mt19937 rng(5);
  const std::vector<TokenId> tokens = random_tokens(rng, cfg);

  StepBatch prefill;
  prefill.seqs.push_back(chunk_of(0, tokens, 0, 32, {0, 1}));
  runner.execute(prefill);  // device blocks 0 and 1 hold the KV of tokens[0, 32)

  runner.swap_out({{0, 0}, {1, 1}});
  const int64_t bytes = runner.host_block_bytes();
  REQUIRE(bytes == int64_t{2} * cfg.num_layers * cfg.num_kv_heads * opt.block_size * cfg.head_dim * 2);
  std::vector<std::byte> first(bytes), second(bytes), again(bytes);
  runner.read_host_block(0, first);  // waits for the swap-out on the copy stream
  runner.read_host_block(1, second);
  CHECK(first != second);
  runner.write_host_block(2, first);
  runner.write_host_block(3, second);
  runner.read_host_block(2, again);
  CHECK(again == first);
  runner.swap_in({{2, 5}, {3, 6}});

  SamplingParams greedy;
  greedy.temperature = 0;
  const auto next_logits = [&](std::vector<int32_t> table) {
    StepBatch step;
    step.seqs.push_back(chunk_of(1, tokens, 32, 33, std::move(table)));
    step.seqs.back().samples = {SampleSpec{.params = &greedy}};
    return runner.forward(step).at(0);
  };
  CHECK(next_logits({5, 6, 7}) == next_logits({0, 1, 2}));  // the same KV, moved through the host blocks

  std::vector<std::byte> short_buffer(bytes - 1);
  CHECK_THROWS_AS(runner.read_host_block(0, short_buffer), std::out_of_range);
  CHECK_THROWS_AS(runner.write_host_block(runner.num_swap_blocks(), first), std::out_of_range);
  CHECK_THROWS_AS(runner.read_host_block(-1, first), std::out_of_range);
}

// Swaps run on the copy stream beside the steps that use none of their blocks, and a step that does use one waits
// for them: a step that writes over blocks being swapped out, and one that reads blocks being swapped in, each
// queued behind 150 separate copies (slow enough that a step that did not wait would beat them).
TEST_CASE("the CUDA runner's steps wait for the swaps whose blocks they use, and only those", "[gpu][runner]") {
  require_device();
  const ModelConfig cfg = small_llama();
  CudaRunnerOptions opt = small_runner_options(512, 4, 64);
  CudaModelRunner runner(cfg, 13, opt);
  REQUIRE(runner.num_swap_blocks() >= 402);
  std::mt19937 rng(6);
  const std::vector<TokenId> a = random_tokens(rng, cfg), b = random_tokens(rng, cfg);
  SamplingParams greedy;
  greedy.temperature = 0;
  const auto prefill = [&](SeqId seq, const std::vector<TokenId>& tokens, std::vector<int32_t> table) {
    StepBatch step;
    step.seqs.push_back(chunk_of(seq, tokens, 0, 32, std::move(table)));
    runner.execute(step);
  };
  const auto next_logits = [&](SeqId seq, const std::vector<TokenId>& tokens, std::vector<int32_t> table) {
    StepBatch step;
    step.seqs.push_back(chunk_of(seq, tokens, 32, 33, std::move(table)));
    step.seqs.back().samples = {SampleSpec{.params = &greedy}};
    return runner.forward(step).at(0);
  };
  // 150 copies of one block each (no two consecutive: none merged), ahead of the swap that matters.
  const auto slow_swaps = [](int device_first, int host_first) {
    std::vector<BlockPair> pairs;
    for (int i = 0; i < 150; ++i) pairs.emplace_back(device_first + 2 * i, host_first + 2 * i);
    return pairs;
  };

  prefill(0, a, {0, 1});
  const std::vector<float> a_next = next_logits(0, a, {0, 1, 2});
  prefill(1, b, {40, 41});
  const std::vector<float> b_next = next_logits(1, b, {40, 41, 42});

  runner.swap_out(slow_swaps(100, 0));
  runner.swap_out({{0, 400}, {1, 401}});
  prefill(1, b, {0, 1});  // writes over a's swapped-out blocks: waits until they are copied

  std::vector<BlockPair> back;
  for (const auto& [device, host] : slow_swaps(100, 0)) back.emplace_back(host, device + 1);
  runner.swap_in(back);
  runner.swap_in({{400, 20}, {401, 21}});
  CHECK(next_logits(1, b, {40, 41, 42}) == b_next);  // uses none of the swapped blocks: runs beside the copies
  CHECK(next_logits(0, a, {20, 21, 22}) == a_next);  // reads the swapped-in blocks: waits for them
}
