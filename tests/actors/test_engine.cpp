// The actor runtime end to end on the real stories260K model: continuous batching against one-at-a-time runs,
// preemption (swap and recompute) under a small KV pool, parallel sampling and beam search against references,
// cancellation, prefix caching, the CPU executor's swap of real KV data, and prompt logprobs (chunked, batched,
// preempted and forked prefills score every prompt token as one runner step over the whole prompt does; such
// requests take no prefix-cache hit).
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <boost/json.hpp>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <fstream>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "actors/engine.h"
#include "model/kv/kv_groups.h"
#include "tests/test_data.h"
#include "model/loader/config.h"
#include "kernels/cpu/cpu_runner.h"
#include "model/loader/safetensors.h"
#include "model/sampling/sampler.h"

using namespace paged;
using namespace paged::test;

namespace {

struct GoldenCase {
  std::vector<TokenId> prompt, greedy;
};

std::vector<GoldenCase> golden_cases() {
  std::vector<GoldenCase> out;
  const auto golden = read_json(kGolden);
  for (const auto& tc : golden.at("cases").as_array())
    out.push_back({ids_of(tc.at("prompt_ids")), ids_of(tc.at("greedy_ids"))});
  return out;
}

// Natural TinyStories text to cut prompts from: every golden prompt followed by its greedy continuation.
const std::vector<TokenId>& corpus() {
  static const std::vector<TokenId> text = [] {
    std::vector<TokenId> t;
    for (const auto& c : golden_cases()) {
      t.insert(t.end(), c.prompt.begin() + 1, c.prompt.end());  // without BOS
      t.insert(t.end(), c.greedy.begin(), c.greedy.end());
    }
    return t;
  }();
  return text;
}

/// BOS plus `len - 1` corpus tokens starting at `offset` (wrapping around).
std::vector<TokenId> text_prompt(size_t offset, size_t len) {
  const auto& c = corpus();
  std::vector<TokenId> p{1};
  for (size_t i = 0; p.size() < len; ++i) p.push_back(c[(offset + i) % c.size()]);
  return p;
}

EngineConfig base_config() {
  EngineConfig c;
  c.model_dir = kModel;
  c.device = "cpu";
  c.swap_space_gib = 0.25;
  return c;
}

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  return p;
}

struct Completion {
  std::vector<TokenId> tokens;
  std::string text;
  std::string finish;
};

/// Submits every request at once (each with its own parameters) and waits until all finished. Returns, per
/// request, its completions by index. The sinks share their state with this call through a shared_ptr, so that a
/// failed wait leaves nothing dangling behind the engine's threads.
std::vector<std::vector<Completion>> run_all(Engine& engine, const std::vector<std::vector<TokenId>>& prompts,
                                             const std::vector<SamplingParams>& params) {
  REQUIRE(prompts.size() == params.size());
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::vector<Completion>> out;
    size_t remaining = 0;
    std::vector<std::string> errors;
  };
  auto sh = std::make_shared<Shared>();
  sh->out.resize(prompts.size());
  sh->remaining = prompts.size();
  for (size_t i = 0; i < prompts.size(); ++i) {
    sh->out[i].resize(params[i].n);
    engine.submit(prompts[i], params[i], [sh, i](RequestEvent ev) {
      std::lock_guard lock(sh->mu);
      for (const auto& d : ev.deltas) {
        if (d.index < 0 || d.index >= static_cast<int>(sh->out[i].size())) {
          sh->errors.push_back("bad completion index");
          continue;
        }
        Completion& c = sh->out[i][d.index];
        c.tokens.insert(c.tokens.end(), d.token_ids.begin(), d.token_ids.end());
        c.text += d.text;
        if (d.finish_reason) c.finish = *d.finish_reason;
      }
      if (ev.error) sh->errors.push_back(*ev.error);
      if (ev.done && --sh->remaining == 0) sh->cv.notify_all();
    });
  }
  std::unique_lock lock(sh->mu);
  const bool finished = sh->cv.wait_for(lock, std::chrono::seconds(60), [&] { return sh->remaining == 0; });
  if (!finished) {
    Metrics& m = engine.metrics();
    WARN("stuck: " << sh->remaining << " requests left; waiting " << m.waiting_requests << ", running "
                   << m.running_requests << ", swapped " << m.swapped_requests << ", running seqs " << m.running_seqs
                   << ", free blocks " << m.kv_blocks_free << "/" << m.kv_blocks_total << ", cpu free "
                   << m.cpu_blocks_free << "/" << m.cpu_blocks_total << ", steps " << m.steps << ", preemptions "
                   << m.preemptions);
  }
  REQUIRE(finished);
  INFO((sh->errors.empty() ? std::string() : sh->errors.front()));
  REQUIRE(sh->errors.empty());
  return sh->out;
}

std::vector<std::vector<Completion>> run_all(Engine& engine, const std::vector<std::vector<TokenId>>& prompts,
                                             const SamplingParams& params) {
  return run_all(engine, prompts, std::vector<SamplingParams>(prompts.size(), params));
}

/// Each request's first completion in `got` has the tokens of the one in `reference`.
void check_same_tokens(const std::vector<std::vector<Completion>>& got,
                       const std::vector<std::vector<Completion>>& reference) {
  REQUIRE(got.size() == reference.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("request " << i);
    CHECK(got[i][0].tokens == reference[i][0].tokens);
  }
}

void require_pool_drained(Engine& engine) {
  engine.wait_idle();
  Metrics& m = engine.metrics();
  CHECK(m.kv_blocks_total > 0);
  CHECK(m.kv_blocks_free == m.kv_blocks_total);
  CHECK(m.cpu_blocks_free == m.cpu_blocks_total);
  CHECK(m.running_seqs == 0);
}

/// `count` requests of mixed prompt lengths (1 .. 150 tokens) and max_tokens (1 .. 48), seeded.
void mixed_requests(size_t count, uint64_t seed, std::vector<std::vector<TokenId>>& prompts,
                    std::vector<SamplingParams>& params) {
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < count; ++i) {
    const size_t len = 1 + rng() % 150;
    prompts.push_back(text_prompt(rng() % corpus().size(), len));
    params.push_back(greedy(1 + static_cast<int>(rng() % 48)));
  }
}

// The scores of every prompt token from one runner step over the whole prompt (no engine).
std::vector<PromptLogprob> reference(const std::vector<TokenId>& prompt, int num_top) {
  static const ModelConfig cfg = load_model_config(kModel);
  static const SafeTensors weights(kModel);
  const int blocks = static_cast<int>(prompt.size()) / 16 + 1;
  CpuModelRunner runner(cfg, weights, {.block_size = 16, .num_blocks = blocks});
  SeqChunk c;
  c.tokens.assign(prompt.begin(), prompt.end() - 1);
  for (int b = 0; b < blocks; ++b) c.block_table.push_back(b);
  c.prompt_logprobs = {.count = static_cast<int>(c.tokens.size()), .num_top = num_top, .next_token = prompt.back()};
  StepBatch step;
  step.seqs = {c};
  return runner.execute(step).prompt_logprobs.at(0).tokens;
}

void require_same_scores(const std::vector<PromptLogprob>& got, const std::vector<PromptLogprob>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("prompt token " << i + 1);
    CHECK(got[i].token == want[i].token);
    CHECK(got[i].rank == want[i].rank);
    CHECK(std::abs(got[i].logprob - want[i].logprob) < 1e-5);
    REQUIRE(got[i].top_logprobs.size() == want[i].top_logprobs.size());
    for (size_t j = 0; j < want[i].top_logprobs.size(); ++j)
      CHECK(got[i].top_logprobs[j].first == want[i].top_logprobs[j].first);
  }
}

SamplingParams scoring(int num_top, int max_tokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  p.prompt_logprobs = num_top;
  return p;
}

}  // namespace

TEST_CASE("64 concurrent mixed requests give exactly the greedy tokens each gives alone", "[engine]") {
  std::vector<std::vector<TokenId>> prompts;
  std::vector<SamplingParams> params;
  mixed_requests(64, 7, prompts, params);

  EngineConfig alone_cfg = base_config();
  alone_cfg.max_num_seqs = 1;
  Engine alone(alone_cfg);
  const auto reference = run_all(alone, prompts, params);
  CHECK(alone.metrics().peak_running_seqs == 1);

  EngineConfig batch_cfg = base_config();
  batch_cfg.max_num_batched_tokens = 256;  // long prompts are split over steps and mixed with decodes
  // And with every prompt in chunks of at most 16 tokens (--long-prefill-token-threshold).
  EngineConfig chunked_cfg = batch_cfg;
  chunked_cfg.long_prefill_token_threshold = 16;
  for (const EngineConfig& cfg : {batch_cfg, chunked_cfg}) {
    Engine batched(cfg);
    const auto got = run_all(batched, prompts, params);
    for (size_t i = 0; i < prompts.size(); ++i) {
      INFO("threshold " << cfg.long_prefill_token_threshold << ", request " << i << " prompt " << prompts[i].size()
                        << " tokens, max_tokens " << params[i].max_tokens);
      REQUIRE(!reference[i][0].tokens.empty());
      CHECK(got[i][0].tokens == reference[i][0].tokens);
      CHECK(got[i][0].text == reference[i][0].text);
      CHECK(got[i][0].finish == reference[i][0].finish);
    }
    CHECK(batched.metrics().peak_running_seqs >= 16);  // the batch really ran together
    CHECK(batched.metrics().steps < alone.metrics().steps);
    require_pool_drained(batched);
  }
  require_pool_drained(alone);
}

TEST_CASE("a KV pool a quarter of the need preempts and still gives identical outputs, swap and recompute",
          "[engine][preemption]") {
  std::mt19937_64 rng(11);
  std::vector<std::vector<TokenId>> prompts;
  std::vector<SamplingParams> params;
  int need = 0;
  for (int i = 0; i < 32; ++i) {
    const int len = 16 + static_cast<int>(rng() % 49), max_tokens = 32 + static_cast<int>(rng() % 33);
    prompts.push_back(text_prompt(rng() % corpus().size(), len));
    SamplingParams p = greedy(max_tokens);
    p.ignore_eos = true;  // every request runs to max_tokens: the memory pressure is known
    params.push_back(p);
    need += (len + max_tokens + 15) / 16;
  }
  Engine unconstrained(base_config());
  const auto reference = run_all(unconstrained, prompts, params);
  CHECK(unconstrained.metrics().preemptions == 0);

  for (PreemptionMode mode : {PreemptionMode::swap, PreemptionMode::recompute}) {
    const bool swap = mode == PreemptionMode::swap;
    INFO((swap ? "swap" : "recompute") << " mode, " << need / 4 << " of " << need << " blocks needed");
    EngineConfig cfg = base_config();
    cfg.num_kv_blocks = need / 4;
    cfg.preemption_mode = mode;
    Engine small(cfg);
    const auto got = run_all(small, prompts, params);
    for (size_t i = 0; i < prompts.size(); ++i) {
      INFO("request " << i);
      CHECK(got[i][0].finish == "length");
      CHECK(static_cast<int>(got[i][0].tokens.size()) == params[i].max_tokens);
      CHECK(got[i][0].tokens == reference[i][0].tokens);
    }
    Metrics& m = small.metrics();
    CHECK(m.preemptions > 0);
    if (swap) {
      CHECK(m.swapped_out_blocks > 0);
      // No sequence can end while swapped out: each runs to max_tokens (no stop id, stop string or abort), and a
      // victim whose token in flight is its last is freed, not swapped. So every block swapped out comes back in.
      CHECK(m.swapped_in_blocks == m.swapped_out_blocks);
    } else {
      CHECK(m.swapped_out_blocks == 0);
    }
    CHECK(m.kv_blocks_total == need / 4);
    require_pool_drained(small);
  }
}

TEST_CASE("--seed: requests that give no seed sample the same tokens in engines started with the same seed",
          "[engine]") {
  SamplingParams p;
  p.temperature = 1.0f;
  p.max_tokens = 32;
  p.ignore_eos = true;
  const std::vector<std::vector<TokenId>> prompts{text_prompt(0, 12), text_prompt(50, 20), text_prompt(100, 8)};
  const auto run = [&](std::optional<uint64_t> seed) {
    EngineConfig cfg = base_config();
    cfg.seed = seed;
    Engine engine(cfg);
    std::vector<std::vector<TokenId>> tokens;
    for (const auto& completions : run_all(engine, prompts, p)) tokens.push_back(completions.at(0).tokens);
    return tokens;
  };
  const auto first = run(7), again = run(7), other = run(8), unseeded = run(std::nullopt);
  for (const auto& t : first) CHECK(t.size() == 32);
  CHECK(first == again);
  // 96 tokens sampled at temperature 1 from a trained model: other seeds agreeing on all of them is vanishingly rare.
  CHECK(first != other);
  CHECK(first != unseeded);
}

TEST_CASE("n=4 with a seed equals four requests with seeds seed+i, and shares the prompt's blocks", "[engine][cow]") {
  // 40 prompt tokens: two full blocks and a partly filled third that the four forks copy on their first write.
  const auto prompt = text_prompt(3, 40);
  SamplingParams p;
  p.temperature = 0.9f;
  p.max_tokens = 24;
  p.ignore_eos = true;
  p.seed = 1234;

  // Prefix caching off in both runs, so that only the forks can share blocks (four separate requests submitted
  // together could otherwise share full prompt blocks through the cache, depending on admission timing).
  EngineConfig cfg = base_config();
  cfg.enable_prefix_caching = false;

  Engine forked(cfg);
  SamplingParams pn = p;
  pn.n = 4;
  const auto together = run_all(forked, {prompt}, pn)[0];
  REQUIRE(together.size() == 4);

  Engine separate(cfg);
  std::vector<SamplingParams> singles;
  for (int i = 0; i < 4; ++i) {
    SamplingParams s = p;
    s.seed = *p.seed + i;  // the derivation the scheduler uses: completion i samples with seed + i
    singles.push_back(s);
  }
  const auto apart = run_all(separate, {prompt, prompt, prompt, prompt}, singles);

  std::set<std::vector<TokenId>> distinct;
  for (int i = 0; i < 4; ++i) {
    INFO("completion " << i);
    CHECK(together[i].tokens.size() == 24);
    CHECK(together[i].tokens == apart[i][0].tokens);
    CHECK(together[i].text == apart[i][0].text);
    distinct.insert(together[i].tokens);
  }
  CHECK(distinct.size() >= 3);  // temperature > 0: the seeds really give different completions

  // 64 tokens = 4 blocks a sequence. Apart: 4 x 4 = 16 blocks. Forked: the 2 full prompt blocks are shared, the
  // partly filled one is copied by 3 of the 4 forks (the last keeps the original), plus one new block each: 10.
  const int64_t peak_forked = forked.metrics().kv_blocks_peak_used, peak_apart = separate.metrics().kv_blocks_peak_used;
  INFO("peak blocks in use: n=4 " << peak_forked << ", 4 requests " << peak_apart);
  CHECK(peak_apart == 16);
  CHECK(peak_forked == 10);
  require_pool_drained(forked);
  require_pool_drained(separate);
}

namespace {

/// Plain beam search on CpuModelRunner, recomputing every beam from scratch each step, with the definition the
/// scheduler implements (vLLM's legacy beam search, early_stopping false): see model/scheduling/beam_search.h.
std::vector<std::vector<TokenId>> reference_beam_search(const std::vector<TokenId>& prompt, int width, int n,
                                                        int max_tokens, const std::vector<TokenId>& stop_ids,
                                                        int max_model_len, double length_penalty = 1.0) {
  const ModelConfig cfg = load_model_config(kModel);
  SafeTensors weights(kModel);
  const int B = 16;
  CpuModelRunner runner(cfg, weights, CpuRunnerOptions{.block_size = B, .num_blocks = (max_model_len + B - 1) / B});
  SamplingParams params = greedy(max_tokens);

  struct Hyp {
    std::vector<TokenId> tokens;
    double cum = 0.0;
    bool stopped = false;
  };
  auto score = [&](const Hyp& h) {
    return h.cum / std::pow(static_cast<double>(prompt.size() + h.tokens.size() - (h.stopped ? 1 : 0)), length_penalty);
  };
  auto logprobs_of = [&](const std::vector<TokenId>& output) {
    SeqChunk c;
    c.tokens = prompt;
    c.tokens.insert(c.tokens.end(), output.begin(), output.end());
    c.start_pos = 0;
    c.block_table.resize((c.tokens.size() + B - 1) / B);
    std::iota(c.block_table.begin(), c.block_table.end(), 0);
    SampleSpec spec;
    spec.params = &params;
    c.samples = {spec};
    StepBatch batch;
    batch.seqs = {c};
    auto logits = runner.forward(batch);
    std::vector<float> lp;
    log_softmax(logits.at(0), lp);
    return lp;
  };

  std::vector<Hyp> live{Hyp{}}, finished;
  for (;;) {
    struct Offer {
      double score;
      size_t beam;
      TokenId token;
    };
    std::vector<Offer> offers;
    for (size_t b = 0; b < live.size(); ++b) {
      const auto lp = logprobs_of(live[b].tokens);
      std::vector<TokenId> ids(lp.size());
      std::iota(ids.begin(), ids.end(), 0);
      std::stable_sort(ids.begin(), ids.end(), [&](TokenId x, TokenId y) { return lp[x] > lp[y]; });
      for (int k = 0; k < 2 * width; ++k) offers.push_back({live[b].cum + lp[ids[k]], b, ids[k]});
    }
    std::stable_sort(offers.begin(), offers.end(), [](const Offer& a, const Offer& b) { return a.score > b.score; });
    offers.resize(2 * width);
    const size_t out_len = live[0].tokens.size() + 1;
    const bool length_end = static_cast<int>(out_len) >= max_tokens ||
                            static_cast<int>(prompt.size() + out_len) >= max_model_len;
    std::vector<Hyp> running;
    for (const Offer& o : offers) {
      Hyp h{live[o.beam].tokens, o.score, false};
      h.tokens.push_back(o.token);
      h.stopped = std::find(stop_ids.begin(), stop_ids.end(), o.token) != stop_ids.end();
      (h.stopped || length_end ? finished : running).push_back(std::move(h));
    }
    std::stable_sort(finished.begin(), finished.end(), [&](const Hyp& a, const Hyp& b) { return score(a) > score(b); });
    const bool done = running.empty() || (finished.size() >= static_cast<size_t>(width) &&
                                          score(finished[width - 1]) >= score(running.front()));
    if (finished.size() > static_cast<size_t>(width)) finished.resize(width);
    if (done) break;
    if (running.size() > static_cast<size_t>(width)) running.resize(width);
    live = std::move(running);
  }
  std::vector<std::vector<TokenId>> out;
  for (int i = 0; i < n && i < static_cast<int>(finished.size()); ++i) out.push_back(finished[i].tokens);
  return out;
}

}  // namespace

TEST_CASE("beam search of width 4 equals a plain reference beam search", "[engine][beam]") {
  const auto cases = golden_cases();
  Engine engine(base_config());
  const TokenId period = engine.tokenizer().encode("a.", false).back();  // "." after a word
  REQUIRE(engine.tokenizer().decode(std::vector<TokenId>{period}) == ".");

  struct Case {
    std::vector<TokenId> prompt;
    int max_tokens;
    std::vector<TokenId> extra_stop;
    float length_penalty = 1.0f;
  };
  // Plain length-bounded searches, and searches where "." ends hypotheses early (finished beams compete with
  // running ones, and the early-stopping rule decides the end), with vLLM's length penalty and others (0: the
  // cumulative logprob alone, favouring short hypotheses; 2: long ones).
  const std::vector<Case> runs = {{cases[0].prompt, 12, {}},
                                  {cases[2].prompt, 10, {}},
                                  {cases[0].prompt, 40, {period}},
                                  {cases[3].prompt, 40, {period}},
                                  {cases[0].prompt, 40, {period}, 0.0f},
                                  {cases[3].prompt, 40, {period}, 2.0f}};

  EngineConfig tight_cfg = base_config();
  tight_cfg.max_num_batched_tokens = 3;  // beams of one request decode in different steps
  Engine tight(tight_cfg);

  for (size_t k = 0; k < runs.size(); ++k) {
    const Case& c = runs[k];
    SamplingParams p = greedy(c.max_tokens);
    p.use_beam_search = true;
    p.n = 4;
    p.stop_token_ids = c.extra_stop;
    p.length_penalty = c.length_penalty;
    std::vector<TokenId> stops = engine.model_config().eos_token_ids;
    for (TokenId id : engine.tokenizer().eos_ids())
      if (std::find(stops.begin(), stops.end(), id) == stops.end()) stops.push_back(id);
    stops.insert(stops.end(), c.extra_stop.begin(), c.extra_stop.end());
    const auto expected =
        reference_beam_search(c.prompt, 4, 4, c.max_tokens, stops, engine.max_model_len(), c.length_penalty);
    REQUIRE(expected.size() == 4);
    for (Engine* e : {&engine, &tight}) {
      const auto got = run_all(*e, {c.prompt}, p)[0];
      REQUIRE(got.size() == 4);
      for (int i = 0; i < 4; ++i) {
        INFO("case " << k << (e == &tight ? " (token budget 3)" : "") << ", beam " << i);
        CHECK(got[i].tokens == expected[i]);
        const bool stopped = std::find(stops.begin(), stops.end(), expected[i].back()) != stops.end();
        CHECK(got[i].finish == (stopped ? "stop" : "length"));
      }
    }
  }
  // With logprobs: each beam's tokens carry the logprobs the model gives them after the prompt and the beam's own
  // earlier tokens (the same text scored as a prompt), summing to the beam's cumulative logprob.
  SamplingParams with_logprobs = greedy(12);
  with_logprobs.use_beam_search = true;
  with_logprobs.n = 3;
  with_logprobs.logprobs = 2;
  const RequestOutput searched = engine.generate({cases[1].prompt}, with_logprobs)[0];
  REQUIRE(searched.outputs.size() == 3);
  for (const CompletionOutput& beam : searched.outputs) {
    REQUIRE(beam.logprobs.size() == beam.token_ids.size());
    std::vector<TokenId> text = cases[1].prompt;
    text.insert(text.end(), beam.token_ids.begin(), beam.token_ids.end());
    const RequestOutput scored = engine.generate({text}, scoring(2, 1))[0];
    double sum = 0.0;
    for (size_t i = 0; i < beam.token_ids.size(); ++i) {
      const PromptLogprob& want = scored.prompt_logprobs.at(cases[1].prompt.size() - 1 + i);
      CHECK(beam.logprobs[i].token == beam.token_ids[i]);
      CHECK(beam.logprobs[i].logprob == Approx(want.logprob).margin(1e-4));
      REQUIRE(beam.logprobs[i].top_logprobs.size() == 2);
      CHECK(beam.logprobs[i].top_logprobs[0].first == want.top_logprobs.at(0).first);
      sum += beam.logprobs[i].logprob;
    }
    CHECK(sum == Approx(beam.cumulative_logprob).margin(1e-4));
  }
  require_pool_drained(engine);
  require_pool_drained(tight);
}

TEST_CASE("beam searches whose beams overflow a small pool together finish with a large pool's results; beams that "
          "can never fit together are refused", "[engine][beam]") {
  // Four searches of width 3, each fitting 24 blocks alone (at most 2 shared prompt blocks + 3 x 5) but not
  // together: preemption takes whole searches (a step needs every beam), a swapped search keeps its beams' shared
  // blocks shared and comes back whole. Before, a beam swapped out alone could never come back while its siblings
  // held the blocks, and the engine waited for ever.
  std::vector<std::vector<TokenId>> prompts;
  for (size_t i = 0; i < 4; ++i) prompts.push_back(text_prompt(97 * i, 20 + 8 * i));
  SamplingParams p = greedy(60);
  p.ignore_eos = true;
  p.use_beam_search = true;
  p.n = 3;
  Engine large(base_config());
  const auto expected = run_all(large, prompts, p);
  for (const PreemptionMode mode : {PreemptionMode::swap, PreemptionMode::recompute}) {
    for (const bool async : {true, false}) {
      INFO((mode == PreemptionMode::swap ? "swap" : "recompute") << (async ? ", async" : ""));
      EngineConfig config = base_config();
      config.num_kv_blocks = 24;
      config.preemption_mode = mode;
      config.async_scheduling = async;
      Engine engine(config);
      const auto got = run_all(engine, prompts, p);
      for (size_t i = 0; i < prompts.size(); ++i)
        for (int b = 0; b < 3; ++b) {
          INFO("request " << i << ", beam " << b);
          CHECK(got[i][b].tokens == expected[i][b].tokens);
        }
      CHECK(engine.metrics().preemptions > 0);
      require_pool_drained(engine);

      // 1 + 3 x 10 blocks at most: refused, though one sequence of that length fits (11 blocks).
      SamplingParams wide = p;
      wide.max_tokens = 150;
      try {
        engine.submit(text_prompt(0, 20), wide, [](RequestEvent) {});
        FAIL("a search whose beams cannot fit the pool together was accepted");
      } catch (const InvalidRequest& e) {
        CHECK(e.param == "max_tokens");
        CHECK_THAT(e.what(), Catch::Contains("3 beams"));
      }
      // So many beams that one token each overflows the pool: the width is named, n or best_of.
      for (const auto& [n, best_of, param] : {std::tuple{40, 0, "n"}, std::tuple{2, 40, "best_of"}}) {
        SamplingParams many = p;
        many.max_tokens = 1;
        many.n = n;
        many.best_of = best_of;
        try {
          engine.submit(text_prompt(0, 20), many, [](RequestEvent) {});
          FAIL("a search of 40 beams was accepted into a pool of 24 blocks");
        } catch (const InvalidRequest& e) {
          CHECK(e.param == param);
          CHECK_THAT(e.what(), Catch::Contains("40 beams"));
        }
      }
      wide.use_beam_search = false;
      wide.n = 1;
      CHECK(engine.generate({text_prompt(0, 20)}, wide)[0].outputs[0].token_ids.size() == 150u);
      require_pool_drained(engine);
    }
  }
}

TEST_CASE("priority scheduling: the most urgent waiting request runs next; without it a priority is refused",
          "[engine][priority]") {
  EngineConfig config = base_config();
  config.priority_scheduling = true;
  config.max_num_seqs = 1;  // one at a time: the order of the ends is the order of admission
  Engine engine(config);
  std::mutex mu;
  std::vector<int> ended;  // the requests' priorities, in the order they ended
  bool first_started = false;
  std::condition_variable cv;
  SamplingParams p = greedy(24);
  p.ignore_eos = true;
  const std::vector<int> priorities{0, 9, 4, -3, 4, 1};  // the first is admitted before the others arrive
  for (size_t i = 0; i < priorities.size(); ++i) {
    p.priority = priorities[i];
    engine.submit(text_prompt(31 * i, 12), p, [&, prio = priorities[i]](RequestEvent ev) {
      std::lock_guard lock(mu);
      first_started = true;
      if (ev.done) ended.push_back(prio);
      cv.notify_all();
    });
    if (i == 0) {  // it runs before the others arrive
      std::unique_lock lock(mu);
      REQUIRE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return first_started; }));
    }
  }
  {
    std::unique_lock lock(mu);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return ended.size() == priorities.size(); }));
  }
  CHECK(ended == std::vector<int>{0, -3, 1, 4, 4, 9});
  require_pool_drained(engine);

  Engine fcfs(base_config());
  SamplingParams urgent = greedy(4);
  urgent.priority = -1;
  try {
    fcfs.submit(text_prompt(0, 12), urgent, [](RequestEvent) {});
    FAIL("a priority was taken without priority scheduling");
  } catch (const InvalidRequest& e) {
    CHECK(e.param == "priority");
  }
}

TEST_CASE("aborting mid-generation ends with 'cancelled', delivers no more tokens and frees the blocks at once",
          "[engine][abort]") {
  // What the sink touches is declared before the engine, so it outlives the engine's threads even on a failure.
  std::mutex mu;
  std::condition_variable cv;
  std::vector<RequestEvent> events;
  bool done_seen = false, event_after_done = false;
  int64_t free_while_running = -1;
  SamplingParams p = greedy(400);
  p.ignore_eos = true;
  RequestId id = 0;
  std::atomic<bool> submitted{false};
  Engine engine(base_config());
  id = engine.submit(text_prompt(0, 60), p, [&](RequestEvent ev) {
    std::lock_guard lock(mu);
    if (done_seen) event_after_done = true;
    done_seen = done_seen || ev.done;
    events.push_back(std::move(ev));
    if (events.size() == 3) {
      // Abort from the sink, as a server does when its client goes away: at most a step or two more is in flight.
      free_while_running = engine.metrics().kv_blocks_free;
      while (!submitted) std::this_thread::yield();
      engine.abort(id);
    }
    cv.notify_all();
  });
  submitted = true;
  {
    std::unique_lock lock(mu);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return done_seen; }));
  }
  engine.wait_idle();  // returns once the scheduler and memory manager processed the abort
  CHECK(free_while_running < engine.metrics().kv_blocks_total);
  CHECK(engine.metrics().kv_blocks_free == engine.metrics().kv_blocks_total);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // a late token would arrive by now
  std::lock_guard lock(mu);
  CHECK_FALSE(event_after_done);
  const RequestEvent& last = events.back();
  CHECK(last.done);
  REQUIRE(last.deltas.size() == 1);
  CHECK(last.deltas[0].finish_reason == std::optional<std::string>("cancelled"));
  for (size_t i = 0; i + 1 < events.size(); ++i) CHECK_FALSE(events[i].done);
  int tokens = 0;
  for (const auto& ev : events)
    for (const auto& d : ev.deltas) tokens += static_cast<int>(d.token_ids.size());
  CHECK(tokens >= 3);
  CHECK(tokens < 50);
  CHECK(engine.metrics().requests_aborted == 1);

  // Unknown and finished ids are ignored; the engine keeps serving.
  engine.abort(id);
  engine.abort(987654);
  const auto after = run_all(engine, {text_prompt(5, 20)}, greedy(8));
  CHECK(after[0][0].tokens.size() == 8);
  require_pool_drained(engine);
}

TEST_CASE("aborting some of many running requests leaves the others' outputs unchanged", "[engine][abort]") {
  std::vector<std::vector<TokenId>> prompts;
  std::vector<SamplingParams> params;
  for (int i = 0; i < 24; ++i) {
    prompts.push_back(text_prompt(17 * i, 10 + 3 * i));
    SamplingParams p = greedy(i % 3 == 0 ? 300 : 24);
    p.ignore_eos = true;
    params.push_back(p);
  }
  EngineConfig cfg = base_config();
  cfg.num_kv_blocks = 60;  // pressure too: aborts free blocks that preempted requests then get
  cfg.preemption_mode = PreemptionMode::swap;
  std::mutex mu;  // declared before the engine: the sinks' state outlives its threads
  std::condition_variable cv;
  std::vector<std::vector<TokenId>> tokens(prompts.size());
  std::vector<std::string> finish(prompts.size());
  std::vector<RequestId> ids(prompts.size());
  size_t remaining = prompts.size();
  Engine engine(cfg);
  for (size_t i = 0; i < prompts.size(); ++i)
    ids[i] = engine.submit(prompts[i], params[i], [&, i](RequestEvent ev) {
      std::lock_guard lock(mu);
      for (const auto& d : ev.deltas) {
        tokens[i].insert(tokens[i].end(), d.token_ids.begin(), d.token_ids.end());
        if (d.finish_reason) finish[i] = *d.finish_reason;
      }
      if (ev.done) --remaining;
      cv.notify_all();
    });
  {
    std::unique_lock lock(mu);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return tokens[0].size() >= 5; }));
  }
  for (size_t i = 0; i < prompts.size(); i += 3) engine.abort(ids[i]);
  {
    std::unique_lock lock(mu);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return remaining == 0; }));
  }
  require_pool_drained(engine);

  Engine reference(base_config());
  const auto expected = run_all(reference, prompts, params);
  for (size_t i = 0; i < prompts.size(); ++i) {
    INFO("request " << i);
    if (i % 3 == 0) {
      CHECK(finish[i] == "cancelled");
      CHECK(tokens[i].size() < 300);
      // What arrived before the abort is a prefix of the full output.
      CHECK(std::equal(tokens[i].begin(), tokens[i].end(), expected[i][0].tokens.begin()));
    } else {
      CHECK(finish[i] == "length");
      CHECK(tokens[i] == expected[i][0].tokens);
    }
  }
}

TEST_CASE("prefix caching: a second request with the same 5-block prefix reuses the blocks and computes its tail",
          "[engine][prefix]") {
  // 87 tokens: 5 full blocks of 16 and 7 more; the second request shares the first 80 and has its own 11-token tail.
  const auto first = text_prompt(0, 87);
  auto second = std::vector<TokenId>(first.begin(), first.begin() + 80);
  const auto tail = text_prompt(200, 12);
  second.insert(second.end(), tail.begin() + 1, tail.end());
  REQUIRE(second.size() == 91);

  Engine cached(base_config());
  Metrics& m = cached.metrics();
  const auto out1 = run_all(cached, {first}, greedy(8));
  cached.wait_idle();
  CHECK(m.prefix_cache_hit_tokens == 0);
  CHECK(m.prompt_tokens_computed == 87);
  CHECK(m.kv_blocks_cached >= 5);  // the finished request's full blocks stay cached

  const auto out2 = run_all(cached, {second}, greedy(8));
  cached.wait_idle();
  CHECK(m.prefix_cache_hit_tokens == 80);
  CHECK(m.prompt_tokens_computed == 87 + 11);

  // The identical prompt again: every full block but the last token's is reused (at least one token is computed).
  const auto out3 = run_all(cached, {first}, greedy(8));
  cached.wait_idle();
  CHECK(m.prefix_cache_hit_tokens == 80 + 80);
  CHECK(m.prompt_tokens_computed == 87 + 11 + 7);
  CHECK(out3[0][0].tokens == out1[0][0].tokens);

  EngineConfig off_cfg = base_config();
  off_cfg.enable_prefix_caching = false;
  Engine uncached(off_cfg);
  const auto ref = run_all(uncached, {first, second}, greedy(8));
  CHECK(out1[0][0].tokens == ref[0][0].tokens);
  CHECK(out2[0][0].tokens == ref[1][0].tokens);
  CHECK(uncached.metrics().prefix_cache_hit_tokens == 0);
  CHECK(uncached.metrics().prompt_tokens_computed == 87 + 91);
  require_pool_drained(cached);
}

TEST_CASE("prefix caching: cached blocks are evicted when a new request needs them, and /metrics counts them",
          "[engine][prefix]") {
  // 8 blocks. The first request (87 + 8 tokens: 6 blocks) leaves its 5 full blocks cached and 3 blocks free; the
  // second, another 87-token prompt, takes the 3 free blocks and evicts 3 cached ones.
  EngineConfig config = base_config();
  config.num_kv_blocks = 8;
  Engine engine(config);
  Metrics& m = engine.metrics();
  run_all(engine, {text_prompt(0, 87)}, greedy(8));
  engine.wait_idle();
  CHECK(m.kv_blocks_cached == 5);
  CHECK(m.evicted_blocks == 0);
  run_all(engine, {text_prompt(500, 87)}, greedy(8));
  engine.wait_idle();
  CHECK(m.prefix_cache_hit_tokens == 0);
  CHECK(m.evicted_blocks == 3);
  CHECK(m.prometheus().find("\npaged_kv_evicted_blocks_total 3\n") != std::string::npos);
  require_pool_drained(engine);
}

TEST_CASE("prefix caching: a request shares the in-use prefix blocks of a running one", "[engine][prefix]") {
  const auto first = text_prompt(0, 87);
  auto second = std::vector<TokenId>(first.begin(), first.begin() + 80);
  const auto tail = text_prompt(200, 12);
  second.insert(second.end(), tail.begin() + 1, tail.end());
  SamplingParams p = greedy(40);
  p.ignore_eos = true;

  std::mutex mu;  // declared before the engine: the sinks' state outlives its threads
  std::condition_variable cv;
  std::vector<std::vector<TokenId>> got(2);
  int done = 0;
  Engine engine(base_config());
  auto sink = [&](int k) {
    return [&, k](RequestEvent ev) {
      std::lock_guard lock(mu);
      for (const auto& d : ev.deltas) got[k].insert(got[k].end(), d.token_ids.begin(), d.token_ids.end());
      done += ev.done;
      cv.notify_all();
    };
  };
  engine.submit(first, p, sink(0));
  {
    std::unique_lock lock(mu);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return got[0].size() >= 2; }));
  }
  engine.submit(second, p, sink(1));  // the first is 38 tokens from its end: both run together
  {
    std::unique_lock lock(mu);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return done == 2; }));
  }
  Metrics& m = engine.metrics();
  CHECK(m.prefix_cache_hit_tokens == 80);
  CHECK(m.prompt_tokens_computed == 87 + 11);
  // Apart, the two would hold 8 blocks (87 + 39 tokens) and 9 blocks (91 + 39) at their ends: 17. Sharing the 5
  // prefix blocks, at most 12 are ever in use.
  CHECK(m.kv_blocks_peak_used <= 12);
  CHECK(m.kv_blocks_peak_used >= 9);

  Engine reference(base_config());
  const auto expected = run_all(reference, {first, second}, p);
  CHECK(got[0] == expected[0][0].tokens);
  CHECK(got[1] == expected[1][0].tokens);
  require_pool_drained(engine);
}

TEST_CASE("greedy outputs are identical with prefix caching on and off, and equal Hugging Face's", "[engine][prefix]") {
  const auto cases = golden_cases();
  std::vector<std::vector<TokenId>> golden_prompts;
  for (const auto& c : cases) golden_prompts.push_back(c.prompt);
  // Shared prefixes: 12 prompts over three stems of 37, 48 and 70 tokens with different tails, in two waves so
  // that the second wave finds the first's blocks cached (and some of one wave share within the wave).
  std::vector<std::vector<TokenId>> wave1, wave2;
  const size_t stems[] = {37, 48, 70};
  for (int i = 0; i < 12; ++i) {
    auto p = text_prompt(40 * (i % 3), stems[i % 3]);
    const auto tail = text_prompt(100 + 13 * i, 2 + i);
    p.insert(p.end(), tail.begin() + 1, tail.end());
    (i < 6 ? wave1 : wave2).push_back(p);
  }

  std::map<bool, std::vector<std::vector<TokenId>>> outputs;
  for (bool caching : {true, false}) {
    EngineConfig cfg = base_config();
    cfg.enable_prefix_caching = caching;
    Engine engine(cfg);
    const auto g = run_all(engine, golden_prompts, greedy(64));
    for (size_t i = 0; i < cases.size(); ++i) {
      INFO("golden case " << i << (caching ? " with" : " without") << " prefix caching");
      CHECK(g[i][0].tokens == cases[i].greedy);
      outputs[caching].push_back(g[i][0].tokens);
    }
    // The golden prompts again: with caching, the full blocks of the first run are hits now.
    const auto again = run_all(engine, golden_prompts, greedy(64));
    for (size_t i = 0; i < cases.size(); ++i) CHECK(again[i][0].tokens == cases[i].greedy);
    for (const auto* wave : {&wave1, &wave2})
      for (const auto& r : run_all(engine, *wave, greedy(32))) outputs[caching].push_back(r[0].tokens);
    if (caching)
      CHECK(engine.metrics().prefix_cache_hit_tokens >= 6 * 32);
    else
      CHECK(engine.metrics().prefix_cache_hit_tokens == 0);
    require_pool_drained(engine);
  }
  REQUIRE(outputs[true].size() == outputs[false].size());
  for (size_t i = 0; i < outputs[true].size(); ++i) {
    INFO("output " << i);
    CHECK(outputs[true][i] == outputs[false][i]);
  }
}

TEST_CASE("CPU runner: KV swapped out, overwritten, swapped into other blocks continues with the same logits",
          "[engine][swap]") {
  const ModelConfig cfg = load_model_config(kModel);
  SafeTensors weights(kModel);
  const int B = 16;
  CpuModelRunner runner(cfg, weights, CpuRunnerOptions{.block_size = B, .num_blocks = 16, .num_swap_blocks = 8});
  CpuModelRunner reference(cfg, weights, CpuRunnerOptions{.block_size = B, .num_blocks = 16, .num_swap_blocks = 0});
  SamplingParams params = greedy(1);
  const auto prompt = text_prompt(9, 37);  // three blocks, the last partly filled

  auto step = [&](CpuModelRunner& r, const std::vector<TokenId>& tokens, int start, std::vector<int32_t> table) {
    SeqChunk c;
    c.tokens = tokens;
    c.start_pos = start;
    c.block_table = std::move(table);
    SampleSpec spec;
    spec.params = &params;
    c.samples = {spec};
    StepBatch batch;
    batch.seqs = {c};
    return r.forward(batch).at(0);
  };
  auto argmax = [](const std::vector<float>& l) {
    return static_cast<TokenId>(std::max_element(l.begin(), l.end()) - l.begin());
  };

  // The never-swapped run: prefill, then 20 decodes (into a fourth block), on blocks {5, 6, 7, 8}.
  const std::vector<int32_t> ref_table{5, 6, 7, 8};
  std::vector<std::vector<float>> expected{step(reference, prompt, 0, ref_table)};
  std::vector<TokenId> seq = prompt;
  for (int i = 0; i < 20; ++i) {
    seq.push_back(argmax(expected.back()));
    expected.push_back(step(reference, {seq.back()}, static_cast<int>(seq.size()) - 1, ref_table));
  }

  // The swapped run: prefill and 5 decodes on {3, 9, 1}; swap out to CPU blocks {6, 2, 4}; another sequence
  // overwrites {3, 9, 1}; swap into {12, 0, 7}; 15 more decodes on {12, 0, 7, 10}.
  std::vector<int32_t> table{3, 9, 1};
  seq = prompt;
  std::vector<std::vector<float>> got{step(runner, prompt, 0, table)};
  for (int i = 0; i < 5; ++i) {
    seq.push_back(argmax(got.back()));
    got.push_back(step(runner, {seq.back()}, static_cast<int>(seq.size()) - 1, table));
  }
  runner.swap_out({{3, 6}, {9, 2}, {1, 4}});
  step(runner, text_prompt(100, 48), 0, {3, 9, 1});  // clobbers every slot of the old blocks
  runner.swap_in({{6, 12}, {2, 0}, {4, 7}});
  table = {12, 0, 7, 10};
  for (int i = 5; i < 20; ++i) {
    seq.push_back(argmax(got.back()));
    got.push_back(step(runner, {seq.back()}, static_cast<int>(seq.size()) - 1, table));
  }
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("logits " << i);
    CHECK(got[i] == expected[i]);  // bit-identical: swap is a copy
  }

  // And the contrast: continuing on the clobbered blocks without swapping back gives different logits.
  const auto wrong = step(runner, {seq[prompt.size() + 5]}, static_cast<int>(prompt.size()) + 5, {3, 9, 1});
  CHECK(wrong != expected[6]);
}

TEST_CASE("a sequence that could outgrow the KV pool is refused; one that fits it exactly completes under pressure",
          "[engine]") {
  EngineConfig config = base_config();
  config.num_kv_blocks = 8;  // 128 tokens
  config.preemption_mode = PreemptionMode::swap;
  Engine engine(config);
  const std::vector<TokenId> prompt = {1, 403, 407, 261, 378};
  CHECK_THROWS_AS(engine.submit(prompt, greedy(124), [](RequestEvent) {}), InvalidRequest);
  CHECK(engine.metrics().waiting_requests == 0);
  // Three requests that each need the whole pool at the end: they preempt each other and still all finish.
  SamplingParams params = greedy(123);
  params.ignore_eos = true;
  const auto outputs = engine.generate(std::vector<std::vector<TokenId>>(3, prompt), params);
  for (const auto& o : outputs) CHECK(o.outputs[0].token_ids.size() == 123u);
  CHECK(outputs[0].outputs[0].token_ids == outputs[2].outputs[0].token_ids);
  engine.wait_idle();
  CHECK(engine.metrics().kv_blocks_free == engine.metrics().kv_blocks_total);
}

TEST_CASE("every layer sliding: a sequence holds its window's blocks, so a pool of a third of the need runs all at "
          "once, with the tokens of a runner that keeps every block", "[engine][sliding]") {
  TempDir dir("paged_sliding_");
  write_sliding_stories(dir.path(), 32);
  const ModelConfig cfg = load_model_config(dir.path().string());
  REQUIRE(kv_groups_of(cfg).windows == std::vector<int>{32});

  std::vector<std::vector<TokenId>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(text_prompt(37 * i, 20 + 4 * i));
  SamplingParams params = greedy(150);
  params.ignore_eos = true;
  int need = 0;  // blocks of every sequence's whole length
  for (const auto& p : prompts) need += (static_cast<int>(p.size()) + 150 + 15) / 16;

  // The reference: the CPU runner alone, every block of the sequence in its table, one prompt.
  const SafeTensors weights(dir.path().string());
  CpuModelRunner runner(cfg, weights, CpuRunnerOptions{.block_size = 16, .num_blocks = 16});
  std::vector<int32_t> table(16);
  std::iota(table.begin(), table.end(), 0);
  const std::vector<TokenId> expected = greedy_on_runner(runner, {prompts[0]}, 150, {table})[0];

  EngineConfig big = base_config();
  big.model_dir = dir.path().string();
  Engine roomy(big);
  const auto reference = run_all(roomy, prompts, params);
  CHECK(reference[0][0].tokens == expected);

  EngineConfig small = big;
  small.num_kv_blocks = 40;  // 8 sequences of ceil(32 / 16) + 1 blocks, one more while growing, one planned ahead
  small.max_num_batched_tokens = 64;
  INFO(*small.num_kv_blocks << " blocks of the " << need << " the sequences' lengths take");
  REQUIRE(need > 2 * *small.num_kv_blocks);
  Engine tight(small);
  check_same_tokens(run_all(tight, prompts, params), reference);
  CHECK(tight.metrics().preemptions == 0);
  require_pool_drained(tight);
  // The startup log's concurrency counts a sequence at the blocks its window overlaps: ceil(32 / 16) + 1.
  CHECK(tight.summary().blocks_per_sequence() == 3);
  CHECK(tight.summary().max_concurrency() == Approx(40.0 / 3));
  CHECK(Engine(base_config()).summary().blocks_per_sequence() == 512 / 16);  // stories260K keeps every block
}

TEST_CASE("every layer sliding: sequences longer than the whole KV pool complete, preempted by swap or recompute, "
          "with the tokens of a roomy pool", "[engine][sliding]") {
  TempDir dir("paged_sliding_");
  write_sliding_stories(dir.path(), 96);  // a sequence keeps ceil(96 / 16) + 1 = 7 blocks, 8 while it grows
  std::vector<std::vector<TokenId>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(text_prompt(53 * i, 30 + 5 * i));
  SamplingParams params = greedy(400);
  params.ignore_eos = true;
  EngineConfig roomy = base_config();
  roomy.model_dir = dir.path().string();
  Engine reference_engine(roomy);
  const auto reference = run_all(reference_engine, prompts, params);
  for (PreemptionMode mode : {PreemptionMode::swap, PreemptionMode::recompute}) {
    INFO((mode == PreemptionMode::swap ? "swap" : "recompute"));
    EngineConfig small = roomy;
    small.num_kv_blocks = 16;  // 256 tokens: each sequence grows to 430-465, two at most run side by side
    small.max_num_batched_tokens = 32;
    small.preemption_mode = mode;
    Engine tight(small);
    check_same_tokens(run_all(tight, prompts, params), reference);
    CHECK(tight.metrics().preemptions > 0);
    require_pool_drained(tight);
    // A model that keeps every block refuses the same request up front.
    EngineConfig full = base_config();
    full.num_kv_blocks = 16;
    full.max_num_batched_tokens = 32;
    Engine keeps(full);
    CHECK_THROWS_AS(keeps.submit(prompts[0], params, [](RequestEvent) {}), InvalidRequest);
  }
}

TEST_CASE("some layers sliding: a KV group per window, each sliding group keeps its window's blocks; tokens of the "
          "runner keeping every block, in a tight pool, swapped and recomputed", "[engine][sliding][groups]") {
  TempDir dir("paged_hybrid_");
  // Layers 0, 1 and 3 slide over 32 positions, 2 and 4 attend to all: groups of 2 layers, the full one and two
  // sliding (the second of one layer).
  write_sliding_stories(dir.path(), 32,
                        {"sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                         "full_attention"});
  const ModelConfig cfg = load_model_config(dir.path().string());
  const KvGroups groups = kv_groups_of(cfg);
  REQUIRE(groups.windows == std::vector<int>{0, 32, 32});
  REQUIRE(groups.layers_per_block == 2);

  std::vector<std::vector<TokenId>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(text_prompt(41 * i, 24 + 5 * i));
  SamplingParams params = greedy(120);
  params.ignore_eos = true;

  // The reference: the CPU runner alone, one prompt, every block of every group in its tables.
  const SafeTensors weights(dir.path().string());
  CpuModelRunner runner(cfg, weights, CpuRunnerOptions{.block_size = 16, .num_blocks = 48});
  std::vector<std::vector<int32_t>> tables(3, std::vector<int32_t>(16));
  for (int g = 0; g < 3; ++g) std::iota(tables[g].begin(), tables[g].end(), 16 * g);
  const std::vector<TokenId> expected =
      greedy_on_runner(runner, {prompts[0]}, 120, {tables[0]}, nullptr, {{tables[1], tables[2]}})[0];

  EngineConfig big = base_config();
  big.model_dir = dir.path().string();
  Engine roomy(big);
  const auto reference = run_all(roomy, prompts, params);
  CHECK(reference[0][0].tokens == expected);
  // A sequence of max_model_len keeps every block of the full group and ceil(32 / 16) + 1 of each sliding one.
  CHECK(roomy.summary().blocks_per_sequence() == 512 / 16 + 2 * 3);

  int need = 0;  // blocks of every sequence's whole length, in all three groups
  for (const auto& p : prompts) need += 3 * ((static_cast<int>(p.size()) + 120 + 15) / 16);
  for (PreemptionMode mode : {PreemptionMode::swap, PreemptionMode::recompute}) {
    INFO((mode == PreemptionMode::swap ? "swap" : "recompute"));
    EngineConfig small = big;
    small.num_kv_blocks = 60;
    small.max_num_batched_tokens = 64;
    small.preemption_mode = mode;
    REQUIRE(need > 2 * *small.num_kv_blocks);
    Engine tight(small);
    check_same_tokens(run_all(tight, prompts, params), reference);
    CHECK(tight.metrics().preemptions > 0);  // the full group alone needs more than the pool
    require_pool_drained(tight);
  }
}

TEST_CASE("prompt logprobs through the engine: chunked, batched and preempted prefills score every token",
          "[engine][prompt_logprobs]") {
  std::mt19937_64 rng(5);
  std::vector<std::vector<TokenId>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(text_prompt(rng() % 300, 40 + rng() % 120));
  prompts.push_back({1});  // nothing to score
  prompts.push_back({1, 403});
  for (PreemptionMode mode : {PreemptionMode::recompute, PreemptionMode::swap}) {
    EngineConfig cfg = base_config();
    cfg.max_num_batched_tokens = 48;  // several chunks per prompt
    cfg.num_kv_blocks = 24;           // of the ~70 the requests need together: preemptions mid-prefill
    cfg.preemption_mode = mode;
    Engine engine(cfg);
    SamplingParams p = scoring(3, 24);
    p.ignore_eos = true;
    const auto out = engine.generate(prompts, p);
    CHECK(engine.metrics().preemptions > 0);
    for (size_t r = 0; r < prompts.size(); ++r) {
      INFO("request " << r << ", prompt of " << prompts[r].size() << (mode == PreemptionMode::swap ? ", swap" : ""));
      if (prompts[r].size() == 1) {
        CHECK(out[r].prompt_logprobs.empty());
        continue;
      }
      require_same_scores(out[r].prompt_logprobs, reference(prompts[r], 3));
    }
  }
}

TEST_CASE("prompt logprobs take no prefix-cache hit, once per request whatever n or beam width",
          "[engine][prompt_logprobs][prefix]") {
  const auto prompt = text_prompt(7, 70);  // 4 full blocks
  const auto want = reference(prompt, 2);
  Engine engine(base_config());
  Metrics& m = engine.metrics();
  engine.generate({prompt}, scoring(2, 4));  // fills the prefix cache
  engine.wait_idle();
  REQUIRE(m.prefix_cache_hit_tokens == 0);
  SamplingParams parallel = scoring(2, 4);
  parallel.temperature = 0.7f;
  parallel.seed = 3;
  parallel.n = 3;
  const auto forked = engine.generate({prompt}, parallel);
  require_same_scores(forked[0].prompt_logprobs, want);
  SamplingParams beam = scoring(2, 4);
  beam.use_beam_search = true;
  beam.n = 2;
  require_same_scores(engine.generate({prompt}, beam)[0].prompt_logprobs, want);
  engine.wait_idle();
  CHECK(m.prefix_cache_hit_tokens == 0);  // each recomputed its prompt
  SamplingParams plain = scoring(2, 4);
  plain.prompt_logprobs.reset();
  const auto cached = engine.generate({prompt}, plain);
  engine.wait_idle();
  CHECK(m.prefix_cache_hit_tokens == 64);  // the blocks it left are there for the others
  CHECK(cached[0].prompt_logprobs.empty());
}

TEST_CASE("the engine refuses prompt_logprobs outside [0, 20]", "[engine][prompt_logprobs]") {
  Engine engine(base_config());
  SamplingParams p = scoring(21, 4);
  try {
    engine.validate(p, 4);
    FAIL("accepted");
  } catch (const InvalidRequest& e) {
    CHECK(e.param == "prompt_logprobs");
  }
}

TEST_CASE("--max-logprobs bounds logprobs and prompt_logprobs; --dtype names the device's own, or is refused",
          "[engine][prompt_logprobs]") {
  EngineConfig c = base_config();
  c.max_logprobs = 3;
  Engine engine(c);
  const auto refused = [&](const SamplingParams& p) -> std::string {
    try {
      engine.validate(p, 4);
    } catch (const InvalidRequest& e) {
      return e.param;
    }
    return "";
  };
  SamplingParams p;
  p.logprobs = 3;
  p.prompt_logprobs = 3;
  CHECK(refused(p).empty());
  p.logprobs = 4;
  CHECK(refused(p) == "logprobs");
  p.logprobs = 3;
  p.prompt_logprobs = 4;
  CHECK(refused(p) == "prompt_logprobs");
  // The CPU executor computes in float32: --dtype float32 is its own, bfloat16 is refused before anything loads.
  EngineConfig f32 = base_config();
  f32.dtype = "float32";
  CHECK_NOTHROW(Engine(f32));
  EngineConfig bf16 = base_config();
  bf16.dtype = "bfloat16";
  CHECK_THROWS_WITH(Engine(bf16), Catch::Contains("computes in float32"));
  EngineConfig too_many = base_config();
  too_many.max_logprobs = 21;
  CHECK_THROWS_WITH(Engine(too_many), Catch::Contains("max_logprobs"));
}
