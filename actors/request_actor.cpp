#include <algorithm>
#include <chrono>

#include "actors/actors.h"

namespace paged {

namespace {

using Clock = std::chrono::steady_clock;

/// One completion's text state: detokenizer, text so far, and where stop strings were searched up to.
struct Completion {
  std::unique_ptr<IncrementalDetokenizer> detok;
  std::string text;                  // text emitted so far (complete UTF-8, stop strings cut)
  std::string held;                  // text withheld because it may be the start of a stop string
  std::vector<TokenId> token_ids;
  std::vector<SampledToken> logprobs;
  double cumulative_logprob = 0.0;
  std::optional<std::string> finish;
};

}  // namespace

struct RequestState {
  RequestSpec spec;
  const Tokenizer* tokenizer = nullptr;
  RequestSink sink;
  caf::actor router;
  caf::actor scheduler;              // of the replica serving the request; null until the router answered
  Metrics* metrics = nullptr;
  std::vector<Completion> completions;
  bool buffered = false;             // beam search / best_of > n: everything in the final event
  int completion_tokens = 0;
  Clock::time_point start = Clock::now();
  std::optional<Clock::time_point> scheduled;      // first admitted to a step (queue time, prefill time)
  int cached_tokens = 0;                           // prompt tokens its prefix-cache hit held then
  std::optional<Clock::time_point> first_token;
  std::optional<Clock::time_point> last_output;    // the previous step that gave it output (inter-token latency)
  std::vector<PromptLogprob> prompt_logprobs;      // prompt_logprobs: entry i scores prompt token i + 1, in order
  bool prompt_logprobs_sent = false;               // they went out with an event
};

namespace {

using Self = caf::stateful_actor<RequestState>;

// A completion's detokenizer: its text continues the prompt's (vLLM: decode(prompt + output) - decode(prompt)).
std::unique_ptr<IncrementalDetokenizer> new_detokenizer(const RequestState& st) {
  return std::make_unique<IncrementalDetokenizer>(*st.tokenizer, st.spec.params->skip_special_tokens, *st.spec.prompt);
}

// Longest suffix of `text` that is a proper prefix of some stop string: it must be withheld until it resolves.
size_t partial_stop_suffix(const std::string& text, const std::vector<std::string>& stops) {
  size_t best = 0;
  for (const auto& s : stops)
    for (size_t len = std::min(s.size() - 1, text.size()); len > best; --len)
      if (text.compare(text.size() - len, len, s, 0, len) == 0) {
        best = len;
        break;
      }
  return best;
}

/// Appends new text to a completion, applying stop strings (cut before the first match, or after it when
/// `keep_stop`). Returns the delta to emit now.
std::string add_text(Completion& c, std::string fresh, const std::vector<std::string>& stops, bool keep_stop,
                     bool final) {
  std::string pending = c.held + fresh;
  c.held.clear();
  if (!stops.empty()) {
    size_t cut = std::string::npos, matched = 0;
    for (const auto& s : stops)
      if (const size_t at = s.empty() ? std::string::npos : pending.find(s); at < cut) {
        cut = at;
        matched = s.size();
      }
    // A stop string may straddle the boundary with text already emitted only through `held`, which is included.
    if (cut != std::string::npos) {
      pending.resize(keep_stop ? cut + matched : cut);
      c.finish = "stop";
    } else if (!final) {
      const size_t keep = partial_stop_suffix(pending, stops);
      c.held = pending.substr(pending.size() - keep);
      pending.resize(pending.size() - keep);
    }
  }
  c.text += pending;
  return pending;
}

/// Takes the scores of prompt tokens from position `scored.first_pos` on: each position's first score counts (a
/// chunk recomputed after a preemption, or on another replica, scores some again).
void take_prompt_logprobs(RequestState& st, const ChunkPromptLogprobs& scored) {
  for (size_t i = 0; i < scored.tokens.size(); ++i)
    if (static_cast<size_t>(scored.first_pos) + i == st.prompt_logprobs.size() + 1)
      st.prompt_logprobs.push_back(scored.tokens[i]);
}

/// Puts the prompt's scores into `ev`, the first event after the whole prompt was scored.
void attach_prompt_logprobs(RequestState& st, RequestEvent& ev) {
  if (!st.spec.params->prompt_logprobs || st.prompt_logprobs_sent ||
      st.prompt_logprobs.size() + 1 < st.spec.prompt->size())
    return;
  ev.prompt_logprobs = std::move(st.prompt_logprobs);
  st.prompt_logprobs_sent = true;
}

/// Records end-to-end latency and TPOT, delivers the request's last event and stops the actor.
void finish_request(Self* self, RequestEvent last) {
  auto& st = self->state;
  const auto now = Clock::now();
  st.metrics->e2e.observe(std::chrono::duration<double>(now - st.start).count());
  if (st.first_token) st.metrics->decode_time.observe(std::chrono::duration<double>(now - *st.first_token).count());
  const std::optional<std::string>& reason = st.completions.empty() ? std::nullopt : st.completions[0].finish;
  (reason == "stop" ? st.metrics->finished_stop : reason == "length" ? st.metrics->finished_length
                                                                      : st.metrics->finished_abort) += 1;
  if (st.first_token && st.completion_tokens > 1)
    st.metrics->tpot.observe(std::chrono::duration<double>(now - *st.first_token).count() /
                             (st.completion_tokens - 1));
  attach_prompt_logprobs(st, last);
  st.sink(std::move(last));
  if (st.scheduler) self->demonitor(st.scheduler);  // the monitor lives on the scheduler: they would pile up there
  self->send(st.router, done_atom::value, st.spec.id);
  self->quit();
}

/// Ends the request now: every completion not ended yet ends "cancelled"; `error` (with `unavailable` when no
/// replica can serve) says why, if it failed.
void emit_final(Self* self, bool cancelled, std::optional<std::string> error = std::nullopt,
                bool unavailable = false) {
  auto& st = self->state;
  RequestEvent ev;
  ev.id = st.spec.id;
  ev.done = true;
  ev.unavailable = error && unavailable;
  ev.prompt_tokens = static_cast<int>(st.spec.prompt->size());
  ev.cached_tokens = st.cached_tokens;
  ev.error = std::move(error);
  const auto& p = *st.spec.params;
  std::vector<int> order(st.completions.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  int n_out = static_cast<int>(order.size());
  if (st.buffered && !p.use_beam_search && p.best_of > p.n) {
    // best_of: the n completions with the highest cumulative logprob.
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return st.completions[a].cumulative_logprob > st.completions[b].cumulative_logprob;
    });
    n_out = p.n;
  }
  for (int k = 0; k < n_out && k < static_cast<int>(order.size()); ++k) {
    Completion& c = st.completions[order[k]];
    CompletionDelta d;
    d.index = k;
    if (!c.finish) {
      d.text = add_text(c, c.detok->finish(), p.stop, p.include_stop_str_in_output, true);
      if (!c.finish) c.finish = cancelled ? "cancelled" : "length";
    }
    if (st.buffered) {
      d.text = c.text;
      d.token_ids = c.token_ids;
      d.logprobs = c.logprobs;
    }
    d.finish_reason = c.finish;
    ev.deltas.push_back(std::move(d));
  }
  ev.completion_tokens = st.completion_tokens;
  finish_request(self, std::move(ev));
}

/// Takes one completion's output of a step: detokenizes, applies stop strings, feeds the sink. Returns true if it
/// ended the request (the actor quits).
bool take_output(Self* self, const SeqOutput& out) {
  auto& st = self->state;
  if (out.index < 0 || out.index >= static_cast<int>(st.completions.size())) return false;
  Completion& c = st.completions[out.index];
  if (c.finish) return false;  // ended by a stop string: later tokens are dropped
  if (!st.first_token) {
    st.first_token = Clock::now();
    st.metrics->ttft.observe(std::chrono::duration<double>(*st.first_token - st.start).count());
    if (st.scheduled)
      st.metrics->prefill_time.observe(std::chrono::duration<double>(*st.first_token - *st.scheduled).count());
  }
  const auto& p = *st.spec.params;
  CompletionDelta d;
  d.index = out.index;
  for (const SampledToken& t : out.tokens) {
    if (c.finish) break;  // a stop string ended it: the step's later tokens (speculative decoding) are not output
    // Stop ids and EOS end the completion without becoming text (vLLM's default).
    const bool is_stop_id = out.finish == "stop" && &t == &out.tokens.back() &&
                            std::find(st.spec.stop_ids.begin(), st.spec.stop_ids.end(), t.token) !=
                                st.spec.stop_ids.end();
    c.token_ids.push_back(t.token);
    d.token_ids.push_back(t.token);
    if (p.logprobs) {
      c.logprobs.push_back(t);
      d.logprobs.push_back(t);
    }
    ++st.completion_tokens;
    if (!is_stop_id)
      d.text += add_text(c, c.detok->push(t.token), p.stop, p.include_stop_str_in_output, false);
  }
  c.cumulative_logprob = out.cumulative_logprob;
  const bool stopped_by_string = c.finish.has_value();
  if (!c.finish && !out.finish.empty()) {
    d.text += add_text(c, c.detok->finish(), p.stop, p.include_stop_str_in_output, true);
    if (!c.finish) c.finish = out.finish;
  }
  d.finish_reason = c.finish;
  if (stopped_by_string && out.finish.empty()) self->send(st.scheduler, stop_atom::value, st.spec.id, out.index);
  const bool all_done =
      std::all_of(st.completions.begin(), st.completions.end(), [](const Completion& x) { return x.finish; });
  if (all_done && st.buffered) {
    emit_final(self, false);
    return true;
  }
  if (!st.buffered) {
    RequestEvent ev;
    ev.id = st.spec.id;
    ev.prompt_tokens = static_cast<int>(st.spec.prompt->size());
    ev.cached_tokens = st.cached_tokens;
    ev.completion_tokens = st.completion_tokens;
    ev.deltas.push_back(std::move(d));
    if (all_done) {
      ev.done = true;
      finish_request(self, std::move(ev));
      return true;
    }
    attach_prompt_logprobs(st, ev);
    st.sink(std::move(ev));
  }
  return false;
}

}  // namespace

namespace {

// Serves the request through `scheduler` from now on (monitored: it ends when the replica fails).
void served_by(Self* self, caf::actor scheduler) {
  auto& st = self->state;
  st.scheduler = std::move(scheduler);
  self->monitor(st.scheduler);
}

// Asks the router for a replica: `resume` to move there (a null answer: the request was aborted meanwhile). `why`:
// what the request is moved for, which a refusal names.
template <class Atom>
void ask_router(Self* self, Atom atom, std::string why) {
  auto& st = self->state;
  self->request(st.router, caf::infinite, atom, st.spec)
      .then(
          [self](caf::actor& scheduler) {
            if (!scheduler) {
              emit_final(self, true);
              return;
            }
            served_by(self, std::move(scheduler));
          },
          [self, why](caf::error& e) {
            emit_final(self, true, why + "the engine cannot serve the request: " + self->system().render(e), true);
          });
}

// The replica serving the request is lost: continue on another one from what the client was sent.
void move_to_another_replica(Self* self, const caf::error& reason) {
  auto& st = self->state;
  st.scheduler = nullptr;
  std::vector<DeliveredCompletion> delivered;
  for (size_t i = 0; i < st.completions.size(); ++i) {
    const Completion& c = st.completions[i];
    delivered.push_back({static_cast<int>(i), c.token_ids, c.cumulative_logprob, c.finish.has_value()});
  }
  const ResumePoint point = resume_point(*st.spec.params, delivered);
  if (!point.restart && point.seqs.empty()) {
    emit_final(self, false);
    return;
  }
  if (point.restart) {
    // Nothing reached the client (or it gets everything at the end): start over, which gives the same result.
    for (Completion& c : st.completions) {
      c = Completion{};
      c.detok = new_detokenizer(st);
    }
    st.completion_tokens = 0;
  }
  st.spec.resume = point.seqs;
  st.metrics->requests_moved += 1;
  ask_router(self, resume_atom::value, "the engine stopped serving the request (its replica was lost: " +
                                           self->system().render(reason) + "), and ");
}

caf::behavior request_actor(Self* self, RequestSpec spec, const Tokenizer* tokenizer, RequestSink sink,
                            caf::actor router, Metrics* metrics) {
  auto& st = self->state;
  st.spec = spec;
  st.spec.client = caf::actor_cast<caf::actor>(self);
  st.tokenizer = tokenizer;
  st.sink = std::move(sink);
  st.router = router;
  st.metrics = metrics;
  const auto& p = *spec.params;
  const int width = std::max({1, p.n, p.best_of});
  st.buffered = p.use_beam_search || p.best_of > p.n;
  st.completions.resize(p.use_beam_search ? std::max(1, p.n) : width);
  for (auto& c : st.completions) c.detok = new_detokenizer(st);
  // A scheduler that stops on a failure (an executor failed: a GPU error, a lost worker) moves this request to
  // another replica; an engine shutting down ends it quietly.
  self->set_down_handler([self](const caf::down_msg& down) {
    if (down.source != self->state.scheduler.address()) return;  // a scheduler left behind
    if (down.reason == caf::exit_reason::user_shutdown) {
      self->quit();
      return;
    }
    move_to_another_replica(self, down.reason);
  });
  ask_router(self, submit_atom::value, "");
  return {
      [self](output_atom, const std::vector<SeqOutput>& outputs) {
        auto& st = self->state;
        const auto now = Clock::now();
        if (st.last_output) st.metrics->itl.observe(std::chrono::duration<double>(now - *st.last_output).count());
        st.last_output = now;
        for (const SeqOutput& out : outputs)
          if (take_output(self, out)) return;  // the request ended
      },
      [self](prompt_lp_atom, const ChunkPromptLogprobs& scored) { take_prompt_logprobs(self->state, scored); },
      [self](scheduled_atom, int cached) {
        auto& st = self->state;
        if (st.scheduled) return;  // a moved request is admitted again: its queue time was taken
        st.scheduled = Clock::now();
        st.cached_tokens = cached;
        st.metrics->queue_time.observe(std::chrono::duration<double>(*st.scheduled - st.start).count());
      },
      [self](cancel_atom, const std::string& reason, bool unavailable) {
        emit_final(self, true, reason.empty() ? std::nullopt : std::optional<std::string>(reason), unavailable);
      },
  };
}

}  // namespace

caf::actor spawn_request(caf::actor_system& system, RequestSpec spec, const Tokenizer* tokenizer, RequestSink sink,
                         caf::actor router, Metrics* metrics) {
  return system.spawn(request_actor, std::move(spec), tokenizer, std::move(sink), std::move(router), metrics);
}

}  // namespace paged
