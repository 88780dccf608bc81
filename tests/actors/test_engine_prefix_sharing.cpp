// Prefix sharing within a step on the real stories260K model (CPU executor): 48 prompts with a common prefix,
// submitted at once, compute the prefix once and give the greedy tokens each gives alone with prefix caching off,
// also when some of them are aborted while the others run.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>

#include "actors/engine.h"
#include "tests/test_data.h"

using namespace paged;
using namespace paged::test;

namespace {

constexpr int kPrefix = 64;  // four full blocks of 16
constexpr int kPrompts = 48;

/// The golden prompts (without BOS) and their greedy continuations, one after the other: natural text.
std::vector<TokenId> golden_text() {
  std::vector<TokenId> text;
  const auto golden = read_json(kGolden);
  for (const auto& tc : golden.at("cases").as_array()) {
    const auto prompt = ids_of(tc.at("prompt_ids")), greedy = ids_of(tc.at("greedy_ids"));
    text.insert(text.end(), prompt.begin() + 1, prompt.end());
    text.insert(text.end(), greedy.begin(), greedy.end());
  }
  return text;
}

/// kPrompts prompts: BOS and 63 tokens of golden text in common, then 1 to 12 tokens of their own from the text.
std::vector<std::vector<TokenId>> shared_prefix_prompts() {
  const std::vector<TokenId> text = golden_text();
  const size_t tail_offsets = 290;
  REQUIRE(text.size() >= kPrefix - 1 + tail_offsets + 12);
  std::vector<TokenId> prefix{1};
  prefix.insert(prefix.end(), text.begin(), text.begin() + kPrefix - 1);
  std::vector<std::vector<TokenId>> prompts;
  for (int i = 0; i < kPrompts; ++i) {
    auto p = prefix;
    const auto from = text.begin() + kPrefix - 1 + (7 * i) % tail_offsets;
    p.insert(p.end(), from, from + 1 + i % 12);
    prompts.push_back(std::move(p));
  }
  return prompts;
}

EngineConfig cpu_config(bool prefix_caching, int max_num_seqs) {
  EngineConfig c;
  c.model_dir = kModel;
  c.device = "cpu";
  c.enable_prefix_caching = prefix_caching;
  c.max_num_seqs = max_num_seqs;
  return c;
}

const SamplingParams kGreedy{.max_tokens = 8, .temperature = 0.0f};

/// The kGreedy tokens of each prompt run one at a time with prefix caching off.
std::vector<std::vector<TokenId>> alone_reference(const std::vector<std::vector<TokenId>>& prompts,
                                                  int64_t* prompt_tokens_computed) {
  Engine alone(cpu_config(false, 1));
  std::vector<std::vector<TokenId>> out;
  for (const auto& r : alone.generate(prompts, kGreedy)) out.push_back(r.outputs.at(0).token_ids);
  alone.wait_idle();
  *prompt_tokens_computed = alone.metrics().prompt_tokens_computed;
  return out;
}

int64_t tail_tokens(const std::vector<std::vector<TokenId>>& prompts) {
  int64_t n = 0;
  for (const auto& p : prompts) n += static_cast<int64_t>(p.size()) - kPrefix;
  return n;
}

}  // namespace

TEST_CASE("48 prompts with a common prefix submitted at once compute it once, with the tokens each gives alone",
          "[engine][prefix][share]") {
  const auto prompts = shared_prefix_prompts();
  int64_t alone_computed = 0;
  const auto want = alone_reference(prompts, &alone_computed);
  CHECK(alone_computed == kPrompts * kPrefix + tail_tokens(prompts));

  Engine together(cpu_config(true, 256));
  const auto got = together.generate(prompts, kGreedy);
  REQUIRE(got.size() == prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    INFO("prompt " << i);
    CHECK(got[i].outputs.at(0).token_ids == want[i]);
  }
  together.wait_idle();
  Metrics& m = together.metrics();
  INFO("prompt tokens computed: " << m.prompt_tokens_computed << " sharing within a step, " << alone_computed
                                  << " with prefix caching off; " << m.steps << " steps");
  CHECK(m.prompt_tokens_computed == kPrefix + tail_tokens(prompts));
  CHECK(m.prefix_cache_hit_tokens == (kPrompts - 1) * kPrefix);
  CHECK(m.kv_blocks_free == m.kv_blocks_total);
}

TEST_CASE("aborting some of 48 prompts that share a prefix leaves the others their tokens",
          "[engine][prefix][share][abort]") {
  const auto prompts = shared_prefix_prompts();
  int64_t alone_computed = 0;
  const auto want = alone_reference(prompts, &alone_computed);

  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::vector<TokenId>> tokens = std::vector<std::vector<TokenId>>(kPrompts);
    std::vector<std::string> finish = std::vector<std::string>(kPrompts);
    int done = 0;
    int first_long_tokens = 0;
    std::vector<std::string> errors;
  };
  auto sh = std::make_shared<Shared>();  // outlives the engine's threads if a wait fails
  Engine engine(cpu_config(true, 256));
  // Two long prefills first, then the prompts; an eighth of them aborted right after they were submitted, another
  // eighth once the first long request has its first token. Whether an abort lands between a plan and the step
  // that carries it (a reader then computes the prefix: drop_ended_chunks, tested in tests/model) is up to timing;
  // every outcome must leave the other prompts their tokens.
  std::vector<TokenId> long_prompt{1};
  const std::vector<TokenId> text = golden_text();
  for (size_t i = 0; long_prompt.size() < 480; ++i) long_prompt.push_back(text[i % text.size()]);
  const SamplingParams busy{.max_tokens = 16, .temperature = 0.0f, .ignore_eos = true};
  for (int k = 0; k < 2; ++k)
    engine.submit(long_prompt, busy, [sh, k](RequestEvent ev) {
      std::lock_guard lock(sh->mu);
      for (const auto& d : ev.deltas) sh->first_long_tokens += k == 0 ? static_cast<int>(d.token_ids.size()) : 0;
      if (ev.error) sh->errors.push_back(*ev.error);
      sh->done += ev.done;
      sh->cv.notify_all();
    });
  std::vector<RequestId> ids;
  for (int i = 0; i < kPrompts; ++i) {
    ids.push_back(engine.submit(prompts[i], kGreedy, [sh, i](RequestEvent ev) {
      std::lock_guard lock(sh->mu);
      for (const auto& d : ev.deltas) {
        sh->tokens[i].insert(sh->tokens[i].end(), d.token_ids.begin(), d.token_ids.end());
        if (d.finish_reason) sh->finish[i] = *d.finish_reason;
      }
      if (ev.error) sh->errors.push_back(*ev.error);
      sh->done += ev.done;
      sh->cv.notify_all();
    }));
    if (i % 8 == 0) engine.abort(ids.back());
  }
  {
    std::unique_lock lock(sh->mu);
    REQUIRE(sh->cv.wait_for(lock, std::chrono::seconds(60), [&] { return sh->first_long_tokens > 0; }));
  }
  for (int i = 4; i < kPrompts; i += 8) engine.abort(ids[i]);
  {
    std::unique_lock lock(sh->mu);
    REQUIRE(sh->cv.wait_for(lock, std::chrono::seconds(60), [&] { return sh->done == kPrompts + 2; }));
    REQUIRE(sh->errors.empty());
  }
  for (int i = 0; i < kPrompts; ++i) {
    INFO("prompt " << i << ", finish " << sh->finish[i]);
    if (sh->finish[i] == "cancelled") {
      CHECK(i % 4 == 0);  // one of those aborted (the others may have ended before their abort)
      const auto& got = sh->tokens[i];  // what arrived before the abort: a prefix of the output
      CHECK(got.size() <= want[i].size());
      const size_t n = std::min(got.size(), want[i].size());
      CHECK(std::equal(got.begin(), got.begin() + n, want[i].begin(), want[i].begin() + n));
    } else {
      CHECK(sh->tokens[i] == want[i]);
    }
  }
  engine.wait_idle();
  CHECK(engine.metrics().kv_blocks_free == engine.metrics().kv_blocks_total);
}
