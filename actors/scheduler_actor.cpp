#include <algorithm>
#include <map>
#include <unordered_map>

#include "actors/actors.h"

namespace paged {

namespace {

/// One sequence: a completion (or a beam) of a request.
struct SeqData {
  SeqId id = 0;
  uint64_t request = 0;
  int index = 0;                                    // completion index (seed offset)
  std::shared_ptr<std::vector<TokenId>> output = std::make_shared<std::vector<TokenId>>();
  int num_computed = 0;                             // as planned: KV of tokens [0, num_computed) is (or will be) cached
  int num_done = 0;                                 // tokens whose KV a finished step wrote
  int num_marked = 0;                               // computed tokens reported to the memory manager
  PlanSeq::Phase phase = PlanSeq::Phase::waiting;
  bool swapping_in = false;
  bool pending = false;                             // a token of this sequence is being sampled in flight
  double cumulative_logprob = 0.0;
};

struct RequestData {
  RequestSpec spec;
  uint64_t arrival = 0;
  int width = 1;                 // completions generated (n, best_of) or beams
  bool beam = false;
  bool forked = false;           // parallel sampling: the completions exist
  std::vector<SeqId> seqs;       // live sequences
  struct Hyp {
    std::vector<TokenId> tokens;
    double cumulative_logprob;
    std::string finish;
  };
  std::vector<Hyp> finished_beams;
  int next_index = 1;
};

}  // namespace

struct SchedulerState {
  SchedulerSetup setup;
  std::unordered_map<uint64_t, RequestData> requests;
  std::unordered_map<SeqId, SeqData> seqs;
  SeqId next_seq = 1;
  uint64_t next_arrival = 0;

  bool step_running = false;
  bool plan_requested = false;
  std::optional<StepPlan> next_plan;
  std::vector<StepResult> partial_results;          // replies of the executors for the running step
  std::vector<std::pair<SeqId, int>> step_ends;     // (sequence, tokens cached once the running step is done)
  std::vector<caf::response_promise> drain_waiters;

  std::vector<TokenId> all_tokens(const SeqData& s) const {
    const RequestData& r = requests.at(s.request);
    std::vector<TokenId> t(*r.spec.prompt);
    t.insert(t.end(), s.output->begin(), s.output->end());
    return t;
  }
};

namespace {

using Self = caf::stateful_actor<SchedulerState>;

void kick(Self* self);
void request_plan(Self* self);

void free_seqs(Self* self, const std::vector<SeqId>& ids) {
  if (ids.empty()) return;
  auto& st = self->state;
  for (SeqId id : ids) st.seqs.erase(id);
  self->send(st.setup.memory_manager, free_atom::value, ids);
}

void publish_queue_metrics(Self* self) {
  auto& st = self->state;
  int64_t waiting = 0, running = 0, swapped = 0, running_seqs = 0;
  for (const auto& [id, r] : st.requests) {
    bool any_running = false, any_swapped = false, all_waiting = true;
    for (SeqId s : r.seqs) {
      const SeqData& d = st.seqs.at(s);
      if (d.phase == PlanSeq::Phase::running) any_running = true, ++running_seqs;
      if (d.phase == PlanSeq::Phase::swapped) any_swapped = true;
      if (d.phase != PlanSeq::Phase::waiting) all_waiting = false;
    }
    running += any_running;
    swapped += any_swapped && !any_running;
    waiting += all_waiting;
  }
  Metrics& m = *st.setup.metrics;
  m.waiting_requests = waiting;
  m.running_requests = running;
  m.swapped_requests = swapped;
  m.running_seqs = running_seqs;
  if (running_seqs > m.peak_running_seqs) m.peak_running_seqs = running_seqs;
}

void finish_request_if_done(Self* self, uint64_t rid, bool aborted = false) {
  auto& st = self->state;
  auto it = st.requests.find(rid);
  if (it == st.requests.end() || !it->second.seqs.empty()) return;
  st.requests.erase(it);
  (aborted ? st.setup.metrics->requests_aborted : st.setup.metrics->requests_finished) += 1;
  if (st.requests.empty()) {
    for (auto& p : st.drain_waiters) {
      // Reply after the memory manager processed every free sent so far.
      self->request(st.setup.memory_manager, caf::infinite, drained_atom::value)
          .then([p](bool) mutable { p.deliver(true); });
    }
    st.drain_waiters.clear();
  }
}

/// Ends sequence `id` of its request (the request actor already knows or is told through `out`).
void end_seq(Self* self, SeqId id) {
  auto& st = self->state;
  auto it = st.seqs.find(id);
  if (it == st.seqs.end()) return;
  const uint64_t rid = it->second.request;
  auto& r = st.requests.at(rid);
  r.seqs.erase(std::remove(r.seqs.begin(), r.seqs.end(), id), r.seqs.end());
  free_seqs(self, {id});
  finish_request_if_done(self, rid);
}

std::optional<std::string> finish_reason(const SchedulerState& st, const RequestData& r, const SeqData& s) {
  const TokenId last = s.output->back();
  const auto& p = *r.spec.params;
  if (static_cast<int>(s.output->size()) >= p.min_tokens &&
      std::find(r.spec.stop_ids.begin(), r.spec.stop_ids.end(), last) != r.spec.stop_ids.end())
    return "stop";
  if (static_cast<int>(s.output->size()) >= p.max_tokens) return "length";
  if (static_cast<int>(r.spec.prompt->size() + s.output->size()) >= st.setup.max_model_len) return "length";
  return std::nullopt;
}

SeqId fork_seq(Self* self, SeqData& parent, int index) {
  auto& st = self->state;
  SeqData child;
  child.id = st.next_seq++;
  child.request = parent.request;
  child.index = index;
  *child.output = *parent.output;
  child.num_computed = parent.num_computed;
  child.num_done = parent.num_done;
  child.num_marked = parent.num_marked;
  child.phase = parent.phase;
  child.cumulative_logprob = parent.cumulative_logprob;
  self->send(st.setup.memory_manager, fork_atom::value, parent.id, child.id);
  st.requests.at(parent.request).seqs.push_back(child.id);
  const SeqId id = child.id;
  st.seqs.emplace(id, std::move(child));
  return id;
}

/// One beam-search step of a request from the candidates of its beams (HF/vLLM semantics, length_penalty 1).
void beam_step(Self* self, RequestData& r, const std::vector<std::pair<SeqId, const std::vector<SampledToken>*>>& beams) {
  auto& st = self->state;
  struct Cand {
    double score;
    size_t beam;
    TokenId token;
  };
  std::vector<Cand> cands;
  for (size_t b = 0; b < beams.size(); ++b)
    for (const SampledToken& t : *beams[b].second)
      cands.push_back({st.seqs.at(beams[b].first).cumulative_logprob + t.logprob, b, t.token});
  std::stable_sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) { return a.score > b.score; });
  const auto& p = *r.spec.params;
  std::vector<const Cand*> chosen;
  for (const Cand& c : cands) {
    if (chosen.size() == static_cast<size_t>(r.width)) break;
    const SeqData& parent = st.seqs.at(beams[c.beam].first);
    const bool is_stop = std::find(r.spec.stop_ids.begin(), r.spec.stop_ids.end(), c.token) != r.spec.stop_ids.end() &&
                         static_cast<int>(parent.output->size()) + 1 >= p.min_tokens;
    if (is_stop) {
      if (r.finished_beams.size() < static_cast<size_t>(r.width)) {
        auto tokens = *parent.output;
        tokens.push_back(c.token);
        r.finished_beams.push_back({std::move(tokens), c.score, "stop"});
      }
    } else {
      chosen.push_back(&c);
    }
  }
  // New beams: a parent's first continuation reuses its sequence, the others fork it; unused parents end.
  std::vector<int> uses(beams.size(), 0);
  std::vector<SeqId> live;
  for (const Cand* c : chosen) {
    SeqData& parent = st.seqs.at(beams[c->beam].first);
    if (uses[c->beam]++ > 0) live.push_back(fork_seq(self, parent, r.next_index++));
  }
  std::fill(uses.begin(), uses.end(), 0);
  size_t fork_i = 0;
  std::vector<std::pair<SeqId, const Cand*>> updates;
  for (const Cand* c : chosen) {
    const SeqId pid = beams[c->beam].first;
    updates.emplace_back(uses[c->beam]++ == 0 ? pid : live[fork_i++], c);
  }
  std::vector<SeqId> ended;
  for (const auto& [pid, _] : beams)
    if (std::none_of(updates.begin(), updates.end(), [&](const auto& u) { return u.first == pid; })) ended.push_back(pid);
  for (const auto& [sid, c] : updates) {
    SeqData& s = st.seqs.at(sid);
    s.output->push_back(c->token);
    s.cumulative_logprob = c->score;
  }
  for (SeqId e : ended) {
    r.seqs.erase(std::remove(r.seqs.begin(), r.seqs.end(), e), r.seqs.end());
    free_seqs(self, {e});
  }
  const bool length_done =
      !updates.empty() && finish_reason(st, r, st.seqs.at(updates.front().first)).has_value();
  if (!(updates.empty() || length_done || r.finished_beams.size() >= static_cast<size_t>(r.width))) return;

  // Done: rank finished and live beams by cumulative logprob / sequence length; the best n are the outputs.
  for (const auto& [sid, _] : updates)
    r.finished_beams.push_back({*st.seqs.at(sid).output, st.seqs.at(sid).cumulative_logprob, "length"});
  const double prompt_len = static_cast<double>(r.spec.prompt->size());
  std::stable_sort(r.finished_beams.begin(), r.finished_beams.end(), [&](const auto& a, const auto& b) {
    return a.cumulative_logprob / (prompt_len + a.tokens.size()) > b.cumulative_logprob / (prompt_len + b.tokens.size());
  });
  const int n = std::max(1, p.n);
  for (int i = 0; i < n && i < static_cast<int>(r.finished_beams.size()); ++i) {
    SeqOutput out;
    out.index = i;
    out.replace = true;
    for (TokenId t : r.finished_beams[i].tokens) out.tokens.push_back({t, 0.0f, {}});
    out.finish = r.finished_beams[i].finish;
    out.cumulative_logprob = r.finished_beams[i].cumulative_logprob;
    self->send(r.spec.client, output_atom::value, out);
  }
  const auto remaining = r.seqs;
  r.seqs.clear();
  free_seqs(self, remaining);
  finish_request_if_done(self, r.spec.id);
}

void handle_results(Self* self, const StepResult& res) {
  auto& st = self->state;
  std::map<uint64_t, std::vector<std::pair<SeqId, const std::vector<SampledToken>*>>> beam_groups;
  for (size_t i = 0; i < res.seqs.size(); ++i) {
    auto it = st.seqs.find(res.seqs[i]);
    if (it == st.seqs.end()) continue;  // aborted or ended while in flight
    SeqData& s = it->second;
    s.pending = false;
    RequestData& r = st.requests.at(s.request);
    const auto& samples = res.samples[i];
    if (r.beam) {
      beam_groups[r.spec.id].emplace_back(s.id, &samples[0]);
      continue;
    }
    // Parallel sampling: the first token of every completion comes from the same logits; forks share the prompt.
    std::vector<std::pair<SeqId, SampledToken>> appended{{s.id, samples[0][0]}};
    if (!r.forked && r.width > 1) {
      r.forked = true;
      for (size_t k = 1; k < samples.size(); ++k) appended.emplace_back(fork_seq(self, s, r.next_index++), samples[k][0]);
    }
    for (auto& [sid, tok] : appended) {
      SeqData& q = st.seqs.at(sid);
      q.output->push_back(tok.token);
      q.cumulative_logprob += tok.logprob;
      SeqOutput out;
      out.index = q.index;
      out.tokens.push_back(tok);
      out.finish = finish_reason(st, r, q).value_or("");
      out.cumulative_logprob = q.cumulative_logprob;
      st.setup.metrics->generation_tokens += 1;
      self->send(r.spec.client, output_atom::value, out);
      if (!out.finish.empty()) end_seq(self, sid);
    }
  }
  for (auto& [rid, beams] : beam_groups) {
    auto it = st.requests.find(rid);
    if (it != st.requests.end()) beam_step(self, it->second, beams);
  }
  // Report KV the step really wrote to the memory manager, so that full blocks enter the prefix cache (planned but
  // unwritten tokens never do: a block must not be found by a prefix hit before its KV exists).
  const int block_size = st.setup.block_size;
  for (const auto& [id, end] : st.step_ends) {
    auto it = st.seqs.find(id);
    if (it == st.seqs.end() || it->second.phase != PlanSeq::Phase::running) continue;
    SeqData& s = it->second;
    s.num_done = std::max(s.num_done, end);
    if (s.num_done / block_size > s.num_marked / block_size) {
      auto tokens = st.all_tokens(s);
      tokens.resize(s.num_done);
      self->send(st.setup.memory_manager, computed_atom::value, id, tokens, s.num_done);
      s.num_marked = s.num_done;
    }
  }
  st.step_ends.clear();
}

bool forks_on_result(const SchedulerState& st, const StepPlan& plan) {
  for (const PlannedChunk& c : plan.chunks) {
    if (!c.sample) continue;
    auto it = st.seqs.find(c.id);
    if (it == st.seqs.end()) continue;
    const RequestData& r = st.requests.at(it->second.request);
    if (r.beam || (!r.forked && r.width > 1)) return true;
  }
  return false;
}

void dispatch(Self* self, StepPlan plan) {
  auto& st = self->state;
  auto batch = std::make_shared<StepBatch>();
  StepMsg msg;
  batch->copies = plan.copies;
  std::vector<SeqId> finished_meanwhile;
  for (PlannedChunk& c : plan.chunks) {
    auto it = st.seqs.find(c.id);
    if (it == st.seqs.end()) continue;  // ended after planning; its blocks were freed after the plan
    SeqData& s = it->second;
    RequestData& r = st.requests.at(s.request);
    SeqChunk chunk;
    chunk.seq = s.id;
    chunk.start_pos = c.start_pos;
    const auto& prompt = *r.spec.prompt;
    for (int p = c.start_pos; p < c.start_pos + c.num_tokens; ++p)
      chunk.tokens.push_back(p < static_cast<int>(prompt.size()) ? prompt[p] : (*s.output)[p - prompt.size()]);
    chunk.block_table = std::move(c.block_table);
    if (c.start_pos < static_cast<int>(prompt.size()))
      st.setup.metrics->prompt_tokens_computed +=
          std::min<int>(c.start_pos + c.num_tokens, static_cast<int>(prompt.size())) - c.start_pos;
    if (c.sample) {
      const int specs = (!r.forked && r.width > 1 && !r.beam) ? r.width : 1;
      for (int k = 0; k < specs; ++k) {
        SampleSpec spec;
        spec.params = r.spec.params.get();
        spec.seed = r.spec.seed + static_cast<uint64_t>(k == 0 ? s.index : k);
        spec.prompt = r.spec.prompt.get();
        spec.output = s.output.get();
        spec.stop_ids = &r.spec.stop_ids;
        spec.num_logprobs = r.spec.params->logprobs.value_or(0);
        spec.num_candidates = r.beam ? 2 * r.width : 1;
        chunk.samples.push_back(spec);
      }
      s.pending = true;
      msg.keep_alive.push_back(s.output);
      msg.keep_alive.push_back(r.spec.prompt);
      msg.keep_alive.push_back(r.spec.params);
    }
    st.step_ends.emplace_back(s.id, c.start_pos + c.num_tokens);
    batch->seqs.push_back(std::move(chunk));
  }
  if (batch->seqs.empty()) {
    kick(self);
    return;
  }
  // stop_ids live in RequestData, which an abort may erase mid-step: give the batch its own copies.
  auto owned_stop_ids = std::make_shared<std::vector<std::vector<TokenId>>>();
  owned_stop_ids->reserve(batch->seqs.size());
  for (SeqChunk& c : batch->seqs)
    for (SampleSpec& spec : c.samples) {
      owned_stop_ids->push_back(*spec.stop_ids);
      spec.stop_ids = &owned_stop_ids->back();
    }
  msg.keep_alive.push_back(owned_stop_ids);
  msg.batch = batch;
  st.step_running = true;
  st.setup.metrics->steps += 1;
  const bool pipeline = !forks_on_result(st, plan);
  st.partial_results.clear();
  for (const caf::actor& ex : st.setup.executors) {
    self->request(ex, caf::infinite, step_atom::value, msg)
        .then(
            [self](StepResult& r) {
              auto& s = self->state;
              s.partial_results.push_back(std::move(r));
              if (s.partial_results.size() < s.setup.executors.size()) return;
              StepResult merged;
              for (auto& p : s.partial_results)
                if (!p.seqs.empty()) merged = std::move(p);  // rank 0 samples
              s.partial_results.clear();
              s.step_running = false;
              handle_results(self, merged);
              publish_queue_metrics(self);
              if (s.next_plan) {
                auto p = std::move(*s.next_plan);
                s.next_plan.reset();
                dispatch(self, std::move(p));
              } else {
                kick(self);
              }
            },
            [self](caf::error& err) {
              self->quit(err);  // an executor failed: the engine cannot continue
            });
  }
  if (pipeline) request_plan(self);  // plan step N+1 while step N runs
}

void apply_plan(Self* self, StepPlan& plan) {
  auto& st = self->state;
  for (SeqId id : plan.preempted_recompute) {
    auto it = st.seqs.find(id);
    if (it == st.seqs.end()) continue;
    it->second.phase = PlanSeq::Phase::waiting;
    it->second.num_computed = 0;
    it->second.num_done = 0;
    it->second.num_marked = 0;
    st.setup.metrics->preemptions += 1;
  }
  for (SeqId id : plan.preempted_swap) {
    auto it = st.seqs.find(id);
    if (it == st.seqs.end()) continue;
    it->second.phase = PlanSeq::Phase::swapped;
    st.setup.metrics->preemptions += 1;
  }
  if (!plan.swap_out.empty())
    for (const caf::actor& ex : st.setup.executors) self->send(ex, swap_out_atom::value, plan.swap_out);
  for (const auto& [id, cached] : plan.admitted) {
    auto it = st.seqs.find(id);
    if (it == st.seqs.end()) continue;
    it->second.phase = PlanSeq::Phase::running;
    it->second.num_computed = cached;
    it->second.num_done = cached;
    it->second.num_marked = cached;
  }
  for (const PlannedChunk& c : plan.chunks) {
    auto it = st.seqs.find(c.id);
    if (it != st.seqs.end()) it->second.num_computed = c.start_pos + c.num_tokens;
  }
  for (SeqId id : plan.rejected) {
    auto it = st.seqs.find(id);
    if (it == st.seqs.end()) continue;
    const uint64_t rid = it->second.request;
    auto& r = st.requests.at(rid);
    self->send(r.spec.client, cancel_atom::value, std::string("the request needs more KV-cache blocks than exist"));
    auto ids = r.seqs;
    r.seqs.clear();
    free_seqs(self, ids);
    finish_request_if_done(self, rid);
  }
  if (!plan.swapping_in.empty()) {
    for (SeqId id : plan.swapping_in)
      if (auto it = st.seqs.find(id); it != st.seqs.end()) it->second.swapping_in = true;
    auto remaining = std::make_shared<size_t>(st.setup.executors.size());
    auto ids = plan.swapping_in;
    for (const caf::actor& ex : st.setup.executors)
      self->request(ex, caf::infinite, swap_in_atom::value, plan.swap_in).then([self, remaining, ids](bool) {
        if (--*remaining > 0) return;
        for (SeqId id : ids) {
          auto it = self->state.seqs.find(id);
          if (it == self->state.seqs.end()) continue;
          it->second.swapping_in = false;
          it->second.phase = PlanSeq::Phase::running;
        }
        kick(self);
      });
  }
}

void request_plan(Self* self) {
  auto& st = self->state;
  std::vector<PlanSeq> view;
  for (const auto& [id, s] : st.seqs) {
    if (s.swapping_in) continue;
    PlanSeq p;
    p.id = id;
    p.arrival = st.requests.at(s.request).arrival;
    p.phase = s.phase;
    p.num_computed = s.num_computed;
    const int known = static_cast<int>(st.requests.at(s.request).spec.prompt->size() + s.output->size());
    p.num_tokens = known + (s.pending ? 1 : 0);
    if (s.phase == PlanSeq::Phase::waiting) {
      if (s.pending) continue;  // preempted while its last token is in flight: admit it next time
      p.tokens = st.all_tokens(s);
    }
    view.push_back(std::move(p));
  }
  if (view.empty()) return;
  st.plan_requested = true;
  self->request(st.setup.memory_manager, caf::infinite, plan_atom::value, std::move(view), st.setup.limits)
      .then([self](StepPlan& plan) {
        auto& s = self->state;
        s.plan_requested = false;
        apply_plan(self, plan);
        publish_queue_metrics(self);
        if (s.step_running) {
          s.next_plan = std::move(plan);
        } else if (!plan.chunks.empty()) {
          dispatch(self, std::move(plan));
        }
        // An empty plan with nothing running: wait for a swap-in to finish, a new request or an abort.
      });
}

void kick(Self* self) {
  auto& st = self->state;
  if (st.step_running || st.plan_requested || st.next_plan) return;
  request_plan(self);
}

}  // namespace

namespace {

caf::behavior scheduler_actor(caf::stateful_actor<SchedulerState>* self, SchedulerSetup setup) {
  self->state.setup = std::move(setup);
  return {
      [self](submit_atom, const RequestSpec& spec) {
        auto& st = self->state;
        RequestData r;
        r.spec = spec;
        r.arrival = st.next_arrival++;
        const auto& p = *spec.params;
        r.beam = p.use_beam_search;
        r.width = std::max({1, p.n, p.best_of});
        SeqData s;
        s.id = st.next_seq++;
        s.request = spec.id;
        s.index = 0;
        r.seqs.push_back(s.id);
        st.setup.metrics->prompt_tokens += static_cast<int64_t>(spec.prompt->size());
        st.seqs.emplace(s.id, std::move(s));
        st.requests.emplace(spec.id, std::move(r));
        publish_queue_metrics(self);
        kick(self);
      },
      [self](abort_atom, uint64_t rid) {
        auto& st = self->state;
        auto it = st.requests.find(rid);
        if (it == st.requests.end()) return;
        self->send(it->second.spec.client, cancel_atom::value, std::string());
        auto ids = it->second.seqs;
        it->second.seqs.clear();
        free_seqs(self, ids);  // blocks freed now, even mid-step
        finish_request_if_done(self, rid, true);
        publish_queue_metrics(self);
        kick(self);
      },
      [self](stop_atom, uint64_t rid, int index) {
        auto& st = self->state;
        auto it = st.requests.find(rid);
        if (it == st.requests.end()) return;
        for (SeqId id : it->second.seqs)
          if (st.seqs.at(id).index == index) {
            end_seq(self, id);
            break;
          }
        kick(self);
      },
      [self](drained_atom) -> caf::result<bool> {
        auto& st = self->state;
        auto p = self->make_response_promise<bool>();
        if (st.requests.empty()) {
          self->request(st.setup.memory_manager, caf::infinite, drained_atom::value)
              .then([p](bool) mutable { p.deliver(true); });
        } else {
          st.drain_waiters.push_back(p);
        }
        return p;
      },
  };
}

}  // namespace

caf::actor spawn_scheduler(caf::actor_system& system, SchedulerSetup setup) {
  return system.spawn(scheduler_actor, std::move(setup));
}

}  // namespace paged
