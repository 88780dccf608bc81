// The executor in another process's place: a Worker published on loopback and an Engine that reaches it through
// CAF's network layer (a real TCP connection), against the same engine with its executor in-process, on the real
// stories260K model. Plus the wire form of a step on its own, what an engine refuses to connect to, and the
// worker's hardening: bad steps (and bytes that are no step) and swap orders refused with an error while the worker
// stays healthy, a runner that throws, one engine served at a time, none of an engine's sequences known to the next;
// and a proxy's answer to a worker's result that does not unpack.
#include <catch2/catch.hpp>

#include <caf/io/all.hpp>

#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <variant>

#include "actors/actors.h"
#include "actors/engine.h"
#include "actors/messages.h"
#include "actors/worker.h"
#include "model/loader/config.h"
#include "model/tokenizer/load_tokenizer.h"
#include "actors/step_wire.h"
#include "tests/actors/same_step.h"
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

// An engine of config `c` fails to start with a ModelError naming --workers and `why`.
void expect_refused(const EngineConfig& c, const std::string& why) {
  try {
    Engine engine(c);
    FAIL("the engine started");
  } catch (const ModelError& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find("--workers") != std::string::npos);
    CHECK(std::string(e.what()).find(why) != std::string::npos);
  }
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

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A head of the test's own on a worker: another CAF node that sends what it is told, as an engine's proxy would.
class RawHead {
 public:
  explicit RawHead(uint16_t port) {
    register_message_types(cfg_);
    cfg_.load<caf::io::middleman>();
    system_ = std::make_unique<caf::actor_system>(cfg_);
    auto worker = system_->middleman().remote_actor("127.0.0.1", port);
    REQUIRE(worker);
    worker_ = *worker;
    self_ = std::make_unique<caf::scoped_actor>(*system_);
  }
  // The worker's answer to (xs...): the Reply, or the error rendered as an engine renders it.
  template <class Reply, class... Ts>
  std::pair<std::optional<Reply>, std::string> ask(const Ts&... xs) {
    std::optional<Reply> reply;
    std::string error;
    (*self_)->request(worker_, std::chrono::seconds(30), xs...)
        .receive([&](Reply& r) { reply = std::move(r); }, [&](caf::error& e) { error = system_->render(e); });
    return {std::move(reply), std::move(error)};
  }
  // The worker's answer to `bytes` as a step: the result it unpacks to, or the error rendered.
  std::pair<std::optional<StepResult>, std::string> step_bytes(std::string bytes) {
    auto [packed, error] = ask<PackedResult>(step_atom::value, PackedStep{std::move(bytes)});
    if (!packed) return {std::nullopt, std::move(error)};
    auto result = unpack_result(packed->bytes);
    if (const auto* bad = std::get_if<FieldError>(&result)) return {std::nullopt, "unpack: " + bad->describe()};
    return {std::get<StepResult>(std::move(result)), ""};
  }
  std::pair<std::optional<StepResult>, std::string> step(const WireStep& wire) { return step_bytes(pack_step(wire)); }
  // The error the worker answers a step with ("" when it executes it).
  std::string step_error(const WireStep& wire) { return step(wire).second; }
  // What any node that reaches the port can send: CAF's exit (anonymous and from an actor of its own) and error
  // messages, and a message of a type the worker does not take. (Not exit_reason::kill: CAF ends any actor on it,
  // before its exit handler; see worker_executor_actor.)
  void send_system_messages() {
    caf::anon_send_exit(worker_, caf::exit_reason::user_shutdown);  // its source: the worker's own address
    (*self_)->send_exit(worker_, caf::exit_reason::unreachable);
    caf::anon_send(worker_, caf::make_error(caf::sec::runtime_error));
    (*self_)->send(worker_, caf::make_error(caf::sec::request_receiver_down));
    (*self_)->send(worker_, std::string("not a message a worker takes"));
  }

 private:
  caf::actor_system_config cfg_;
  std::unique_ptr<caf::actor_system> system_;
  caf::actor worker_;
  std::unique_ptr<caf::scoped_actor> self_;
};

// One greedy sequence `id` on a runner's blocks `blocks`: its prefill step, then decode steps, each sampling one
// token with logprobs; the sampling inputs live here.
struct GreedySequence {
  SeqId id = 5;
  std::vector<int32_t> blocks{0, 1};
  SamplingParams params;
  std::vector<TokenId> prompt{1, 403, 407, 261, 378, 22, 90}, output, stop_ids;

  GreedySequence() {
    params.temperature = 0.0f;
    params.logprobs = 2;
  }
  // The next step: the prompt first, then the last token sampled.
  StepBatch next() const {
    StepBatch b;
    SeqChunk& c = b.seqs.emplace_back();
    c.seq = id;
    c.tokens = output.empty() ? prompt : std::vector<TokenId>{output.back()};
    c.start_pos = output.empty() ? 0 : static_cast<int32_t>(prompt.size() + output.size()) - 1;
    c.block_table = blocks;
    c.samples.push_back({.params = &params, .seed = 1, .prompt = &prompt, .output = &output, .stop_ids = &stop_ids,
                         .num_logprobs = 2, .num_candidates = 1});
    return b;
  }
};

// `b` as the first step of an engine: everything it refers to on the wire.
WireStep first_wire_step(const StepBatch& b) { return WireEncoder().encode(b); }

// The sampled token of a one-chunk, one-sample result, with its logprobs.
SampledToken only_sample(const StepResult& r) {
  REQUIRE(r.samples.size() == 1);
  REQUIRE(r.samples[0].size() == 1);
  REQUIRE(r.samples[0][0].size() == 1);
  return r.samples[0][0][0];
}

// A runner that throws std::out_of_range for sequence 13 (as kv_slot does for a table that is too short) and on
// every swap-out, and else answers an empty sample list per chunk.
class ThrowingRunner final : public ModelRunner {
 public:
  StepResult execute(const StepBatch& batch) override {
    StepResult r;
    for (const SeqChunk& c : batch.seqs) {
      if (c.seq == 13) throw std::out_of_range("vector::_M_range_check");
      r.seqs.push_back(c.seq);
    }
    return r;
  }
  void swap_out(const std::vector<BlockPair>&) override { throw std::out_of_range("swap out"); }
  void swap_in(const std::vector<BlockPair>&) override {}
};

// The error `to` answers (xs...) with, rendered; "" when it answers a Reply.
template <class Reply, class... Ts>
std::string error_reply(caf::scoped_actor& self, const caf::actor& to, const Ts&... xs) {
  std::string error = "(no answer)";
  self->request(to, std::chrono::seconds(10), xs...)
      .receive([&](const Reply&) { error.clear(); }, [&](caf::error& e) { error = self->system().render(e); });
  return error;
}

// A step of one chunk for sequence `seq` at position 0 on block 0.
StepBatch one_token_step(SeqId seq) {
  StepBatch b;
  b.seqs.push_back({.seq = seq, .tokens = {1}, .start_pos = 0, .block_table = {0}, .samples = {}});
  return b;
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
  WireDecoder decoder({.vocab_size = cfg.vocab_size, .block_size = 16, .num_blocks = 16, .num_swap_blocks = 0,
                        .max_model_len = 64, .max_num_batched_tokens = 64});
  auto decoded = decoder.decode(first_wire_step(b));
  REQUIRE(std::holds_alternative<StepBatch>(decoded));
  const StepBatch& back = std::get<StepBatch>(decoded);
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

TEST_CASE("every sampling parameter survives a wire step's packing and decoding, unset optional ones too",
          "[remote]") {
  // Every field away from its default (temperature 0, as beam search needs, for a step that passes the check).
  const SamplingParams set{.n = 3, .best_of = 5, .use_beam_search = true, .max_tokens = 77, .min_tokens = 4,
                           .temperature = 0.0f, .top_p = 0.8f, .top_k = 12, .min_p = 0.05f, .seed = uint64_t{1} << 40,
                           .repetition_penalty = 1.1f, .presence_penalty = -0.5f, .frequency_penalty = 0.3f,
                           .logit_bias = {{3, 1.5f}, {9, -2.0f}}, .stop_token_ids = {7, 8}, .stop = {"\n\n", "The end"},
                           .ignore_eos = true, .logprobs = 4, .prompt_logprobs = 2, .skip_special_tokens = false};
  const SamplingParams unset;  // no seed, no logprobs
  const std::vector<TokenId> prompt = {1, 2, 3}, output = {4}, stops = {2, 7, 8};
  StepBatch b;
  b.copies = {{5, 6}};
  b.finished = {3, 4};
  for (const SamplingParams* p : {&set, &unset}) {
    SeqChunk& c = b.seqs.emplace_back();
    c.seq = 9 + b.seqs.size();
    c.tokens = {4};
    c.start_pos = 3;
    c.block_table = {static_cast<int32_t>(b.seqs.size())};
    for (uint64_t seed : {11, 12})
      c.samples.push_back(SampleSpec{.params = p, .seed = seed, .prompt = &prompt, .output = &output,
                                     .stop_ids = &stops, .num_logprobs = 4, .num_candidates = 2});
  }
  b.seqs.push_back({.seq = 12, .tokens = {5, 6}, .start_pos = 0, .block_table = {0}, .samples = {},
                    .prompt_logprobs = {.count = 2, .num_top = 2, .next_token = 7}});

  auto unpacked = unpack_step(pack_step(first_wire_step(b)));
  REQUIRE(std::holds_alternative<WireStep>(unpacked));
  const WireStep& received = std::get<WireStep>(unpacked);
  CHECK_FALSE(received.seqs.at(2).context);  // a chunk without samples
  WireDecoder decoder({.vocab_size = 32, .block_size = 16, .num_blocks = 8, .num_swap_blocks = 0,
                       .max_model_len = 64, .max_num_batched_tokens = 64});
  auto decoded = decoder.decode(received);
  if (const auto* e = std::get_if<FieldError>(&decoded)) FAIL(e->describe());
  require_same_step(std::get<StepBatch>(decoded), b);
}

TEST_CASE("an engine whose executor is a worker on loopback generates what an in-process one does", "[remote]") {
  Worker worker(cpu_config(), "127.0.0.1", 0);
  REQUIRE(worker.port() != 0);
  CHECK(worker.info().device == "cpu");
  EngineConfig remote_config = cpu_config();
  remote_config.device = "auto";  // the worker's device counts, not this process's
  remote_config.workers = {"127.0.0.1:" + std::to_string(worker.port())};
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

  // Prompt logprobs: scored on the worker, checked and unpacked by the proxy, as the in-process runner scores them.
  SamplingParams scored;
  scored.temperature = 0.0f;
  scored.max_tokens = 4;
  scored.prompt_logprobs = 5;
  const auto rs = remote.generate(ps, scored), ls = local.generate(ps, scored);
  REQUIRE(rs.size() == ls.size());
  for (size_t i = 0; i < rs.size(); ++i) {
    INFO("prompt " << i);
    REQUIRE(rs[i].prompt_logprobs.size() == ps[i].size() - 1);
    REQUIRE(ls[i].prompt_logprobs.size() == ps[i].size() - 1);
    for (size_t k = 0; k < rs[i].prompt_logprobs.size(); ++k) {
      const PromptLogprob &g = rs[i].prompt_logprobs[k], &w = ls[i].prompt_logprobs[k];
      CHECK(g.token == ps[i][k + 1]);
      CHECK(g.token == w.token);
      CHECK(g.logprob == w.logprob);
      CHECK(g.rank == w.rank);
      CHECK(g.top_logprobs == w.top_logprobs);
    }
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

TEST_CASE("drafts cross the wire: an engine that speculates with a worker generates what one that does not does",
          "[remote][speculative]") {
  // Room for every sequence's drafts: a step samples at most max_num_seqs positions.
  EngineConfig config = cpu_config();
  config.max_num_seqs = 64;
  Worker worker(config, "127.0.0.1", 0);
  EngineConfig remote_config = config;
  remote_config.workers = {"127.0.0.1:" + std::to_string(worker.port())};
  remote_config.speculative_config = {.num_speculative_tokens = 3, .prompt_lookup_min = 1, .prompt_lookup_max = 2};
  Engine remote(remote_config);
  Engine local(config);
  const auto ps = prompts(local.model_config().vocab_size);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 40;
  CHECK(completions(remote.generate(ps, greedy)) == completions(local.generate(ps, greedy)));
  SamplingParams sampled;
  sampled.temperature = 0.9f;
  sampled.seed = 99;
  sampled.frequency_penalty = 0.3f;
  sampled.max_tokens = 30;
  CHECK(completions(remote.generate(ps, sampled)) == completions(local.generate(ps, sampled)));
  remote.wait_idle();
  INFO(remote.metrics().spec_decode_accepted_tokens << " of " << remote.metrics().spec_decode_draft_tokens
                                                    << " drafts accepted");
  CHECK(remote.metrics().spec_decode_accepted_tokens > 0);
  CHECK(remote.metrics().kv_blocks_free.load() == remote.metrics().kv_blocks_total.load());
}

TEST_CASE("released table entries of a sliding model cross the wire, a table per KV group: a worker generates what "
          "an in-process engine does", "[remote][sliding]") {
  // Every layer sliding (one group), or layers 0, 1 and 3 (three groups of two layers: the full ones, two sliding).
  const bool hybrid = GENERATE(false, true);
  INFO((hybrid ? "layers 0, 1, 3 sliding" : "every layer sliding"));
  TempDir dir("paged_sliding_");
  write_sliding_stories(dir.path(), 32,
                        hybrid ? std::vector<std::string>{"sliding_attention", "sliding_attention", "full_attention",
                                                          "sliding_attention", "full_attention"}
                               : std::vector<std::string>{});
  EngineConfig c = cpu_config();
  c.model_dir = dir.path().string();
  Worker worker(c, "127.0.0.1", 0);
  CHECK(worker.info().kv_windows == (hybrid ? std::vector<int>{0, 32, 32} : std::vector<int>{32}));
  CHECK(worker.info().layers_per_block == (hybrid ? 2 : 5));
  EngineConfig remote_config = c;
  remote_config.workers = {"127.0.0.1:" + std::to_string(worker.port())};
  {
    Engine remote(remote_config);
    Engine local(c);
    SamplingParams greedy;
    greedy.temperature = 0.0f;
    greedy.max_tokens = 120;  // far past the window: the steps carry released entries
    greedy.ignore_eos = true;
    const auto ps = prompts(local.model_config().vocab_size);
    CHECK(completions(remote.generate(ps, greedy)) == completions(local.generate(ps, greedy)));
    remote.wait_idle();
    CHECK(remote.metrics().kv_blocks_free.load() == remote.metrics().kv_blocks_total.load());
  }
  // An engine whose model keeps every block (it would not expect released entries) is refused this worker.
  EngineConfig full = cpu_config();
  full.workers = remote_config.workers;
  expect_refused(full, hybrid ? "the worker's model has KV groups of windows [0, 32, 32], 2 layers a block, this "
                                "engine's KV groups of windows [0], 5 layers a block"
                              : "the worker's model has KV groups of windows [32], 5 layers a block, this engine's KV "
                                "groups of windows [0], 5 layers a block");
}

TEST_CASE("an engine refuses a worker it cannot use, naming why", "[remote]") {
  EngineConfig c = cpu_config();
  uint16_t closed = 0;
  {
    Worker gone(cpu_config(), "127.0.0.1", 0);
    closed = gone.port();
  }
  c.workers = {"127.0.0.1:" + std::to_string(closed)};
  expect_refused(c, "127.0.0.1");
  c.workers = {"localhost"};
  expect_refused(c, "HOST:PORT");
  Worker worker(cpu_config(), "127.0.0.1", 0);
  c.workers = {"127.0.0.1:" + std::to_string(worker.port())};
  c.block_size = 32;
  expect_refused(c, "--block-size");
  c.block_size = 16;
  c.max_num_seqs = 64;
  expect_refused(c, "--max-num-seqs");
  c.max_num_seqs = 8;
  c.tensor_parallel_size = 2;
  expect_refused(c, "--tensor-parallel-size");
}

TEST_CASE("an engine refuses a worker whose hello reports pools it cannot plan with", "[remote]") {
  Worker real(cpu_config(), "127.0.0.1", 0);
  for (const bool swap : {true, false}) {
    WorkerInfo info = real.info();
    (swap ? info.num_swap_blocks : info.max_sampled_positions) = swap ? -1 : 0;
    // A node of the test's own that answers hello with that info (a worker the engine must not trust blindly).
    caf::actor_system_config cfg;
    register_message_types(cfg);
    cfg.load<caf::io::middleman>();
    caf::actor_system system(cfg);
    const caf::actor fake = system.spawn([info]() -> caf::behavior { return {[info](hello_atom) { return info; }}; });
    const auto port = system.middleman().publish(fake, 0, "127.0.0.1");
    REQUIRE(port);
    EngineConfig c = cpu_config();
    c.workers = {"127.0.0.1:" + std::to_string(*port)};
    expect_refused(c, swap ? "-1 swap blocks" : "positions a step");
    system.middleman().unpublish(fake, *port);
    caf::anon_send_exit(fake, caf::exit_reason::user_shutdown);
  }
}

TEST_CASE("a worker refuses bad steps and swap orders with an error, writes nothing for them, and stays healthy",
          "[remote]") {
  Worker worker(cpu_config(), "127.0.0.1", 0);
  const WorkerInfo& info = worker.info();
  REQUIRE(info.num_blocks < 9000);
  const ModelConfig cfg = load_model_config(kModel);
  const SafeTensors weights(kModel);
  CpuModelRunner local(cfg, weights, {.block_size = 16, .num_blocks = 4});

  RawHead head(worker.port());
  REQUIRE(head.ask<WorkerInfo>(hello_atom::value).first);
  WireEncoder head_wire;  // the head's good steps, as deltas
  GreedySequence seq;
  const auto step_both = [&] {  // the next step on the worker and on the local runner: the same sample
    const StepBatch step = seq.next();
    auto [remote, error] = head.step(head_wire.encode(step));
    INFO(error);
    REQUIRE(remote);
    const SampledToken got = only_sample(*remote), want = only_sample(local.execute(step));
    CHECK(got.token == want.token);
    CHECK(got.logprob == want.logprob);
    CHECK(got.top_logprobs == want.top_logprobs);
    seq.output.push_back(got.token);
  };
  step_both();
  step_both();

  // Each bad step has a first chunk that would overwrite the sequence's blocks with other tokens, and a copy onto its
  // first block: had any of it run, the next good step would sample from other KV. Its second chunk samples for a
  // sequence new to the worker.
  const auto refused = [&](const std::function<void(WireStep&)>& spoil, const std::string& why) {
    StepBatch clobber = one_token_step(77);
    clobber.seqs[0].tokens.assign(18, 9);
    clobber.seqs[0].block_table = {0, 1};
    clobber.copies = {{2, 0}};
    clobber.seqs.push_back(one_token_step(78).seqs[0]);
    clobber.seqs.back().samples = seq.next().seqs[0].samples;
    WireStep wire = first_wire_step(clobber);
    spoil(wire);
    const std::string error = head.step_error(wire);
    INFO(why << " / " << error);
    CHECK(contains(error, "invalid step: "));
    CHECK(contains(error, why));
  };
  refused([](WireStep& w) { w.seqs[1].table_tail = {9000}; },
          "seqs[1].block_table[0]: block 9000 is outside the device pool [0, " + std::to_string(info.num_blocks));
  refused([&](WireStep& w) { w.seqs[1].tokens = {info.vocab_size}; }, "seqs[1].tokens[0]: token 512 is outside");
  refused([](WireStep& w) { w.seqs[1].start_pos = -4; }, "seqs[1].start_pos");
  refused([](WireStep& w) { w.seqs[1].start_pos = 40; }, "seqs[1].block_table: 1 blocks do not reach");
  refused([](WireStep& w) { w.seqs[1].context->params.temperature = -1.0f; },
          "seqs[1].samples[0].params.temperature: temperature must be in [0, 100]");
  refused([](WireStep& w) { w.seqs[1].context->params.top_p = std::numeric_limits<float>::quiet_NaN(); },
          "seqs[1].samples[0].params.top_p");
  refused([](WireStep& w) { w.seqs[1].context->params.repetition_penalty = 0.0f; },
          "seqs[1].samples[0].params.repetition_penalty");
  refused([](WireStep& w) { w.seqs[1].context->prompt.push_back(-1); }, "seqs[1].context.prompt[7]");
  refused([&](WireStep& w) { w.seqs[1].output_tail = {info.vocab_size}; }, "seqs[1].output_tail[0]: token 512");
  refused([](WireStep& w) { w.seqs[1].samples[0].num_candidates = 0; }, "seqs[1].samples[0].num_candidates");
  refused([](WireStep& w) { w.seqs[1].seq = 77; }, "sequence 77 has two chunks");
  refused([&](WireStep& w) { w.copies.push_back({0, info.num_blocks}); }, "copies[1].second: device block");
  // Deltas that do not follow from what the worker holds.
  refused([](WireStep& w) { w.seqs[1].table_keep = 2; },
          "seqs[1].table_keep: 2 exceeds the 0 blocks known for sequence 78");
  refused([](WireStep& w) { w.seqs[1].context.reset(); },
          "seqs[1].samples: sequence 78 samples, but its context (parameters, prompt, stop ids) never came");

  // Bytes that are no packed step.
  CHECK(contains(head.step_bytes("").second, "invalid step: seqs: the bytes end at 0"));
  CHECK(contains(head.step_bytes(pack_step(first_wire_step(seq.next())) + "!").second,
                 "invalid step: bytes: the step ends at byte"));

  // Bad swap orders: which side is which pool matters.
  const auto swap_error = [&](auto atom, std::vector<BlockPair> pairs) {
    return head.ask<bool>(atom, std::move(pairs)).second;
  };
  CHECK(contains(swap_error(swap_out_atom::value, {{0, info.num_swap_blocks}}),
                 "invalid swap order: swap_out[0].second: swap block"));
  CHECK(contains(swap_error(swap_in_atom::value, {{0, 0}, {info.num_swap_blocks, 1}}), "swap_in[1].first: swap block"));
  CHECK(contains(swap_error(swap_in_atom::value, {{0, 9000}}), "swap_in[0].second: device block 9000"));
  CHECK(contains(swap_error(swap_out_atom::value, {{0, 1}, {2, 1}}), "destination of two pairs"));
  // A good swap-out (a copy of the sequence's blocks) changes nothing the next step reads.
  CHECK(swap_error(swap_out_atom::value, {{0, 0}, {1, 1}}).empty());

  {  // A good step whose alternatives include masked tokens (-inf) on other blocks: a reply, -inf as it is.
    GreedySequence masked;
    masked.id = 6;
    masked.blocks = {2, 3};
    masked.params.min_tokens = 5;
    for (TokenId t = 0; t < info.vocab_size - 10; ++t) masked.stop_ids.push_back(t);
    StepBatch step = masked.next();
    step.seqs[0].samples[0].num_logprobs = 20;
    auto [result, error] = head.step(head_wire.encode(step));
    INFO(error);
    REQUIRE(result);
    const SampledToken t = only_sample(*result);
    CHECK(t.token >= info.vocab_size - 10);
    REQUIRE(t.top_logprobs.size() == 20);
    CHECK(t.top_logprobs[9].second > -100.0f);
    CHECK(t.top_logprobs[10].second == -std::numeric_limits<float>::infinity());
  }

  for (int i = 0; i < 3; ++i) step_both();  // the same tokens as the local runner: healthy, KV intact
}

TEST_CASE("an executor answers what its runner throws with an error and takes the next message", "[remote]") {
  caf::actor_system_config cfg;
  register_message_types(cfg);
  caf::actor_system system(cfg);
  caf::scoped_actor self{system};
  const auto runner = std::make_shared<ThrowingRunner>();

  // A failing step and swap-out come back as errors; the executor answers the next step and swap-in as usual.
  const auto fails_then_goes_on = [&](const caf::actor& executor, const std::function<std::string(SeqId)>& step) {
    CHECK(step(13) == "the runner failed: vector::_M_range_check");
    CHECK(step(12).empty());
    CHECK(error_reply<bool>(self, executor, swap_out_atom::value, std::vector<BlockPair>{{0, 0}}) ==
          "the runner failed: swap out");
    CHECK(error_reply<bool>(self, executor, swap_in_atom::value, std::vector<BlockPair>{{0, 0}}).empty());
    caf::anon_send_exit(executor, caf::exit_reason::user_shutdown);
  };
  SECTION("the executor of an engine") {
    const caf::actor executor = system.spawn(executor_actor, runner, nullptr);
    fails_then_goes_on(executor, [&](SeqId seq) {
      return error_reply<StepResult>(self, executor, step_atom::value,
                                     StepMsg{std::make_shared<StepBatch>(one_token_step(seq)), {}});
    });
  }
  SECTION("the executor of a worker") {
    const WorkerInfo info{.device = "cpu", .vocab_size = 32, .block_size = 16, .max_model_len = 64, .max_num_seqs = 4,
                          .max_num_batched_tokens = 64, .num_blocks = 4, .num_swap_blocks = 4};
    std::shared_ptr<const Tokenizer> tokenizer = load_tokenizer(kModel);
    const caf::actor executor = system.spawn(
        worker_executor_actor, runner, info,
        std::make_shared<constraint::SequenceConstraints>(std::make_shared<const constraint::TokenTrie>(*tokenizer), tokenizer),
        std::make_shared<const std::atomic<bool>>(false));
    const auto step = [&](SeqId seq) {
      return error_reply<PackedResult>(self, executor, step_atom::value,
                                       PackedStep{pack_step(first_wire_step(one_token_step(seq)))});
    };
    CHECK(contains(step(12), "refused: no engine said hello"));
    self->request(executor, std::chrono::seconds(10), hello_atom::value)
        .receive([](const WorkerInfo&) {}, [](caf::error&) { FAIL("hello refused"); });
    fails_then_goes_on(executor, step);
  }
}

TEST_CASE("a proxy answers with the result a worker packed, or with an error when it does not unpack or fit",
          "[remote]") {
  caf::actor_system_config cfg;
  register_message_types(cfg);
  caf::actor_system system(cfg);
  caf::scoped_actor self{system};
  // A worker stand-in: for sequence 1 a packed result with -inf among the logprobs, for 3 one with a token outside
  // the vocabulary, for others bytes of no result.
  StepResult sampled;
  sampled.samples = {{{{7, -0.5f, {{7, -0.5f}, {3, -std::numeric_limits<float>::infinity()}}}}}};
  const caf::actor worker = system.spawn([sampled]() -> caf::behavior {
    return {[sampled](step_atom, const PackedStep& step) {
      const SeqId seq = std::get<WireStep>(unpack_step(step.bytes)).seqs.at(0).seq;
      StepResult answer = sampled;
      answer.seqs = {seq};
      if (seq == 3) answer.samples[0][0][0].token = 9999;
      return PackedResult{seq == 1 || seq == 3 ? pack_result(answer) : std::string("\x01")};
    }};
  });
  const caf::actor proxy = system.spawn(remote_executor_proxy, worker, 512);
  static const SamplingParams params;
  static const std::vector<TokenId> none;
  const auto step = [&](SeqId seq, int num_logprobs = 2) {
    StepBatch b = one_token_step(seq);
    b.seqs[0].samples.push_back({.params = &params, .seed = 0, .prompt = &none, .output = &none, .stop_ids = &none,
                                 .num_logprobs = num_logprobs, .num_candidates = 1});
    return StepMsg{std::make_shared<StepBatch>(std::move(b)), {}};
  };
  std::optional<StepResult> got;
  self->request(proxy, std::chrono::seconds(10), step_atom::value, step(1))
      .receive([&](StepResult& r) { got = std::move(r); }, [](caf::error& e) { FAIL(to_string(e)); });
  REQUIRE(got);
  CHECK(got->seqs == std::vector<SeqId>{1});
  CHECK(only_sample(*got).top_logprobs == only_sample(sampled).top_logprobs);
  CHECK(error_reply<StepResult>(self, proxy, step_atom::value, step(2)) ==
        "invalid step result: seqs: the bytes end at 1, 3 bytes short of the value at byte 0");
  CHECK(error_reply<StepResult>(self, proxy, step_atom::value, step(3)) ==
        "invalid step result: samples[0][0][0].token: token 9999 is outside the vocabulary");
  CHECK(error_reply<StepResult>(self, proxy, step_atom::value, step(1, 1)) ==
        "invalid step result: samples[0][0][0].top_logprobs: 2 alternatives, 1 asked");
  caf::anon_send_exit(proxy, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(worker, caf::exit_reason::user_shutdown);
}

TEST_CASE("a worker serves one engine at a time: another is refused while the first is there, served after; no "
          "peer's exit or error message ends it", "[remote]") {
  Worker worker(cpu_config(), "127.0.0.1", 0);
  {  // CAF's system messages from a node of its own, then its hello: answered (the worker took the others).
    RawHead intruder(worker.port());
    intruder.send_system_messages();
    CHECK(intruder.ask<WorkerInfo>(hello_atom::value).first);
  }
  EngineConfig config = cpu_config();
  config.workers = {"127.0.0.1:" + std::to_string(worker.port())};
  Engine local(cpu_config());
  const std::vector<std::vector<TokenId>> ps(prompts(local.model_config().vocab_size));
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.max_tokens = 12;
  const auto want = completions(local.generate(ps, greedy));

  auto first = std::make_unique<Engine>(config);
  try {
    Engine second(config);
    FAIL("a second engine was served");
  } catch (const ModelError& e) {
    INFO(e.what());
    CHECK(contains(e.what(), "--workers 127.0.0.1:"));
    CHECK(contains(e.what(), "refused: the worker is already serving another engine"));
  }
  {  // A node that never said hello: its steps and swaps are refused, its hello too; its exits and errors change
     // nothing.
    RawHead intruder(worker.port());
    intruder.send_system_messages();
    const WireStep step = first_wire_step(one_token_step(1));
    CHECK(contains(intruder.step_error(step), "already serving another engine"));
    CHECK(contains(intruder.ask<bool>(swap_in_atom::value, std::vector<BlockPair>{{0, 0}}).second,
                   "already serving another engine"));
    CHECK(contains(intruder.ask<WorkerInfo>(hello_atom::value).second, "already serving another engine"));
  }
  CHECK(completions(first->generate(ps, greedy)) == want);  // the first engine is served as before
  first.reset();
  Engine third(config);  // the first is gone: the worker takes a new engine
  CHECK(completions(third.generate(ps, greedy)) == want);
}

TEST_CASE("a worker knows none of an engine's sequences when it serves the next one", "[remote]") {
  Worker worker(cpu_config(), "127.0.0.1", 0);
  GreedySequence seq;
  WireEncoder encoder;  // the first head's, which the second goes on with
  {
    RawHead first(worker.port());
    REQUIRE(first.ask<WorkerInfo>(hello_atom::value).first);
    CHECK(first.step_error(encoder.encode(seq.next())).empty());
  }
  RawHead second(worker.port());
  REQUIRE(second.ask<WorkerInfo>(hello_atom::value).first);
  seq.output.push_back(300);
  // A delta against what the first head sent: the worker holds none of it now.
  CHECK(contains(second.step_error(encoder.encode(seq.next())),
                 "invalid step: seqs[0].table_keep: 2 exceeds the 0 blocks known for sequence 5"));
  // A step that sends the sequence whole is taken.
  encoder.reset();
  CHECK(second.step_error(encoder.encode(seq.next())).empty());
}

TEST_CASE("a worker fills a deferred token in from its last samples, and refuses one it cannot fill", "[remote]") {
  Worker worker(cpu_config(), "127.0.0.1", 0);
  const ModelConfig cfg = load_model_config(kModel);
  const SafeTensors weights(kModel);
  CpuModelRunner local(cfg, weights, {.block_size = 16, .num_blocks = 4});
  RawHead head(worker.port());
  REQUIRE(head.ask<WorkerInfo>(hello_atom::value).first);
  WireEncoder encoder;
  GreedySequence seq;
  seq.params.temperature = 0.8f;  // seeded sampling: the random stream's index counts the deferred token
  seq.params.repetition_penalty = 1.5f;
  for (int step = 0; step < 6; ++step) {
    INFO("step " << step);
    const StepBatch known = seq.next();
    const SampledToken want = only_sample(local.execute(known));
    StepBatch sent = known;
    if (step > 0) {  // as a scheduler with a step in flight sends it: without the newest token
      seq.output.pop_back();
      sent = seq.next();
      sent.seqs[0].tokens = {-1};
      sent.seqs[0].start_pos = known.seqs[0].start_pos;
      sent.seqs[0].last_token_deferred = true;
    }
    auto [remote, error] = head.step(encoder.encode(sent));
    INFO(error);
    REQUIRE(remote);
    const SampledToken got = only_sample(*remote);
    CHECK(got.token == want.token);
    CHECK(got.logprob == want.logprob);
    if (step > 0) seq.output.push_back(known.seqs[0].tokens[0]);
    seq.output.push_back(got.token);
  }
  // Sequence 6 sampled nothing in the step before: its deferred token is refused, and the worker goes on.
  StepBatch orphan = one_token_step(6);
  orphan.seqs[0].tokens = {-1};
  orphan.seqs[0].last_token_deferred = true;
  orphan.seqs[0].samples = seq.next().seqs[0].samples;
  CHECK(contains(head.step_error(encoder.encode(orphan)),
                 "invalid step: seqs[0].tokens: a deferred token of sequence 6, which sampled nothing"));
  const StepBatch known = seq.next();
  auto [remote, error] = head.step(encoder.encode(known));
  INFO(error);
  REQUIRE(remote);
  CHECK(only_sample(*remote).token == only_sample(local.execute(known)).token);
}
