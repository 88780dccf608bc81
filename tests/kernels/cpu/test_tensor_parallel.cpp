// Tensor parallelism on CPU executors: stories260K (8 heads, 4 KV heads) sharded over 2 and 4 ranks with the
// in-process all-reduce gives the greedy outputs of one rank; sizes that do not divide the heads are refused.
#include <catch2/catch.hpp>

#include <algorithm>
#include <boost/json.hpp>
#include <cmath>
#include <condition_variable>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "actors/engine.h"
#include "tests/test_data.h"
#include "model/loader/config.h"
#include "kernels/cpu/cpu_runner.h"
#include "model/loader/safetensors.h"
#include "kernels/cpu/local_all_reduce.h"

using namespace paged;
using namespace paged::test;

namespace {


std::vector<std::vector<TokenId>> golden_field(const char* field) {
  std::ifstream in(kGolden);
  REQUIRE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  std::vector<std::vector<TokenId>> out;
  const boost::json::value golden = boost::json::parse(ss.str());
  for (const auto& tc : golden.at("cases").as_array()) {
    auto& ids = out.emplace_back();
    for (const auto& x : tc.at(field).as_array()) ids.push_back(static_cast<TokenId>(x.as_int64()));
  }
  return out;
}

/// 48 prompts of 2 .. 120 tokens cut from TinyStories text (the golden prompts and continuations), with
/// max_tokens of 4 .. 40; the five golden prompts themselves come first, with 64 tokens.
void mixed_batch(std::vector<std::vector<TokenId>>& prompts, std::vector<SamplingParams>& params) {
  const auto golden_prompts = golden_field("prompt_ids");
  const auto golden_outputs = golden_field("greedy_ids");
  std::vector<TokenId> text;
  for (size_t i = 0; i < golden_prompts.size(); ++i) {
    text.insert(text.end(), golden_prompts[i].begin() + 1, golden_prompts[i].end());
    text.insert(text.end(), golden_outputs[i].begin(), golden_outputs[i].end());
  }
  SamplingParams p;
  p.temperature = 0.0f;
  for (const auto& g : golden_prompts) {
    prompts.push_back(g);
    p.max_tokens = 64;
    params.push_back(p);
  }
  std::mt19937_64 rng(48);
  while (prompts.size() < 48) {
    const size_t len = 2 + rng() % 119, offset = rng() % text.size();
    std::vector<TokenId> prompt{1};
    for (size_t i = 0; prompt.size() < len; ++i) prompt.push_back(text[(offset + i) % text.size()]);
    prompts.push_back(prompt);
    p.max_tokens = 4 + static_cast<int>(rng() % 37);
    params.push_back(p);
  }
}

std::vector<std::vector<TokenId>> run_all(Engine& engine, const std::vector<std::vector<TokenId>>& prompts,
                                          const std::vector<SamplingParams>& params) {
  struct Shared {  // owned by the sinks too: a failed wait leaves nothing dangling
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::vector<TokenId>> out;
    size_t remaining = 0;
    bool failed = false;
  };
  auto sh = std::make_shared<Shared>();
  sh->out.resize(prompts.size());
  sh->remaining = prompts.size();
  for (size_t i = 0; i < prompts.size(); ++i)
    engine.submit(prompts[i], params[i], [sh, i](RequestEvent ev) {
      std::lock_guard lock(sh->mu);
      for (const auto& d : ev.deltas) sh->out[i].insert(sh->out[i].end(), d.token_ids.begin(), d.token_ids.end());
      sh->failed = sh->failed || ev.error.has_value();
      if (ev.done && --sh->remaining == 0) sh->cv.notify_all();
    });
  std::unique_lock lock(sh->mu);
  REQUIRE(sh->cv.wait_for(lock, std::chrono::seconds(120), [&] { return sh->remaining == 0; }));
  REQUIRE_FALSE(sh->failed);
  return sh->out;
}

}  // namespace

TEST_CASE("tensor_parallel_size 2 and 4 on CPU give the greedy outputs of size 1 on 48 mixed prompts", "[tp]") {
  std::vector<std::vector<TokenId>> prompts;
  std::vector<SamplingParams> params;
  mixed_batch(prompts, params);
  const auto golden = golden_field("greedy_ids");

  std::vector<std::vector<TokenId>> reference;
  for (int tp : {1, 2, 4}) {
    INFO("tensor_parallel_size " << tp);
    EngineConfig cfg;
    cfg.model_dir = kModel;
    cfg.device = "cpu";
    cfg.tensor_parallel_size = tp;
    cfg.swap_space_gib = 0.05;
    cfg.max_num_batched_tokens = 512;
    Engine engine(cfg);
    CHECK(engine.config().tensor_parallel_size == tp);
    const auto out = run_all(engine, prompts, params);
    for (size_t i = 0; i < golden.size(); ++i) CHECK(out[i] == golden[i]);  // Hugging Face's greedy tokens
    if (tp == 1) {
      reference = out;
      continue;
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      INFO("prompt " << i << " (" << prompts[i].size() << " tokens)");
      CHECK(out[i] == reference[i]);
    }
    engine.wait_idle();
    CHECK(engine.metrics().kv_blocks_free == engine.metrics().kv_blocks_total);
  }
}

TEST_CASE("a tensor_parallel_size that does not divide the heads is a clear error", "[tp]") {
  EngineConfig cfg;
  cfg.model_dir = kModel;
  cfg.device = "cpu";
  cfg.tensor_parallel_size = 3;
  try {
    Engine engine(cfg);
    FAIL("an engine with tensor_parallel_size 3 was built for 8 heads and 4 KV heads");
  } catch (const ModelError& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(what.find("tensor_parallel_size 3") != std::string::npos);
    CHECK(what.find("heads") != std::string::npos);
  }
  cfg.tensor_parallel_size = 8;  // divides the 8 heads but not the 4 KV heads
  CHECK_THROWS_AS(Engine(cfg), ModelError);
  cfg.tensor_parallel_size = 0;
  CHECK_THROWS_AS(Engine(cfg), ModelError);
}

TEST_CASE("CPU runner shards: two ranks with the all-reduce give the logits of one rank", "[tp]") {
  const ModelConfig cfg = load_model_config(kModel);
  SafeTensors weights(kModel);
  const auto prompts = golden_field("prompt_ids");
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  StepBatch batch;
  int next_block = 0;
  for (size_t s = 0; s < prompts.size(); ++s) {
    SeqChunk c;
    c.seq = s;
    c.tokens = prompts[s];
    c.block_table = {next_block++};
    c.samples.push_back(SampleSpec{.params = &greedy});
    batch.seqs.push_back(c);
  }
  CpuModelRunner single(cfg, weights, CpuRunnerOptions{.block_size = 16, .num_blocks = next_block});
  const auto expected = single.forward(batch);

  LocalAllReduce all_reduce(2);
  CpuModelRunner rank0(cfg, weights,
                       CpuRunnerOptions{.block_size = 16, .num_blocks = next_block, .tp_rank = 0, .tp_size = 2,
                                        .all_reduce = &all_reduce});
  CpuModelRunner rank1(cfg, weights,
                       CpuRunnerOptions{.block_size = 16, .num_blocks = next_block, .tp_rank = 1, .tp_size = 2,
                                        .all_reduce = &all_reduce});
  CHECK(rank0.block_elems() * 2 == single.block_elems());  // each rank holds half the KV heads of every block
  std::vector<std::vector<float>> from_rank1;
  std::thread t([&] { from_rank1 = rank1.forward(batch); });
  const auto got = rank0.forward(batch);
  t.join();
  CHECK(from_rank1.empty());  // only rank 0 produces logits
  REQUIRE(got.size() == expected.size());
  for (size_t s = 0; s < got.size(); ++s) {
    float max_diff = 0.0f;
    for (size_t v = 0; v < got[s].size(); ++v) max_diff = std::max(max_diff, std::abs(got[s][v] - expected[s][v]));
    INFO("sequence " << s << ": max |logit difference| " << max_diff);
    CHECK(max_diff < 1e-4f);
    CHECK(std::max_element(got[s].begin(), got[s].end()) - got[s].begin() ==
          std::max_element(expected[s].begin(), expected[s].end()) - expected[s].begin());
  }
}
