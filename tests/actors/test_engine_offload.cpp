// The prefix cache's CPU tier on the real stories260K model (CPU executor): conversations whose earlier turns left
// a small device pool come back, each turn sending its whole history and a new message. With --kv-offloading-size
// their history is promoted from the tier instead of recomputed: the greedy tokens are those of the run without the
// tier, and at least 30% fewer prompt tokens are computed.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>

#include "actors/actors.h"
#include "actors/engine.h"
#include "tests/test_data.h"

using namespace paged;
using namespace paged::test;

namespace {

constexpr int kConversations = 4;
constexpr int kTurns = 5;
constexpr int kMessageTokens = 16;
constexpr int kSystemTokens = 48;
constexpr int kDeviceBlocks = 20;   // 320 tokens: less than the four histories together (up to 11 blocks each)
constexpr int kOffloadBlocks = 64;  // all of them
// stories260K: 5 layers, 4 KV heads of 8 dimensions, K and V in float32: bytes of a block of 16 tokens.
constexpr double kCpuBlockBytes = 2.0 * 5 * 4 * 16 * 8 * 4;

/// Natural text: the golden cases' prompts (without BOS) and greedy continuations, one after the other.
std::vector<TokenId> natural_text() {
  std::vector<TokenId> text;
  const boost::json::value golden = read_json(kGolden);
  for (const auto& tc : golden.at("cases").as_array()) {
    const auto prompt = ids_of(tc.at("prompt_ids")), greedy = ids_of(tc.at("greedy_ids"));
    text.insert(text.end(), prompt.begin() + 1, prompt.end());
    text.insert(text.end(), greedy.begin(), greedy.end());
  }
  return text;
}

struct ConversationRun {
  std::vector<std::vector<TokenId>> outputs;  // every turn's greedy tokens, conversation by conversation
  int64_t prompt_tokens_computed = 0;
  int64_t offload_hit_tokens = 0;
  int64_t offloaded_blocks = 0;
  int64_t offload_blocks_total = 0;
  std::string prometheus;  // /metrics at the end
};

/// kTurns turns of kConversations conversations, interleaved (every conversation's turn t, then turn t + 1): a
/// common system prompt, then per turn a message from the text and the 8 greedy tokens the model answers.
ConversationRun converse(double kv_offloading_gib) {
  EngineConfig c;
  c.model_dir = kModel;
  c.device = "cpu";
  c.num_kv_blocks = kDeviceBlocks;
  c.swap_space_gib = 0;
  c.kv_offloading_gib = kv_offloading_gib;
  c.max_num_seqs = kConversations;
  Engine engine(c);
  const std::vector<TokenId> text = natural_text();
  REQUIRE(text.size() > size_t{kSystemTokens + kMessageTokens + 200});
  std::vector<std::vector<TokenId>> history(kConversations, std::vector<TokenId>{1});
  for (auto& h : history) h.insert(h.end(), text.begin(), text.begin() + kSystemTokens - 1);
  const SamplingParams greedy{.max_tokens = 8, .temperature = 0.0f, .ignore_eos = true};
  ConversationRun run;
  for (int turn = 0; turn < kTurns; ++turn) {
    for (int conv = 0; conv < kConversations; ++conv) {
      const size_t from = kSystemTokens + (37 * conv + 53 * turn) % 200;
      history[conv].insert(history[conv].end(), text.begin() + from, text.begin() + from + kMessageTokens);
      const auto out = engine.generate(std::vector<std::vector<TokenId>>{history[conv]}, greedy);
      const std::vector<TokenId>& answer = out.at(0).outputs.at(0).token_ids;
      history[conv].insert(history[conv].end(), answer.begin(), answer.end());
      run.outputs.push_back(answer);
    }
  }
  engine.wait_idle();
  const Metrics& m = engine.metrics();
  run.prompt_tokens_computed = m.prompt_tokens_computed;
  run.offload_hit_tokens = m.offload_hit_tokens;
  run.offloaded_blocks = m.offloaded_blocks;
  run.offload_blocks_total = m.offload_blocks_total;
  run.prometheus = m.prometheus();
  CHECK(m.kv_blocks_free == m.kv_blocks_total);
  return run;
}

}  // namespace

TEST_CASE("conversations that return after leaving a small device pool reuse their history from the CPU tier",
          "[engine][prefix][tier]") {
  const ConversationRun off = converse(0.0);
  const ConversationRun on = converse((kOffloadBlocks + 0.5) * kCpuBlockBytes / std::pow(2.0, 30));
  CHECK(off.offload_hit_tokens == 0);
  CHECK(off.offload_blocks_total == 0);
  CHECK(on.offload_blocks_total == kOffloadBlocks);
  CHECK(on.offloaded_blocks > 0);
  CHECK(on.offload_hit_tokens > 0);
  // /metrics: hits and queries per tier, and the demotions.
  const auto has = [&](const std::string& line) { return on.prometheus.find("\n" + line + "\n") != std::string::npos; };
  CHECK(has("paged_kv_tier_hits_total{tier=\"cpu\"} " + std::to_string(on.offload_hit_tokens)));
  CHECK(has("paged_kv_offloaded_blocks_total " + std::to_string(on.offloaded_blocks)));
  CHECK(has("paged_kv_offload_blocks_total " + std::to_string(kOffloadBlocks)));
  CHECK(on.prometheus.find("paged_kv_tier_queries_total{tier=\"cpu\"} ") != std::string::npos);
  REQUIRE(on.outputs.size() == off.outputs.size());
  for (size_t i = 0; i < on.outputs.size(); ++i) {
    INFO("turn " << i / kConversations << " of conversation " << i % kConversations);
    CHECK(on.outputs[i] == off.outputs[i]);
  }
  INFO("prompt tokens computed: " << on.prompt_tokens_computed << " with the CPU tier, " << off.prompt_tokens_computed
                                  << " without; " << on.offload_hit_tokens << " tokens promoted");
  CHECK(double(on.prompt_tokens_computed) <= 0.7 * double(off.prompt_tokens_computed));
}

TEST_CASE("--kv-offloading-size needs prefix caching", "[engine][tier]") {
  EngineConfig c;
  c.model_dir = kModel;
  c.device = "cpu";
  c.enable_prefix_caching = false;
  c.kv_offloading_gib = 0.01;
  CHECK_THROWS_AS(Engine(c), ModelError);
}

TEST_CASE("the host pool splits into swap space and CPU tier in the proportion of their sizes", "[engine][tier]") {
  EngineConfig c;
  c.swap_space_gib = 3;
  c.kv_offloading_gib = 1;
  CHECK(split_host_pool(100, c) == std::pair{75, 25});
  CHECK(split_host_pool(101, c) == std::pair{76, 25});  // the tier rounded down
  c.swap_space_gib = 0;
  CHECK(split_host_pool(100, c) == std::pair{0, 100});
  c.kv_offloading_gib = 0;
  CHECK(split_host_pool(100, c) == std::pair{100, 0});
  CHECK(split_host_pool(0, c) == std::pair{0, 0});
}

namespace {

// Engines over one disk-tier folder: a 10-block device pool, a 4-block CPU tier, and the disk tier.
EngineConfig disk_config(const std::filesystem::path& dir) {
  EngineConfig c;
  c.model_dir = kModel;
  c.device = "cpu";
  c.num_kv_blocks = 10;
  c.swap_space_gib = 0;
  c.kv_offloading_gib = (4 + 0.5) * kCpuBlockBytes / std::pow(2.0, 30);
  c.kv_disk_dir = dir.string();
  c.kv_disk_gib = 1.0 / 1024;  // 1 MiB: about 100 blocks
  return c;
}

struct DiskRun {
  std::vector<TokenId> answer;  // the greedy tokens of the system-prompt request
  int64_t disk_hit_tokens = 0, prompt_tokens_computed = 0;
};

const SamplingParams kEight{.max_tokens = 8, .temperature = 0.0f, .ignore_eos = true};

/// A system prompt of 64 tokens of text (BOS and 63), then a question of 8.
std::vector<TokenId> system_request() {
  const std::vector<TokenId> text = natural_text();
  std::vector<TokenId> p{1};
  p.insert(p.end(), text.begin(), text.begin() + 63);
  p.insert(p.end(), text.begin() + 200, text.begin() + 208);
  return p;
}

/// The system-prompt request; with `churn`, then prompts of other text that push its blocks out of the device
/// pool and the CPU tier (to disk).
DiskRun disk_run(const EngineConfig& c, bool churn) {
  Engine engine(c);
  DiskRun run;
  run.answer = engine.generate(std::vector<std::vector<TokenId>>{system_request()}, kEight).at(0).outputs.at(0).token_ids;
  if (churn) {
    const std::vector<TokenId> text = natural_text();
    REQUIRE(text.size() >= 70 + 60 * 4 + 50);
    for (int k = 0; k < 5; ++k) {
      std::vector<TokenId> other{1};
      other.insert(other.end(), text.begin() + 70 + 60 * k, text.begin() + 70 + 60 * k + 50);
      engine.generate(std::vector<std::vector<TokenId>>{other}, kEight);
    }
  }
  engine.wait_idle();
  run.disk_hit_tokens = engine.metrics().disk_hit_tokens;
  run.prompt_tokens_computed = engine.metrics().prompt_tokens_computed;
  CHECK(engine.metrics().kv_blocks_free == engine.metrics().kv_blocks_total);
  return run;
}

}  // namespace

TEST_CASE("after a restart the disk tier serves the system prompt; a truncated file is a miss",
          "[engine][prefix][tier][disk]") {
  EngineConfig uncached;
  uncached.model_dir = kModel;
  uncached.device = "cpu";
  uncached.enable_prefix_caching = false;
  const std::vector<TokenId> want =
      Engine(uncached).generate(std::vector<std::vector<TokenId>>{system_request()}, kEight).at(0).outputs.at(0).token_ids;

  TempDir dir("paged_kv_disk_");
  const DiskRun first = disk_run(disk_config(dir.path()), true);
  CHECK(first.answer == want);
  CHECK(first.disk_hit_tokens == 0);
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) files += entry.path().extension() == ".kv";
  INFO(files << " block files after the first engine");
  REQUIRE(files >= 4);

  const DiskRun second = disk_run(disk_config(dir.path()), false);  // a new engine: empty device pool and CPU tier
  CHECK(second.answer == want);
  CHECK(second.disk_hit_tokens == 64);  // the system prompt's four blocks
  CHECK(second.prompt_tokens_computed == static_cast<int64_t>(system_request().size()) - 64);

  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    if (entry.path().extension() == ".kv") std::filesystem::resize_file(entry.path(), std::filesystem::file_size(entry) - 1);
  const DiskRun third = disk_run(disk_config(dir.path()), false);
  CHECK(third.answer == want);
  CHECK(third.disk_hit_tokens == 0);
  CHECK(third.prompt_tokens_computed == static_cast<int64_t>(system_request().size()));
}

TEST_CASE("the disk tier's flags are refused where it cannot work", "[engine][tier][disk]") {
  TempDir dir("paged_kv_disk_");
  EngineConfig c = disk_config(dir.path());
  c.kv_offloading_gib = 0;
  CHECK_THROWS_AS(Engine(c), ModelError);  // no CPU tier to drop blocks
  c = disk_config(dir.path());
  c.kv_disk_gib = 0;
  CHECK_THROWS_AS(Engine(c), ModelError);
  c = disk_config(dir.path());
  c.kv_disk_dir.clear();
  CHECK_THROWS_AS(Engine(c), ModelError);  // a size without a folder
}
