#include <algorithm>
#include <chrono>
#include <map>
#include <set>
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
  std::optional<std::vector<SampledToken>> beam_candidates;  // beam search: this step's offers, until every beam has them
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
  std::chrono::steady_clock::time_point step_sent;  // when the running step went to the executors
  std::vector<caf::response_promise> drain_waiters;

  /// Token at position p of a sequence: prompt, then output.
  TokenId token_at(const SeqData& s, int p) const {
    const auto& prompt = *requests.at(s.request).spec.prompt;
    return p < static_cast<int>(prompt.size()) ? prompt[p] : (*s.output)[p - prompt.size()];
  }
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
  child.cumulative_logprob = parent.cumulative_logprob;
  if (parent.phase == PlanSeq::Phase::running && !parent.swapping_in) {
    child.num_computed = parent.num_computed;
    child.num_done = parent.num_done;
    child.num_marked = parent.num_marked;
    child.phase = parent.phase;
    self->send(st.setup.memory_manager, fork_atom::value, parent.id, child.id);
  }
  // else: the parent was preempted (its blocks are freed or on the CPU) while it waited for the other beams of its
  // request: the child starts as a waiting sequence and is recomputed (prefix-cache hits make that cheap).
  st.requests.at(parent.request).seqs.push_back(child.id);
  const SeqId id = child.id;
  st.seqs.emplace(id, std::move(child));
  return id;
}

/// Beam score (vLLM's legacy get_beam_search_score with length_penalty 1): cumulative logprob over the sequence
/// length, prompt included, not counting a final stop id.
double beam_score(double cumulative_logprob, size_t prompt_len, size_t output_len, bool stopped) {
  return cumulative_logprob / static_cast<double>(prompt_len + output_len - (stopped ? 1 : 0));
}

/// One beam-search step of a request once every live beam has its candidates, with the semantics of vLLM's legacy
/// beam search (length_penalty 1, early_stopping false):
/// - each beam offers its 2w best next tokens (w = width) scored cumulative logprob + token logprob; the 2w best
///   offers over all beams (ties: beam order, then token rank) are the children;
/// - a child ending in a stop id (EOS / stop_token_ids, at or past min_tokens) or reaching max_tokens / the model
///   length is finished; earlier and new finished hypotheses are ranked by beam_score and the best w kept;
/// - the search stops when no child runs on, or when w hypotheses are finished and the worst of them scores at
///   least the best running child; otherwise the best w running children are the next beams (a parent's first
///   child continues its sequence, the others fork it, parents without children end);
/// - the outputs are the best n finished hypotheses by beam_score.
void beam_step(Self* self, RequestData& r, const std::vector<std::pair<SeqId, const std::vector<SampledToken>*>>& beams) {
  auto& st = self->state;
  const auto& p = *r.spec.params;
  const size_t width = static_cast<size_t>(r.width);
  const size_t prompt_len = r.spec.prompt->size();
  struct Cand {
    double score;  // cumulative logprob
    size_t beam;
    TokenId token;
    bool stopped;
    bool finished;
  };
  std::vector<Cand> cands;
  for (size_t b = 0; b < beams.size(); ++b)
    for (const SampledToken& t : *beams[b].second)
      cands.push_back({st.seqs.at(beams[b].first).cumulative_logprob + t.logprob, b, t.token, false, false});
  std::stable_sort(cands.begin(), cands.end(), [](const Cand& a, const Cand& b) { return a.score > b.score; });
  if (cands.size() > 2 * width) cands.resize(2 * width);

  const size_t out_len = st.seqs.at(beams.front().first).output->size() + 1;  // every beam has the same length
  const bool length_end = static_cast<int>(out_len) >= p.max_tokens ||
                          static_cast<int>(prompt_len + out_len) >= st.setup.max_model_len;
  std::vector<RequestData::Hyp> finished = std::move(r.finished_beams);
  std::vector<const Cand*> running;
  for (Cand& c : cands) {
    c.stopped = std::find(r.spec.stop_ids.begin(), r.spec.stop_ids.end(), c.token) != r.spec.stop_ids.end() &&
                static_cast<int>(out_len) >= p.min_tokens;
    c.finished = c.stopped || length_end;
    if (!c.finished) {
      running.push_back(&c);
      continue;
    }
    auto tokens = *st.seqs.at(beams[c.beam].first).output;
    tokens.push_back(c.token);
    finished.push_back({std::move(tokens), c.score, c.stopped ? "stop" : "length"});
  }
  auto hyp_score = [&](const RequestData::Hyp& h) {
    return beam_score(h.cumulative_logprob, prompt_len, h.tokens.size(), h.finish == "stop");
  };
  std::stable_sort(finished.begin(), finished.end(),
                   [&](const auto& a, const auto& b) { return hyp_score(a) > hyp_score(b); });
  const bool stop = running.empty() ||
                    (finished.size() >= width &&
                     hyp_score(finished[width - 1]) >= beam_score(running.front()->score, prompt_len, out_len, false));
  if (finished.size() > width) finished.resize(width);
  r.finished_beams = std::move(finished);

  if (!stop) {
    if (running.size() > width) running.resize(width);
    // Forks first, from the parents' current state; then the parents take their own first child's token.
    std::vector<int> uses(beams.size(), 0);
    std::vector<std::pair<SeqId, const Cand*>> updates;
    for (const Cand* c : running) {
      SeqData& parent = st.seqs.at(beams[c->beam].first);
      updates.emplace_back(uses[c->beam]++ == 0 ? parent.id : fork_seq(self, parent, r.next_index++), c);
    }
    for (size_t b = 0; b < beams.size(); ++b)
      if (uses[b] == 0) {
        r.seqs.erase(std::remove(r.seqs.begin(), r.seqs.end(), beams[b].first), r.seqs.end());
        free_seqs(self, {beams[b].first});
      }
    for (const auto& [sid, c] : updates) {
      SeqData& s = st.seqs.at(sid);
      s.output->push_back(c->token);
      s.cumulative_logprob = c->score;
      s.beam_candidates.reset();
    }
    return;
  }

  // Done: the best n finished hypotheses (running children fill in only if fewer than n finished, which needs a
  // vocabulary smaller than 2w).
  for (const Cand* c : running) {
    if (r.finished_beams.size() >= width) break;
    auto tokens = *st.seqs.at(beams[c->beam].first).output;
    tokens.push_back(c->token);
    r.finished_beams.push_back({std::move(tokens), c->score, "length"});
  }
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
  // Report KV the step really wrote to the memory manager, first: it decides copy-on-write by it, so a fork below
  // (n > 1, beam search) must find its parent's count up to date, or the copy of a partly filled block is skipped.
  // Full blocks enter the prefix cache (planned but unwritten tokens never do: a block must not be found by a prefix
  // hit before its KV exists). Only the tail from the first unregistered block travels.
  const int block_size = st.setup.block_size;
  for (const auto& [id, end] : st.step_ends) {
    auto it = st.seqs.find(id);
    if (it == st.seqs.end() || it->second.phase != PlanSeq::Phase::running) continue;
    SeqData& s = it->second;
    s.num_done = std::max(s.num_done, end);
    if (s.num_done <= s.num_marked) continue;
    const int from = s.num_marked / block_size * block_size;
    std::vector<TokenId> tail;
    for (int p = from; p < s.num_done; ++p) tail.push_back(st.token_at(s, p));
    self->send(st.setup.memory_manager, computed_atom::value, id, from, std::move(tail), s.num_done);
    s.num_marked = s.num_done;
  }
  st.step_ends.clear();
  std::set<uint64_t> beam_requests;
  for (size_t i = 0; i < res.seqs.size(); ++i) {
    auto it = st.seqs.find(res.seqs[i]);
    if (it == st.seqs.end()) continue;  // aborted or ended while in flight
    SeqData& s = it->second;
    s.pending = false;
    RequestData& r = st.requests.at(s.request);
    const auto& samples = res.samples[i];
    if (r.beam) {
      // A beam step needs the offers of every live beam; beams left out of a step (token budget, preemption) give
      // theirs in a later step, and the step waits for them.
      s.beam_candidates = samples[0];
      beam_requests.insert(r.spec.id);
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
  for (uint64_t rid : beam_requests) {
    auto it = st.requests.find(rid);
    if (it == st.requests.end()) continue;
    std::vector<std::pair<SeqId, const std::vector<SampledToken>*>> beams;
    for (SeqId id : it->second.seqs) {
      const SeqData& s = st.seqs.at(id);
      if (!s.beam_candidates || s.pending) break;
      beams.emplace_back(id, &*s.beam_candidates);
    }
    if (!beams.empty() && beams.size() == it->second.seqs.size()) beam_step(self, it->second, beams);
  }
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
    for (int p = c.start_pos; p < c.start_pos + c.num_tokens; ++p) chunk.tokens.push_back(st.token_at(s, p));
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
  // Reserved for every sample (a parallel-sampling group draws several from one chunk): the specs point into it.
  auto owned_stop_ids = std::make_shared<std::vector<std::vector<TokenId>>>();
  size_t num_samples = 0;
  for (const SeqChunk& c : batch->seqs) num_samples += c.samples.size();
  owned_stop_ids->reserve(num_samples);
  for (SeqChunk& c : batch->seqs)
    for (SampleSpec& spec : c.samples) {
      owned_stop_ids->push_back(*spec.stop_ids);
      spec.stop_ids = &owned_stop_ids->back();
    }
  msg.keep_alive.push_back(owned_stop_ids);
  msg.batch = batch;
  st.step_running = true;
  st.step_sent = std::chrono::steady_clock::now();
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
              s.setup.metrics->step_time_us += std::chrono::duration_cast<std::chrono::microseconds>(
                                                   std::chrono::steady_clock::now() - s.step_sent)
                                                   .count();
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
    // The memory manager drops `computed` reports for a swapped sequence, and one may be in flight now (sent for
    // the step that ran while this plan was made): after the swap-in, report from position 0 again rather than
    // from a block the manager never registered.
    it->second.num_marked = 0;
    st.setup.metrics->preemptions += 1;
  }
  // A request, not a send: the executor replies `true`, and a reply the scheduler has no handler for comes back
  // to the executor as an unexpected_message error, whose default handler makes the executor quit (the engine
  // then stalls at its next step). Mailbox order still puts the copy before the next step.
  if (!plan.swap_out.empty())
    for (const caf::actor& ex : st.setup.executors)
      self->request(ex, caf::infinite, swap_out_atom::value, plan.swap_out).then([](bool) {});
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
        } else if (!plan.preempted_swap.empty() || !plan.preempted_recompute.empty() || !plan.rejected.empty()) {
          request_plan(self);  // the plan only freed memory: plan again at once, it can run something now
        }
        // Otherwise nothing can run: wait for a swap-in to finish, a new request or an abort.
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
