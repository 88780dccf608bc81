#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "actors/actors.h"
#include "model/scheduling/beam_search.h"
#include "model/speculative/ngram.h"

namespace paged {

namespace {

/// One sequence: a completion (or a beam) of a request.
///
/// Who owns what of a sequence: the scheduler owns its tokens, phase and what is in flight (pending, the planned
/// position); the memory manager's KvCacheManager owns its blocks and how many tokens its KV holds (num_computed,
/// which decides copy-on-write and prefix-cache registration). The scheduler tells it through `computed` reports
/// once a step returned; num_reported is only where the next report starts.
struct SeqData {
  SeqId id = 0;
  uint64_t request = 0;
  int index = 0;                                    // completion index (seed offset)
  std::shared_ptr<std::vector<TokenId>> output = std::make_shared<std::vector<TokenId>>();
  int num_planned = 0;    // KV of tokens [0, num_planned) is cached or computed by a step in flight (PlanSeq)
  int num_reported = 0;   // tokens reported written to the memory manager (its num_computed); 0 after a swap-out
                          // was planned, which may have dropped a report in flight: the next report starts at 0
  PlanSeq::Phase phase = PlanSeq::Phase::waiting;
  bool swapping_in = false;
  int pending = 0;        // tokens of this sequence being sampled by steps in flight (two with async scheduling)
  uint64_t output_read_by = 0;  // the newest step sent with a sample of it, which reads *output (copy on write)
  double cumulative_logprob = 0.0;
  std::optional<std::vector<SampledToken>> beam_candidates;  // beam search: this step's offers, until all beams have
  std::vector<SampledToken> beam_output;  // beam search: the output as offered (logprobs, alternatives)
  std::shared_ptr<constraint::TokenConstraint> constraint;   // structured outputs: the output so far against its grammar
  /// Speculative decoding: the drafts proposed for the next step (request_plan), then those its step in flight
  /// computes after its newest token (dispatch); empty: none.
  std::vector<TokenId> drafts;
};

struct RequestData {
  RequestSpec spec;
  uint64_t arrival = 0;
  int width = 1;                 // completions generated (n, best_of) or beams
  bool beam = false;
  bool forked = false;           // parallel sampling: the completions exist
  bool scheduled = false;        // its first sequence was admitted (the request actor was told)
  std::vector<SeqId> seqs;       // live sequences
  std::vector<BeamHypothesis> finished_beams;  // beam search: the best `width` finished so far
  int next_index = 1;
  int prompt_scored_until = 1;   // prompt_logprobs: a step was asked to score prompt positions [1, this)

  /// Whether prompt tokens are left to score: such a request takes no prefix-cache hit (vLLM's rule), since the
  /// logits of cached positions are gone.
  bool scoring_prompt() const {
    return spec.params->prompt_logprobs && prompt_scored_until < static_cast<int>(spec.prompt->size());
  }
};

}  // namespace

struct SchedulerState {
  SchedulerSetup setup;
  std::unordered_map<uint64_t, RequestData> requests;
  std::unordered_map<SeqId, SeqData> seqs;
  SeqId next_seq = 1;
  uint64_t next_arrival = 0;

  /// A step sent to the executors whose results are not handled yet; at most two, oldest first.
  struct InFlight {
    uint64_t id = 0;
    std::vector<StepResult> partial_results;          // replies of the executors so far
    std::vector<std::pair<SeqId, int>> ends;          // (sequence, tokens cached once the step is done)
    std::chrono::steady_clock::time_point sent;       // when it went to the executors
    StepKind kind = StepKind::decode;                  // its kind and tokens (the step profile)
    int tokens = 0;
    // The next step is planned after its results: a sequence forks on them, or drafts continue them (speculation).
    bool plan_after = false;
  };
  std::deque<InFlight> in_flight;
  uint64_t steps_sent = 0, steps_done = 0;            // ids of the newest step sent and handled
  std::chrono::steady_clock::time_point last_result;  // when the previous step's results came
  bool plan_requested = false;
  bool plan_stale = false;  // kick() came while a plan was being made: a swap-in, disk load or request it did not see
  std::optional<StepPlan> next_plan;
  std::vector<caf::response_promise> drain_waiters;
  std::vector<SeqId> finished_since_step;           // freed since the last dispatch: StepBatch::finished

  /// Token at position p of a sequence: prompt, then output, then its drafts.
  TokenId token_at(const SeqData& s, int p) const {
    const auto& prompt = *requests.at(s.request).spec.prompt;
    if (p < static_cast<int>(prompt.size())) return prompt[p];
    const size_t o = static_cast<size_t>(p) - prompt.size();
    return o < s.output->size() ? (*s.output)[o] : s.drafts.at(o - s.output->size());
  }
  std::vector<TokenId> all_tokens(const SeqData& s) const {
    const RequestData& r = requests.at(s.request);
    std::vector<TokenId> t(*r.spec.prompt);
    t.insert(t.end(), s.output->begin(), s.output->end());
    return t;
  }
  /// Appends `token` to the output of `s`; a step still in flight that reads that output (from an executor's
  /// thread) keeps the ids it was sent with: the sequence takes a copy first.
  void append_output(SeqData& s, TokenId token) const {
    if (s.output_read_by > steps_done) s.output = std::make_shared<std::vector<TokenId>>(*s.output);
    s.output->push_back(token);
  }
};

namespace {

using Self = caf::stateful_actor<SchedulerState>;

void kick(Self* self);
void request_plan(Self* self);
void send_disk_loads(Self* self, const std::vector<DiskOrder>& loads);

void free_seqs(Self* self, const std::vector<SeqId>& ids) {
  if (ids.empty()) return;
  auto& st = self->state;
  for (SeqId id : ids) st.seqs.erase(id);
  st.finished_since_step.insert(st.finished_since_step.end(), ids.begin(), ids.end());
  self->send(st.setup.memory_manager, free_atom::value, ids);
}

void publish_queue_metrics(Self* self) {
  auto& st = self->state;
  int64_t waiting = 0, running = 0, swapped = 0, running_seqs = 0;
  LoraUse::Counts lora_running, lora_waiting;  // requests of each LoRA adapter
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
    if (const int32_t lora = r.spec.params->lora; lora != 0) {
      if (any_running) ++lora_running[lora];
      if (all_waiting) ++lora_waiting[lora];
    }
  }
  ReplicaMetricsWriter& m = st.setup.metrics;
  m.set_lora_use(std::move(lora_running), std::move(lora_waiting));
  m.set(&Metrics::waiting_requests, waiting);
  m.set(&Metrics::running_requests, running);
  m.set(&Metrics::swapped_requests, swapped);
  m.set(&Metrics::running_seqs, running_seqs);
  m.raise_peak(&Metrics::peak_running_seqs, [](const Metrics& x) -> int64_t { return x.running_seqs; });
}

void finish_request_if_done(Self* self, uint64_t rid, bool aborted = false) {
  auto& st = self->state;
  auto it = st.requests.find(rid);
  if (it == st.requests.end() || !it->second.seqs.empty()) return;
  st.requests.erase(it);
  st.setup.metrics.add(aborted ? &Metrics::requests_aborted : &Metrics::requests_finished, 1);
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

/// True if an output of `output_len` tokens ends the sequence by length: max_tokens or the model length.
bool reaches_length_limit(const SchedulerState& st, const RequestData& r, size_t output_len) {
  return static_cast<int>(output_len) >= r.spec.params->max_tokens ||
         static_cast<int>(r.spec.prompt->size() + output_len) >= st.setup.max_model_len;
}

std::optional<std::string> finish_reason(const SchedulerState& st, const RequestData& r, const SeqData& s) {
  const TokenId last = s.output->back();
  if (static_cast<int>(s.output->size()) >= r.spec.params->min_tokens &&
      std::find(r.spec.stop_ids.begin(), r.spec.stop_ids.end(), last) != r.spec.stop_ids.end())
    return "stop";
  if (reaches_length_limit(st, r, s.output->size())) return "length";
  return std::nullopt;
}

SeqId fork_seq(Self* self, SeqData& parent, int index) {
  auto& st = self->state;
  SeqData child;
  child.id = st.next_seq++;
  child.request = parent.request;
  child.index = index;
  *child.output = *parent.output;
  if (parent.constraint) child.constraint = std::make_shared<constraint::TokenConstraint>(*parent.constraint);
  child.cumulative_logprob = parent.cumulative_logprob;
  child.beam_output = parent.beam_output;
  if (parent.phase == PlanSeq::Phase::running && !parent.swapping_in) {
    child.num_planned = parent.num_planned;
    child.num_reported = parent.num_reported;
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

/// The outputs of one step, gathered to go as one `output` message per request actor.
class Outbox {
 public:
  void add(const RequestData& r, SeqOutput out) {
    auto& [client, outputs] = by_request_[r.spec.id];
    client = r.spec.client;
    outputs.push_back(std::move(out));
  }
  void send(Self* self) {
    for (auto& [id, to] : by_request_) self->send(to.first, output_atom::value, std::move(to.second));
    by_request_.clear();
  }

 private:
  std::map<uint64_t, std::pair<caf::actor, std::vector<SeqOutput>>> by_request_;
};

/// One beam-search step of a request whose live beams `beam_ids` all have their offers (model/scheduling/
/// beam_search.h decides): forks, ends and extends the beams, or outputs the result and ends the request.
void beam_step(Self* self, RequestData& r, const std::vector<SeqId>& beam_ids, Outbox& outbox) {
  auto& st = self->state;
  const auto& p = *r.spec.params;
  std::vector<Beam> beams;
  for (SeqId id : beam_ids) {
    const SeqData& s = st.seqs.at(id);
    beams.push_back({s.cumulative_logprob, s.beam_output, *s.beam_candidates});
  }
  const BeamSearchLimits limits{.width = r.width,
                                .n = std::max(1, p.n),
                                .min_tokens = p.min_tokens,
                                .max_tokens = p.max_tokens,
                                .max_model_len = st.setup.max_model_len,
                                .prompt_len = r.spec.prompt->size(),
                                .stop_ids = r.spec.stop_ids,
                                .length_penalty = p.length_penalty};
  BeamDecision decision = beam_search_step(beams, std::move(r.finished_beams), limits);
  r.finished_beams = std::move(decision.finished);

  if (!decision.done) {
    // Forks first, from the parents' current state; then the parents take their own first child's token.
    std::vector<SeqId> child_ids;
    std::vector<bool> has_child(beam_ids.size(), false);
    for (const BeamChild& c : decision.children) {
      SeqData& parent = st.seqs.at(beam_ids[c.parent]);
      child_ids.push_back(c.fork ? fork_seq(self, parent, r.next_index++) : parent.id);
      has_child[c.parent] = true;
    }
    for (size_t b = 0; b < beam_ids.size(); ++b)
      if (!has_child[b]) {
        r.seqs.erase(std::remove(r.seqs.begin(), r.seqs.end(), beam_ids[b]), r.seqs.end());
        free_seqs(self, {beam_ids[b]});
      }
    for (size_t i = 0; i < child_ids.size(); ++i) {
      SeqData& s = st.seqs.at(child_ids[i]);
      st.append_output(s, decision.children[i].token.token);
      s.beam_output.push_back(std::move(decision.children[i].token));
      s.cumulative_logprob = decision.children[i].cumulative_logprob;
      s.beam_candidates.reset();
    }
    return;
  }
  for (size_t i = 0; i < r.finished_beams.size(); ++i) {
    BeamHypothesis& h = r.finished_beams[i];
    SeqOutput out;
    out.index = static_cast<int>(i);
    out.replace = true;
    out.tokens = std::move(h.tokens);
    out.finish = h.stopped ? "stop" : "length";
    out.cumulative_logprob = h.cumulative_logprob;
    outbox.add(r, std::move(out));
  }
  const auto remaining = r.seqs;
  r.seqs.clear();
  free_seqs(self, remaining);
  finish_request_if_done(self, r.spec.id);
}

/// Reports to the memory manager, in one message, the KV that the step just returned wrote. First: it decides
/// copy-on-write by it, so a fork after the step (n > 1, beam search) must find its parent's count up to date, or
/// the copy of a partly filled block is skipped. Full blocks enter the prefix cache, those of an admitted chunk
/// already did when planned (KvCacheManager::register_planned); the report confirms them. Only the tail from the
/// first block not reported yet travels.
void report_computed(Self* self, const std::vector<std::pair<SeqId, int>>& step_ends) {
  auto& st = self->state;
  const int block_size = st.setup.block_size;
  std::vector<ComputedKv> reports;
  for (const auto& [id, end] : step_ends) {
    auto it = st.seqs.find(id);
    if (it == st.seqs.end() || it->second.phase != PlanSeq::Phase::running) continue;
    SeqData& s = it->second;
    if (end <= s.num_reported) continue;
    ComputedKv& report = reports.emplace_back();
    report.seq = id;
    report.tokens_offset = s.num_reported / block_size * block_size;
    for (int p = report.tokens_offset; p < end; ++p) report.tokens.push_back(st.token_at(s, p));
    report.num_computed = end;
    s.num_reported = end;
  }
  if (!reports.empty()) self->send(st.setup.memory_manager, computed_atom::value, std::move(reports));
}

/// Speculative decoding: how many drafts the samples of `res` confirm, for each sequence whose chunk had drafts. The
/// others leave the sequence (their KV slots are written again later): `ends` and num_planned drop them, and the
/// drafts a sequence keeps are those its KV now holds after its newest token.
std::unordered_map<SeqId, int> take_verified_drafts(Self* self, std::vector<std::pair<SeqId, int>>& ends,
                                                    const StepResult& res) {
  auto& st = self->state;
  std::unordered_map<SeqId, int> accepted, rejected;
  for (size_t i = 0; i < res.seqs.size(); ++i) {
    auto it = st.seqs.find(res.seqs[i]);
    if (it == st.seqs.end() || it->second.drafts.empty()) continue;
    SeqData& s = it->second;
    std::vector<TokenId> sampled;
    for (const auto& candidates : res.samples[i]) sampled.push_back(candidates.at(0).token);
    const int kept = accepted_drafts(s.drafts, sampled);
    const int dropped = static_cast<int>(s.drafts.size()) - kept;
    st.setup.metrics.add(&Metrics::spec_decode_drafts, 1);
    st.setup.metrics.add(&Metrics::spec_decode_draft_tokens, static_cast<int64_t>(s.drafts.size()));
    st.setup.metrics.add(&Metrics::spec_decode_accepted_tokens, kept);
    s.drafts.resize(static_cast<size_t>(kept));
    s.num_planned -= dropped;
    accepted.emplace(s.id, kept);
    if (dropped > 0) rejected.emplace(s.id, dropped);
  }
  if (!rejected.empty())
    for (auto& [id, end] : ends)
      if (auto it = rejected.find(id); it != rejected.end()) end -= it->second;
  return accepted;
}

void handle_results(Self* self, SchedulerState::InFlight& step, const StepResult& res) {
  auto& st = self->state;
  const std::unordered_map<SeqId, int> verified = take_verified_drafts(self, step.ends, res);
  report_computed(self, step.ends);
  // Before the step's tokens: the request actor has a prompt's scores by the time its first token comes.
  for (const ChunkPromptLogprobs& scored : res.prompt_logprobs) {
    auto it = st.seqs.find(scored.seq);
    if (it != st.seqs.end()) self->send(st.requests.at(it->second.request).spec.client, prompt_lp_atom::value, scored);
  }
  Outbox outbox;
  std::set<uint64_t> beam_requests;
  for (size_t i = 0; i < res.seqs.size(); ++i) {
    auto it = st.seqs.find(res.seqs[i]);
    if (it == st.seqs.end()) continue;  // aborted or ended while in flight
    SeqData& s = it->second;
    s.pending = std::max(0, s.pending - 1);
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
    // Speculative decoding: the drafts confirmed, then the sample after them.
    std::vector<std::pair<SeqId, std::vector<SampledToken>>> appended{{s.id, {samples[0][0]}}};
    if (auto v = verified.find(s.id); v != verified.end()) {
      for (int k = 1; k <= v->second; ++k) appended[0].second.push_back(samples[k][0]);
      s.drafts.clear();  // those kept become output now
    }
    if (!r.forked && r.width > 1) {
      r.forked = true;
      for (size_t k = 1; k < samples.size(); ++k)
        appended.emplace_back(fork_seq(self, s, r.next_index++), std::vector<SampledToken>{samples[k][0]});
    }
    for (auto& [sid, tokens] : appended) {
      SeqData& q = st.seqs.at(sid);
      SeqOutput out;
      out.index = q.index;
      for (SampledToken& tok : tokens) {
        st.append_output(q, tok.token);
        if (q.constraint) q.constraint->accept(tok.token);
        q.cumulative_logprob += tok.logprob;
        out.tokens.push_back(std::move(tok));
        out.finish = finish_reason(st, r, q).value_or("");
        if (!out.finish.empty()) break;  // a stop token or the length limit: the tokens after it are not taken
      }
      out.cumulative_logprob = q.cumulative_logprob;
      st.setup.metrics.add(&Metrics::generation_tokens, static_cast<int64_t>(out.tokens.size()));
      const bool ends = !out.finish.empty();
      outbox.add(r, std::move(out));
      if (ends) end_seq(self, sid);  // may end the request: `r` is not used after the last one
    }
  }
  for (uint64_t rid : beam_requests) {
    auto it = st.requests.find(rid);
    if (it == st.requests.end()) continue;
    std::vector<SeqId> beams;
    for (SeqId id : it->second.seqs) {
      const SeqData& s = st.seqs.at(id);
      if (!s.beam_candidates || s.pending) break;
      beams.push_back(id);
    }
    if (!beams.empty() && beams.size() == it->second.seqs.size()) beam_step(self, it->second, beams, outbox);
  }
  outbox.send(self);
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

void on_step_result(Self* self, uint64_t id, StepResult r);

/// Sends the step `plan` describes to the executors. With a step in flight (async scheduling), a sequence that
/// samples there and runs on here goes with its newest token deferred: the executor fills it in.
void dispatch(Self* self, StepPlan plan) {
  auto& st = self->state;
  auto batch = std::make_shared<StepBatch>();
  StepMsg msg;
  batch->copies = plan.copies;
  // Sequences that ended after planning lose their chunks (their blocks were freed after the plan); a chunk that
  // was to read prefix blocks one of those computes them itself.
  std::unordered_set<SeqId> ended;
  for (const PlannedChunk& c : plan.chunks)
    if (!st.seqs.contains(c.id)) ended.insert(c.id);
  if (!ended.empty()) plan.chunks = drop_ended_chunks(std::move(plan.chunks), ended, st.setup.block_size);
  const uint64_t step_id = st.steps_sent + 1;
  bool deferred = false;
  for (PlannedChunk& c : plan.chunks) {
    SeqData& s = st.seqs.at(c.id);
    RequestData& r = st.requests.at(s.request);
    SeqChunk chunk;
    chunk.seq = s.id;
    chunk.start_pos = c.start_pos;
    chunk.lora = r.spec.params->lora;
    const auto& prompt = *r.spec.prompt;
    const int known = static_cast<int>(prompt.size() + s.output->size());
    // Past the known tokens: the drafts the plan kept (speculation), or else the newest token, which the step in
    // flight samples (the plan counted it) and the executor fills in.
    const int past = std::max(0, c.start_pos + c.num_tokens - known);
    if (!s.drafts.empty()) {
      s.drafts.resize(static_cast<size_t>(past));
      chunk.num_drafts = past;
    }
    for (int p = c.start_pos; p < c.start_pos + c.num_tokens; ++p)
      chunk.tokens.push_back(p < known || chunk.num_drafts > 0 ? st.token_at(s, p) : -1);
    chunk.last_token_deferred = past > 0 && chunk.num_drafts == 0;
    deferred = deferred || chunk.last_token_deferred;
    chunk.block_table = std::move(c.block_table);
    chunk.group_tables = std::move(c.group_tables);
    if (r.scoring_prompt() && c.start_pos < r.prompt_scored_until) {
      // The chunk's positions below the prompt's last score the prompt token after each: from its first (a chunk
      // recomputed after a preemption scores some again; the request actor keeps the first score of each).
      const int end = c.start_pos + c.num_tokens, scored_end = std::min(end, static_cast<int>(prompt.size()) - 1);
      if (scored_end >= r.prompt_scored_until) {
        chunk.prompt_logprobs.count = scored_end - c.start_pos;
        chunk.prompt_logprobs.num_top = *r.spec.params->prompt_logprobs;
        if (scored_end == end) chunk.prompt_logprobs.next_token = prompt[end];
        r.prompt_scored_until = scored_end + 1;
      }
    }
    if (c.start_pos < static_cast<int>(prompt.size()))
      st.setup.metrics.add(&Metrics::prompt_tokens_computed,
                           std::min<int>(c.start_pos + c.num_tokens, static_cast<int>(prompt.size())) - c.start_pos);
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
      if (s.constraint) {
        // The runner fills the mask while the step runs, from a copy as the constraint stands now: the sequence's
        // own takes the tokens of the step before when they come, maybe while this one runs. A token of that step
        // still in flight is the samples' pending_output, which the mask takes first.
        auto snapshot = std::make_shared<const constraint::TokenConstraint>(*s.constraint);
        for (SampleSpec& spec : chunk.samples) spec.mask_source = snapshot.get();
        msg.keep_alive.push_back(std::move(snapshot));
      }
      ++s.pending;
      s.output_read_by = step_id;
      msg.keep_alive.push_back(s.output);
      msg.keep_alive.push_back(r.spec.prompt);
      msg.keep_alive.push_back(r.spec.params);
    }
    batch->seqs.push_back(std::move(chunk));
  }
  if (batch->seqs.empty()) {
    kick(self);
    return;
  }
  SchedulerState::InFlight& step = st.in_flight.emplace_back();
  step.id = st.steps_sent = step_id;
  for (const SeqChunk& c : batch->seqs) {
    step.ends.emplace_back(c.seq, c.start_pos + static_cast<int>(c.tokens.size()));
    step.tokens += static_cast<int>(c.tokens.size());
  }
  step.kind = step_kind(*batch);
  step.plan_after = st.setup.speculation.enabled() || forks_on_result(st, plan);
  step.sent = std::chrono::steady_clock::now();
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
  batch->finished = std::move(st.finished_since_step);
  st.finished_since_step.clear();
  msg.batch = batch;
  st.setup.metrics.add(&Metrics::steps, 1);
  if (deferred) st.setup.metrics.add(&Metrics::steps_deferred, 1);
  st.setup.metrics.total().iteration_tokens.observe(step.tokens);
  for (const caf::actor& ex : st.setup.executors)
    self->request(ex, caf::infinite, step_atom::value, msg)
        .then([self, step_id](StepResult& r) { on_step_result(self, step_id, std::move(r)); },
              [self](caf::error& err) {
                self->quit(err);  // an executor failed: the engine cannot continue
              });
  // Plan step N+1 while step N runs; with two steps in flight, after the older one's results.
  if (!step.plan_after && st.in_flight.size() == 1) request_plan(self);
}

/// One executor's reply to step `id`. Each executor answers its steps in order, so once all replied to the oldest
/// step in flight, that one's results are handled; then the plan waiting for it is sent, or the next one planned.
void on_step_result(Self* self, uint64_t id, StepResult r) {
  auto& st = self->state;
  auto it = std::find_if(st.in_flight.begin(), st.in_flight.end(),
                         [id](const SchedulerState::InFlight& f) { return f.id == id; });
  if (it == st.in_flight.end()) return;
  it->partial_results.push_back(std::move(r));
  while (!st.in_flight.empty() && st.in_flight.front().partial_results.size() == st.setup.executors.size()) {
    SchedulerState::InFlight step = std::move(st.in_flight.front());
    st.in_flight.pop_front();
    StepResult merged;
    for (auto& p : step.partial_results)
      if (!p.seqs.empty() || !p.prompt_logprobs.empty()) merged = std::move(p);  // rank 0 samples
    st.steps_done = step.id;
    // A step's own time: from when it was sent, or from the results of the step ahead of it if those came later.
    const auto now = std::chrono::steady_clock::now();
    const int64_t wall_us =
        std::chrono::duration_cast<std::chrono::microseconds>(now - std::max(step.sent, st.last_result)).count();
    st.last_result = now;
    st.setup.metrics.add(&Metrics::step_time_us, wall_us);
    st.setup.metrics.add(&Metrics::graphs_captured, merged.cost.graphs_captured);
    st.setup.metrics.add(&Metrics::graph_capture_us, merged.cost.graph_capture_us);
    st.setup.metrics.total().step_profile.add(step.kind, step.tokens, wall_us, merged.cost);
    handle_results(self, step, merged);
    publish_queue_metrics(self);
    if (st.next_plan) {
      auto p = std::move(*st.next_plan);
      st.next_plan.reset();
      dispatch(self, std::move(p));
    } else if (!st.in_flight.empty()) {
      if (!st.in_flight.front().plan_after && !st.plan_requested) request_plan(self);  // the step after the one running
    } else {
      kick(self);
    }
  }
}

void apply_plan(Self* self, StepPlan& plan) {
  auto& st = self->state;
  for (SeqId id : plan.preempted_recompute) {
    auto it = st.seqs.find(id);
    if (it == st.seqs.end()) continue;
    it->second.phase = PlanSeq::Phase::waiting;
    it->second.num_planned = 0;
    it->second.num_reported = 0;
    st.setup.metrics.add(&Metrics::preemptions, 1);
  }
  for (SeqId id : plan.preempted_swap) {
    auto it = st.seqs.find(id);
    if (it == st.seqs.end()) continue;
    it->second.phase = PlanSeq::Phase::swapped;
    // The memory manager drops `computed` reports for a swapped sequence, and one may be in flight now (sent for
    // the step that ran while this plan was made): after the swap-in, report from position 0 again rather than
    // from a block the manager never registered.
    it->second.num_reported = 0;
    st.setup.metrics.add(&Metrics::preemptions, 1);
  }
  // A request, not a send: the executor replies `true`, and a reply the scheduler has no handler for comes back
  // to the executor as an unexpected_message error, whose default handler makes the executor quit (the engine
  // then stalls at its next step). Mailbox order still puts the copy before the next step.
  if (!plan.disk_writes.empty())  // before the demotions overwrite the host blocks they save
    for (const caf::actor& ex : st.setup.executors)
      self->request(ex, caf::infinite, disk_write_atom::value, plan.disk_writes).then([](bool) {});
  if (!plan.swap_out.empty())
    for (const caf::actor& ex : st.setup.executors)
      self->request(ex, caf::infinite, swap_out_atom::value, plan.swap_out).then([](bool) {});
  for (const auto& [id, cached] : plan.admitted) {
    auto it = st.seqs.find(id);
    if (it == st.seqs.end()) continue;
    RequestData& r = st.requests.at(it->second.request);
    if (!r.scheduled) {
      r.scheduled = true;
      self->send(r.spec.client, scheduled_atom::value, cached);
    }
    it->second.phase = PlanSeq::Phase::running;
    it->second.num_planned = cached;
    it->second.num_reported = cached;
  }
  for (const PlannedChunk& c : plan.chunks) {
    auto it = st.seqs.find(c.id);
    if (it != st.seqs.end()) it->second.num_planned = c.start_pos + c.num_tokens;
  }
  for (SeqId id : plan.rejected) {
    auto it = st.seqs.find(id);
    if (it == st.seqs.end()) continue;
    const uint64_t rid = it->second.request;
    auto& r = st.requests.at(rid);
    self->send(r.spec.client, cancel_atom::value, std::string("the request needs more KV-cache blocks than exist"),
               false);
    auto ids = r.seqs;
    r.seqs.clear();
    free_seqs(self, ids);
    finish_request_if_done(self, rid);
  }
  if (!plan.swap_in.empty()) {  // swapped sequences (runnable once every executor acked) and CPU-tier promotions
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
  if (!plan.disk_loads.empty()) send_disk_loads(self, plan.disk_loads);
}

// Sends the plan's disk loads to every executor; once all answered, the memory manager learns which keys loaded on
// every rank, and the next plan finds those blocks in the CPU tier.
void send_disk_loads(Self* self, const std::vector<DiskOrder>& loads) {
  auto& st = self->state;
  struct Answers {
    size_t remaining = 0;
    std::vector<uint64_t> keys;
    std::vector<int> ok_on;  // per load: the ranks that loaded it
  };
  auto answers = std::make_shared<Answers>();
  answers->remaining = st.setup.executors.size();
  for (const DiskOrder& o : loads) answers->keys.push_back(o.key);
  answers->ok_on.assign(loads.size(), 0);
  for (const caf::actor& ex : st.setup.executors)
    self->request(ex, caf::infinite, disk_load_atom::value, loads).then([self, answers](const std::vector<uint64_t>& ok) {
      for (size_t i = 0; i < answers->keys.size(); ++i)
        answers->ok_on[i] += std::find(ok.begin(), ok.end(), answers->keys[i]) != ok.end();
      if (--answers->remaining > 0) return;
      std::vector<uint64_t> loaded, failed;
      const int ranks = static_cast<int>(self->state.setup.executors.size());
      for (size_t i = 0; i < answers->keys.size(); ++i)
        (answers->ok_on[i] == ranks ? loaded : failed).push_back(answers->keys[i]);
      self->send(self->state.setup.memory_manager, loaded_atom::value, loaded, failed);
      kick(self);
    });
}

/// Speculative decoding: the drafts sequence `s` proposes for the next step, as many as its length limits leave;
/// none while it prefills or has a token in flight, nor when it searches beams or has yet to fork its first token.
/// A structured output's mask at each position takes the drafts before it (TokenMaskSource::fill_mask).
std::vector<TokenId> propose_drafts(const SchedulerState& st, const SeqData& s, const RequestData& r) {
  const NgramSpeculation& speculation = st.setup.speculation;
  const int known = static_cast<int>(r.spec.prompt->size() + s.output->size());
  if (!speculation.enabled() || s.phase != PlanSeq::Phase::running || s.pending > 0 || s.num_planned != known - 1 ||
      r.beam || (!r.forked && r.width > 1))
    return {};
  const int most = std::min({speculation.num_speculative_tokens,
                             r.spec.params->max_tokens - static_cast<int>(s.output->size()) - 1,
                             st.setup.max_model_len - known - 1});
  return most > 0 ? propose_ngram_drafts(st.all_tokens(s), speculation, most) : std::vector<TokenId>{};
}

void request_plan(Self* self) {
  auto& st = self->state;
  std::vector<PlanSeq> view;
  // Drafts only where the step can sample them: a full batch leaves no position for them (and no time is spent
  // looking for them in every sequence's tokens).
  bool room_for_drafts = st.setup.speculation.enabled();
  if (room_for_drafts) {
    int running = 0;
    for (const auto& [id, s] : st.seqs) running += s.phase == PlanSeq::Phase::running;
    const int positions = st.setup.limits.max_sampled_positions > 0 ? st.setup.limits.max_sampled_positions
                                                                     : st.setup.limits.max_num_seqs;
    room_for_drafts = running < positions;
  }
  for (auto& [id, s] : st.seqs) {
    s.drafts.clear();
    if (s.swapping_in) continue;
    const RequestData& r = st.requests.at(s.request);
    PlanSeq p;
    p.id = id;
    p.arrival = r.arrival;
    p.whole_request = r.beam;
    p.salt = r.spec.params->cache_salt;
    p.lora = r.spec.params->lora;
    p.priority = r.spec.params->priority;
    p.phase = s.phase;
    p.num_computed = s.num_planned;
    p.num_tokens = static_cast<int>(r.spec.prompt->size() + s.output->size()) + s.pending;
    p.last_token_in_flight = s.pending > 0 && reaches_length_limit(st, r, s.output->size() + s.pending);
    if (room_for_drafts) s.drafts = propose_drafts(st, s, r);
    p.num_drafts = static_cast<int>(s.drafts.size());
    p.num_tokens += p.num_drafts;
    if (s.phase == PlanSeq::Phase::waiting) {
      if (s.pending) continue;  // preempted while its last token is in flight: admit it next time
      if (!r.scoring_prompt())  // else none: no prefix-cache lookup
        p.tokens =
            s.output->empty() ? r.spec.prompt : std::make_shared<const std::vector<TokenId>>(st.all_tokens(s));
    }
    view.push_back(std::move(p));
  }
  if (view.empty()) return;
  st.plan_requested = true;
  self->request(st.setup.memory_manager, caf::infinite, plan_atom::value, std::move(view), st.setup.limits)
      .then([self](StepPlan& plan) {
        auto& s = self->state;
        s.plan_requested = false;
        const bool stale = std::exchange(s.plan_stale, false);
        apply_plan(self, plan);
        publish_queue_metrics(self);
        const bool defer = s.setup.async_scheduling && s.setup.executors.size() == 1 && s.in_flight.size() == 1 &&
                           !s.in_flight.front().plan_after;
        if (!s.in_flight.empty() && !(defer && !plan.chunks.empty())) {
          s.next_plan = std::move(plan);
        } else if (!plan.chunks.empty()) {
          dispatch(self, std::move(plan));
        } else if (!plan.preempted_swap.empty() || !plan.preempted_recompute.empty() || !plan.rejected.empty() ||
                   stale) {
          // The plan only freed memory, or came from a view older than a swap-in, disk load or request that
          // finished meanwhile: plan again at once, it can run something now.
          request_plan(self);
        }
        // Otherwise nothing can run: wait for a swap-in to finish, a new request or an abort (each kicks).
      });
}

void kick(Self* self) {
  auto& st = self->state;
  if (!st.in_flight.empty() || st.next_plan) return;  // a step's results plan the next
  if (st.plan_requested) {
    st.plan_stale = true;  // the plan on its way may find nothing to run: its reply plans again
    return;
  }
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
        const auto add_seq = [&](int index, std::vector<TokenId> output, double cumulative_logprob) {
          SeqData s;
          s.id = st.next_seq++;
          s.request = spec.id;
          s.index = index;
          *s.output = std::move(output);
          if (spec.constraint) {
            s.constraint = std::make_shared<constraint::TokenConstraint>(*spec.constraint);
            for (TokenId id : *s.output) s.constraint->accept(id);
          }
          s.cumulative_logprob = cumulative_logprob;
          r.seqs.push_back(s.id);
          st.seqs.emplace(s.id, std::move(s));
        };
        if (spec.resume.empty()) {
          add_seq(0, {}, 0.0);
          st.setup.metrics.add(&Metrics::prompt_tokens, static_cast<int64_t>(spec.prompt->size()));
          st.setup.metrics.total().unqueued_requests -= 1;  // Engine::submit counted it until it got here
        } else {
          // Moved from a lost replica: its completions go on from what their client has, prefilled here like a
          // sequence preempted for recompute. They exist already: no fork at the next sample.
          for (const ResumedSeq& seq : spec.resume) add_seq(seq.index, seq.output, seq.cumulative_logprob);
          r.forked = true;
          r.next_index = r.width;
        }
        st.requests.emplace(spec.id, std::move(r));
        publish_queue_metrics(self);
        kick(self);
      },
      [self](abort_atom, uint64_t rid, const std::string& reason) {
        auto& st = self->state;
        auto it = st.requests.find(rid);
        if (it == st.requests.end()) return;
        self->send(it->second.spec.client, cancel_atom::value, reason, !reason.empty());
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
  ReplicaMetricsWriter metrics = setup.metrics;
  caf::actor scheduler = system.spawn(scheduler_actor, std::move(setup));
  scheduler->attach_functor([metrics](const caf::error&) mutable {
    metrics.clear({&Metrics::waiting_requests, &Metrics::running_requests, &Metrics::swapped_requests,
                   &Metrics::running_seqs});
    metrics.set_lora_use({}, {});
  });
  return scheduler;
}

}  // namespace paged
