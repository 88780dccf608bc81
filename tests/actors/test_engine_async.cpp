// Async scheduling (two steps in flight, EngineConfig::async_scheduling) on the real stories260K model (CPU
// executor): requests of every sampling kind, submitted at once, get the same tokens and logprobs as with each step
// waiting for the one before, also when a small KV pool preempts them (recompute and swap); and steps really are
// deferred, and every block comes back; and swap preemption under two steps in flight never stalls.
#include <catch2/catch.hpp>

#include "actors/engine.h"
#include "tests/actors/engine_runs.h"
#include "tests/test_data.h"

using namespace paged;
using namespace paged::test;

namespace {

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
    check_same_completions(got, want);
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
