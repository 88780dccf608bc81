// Speculative decoding with n-gram drafts (EngineConfig::speculative_config, model/speculative/ngram.h) on the real
// stories260K model (CPU executor): requests of every sampling kind get the tokens of decoding without it (greedy,
// seeded sampling with penalties, min_tokens, n = 2, stop strings, logprobs, structured outputs), also when a small
// pool preempts them or one sequence runs at a time (its drafts beyond max_num_seqs's positions); greedy outputs match HF's; drafts are proposed,
// accepted and rejected, a repetitive request needs fewer steps, and every block comes back.
#include <catch2/catch.hpp>

#include "actors/engine.h"
#include "tests/actors/engine_runs.h"
#include "tests/test_data.h"

using namespace paged;
using namespace paged::test;

namespace {

EngineConfig cpu_config(bool speculate) {
  EngineConfig c;
  c.model_dir = kModel;
  c.device = "cpu";
  c.async_scheduling = false;  // the reference: one step at a time (speculation turns it off anyway)
  c.max_num_batched_tokens = 256;
  if (speculate) c.speculative_config = {.num_speculative_tokens = 4, .prompt_lookup_min = 1, .prompt_lookup_max = 3};
  return c;
}

// Verified positions are computed in one chunk: the same math as one token a step, summed in another order.
constexpr double kLogprobMargin = 1e-4;

}  // namespace

TEST_CASE("n-gram speculation gives every request the tokens of decoding without it", "[engine][speculative]") {
  const auto reqs = varied_requests();
  struct Setting {
    const char* name;
    std::optional<int> blocks;
    PreemptionMode mode;
    int max_num_seqs;
  };
  for (const Setting& s : {Setting{"a pool for all", std::nullopt, PreemptionMode::recompute, 256},
                           Setting{"24 blocks, recompute", 24, PreemptionMode::recompute, 256},
                           Setting{"24 blocks, swap", 24, PreemptionMode::swap, 256},
                           Setting{"one sequence at a time", std::nullopt, PreemptionMode::recompute, 1}}) {
    INFO(s.name);
    auto config = [&](bool speculate) {
      EngineConfig c = cpu_config(speculate);
      c.num_kv_blocks = s.blocks;
      c.preemption_mode = s.mode;
      c.max_num_seqs = s.max_num_seqs;
      return c;
    };
    Engine plain(config(false));
    const auto want = run_all(plain, reqs);
    plain.wait_idle();
    CHECK(plain.metrics().spec_decode_draft_tokens == 0);

    Engine speculative(config(true));
    const auto got = run_all(speculative, reqs);
    speculative.wait_idle();
    Metrics& m = speculative.metrics();
    INFO(m.spec_decode_accepted_tokens << " of " << m.spec_decode_draft_tokens << " drafts accepted in "
                                       << m.spec_decode_drafts << " verifications; " << m.preemptions
                                       << " preemptions");
    CHECK(m.spec_decode_accepted_tokens > 0);
    CHECK(m.spec_decode_accepted_tokens < m.spec_decode_draft_tokens);
    if (s.blocks) CHECK(m.preemptions > 0);
    CHECK(m.kv_blocks_free == m.kv_blocks_total);
    check_same_completions(got, want, kLogprobMargin);
  }
}

TEST_CASE("greedy outputs with n-gram speculation match HF transformers", "[engine][speculative]") {
  const boost::json::value golden = read_json(kGolden);
  std::vector<std::pair<std::vector<TokenId>, SamplingParams>> reqs;
  std::vector<std::vector<TokenId>> expected;
  for (const auto& tc : golden.at("cases").as_array()) {
    expected.push_back(ids_of(tc.at("greedy_ids")));
    SamplingParams p{.max_tokens = static_cast<int>(expected.back().size()), .temperature = 0.0f};
    p.ignore_eos = true;
    reqs.emplace_back(ids_of(tc.at("prompt_ids")), p);
  }
  Engine engine(cpu_config(true));
  const auto got = run_all(engine, reqs);
  engine.wait_idle();
  for (size_t i = 0; i < reqs.size(); ++i) {
    INFO("case " << i);
    CHECK(got[i].at(0).tokens == expected[i]);
  }
  CHECK(engine.metrics().spec_decode_accepted_tokens > 0);
}

TEST_CASE("a request that repeats itself takes fewer steps with n-gram speculation", "[engine][speculative]") {
  // A story told twice: the second telling's continuation is found in the first.
  Engine plain(cpu_config(false)), speculative(cpu_config(true));
  const std::string story = "Once upon a time, there was a little girl named Lily. She loved to play with her ball.";
  const std::vector<TokenId> prompt = plain.tokenizer().encode(story + " " + story + " " + story, true);
  SamplingParams p{.max_tokens = 48, .temperature = 0.0f};
  p.ignore_eos = true;
  const auto want = run_all(plain, {{prompt, p}});
  const auto got = run_all(speculative, {{prompt, p}});
  plain.wait_idle();
  speculative.wait_idle();
  check_same_completions(got, want, kLogprobMargin);
  const Metrics& m = speculative.metrics();
  INFO(m.spec_decode_accepted_tokens << " of " << m.spec_decode_draft_tokens << " drafts accepted; steps "
                                     << m.steps << " against " << plain.metrics().steps);
  CHECK(m.steps < plain.metrics().steps);
  CHECK(m.kv_blocks_free == m.kv_blocks_total);
}

TEST_CASE("a structured output's drafts are masked by the grammar at each position: the output is plain decoding's "
          "and valid",
          "[engine][speculative][structured]") {
  // A list of six like objects repeats itself: its drafts are found, and each position's mask takes those before it.
  SamplingParams p{.max_tokens = 400, .temperature = 0.8f, .seed = 21};
  p.structured = {StructuredOutput::Kind::json_schema,
                  R"({"type": "array", "minItems": 6, "maxItems": 6, "items": {"type": "object",
                      "properties": {"name": {"enum": ["Lily", "Tom", "Sue"]}, "age": {"type": "integer",
                      "minimum": 1, "maximum": 9}}, "required": ["name", "age"], "additionalProperties": false}})",
                  "response_format"};
  Engine plain(cpu_config(false)), speculative(cpu_config(true));
  std::vector<std::pair<std::vector<TokenId>, SamplingParams>> reqs;
  for (uint64_t seed = 21; seed < 25; ++seed) {
    p.seed = seed;
    reqs.emplace_back(plain.tokenizer().encode("Once upon a time", true), p);
  }
  const auto want = run_all(plain, reqs);
  const auto got = run_all(speculative, reqs);
  plain.wait_idle();
  speculative.wait_idle();
  check_same_completions(got, want, kLogprobMargin);
  for (const auto& request : got) {
    INFO(request.at(0).text);
    REQUIRE(request.at(0).finish == "stop");
    const boost::json::value v = boost::json::parse(request.at(0).text);
    CHECK(v.as_array().size() == 6);
  }
  const Metrics& m = speculative.metrics();
  INFO(m.spec_decode_accepted_tokens << " of " << m.spec_decode_draft_tokens << " drafts accepted");
  CHECK(m.spec_decode_accepted_tokens > 0);
  CHECK(m.kv_blocks_free == m.kv_blocks_total);
}
