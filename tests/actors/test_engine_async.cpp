// Async scheduling (two steps in flight, EngineConfig::async_scheduling) on the real stories260K model (CPU
// executor): requests of every sampling kind, submitted at once, get the same tokens and logprobs as with each step
// waiting for the one before, also when a small KV pool preempts them (recompute and swap); and steps really are
// deferred, and every block comes back; and swap preemption under two steps in flight never stalls.
#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>

#include "actors/engine.h"
#include "tests/test_data.h"

using namespace paged;
using namespace paged::test;

namespace {

struct Completion {
  std::vector<TokenId> tokens;
  std::vector<float> logprobs;
  std::string text, finish;
};

/// Prompts from the golden cases, each with parameters of its own: greedy, seeded sampling with the cuts, every
/// penalty, min_tokens against EOS, two completions, a stop string, logprobs, a regex and a JSON schema.
std::vector<std::pair<std::vector<TokenId>, SamplingParams>> varied_requests() {
  std::vector<std::vector<TokenId>> prompts;
  const boost::json::value golden = read_json(kGolden);
  for (const auto& tc : golden.at("cases").as_array()) prompts.push_back(ids_of(tc.at("prompt_ids")));
  REQUIRE(prompts.size() >= 4);
  std::vector<SamplingParams> kinds;
  kinds.push_back({.max_tokens = 40, .temperature = 0.0f});
  kinds.push_back({.max_tokens = 40, .temperature = 0.9f, .top_p = 0.9f, .top_k = 40, .seed = 7});
  kinds.push_back({.max_tokens = 40, .temperature = 1.0f, .min_p = 0.05f, .seed = 11, .repetition_penalty = 1.3f,
                   .presence_penalty = 0.5f, .frequency_penalty = 0.4f});
  kinds.push_back({.max_tokens = 40, .min_tokens = 30, .temperature = 0.0f, .frequency_penalty = 1.0f});
  kinds.push_back({.n = 2, .max_tokens = 30, .temperature = 1.0f, .seed = 3});
  kinds.push_back({.max_tokens = 60, .temperature = 0.0f, .stop = {"."}});
  kinds.push_back({.max_tokens = 25, .temperature = 0.7f, .seed = 5, .logprobs = 3});
  // Structured outputs: each step's mask takes the token still in flight first.
  SamplingParams regex{.max_tokens = 40, .temperature = 1.0f, .seed = 13};
  regex.structured = {StructuredOutput::Kind::regex, "(Once|The) [a-z ]{10,30}\\.", "guided_regex"};
  kinds.push_back(regex);
  SamplingParams schema{.max_tokens = 50, .temperature = 1.0f, .seed = 17};
  schema.structured = {StructuredOutput::Kind::json_schema,
                       R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                          "age": {"type": "integer"}}, "required": ["name", "age"]})",
                       "response_format"};
  kinds.push_back(schema);
  std::vector<std::pair<std::vector<TokenId>, SamplingParams>> out;
  for (int round = 0; round < 3; ++round)
    for (size_t k = 0; k < kinds.size(); ++k) {
      SamplingParams p = kinds[k];
      if (p.seed) *p.seed += round;
      out.emplace_back(prompts[(k + round) % prompts.size()], p);
    }
  return out;
}

/// Every completion of every request, submitted at once: [request][completion index].
std::vector<std::vector<Completion>> run_all(Engine& engine,
                                             const std::vector<std::pair<std::vector<TokenId>, SamplingParams>>& reqs) {
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::map<int, Completion>> got;
    size_t done = 0;
    std::vector<std::string> errors;
  };
  auto sh = std::make_shared<Shared>();
  sh->got.resize(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i)
    engine.submit(reqs[i].first, reqs[i].second, [sh, i](RequestEvent ev) {
      std::lock_guard lock(sh->mu);
      for (const auto& d : ev.deltas) {
        Completion& c = sh->got[i][d.index];
        c.tokens.insert(c.tokens.end(), d.token_ids.begin(), d.token_ids.end());
        for (const auto& lp : d.logprobs) c.logprobs.push_back(lp.logprob);
        c.text += d.text;
        if (d.finish_reason) c.finish = *d.finish_reason;
      }
      if (ev.error) sh->errors.push_back(*ev.error);
      sh->done += ev.done;
      sh->cv.notify_all();
    });
  std::unique_lock lock(sh->mu);
  REQUIRE(sh->cv.wait_for(lock, std::chrono::seconds(120), [&] { return sh->done == reqs.size(); }));
  REQUIRE(sh->errors.empty());
  std::vector<std::vector<Completion>> out;
  for (auto& m : sh->got) {
    out.emplace_back();
    for (auto& [index, c] : m) out.back().push_back(std::move(c));
  }
  return out;
}

EngineConfig cpu_config(bool async, std::optional<int> num_kv_blocks, PreemptionMode mode) {
  EngineConfig c;
  c.model_dir = kModel;
  c.device = "cpu";
  c.async_scheduling = async;
  c.num_kv_blocks = num_kv_blocks;
  c.preemption_mode = mode;
  c.max_num_batched_tokens = 256;  // prefills in chunks, beside the decodes
  return c;
}

}  // namespace

TEST_CASE("two steps in flight give every request the tokens and logprobs of one step at a time",
          "[engine][async]") {
  const auto reqs = varied_requests();
  struct Setting {
    const char* name;
    std::optional<int> blocks;
    PreemptionMode mode;
  };
  for (const Setting& s : {Setting{"a pool for all", std::nullopt, PreemptionMode::recompute},
                           Setting{"24 blocks, recompute", 24, PreemptionMode::recompute},
                           Setting{"24 blocks, swap", 24, PreemptionMode::swap}}) {
    INFO(s.name);
    Engine sync_engine(cpu_config(false, s.blocks, s.mode));
    const auto want = run_all(sync_engine, reqs);
    sync_engine.wait_idle();
    CHECK(sync_engine.metrics().steps_deferred == 0);

    Engine async_engine(cpu_config(true, s.blocks, s.mode));
    const auto got = run_all(async_engine, reqs);
    async_engine.wait_idle();
    Metrics& m = async_engine.metrics();
    INFO(m.steps_deferred << " of " << m.steps << " steps deferred; " << m.preemptions << " preemptions");
    CHECK(m.steps_deferred > m.steps / 4);
    if (s.blocks) CHECK(m.preemptions > 0);
    CHECK(m.kv_blocks_free == m.kv_blocks_total);
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      INFO("request " << i);
      REQUIRE(got[i].size() == want[i].size());
      for (size_t k = 0; k < want[i].size(); ++k) {
        CHECK(got[i][k].tokens == want[i][k].tokens);
        CHECK(got[i][k].logprobs == want[i][k].logprobs);
        CHECK(got[i][k].text == want[i][k].text);
        CHECK(got[i][k].finish == want[i][k].finish);
      }
    }
  }
}

TEST_CASE("swap preemption with two steps in flight never stalls: a swap-in that ends while a plan is being made "
          "gets a plan of its own", "[engine][async]") {
  // Long requests into 40 blocks: sequences are swapped out and in all the time, and a swap-in often ends while the
  // plan made without it is on its way back (which found nothing to run, and waited for a kick that had come).
  std::vector<std::pair<std::vector<TokenId>, SamplingParams>> reqs;
  for (int i = 0; i < 40; ++i) {
    const int len = 40 + (i * 37) % 200;
    std::vector<TokenId> prompt;
    for (int k = 0; k < len; ++k) prompt.push_back(3 + (i * 131 + k * 17) % 500);
    SamplingParams p{.max_tokens = std::min(500 - len, 150 + (i * 23) % 250), .temperature = 0.0f};
    p.ignore_eos = true;
    reqs.emplace_back(std::move(prompt), p);
  }
  EngineConfig c = cpu_config(true, 40, PreemptionMode::swap);
  c.max_num_batched_tokens = 2048;
  Engine engine(c);
  const auto got = run_all(engine, reqs);  // each within 120 s
  engine.wait_idle();
  Metrics& m = engine.metrics();
  CHECK(m.preemptions > 0);
  CHECK(m.kv_blocks_free == m.kv_blocks_total);
  for (size_t i = 0; i < reqs.size(); ++i)
    CHECK(static_cast<int>(got[i].at(0).tokens.size()) == reqs[i].second.max_tokens);
}
