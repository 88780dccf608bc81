// Aborts at any moment, under churn, on the real stories260K model (CPU executor, two steps in flight): requests of
// every kind (greedy, seeded sampling, n > 1, beam search, stop strings, logprobs, prompt logprobs) are submitted
// over time into a small KV pool that preempts (swap and recompute, with the CPU tier) while a third of them are
// aborted from another thread, from their own event sinks (as a server does when its client goes away), right after
// submit, or twice. Every request ends exactly once with nothing after its end, the requests not aborted give the
// tokens they give alone, and every block comes back.
#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include "actors/engine.h"
#include "tests/test_data.h"

using namespace paged;
using namespace paged::test;

namespace {

enum class AbortAt { never, after_submit, from_sink, from_thread, twice };

struct Request {
  std::vector<TokenId> prompt;
  SamplingParams params;
  AbortAt abort = AbortAt::never;
  int abort_after_events = 0;  // from_sink: at this event; from_thread: after this many ms
};

struct Outcome {
  std::vector<std::vector<TokenId>> tokens;  // by completion index
  std::vector<std::string> finish;
  int done_events = 0;
  bool event_after_done = false;
  std::optional<std::string> error;
};

std::vector<Request> churn_requests(size_t count, uint64_t seed) {
  std::vector<std::vector<TokenId>> prompts;
  const boost::json::value golden = read_json(kGolden);
  for (const auto& tc : golden.at("cases").as_array()) prompts.push_back(ids_of(tc.at("prompt_ids")));
  REQUIRE(!prompts.empty());
  std::mt19937_64 rng(seed);
  std::vector<Request> out;
  for (size_t i = 0; i < count; ++i) {
    Request r;
    // Prompts of 1 .. ~2x a golden prompt: two prompts glued (shared prefixes), or one cut short.
    r.prompt = prompts[rng() % prompts.size()];
    if (rng() % 2) {
      const auto& tail = prompts[rng() % prompts.size()];
      r.prompt.insert(r.prompt.end(), tail.begin() + 1, tail.end());
    } else {
      r.prompt.resize(1 + rng() % r.prompt.size());
    }
    SamplingParams& p = r.params;
    p.max_tokens = 8 + static_cast<int>(rng() % 120);
    p.ignore_eos = rng() % 2;
    switch (rng() % 7) {
      case 0: p.temperature = 0.0f; break;
      case 1: p.temperature = 0.9f, p.top_p = 0.9f, p.top_k = 40, p.seed = rng() % 1000; break;
      case 2: p.n = 2 + static_cast<int>(rng() % 2), p.temperature = 1.0f, p.seed = rng() % 1000; break;
      case 3: p.use_beam_search = true, p.n = 2, p.temperature = 0.0f, p.max_tokens = 8 + p.max_tokens % 24; break;
      case 4: p.temperature = 0.0f, p.stop = {"."}; break;
      case 5: p.temperature = 0.7f, p.seed = rng() % 1000, p.logprobs = 2; break;
      default: p.temperature = 0.0f, p.prompt_logprobs = 1; break;
    }
    const int kind = static_cast<int>(rng() % 6);
    r.abort = kind <= 3 ? AbortAt::never : static_cast<AbortAt>(1 + rng() % 4);
    r.abort_after_events = 1 + static_cast<int>(rng() % 12);
    out.push_back(std::move(r));
  }
  return out;
}

// Runs `reqs` through `engine`: submitted a few at a time with short pauses, aborted as each says. Returns once
// every request ended (or fails after a minute).
std::vector<Outcome> run_churn(Engine& engine, const std::vector<Request>& reqs) {
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<Outcome> out;
    std::vector<RequestId> ids;
    std::vector<int> events;
    size_t ended = 0;
  };
  auto sh = std::make_shared<Shared>();
  sh->out.resize(reqs.size());
  sh->ids.assign(reqs.size(), 0);
  sh->events.assign(reqs.size(), 0);
  std::vector<std::pair<std::chrono::steady_clock::time_point, size_t>> timed;  // from_thread aborts
  std::mt19937_64 rng(99);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Request& r = reqs[i];
    sh->out[i].tokens.resize(std::max(1, r.params.n));
    sh->out[i].finish.resize(std::max(1, r.params.n));
    std::unique_lock lock(sh->mu);  // the sink of request i needs its id: held until the id is stored
    const RequestId id = engine.submit(r.prompt, r.params, [sh, i, &engine, abort = r.abort,
                                                            at = r.abort_after_events](RequestEvent ev) {
      std::lock_guard lock(sh->mu);
      Outcome& o = sh->out[i];
      if (o.done_events > 0) o.event_after_done = true;
      for (const auto& d : ev.deltas) {
        if (d.index < 0 || static_cast<size_t>(d.index) >= o.tokens.size()) continue;
        o.tokens[d.index].insert(o.tokens[d.index].end(), d.token_ids.begin(), d.token_ids.end());
        if (d.finish_reason) o.finish[d.index] = *d.finish_reason;
      }
      if (ev.error) o.error = ev.error;
      if (abort == AbortAt::from_sink && ++sh->events[i] == at) engine.abort(sh->ids[i]);
      if (ev.done) {
        ++o.done_events;
        ++sh->ended;
        sh->cv.notify_all();
      }
    });
    sh->ids[i] = id;
    lock.unlock();
    if (r.abort == AbortAt::after_submit) engine.abort(id);
    if (r.abort == AbortAt::twice) {
      engine.abort(id);
      engine.abort(id);
    }
    if (r.abort == AbortAt::from_thread)
      timed.emplace_back(std::chrono::steady_clock::now() + std::chrono::milliseconds(r.abort_after_events * 7), id);
    if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 15));
  }
  std::thread aborter([&engine, timed] {
    for (const auto& [when, id] : timed) {
      std::this_thread::sleep_until(when);
      engine.abort(id);
    }
  });
  aborter.join();
  std::unique_lock lock(sh->mu);
  const bool all = sh->cv.wait_for(lock, std::chrono::seconds(60), [&] { return sh->ended >= reqs.size(); });
  if (!all) {
    const Metrics& m = engine.metrics();
    WARN("stuck: " << reqs.size() - sh->ended << " requests left; waiting " << m.waiting_requests << ", running "
                   << m.running_requests << ", swapped " << m.swapped_requests << ", free blocks "
                   << m.kv_blocks_free << "/" << m.kv_blocks_total);
  }
  REQUIRE(all);
  return sh->out;
}

EngineConfig churn_config(std::optional<int> blocks, PreemptionMode mode, double cpu_tier_gib) {
  EngineConfig c;
  c.model_dir = kModel;
  c.device = "cpu";
  c.num_kv_blocks = blocks;
  c.preemption_mode = mode;
  c.swap_space_gib = 0.25;
  c.kv_offloading_gib = cpu_tier_gib;
  c.max_num_batched_tokens = 192;  // chunked prefills beside the decodes
  return c;
}

}  // namespace

TEST_CASE("requests aborted at any moment under churn end once, leave the others' outputs and free every block",
          "[engine][abort][churn]") {
  const uint64_t seed = GENERATE(2026, 7, 31);
  INFO("seed " << seed);
  const std::vector<Request> reqs = churn_requests(120, seed);
  // The reference: the requests that are not aborted, on an engine with room for all, one step at a time.
  EngineConfig ref_cfg = churn_config(std::nullopt, PreemptionMode::recompute, 0.0);
  ref_cfg.async_scheduling = false;
  std::vector<Request> kept;
  for (const Request& r : reqs)
    if (r.abort == AbortAt::never) kept.push_back({r.prompt, r.params});
  std::vector<Outcome> reference;
  {
    Engine engine(ref_cfg);
    reference = run_churn(engine, kept);
  }
  struct Setup {
    const char* name;
    PreemptionMode mode;
    double cpu_tier_gib;
  };
  for (const Setup& s : {Setup{"swap", PreemptionMode::swap, 0.0}, Setup{"recompute + CPU tier",
                                                                        PreemptionMode::recompute, 0.05}}) {
    SECTION(s.name) {
      Engine engine(churn_config(40, s.mode, s.cpu_tier_gib));
      const std::vector<Outcome> got = run_churn(engine, reqs);
      size_t k = 0, cancelled = 0;
      for (size_t i = 0; i < reqs.size(); ++i) {
        INFO("request " << i);
        const Outcome& o = got[i];
        CHECK(o.done_events == 1);
        CHECK_FALSE(o.event_after_done);
        CHECK_FALSE(o.error);
        if (reqs[i].abort != AbortAt::never) {
          for (const auto& f : o.finish) cancelled += f == "cancelled";
          continue;
        }
        const Outcome& want = reference[k++];
        CHECK(o.finish == want.finish);
        // Sampling is seeded or greedy, so each completion is what it is alone (beam search: the same beams).
        CHECK(o.tokens == want.tokens);
      }
      CHECK(cancelled > 0);  // the aborts did cut requests short
      engine.wait_idle();
      const Metrics& m = engine.metrics();
      CHECK(m.preemptions > 0);  // the pool was under pressure
      CHECK(m.kv_blocks_free == m.kv_blocks_total);
      CHECK(m.cpu_blocks_free == m.cpu_blocks_total);
      CHECK(m.running_seqs == 0);
    }
  }
}
