// The executor in another process's place: a Worker published on loopback and an Engine that reaches it through
// CAF's network layer (a real TCP connection), against the same engine with its executor in-process, on the real
// stories260K model. Plus the wire form of a step on its own, and what an engine refuses to connect to.
#include <catch2/catch.hpp>

#include <random>

#include "actors/engine.h"
#include "actors/messages.h"
#include "actors/worker.h"
#include "model/loader/config.h"
#include "actors/step_wire.h"
#include "tests/test_data.h"

using namespace paged;
using namespace paged::test;

namespace {

EngineConfig cpu_config() {
  EngineConfig c;
  c.model_dir = kModel;
  c.device = "cpu";
  c.max_num_seqs = 8;  // continuous batching with a queue: more prompts than seats
  return c;
}

// Mixed prompts: golden ones and random ids of varied lengths.
std::vector<std::vector<TokenId>> prompts(int vocab) {
  std::vector<std::vector<TokenId>> out;
  const auto golden = read_json(kGolden);
  for (const auto& tc : golden.at("cases").as_array()) out.push_back(ids_of(tc.at("prompt_ids")));
  std::mt19937 rng(5);
  std::uniform_int_distribution<TokenId> id(3, vocab - 1);
  for (int i = 0; i < 11; ++i) {
    std::vector<TokenId> p(1 + 7 * i);
    for (auto& t : p) t = id(rng);
    out.push_back(std::move(p));
  }
  return out;
}

std::vector<std::vector<TokenId>> completions(const std::vector<RequestOutput>& outs) {
  std::vector<std::vector<TokenId>> ids;
  for (const RequestOutput& r : outs)
    for (const CompletionOutput& c : r.outputs) ids.push_back(c.token_ids);
  return ids;
}

}  // namespace

TEST_CASE("a step survives its wire form: same samples from the runner", "[remote]") {
  const ModelConfig cfg = load_model_config(kModel);
  const SafeTensors weights(kModel);
  CpuModelRunner direct(cfg, weights, {.block_size = 16, .num_blocks = 16});
  CpuModelRunner remote(cfg, weights, {.block_size = 16, .num_blocks = 16});
  SamplingParams params;
  params.temperature = 0.8f;
  params.top_k = 40;
  params.top_p = 0.9f;
  params.min_p = 0.02f;
  params.repetition_penalty = 1.3f;
  params.presence_penalty = 0.5f;
  params.frequency_penalty = 0.25f;
  params.min_tokens = 5;
  params.logit_bias = {{5, 2.5f}, {17, -100.0f}};
  const std::vector<TokenId> prompt = {1, 403, 407, 261, 378}, output = {300, 301, 300}, stops = {2, 17};
  StepBatch b;
  SeqChunk& c = b.seqs.emplace_back();
  c.seq = 42;
  c.tokens = prompt;
  c.block_table = {3};
  for (int i = 0; i < 2; ++i)
    c.samples.push_back(SampleSpec{.params = &params, .seed = 7u + i, .prompt = &prompt, .output = &output,
                                   .stop_ids = &stops, .num_logprobs = 3, .num_candidates = 2});
  const WireStep wire = to_wire(b);
  const StepBatch back = from_wire(wire);
  REQUIRE(back.seqs.size() == 1);
  CHECK(back.seqs[0].seq == 42);
  CHECK(back.seqs[0].block_table == c.block_table);
  REQUIRE(back.seqs[0].samples.size() == 2);
  CHECK(*back.seqs[0].samples[1].output == output);
  CHECK(back.seqs[0].samples[1].params->logit_bias == params.logit_bias);
  const StepResult want = direct.execute(b), got = remote.execute(back);
  REQUIRE(got.samples.size() == 1);
  for (int s = 0; s < 2; ++s)
    for (int k = 0; k < 2; ++k) {
      const SampledToken &g = got.samples[0][s][k], &w = want.samples[0][s][k];
      CHECK(g.token == w.token);
      CHECK(g.logprob == w.logprob);
      CHECK(g.top_logprobs == w.top_logprobs);
    }
}

TEST_CASE("every sampling parameter survives CAF's serialisation of a wire step, unset optional ones too",
          "[remote]") {
  // Every field away from its default.
  const SamplingParams set{.n = 3, .best_of = 5, .use_beam_search = true, .max_tokens = 77, .min_tokens = 4,
                           .temperature = 0.7f, .top_p = 0.8f, .top_k = 12, .min_p = 0.05f, .seed = uint64_t{1} << 40,
                           .repetition_penalty = 1.1f, .presence_penalty = -0.5f, .frequency_penalty = 0.3f,
                           .logit_bias = {{3, 1.5f}, {9, -2.0f}}, .stop_token_ids = {7, 8}, .stop = {"\n\n", "The end"},
                           .ignore_eos = true, .logprobs = 4, .skip_special_tokens = false};
  const SamplingParams unset;  // no seed, no logprobs
  const std::vector<TokenId> prompt = {1, 2, 3}, output = {4}, stops = {2, 7, 8};
  StepBatch b;
  b.copies = {{5, 6}};
  SeqChunk& c = b.seqs.emplace_back();
  c.seq = 9;
  c.tokens = {4};
  c.start_pos = 3;
  c.block_table = {0};
  for (const SamplingParams* p : {&set, &unset})
    c.samples.push_back(SampleSpec{.params = p, .seed = 11, .prompt = &prompt, .output = &output, .stop_ids = &stops,
                                   .num_logprobs = 4, .num_candidates = 2});

  WireStep sent = to_wire(b), received;
  std::vector<char> bytes;
  caf::binary_serializer sink(nullptr, bytes);
  REQUIRE_FALSE(sink(sent));
  caf::binary_deserializer source(nullptr, bytes);
  REQUIRE_FALSE(source(received));
  const StepBatch back = from_wire(received);

  CHECK(back.copies == b.copies);
  REQUIRE(back.seqs.size() == 1);
  CHECK(back.seqs[0].seq == 9);
  CHECK(back.seqs[0].tokens == c.tokens);
  CHECK(back.seqs[0].start_pos == 3);
  CHECK(back.seqs[0].block_table == c.block_table);
  REQUIRE(back.seqs[0].samples.size() == 2);
  const SampleSpec& spec = back.seqs[0].samples[0];
  CHECK(spec.seed == 11);
  CHECK(*spec.prompt == prompt);
  CHECK(*spec.output == output);
  CHECK(*spec.stop_ids == stops);
  CHECK(spec.num_logprobs == 4);
  CHECK(spec.num_candidates == 2);
  CHECK(*spec.params == set);
  CHECK(*back.seqs[0].samples[1].params == unset);
}

TEST_CASE("an engine whose executor is a worker on loopback generates what an in-process one does", "[remote]") {
  Worker worker(cpu_config(), "127.0.0.1", 0);
  REQUIRE(worker.port() != 0);
  CHECK(worker.info().device == "cpu");
  EngineConfig remote_config = cpu_config();
  remote_config.device = "auto";  // the worker's device counts, not this process's
  remote_config.remote_executor = "127.0.0.1:" + std::to_string(worker.port());
  Engine remote(remote_config);
  CHECK(remote.config().device == "cpu");
  Engine local(cpu_config());
  const auto ps = prompts(local.model_config().vocab_size);

  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 40;
  CHECK(completions(remote.generate(ps, greedy)) == completions(local.generate(ps, greedy)));

  SamplingParams sampled;  // seeded sampling with penalties and two completions per prompt
  sampled.temperature = 0.9f;
  sampled.top_p = 0.95f;
  sampled.seed = 1234;
  sampled.n = 2;
  sampled.repetition_penalty = 1.2f;
  sampled.frequency_penalty = 0.3f;
  sampled.max_tokens = 24;
  sampled.logprobs = 2;
  const auto r = remote.generate(ps, sampled), l = local.generate(ps, sampled);
  CHECK(completions(r) == completions(l));
  REQUIRE(r.size() == l.size());
  for (size_t i = 0; i < r.size(); ++i)
    for (size_t j = 0; j < r[i].outputs.size(); ++j) {
      REQUIRE(r[i].outputs[j].logprobs.size() == l[i].outputs[j].logprobs.size());
      for (size_t k = 0; k < r[i].outputs[j].logprobs.size(); ++k)
        CHECK(r[i].outputs[j].logprobs[k].top_logprobs == l[i].outputs[j].logprobs[k].top_logprobs);
    }

  SamplingParams beam;
  beam.use_beam_search = true;
  beam.n = 3;
  beam.temperature = 0.0f;
  beam.max_tokens = 12;
  const std::vector<std::vector<TokenId>> few(ps.begin(), ps.begin() + 3);
  CHECK(completions(remote.generate(few, beam)) == completions(local.generate(few, beam)));
  remote.wait_idle();
  CHECK(remote.metrics().kv_blocks_free.load() == remote.metrics().kv_blocks_total.load());
}

TEST_CASE("an engine refuses a worker it cannot use, naming why", "[remote]") {
  const auto refused = [](const EngineConfig& c, const std::string& why) {
    try {
      Engine engine(c);
      FAIL("the engine started");
    } catch (const ModelError& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find("--remote-executor") != std::string::npos);
      CHECK(std::string(e.what()).find(why) != std::string::npos);
    }
  };
  EngineConfig c = cpu_config();
  uint16_t closed = 0;
  {
    Worker gone(cpu_config(), "127.0.0.1", 0);
    closed = gone.port();
  }
  c.remote_executor = "127.0.0.1:" + std::to_string(closed);
  refused(c, "127.0.0.1");
  c.remote_executor = "localhost";
  refused(c, "HOST:PORT");
  Worker worker(cpu_config(), "127.0.0.1", 0);
  c.remote_executor = "127.0.0.1:" + std::to_string(worker.port());
  c.block_size = 32;
  refused(c, "--block-size");
  c.block_size = 16;
  c.max_num_seqs = 64;
  refused(c, "--max-num-seqs");
  c.max_num_seqs = 8;
  c.tensor_parallel_size = 2;
  refused(c, "--tensor-parallel-size");
}

