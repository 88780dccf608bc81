// What the engine shows of itself while it works, on the real stories260K model: Engine::kv_snapshot (the memory
// manager's picture of its blocks agrees with the KV gauges it publishes, the figures /metrics shows, at rest and
// while requests run) and generate's GenerateWatch (it sees the batch's progress to the end; returning false cancels
// the batch: every request ends, every block is free, the engine serves the next batch).
#include <catch2/catch.hpp>

#include <future>
#include <set>
#include <vector>

#include "actors/engine.h"
#include "tests/test_data.h"

using namespace paged;
using namespace paged::test;

namespace {

// A CPU engine of stories260K with `max_num_seqs` seats and a tiny swap space.
EngineConfig small_engine(int max_num_seqs) {
  EngineConfig cfg;
  cfg.model_dir = kModel;
  cfg.device = "cpu";
  cfg.swap_space_gib = 0.01;
  cfg.max_num_seqs = max_num_seqs;
  return cfg;
}

SamplingParams fixed_length(int tokens, float temperature = 0.0f) {
  SamplingParams p;
  p.temperature = temperature;
  p.max_tokens = tokens;
  p.ignore_eos = true;
  return p;
}

// The engine's snapshot, waited for.
std::vector<ReplicaKv> snapshot_of(Engine& engine) {
  std::promise<std::vector<ReplicaKv>> answer;
  auto future = answer.get_future();
  engine.kv_snapshot([&answer](std::vector<ReplicaKv> replicas) { answer.set_value(std::move(replicas)); });
  REQUIRE(future.wait_for(std::chrono::seconds(10)) == std::future_status::ready);
  return future.get();
}

const TierSnapshot& device_tier(const ReplicaKv& r) {
  REQUIRE(!r.kv.tiers.empty());
  REQUIRE(r.kv.tiers.front().name == "device");
  return r.kv.tiers.front();
}

}  // namespace

TEST_CASE("kv_snapshot agrees with the KV gauges at rest and names the sequences of every in-use block",
          "[engine][snapshot]") {
  EngineConfig cfg = small_engine(256);
  cfg.num_kv_blocks = 64;
  Engine engine(cfg);

  std::vector<ReplicaKv> fresh = snapshot_of(engine);
  REQUIRE(fresh.size() == 1);
  CHECK(fresh[0].index == 0);
  CHECK(fresh[0].address.empty());
  CHECK(fresh[0].kv.block_size == cfg.block_size);
  CHECK(device_tier(fresh[0]).num_blocks == 64);
  CHECK(device_tier(fresh[0]).count(kCellFree) == 64);
  CHECK(fresh[0].kv.tiers.size() == 2);  // device and swap

  // Running: every in-use device block is a listed sequence's, or shared.
  const SamplingParams params = fixed_length(200, 0.8f);
  std::atomic<int> done{0};
  for (int i = 0; i < 4; ++i)
    engine.submit(engine.tokenizer().encode("Once upon a time there was a little girl", true), params,
                  [&done](RequestEvent ev) { done += ev.done ? 1 : 0; });
  bool saw_running = false;
  for (int attempt = 0; attempt < 50 && done < 4; ++attempt) {
    const std::vector<ReplicaKv> now = snapshot_of(engine);
    const TierSnapshot& device = device_tier(now[0]);
    std::set<uint8_t> listed;
    int64_t listed_blocks = 0;
    for (const SeqSnapshot& s : now[0].kv.seqs) {
      if (!s.swapped) listed_blocks += s.num_blocks;
      listed.insert(seq_cell(s.seq));
    }
    for (const CellRun& run : device.runs)
      if (run.cell >= kCellFirstSeq) CHECK(listed.count(run.cell) == 1);
    CHECK(device.in_use() <= listed_blocks);  // a shared block is in several tables
    CHECK(device.count(kCellBusy) == 0);      // no CPU tier here
    if (device.in_use() > 0) saw_running = true;
  }
  CHECK(saw_running);
  engine.wait_idle();

  // At rest: the cells count what the gauges say (the prompt's full blocks stay cached).
  const std::vector<ReplicaKv> rest = snapshot_of(engine);
  const TierSnapshot& device = device_tier(rest[0]);
  const Metrics& m = engine.metrics();
  CHECK(device.in_use() == m.kv_blocks_total - m.kv_blocks_free);
  CHECK(device.count(kCellCached) == m.kv_blocks_cached);
  CHECK(m.kv_blocks_cached > 0);
  CHECK(device.count(kCellFree) == m.kv_blocks_free - m.kv_blocks_cached);
  CHECK(rest[0].kv.seqs.empty());
}

TEST_CASE("generate's watch sees the progress, its last call the whole batch", "[engine][watch]") {
  Engine engine(small_engine(4));
  std::vector<GenerateProgress> seen;
  const auto outputs = engine.generate(std::vector<std::string>(6, "Once upon a time"), fixed_length(50),
                                       [&seen](const GenerateProgress& p) {
                                         seen.push_back(p);
                                         return true;
                                       });
  REQUIRE(outputs.size() == 6);
  REQUIRE(!seen.empty());
  for (size_t i = 1; i < seen.size(); ++i) {
    CHECK(seen[i].finished >= seen[i - 1].finished);
    CHECK(seen[i].generated_tokens >= seen[i - 1].generated_tokens);
  }
  CHECK(seen.back().total == 6);
  CHECK(seen.back().finished == 6);
  CHECK(seen.back().generated_tokens == 6 * 50);
}

TEST_CASE("a watch returning false cancels the batch and frees its blocks", "[engine][watch]") {
  Engine engine(small_engine(4));
  int calls = 0;
  CHECK_THROWS_AS(engine.generate(std::vector<std::string>(200, "Once upon a time"), fixed_length(400),
                                  [&calls](const GenerateProgress& p) {
                                    ++calls;
                                    return p.generated_tokens == 0 && calls < 3;  // stop once tokens came
                                  }),
                  GenerationCancelled);
  CHECK(calls >= 1);
  engine.wait_idle();
  const Metrics& m = engine.metrics();
  CHECK(m.kv_blocks_free == m.kv_blocks_total);
  CHECK(m.running_requests == 0);
  CHECK(m.waiting_requests == 0);
  CHECK(m.requests_aborted > 100);  // most of the batch never ran
  const auto again = engine.generate({"Once upon a time"}, fixed_length(7));
  CHECK(again[0].outputs[0].token_ids.size() == 7);
}
