#include "model/scheduling/scheduler_policy.h"

#include <algorithm>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace paged {

namespace {

// plan_step without the CPU tier's copy orders.
StepPlan plan_queues(KvCacheManager& kv, const std::vector<PlanSeq>& seqs, const PlanLimits& limits) {
  StepPlan plan;
  std::vector<const PlanSeq*> running, swapped, waiting;
  for (const PlanSeq& s : seqs) {
    auto& q = s.phase == PlanSeq::Phase::running ? running : s.phase == PlanSeq::Phase::swapped ? swapped : waiting;
    q.push_back(&s);
  }
  auto older = [](const PlanSeq* a, const PlanSeq* b) {
    return std::tie(a->priority, a->arrival, a->id) < std::tie(b->priority, b->arrival, b->id);
  };
  std::sort(running.begin(), running.end(), older);
  std::sort(swapped.begin(), swapped.end(), older);
  std::sort(waiting.begin(), waiting.end(), older);

  int budget = limits.max_num_batched_tokens;
  // What one sequence may compute in this step, `left` of the budget remaining.
  const auto chunk_limit = [&](int left) {
    return limits.long_prefill_token_threshold > 0 ? std::min(left, limits.long_prefill_token_threshold) : left;
  };
  auto schedule = [&](const PlanSeq& s, int start, int n) {
    PlannedChunk& c = plan.chunks.emplace_back(
        PlannedChunk{s.id, start, n, start + n >= s.num_tokens - s.num_drafts, kv.block_table(s.id), {}});
    for (int g = 1; g < kv.num_groups(); ++g) c.group_tables.push_back(kv.block_table(s.id, g));
    budget -= n;
  };

  // A unit: the sequences that go as one. running[i, unit_end(running, i, n)) (sorted, so a request's are adjacent).
  const auto unit_end = [](const std::vector<const PlanSeq*>& q, size_t i, size_t n) {
    size_t e = i + 1;
    while (e < n && q[i]->whole_request && q[e]->arrival == q[i]->arrival) ++e;
    return e;
  };

  // 1. Running units, oldest first; victims are taken from the newest end.
  size_t end = running.size();  // running[end..] were preempted
  bool preempted = false;
  const auto preempt_newest = [&] {
    size_t first = end - 1;
    while (first > 0 && unit_end(running, first - 1, end) == end) --first;
    preempted = true;
    std::vector<SeqId> swap;
    for (size_t v = first; v < end; ++v) {
      // A victim whose token in flight ends it is freed: a swap-out would copy blocks that are never swapped back in.
      if (limits.preemption == PreemptionMode::swap && !running[v]->last_token_in_flight) {
        swap.push_back(running[v]->id);
      } else {
        kv.free(running[v]->id);
        plan.preempted_recompute.push_back(running[v]->id);
      }
    }
    end = first;
    if (swap.empty()) return;
    if (auto pairs = kv.swap_out(swap)) {
      plan.swap_out.insert(plan.swap_out.end(), pairs->begin(), pairs->end());
      plan.preempted_swap.insert(plan.preempted_swap.end(), swap.begin(), swap.end());
      return;
    }
    for (SeqId id : swap) kv.free(id);
    plan.preempted_recompute.insert(plan.preempted_recompute.end(), swap.begin(), swap.end());
  };
  for (size_t i = 0; i < end;) {
    // Forks (n > 1, beam search) can run more sequences than max_num_seqs: a step takes the oldest that many, the
    // others keep their blocks and run in a later step.
    if (static_cast<int>(plan.chunks.size()) >= limits.max_num_seqs) break;
    const size_t next = unit_end(running, i, end);
    std::vector<KvCacheManager::Reservation> work;
    std::vector<const PlanSeq*> workers;
    int left = budget;
    for (size_t k = i; k < next && static_cast<int>(plan.chunks.size() + work.size()) < limits.max_num_seqs; ++k) {
      const PlanSeq& s = *running[k];
      const int n = std::min(s.num_tokens - s.num_computed, chunk_limit(left));
      if (n <= 0) continue;  // out of budget this step (or nothing to do)
      work.push_back({s.id, s.num_computed, s.num_computed + n});
      workers.push_back(&s);
      left -= n;
    }
    // Drafts go first: no sequence is preempted for a guess. Then the newest units, possibly this one (end == i).
    bool drafts_dropped = false;
    while (end > i && !kv.can_reserve_all(work)) {
      if (!std::exchange(drafts_dropped, true)) {
        for (size_t w = 0; w < work.size(); ++w)
          work[w].num_tokens_to_hold = std::min(work[w].num_tokens_to_hold,
                                                std::max(work[w].first_write_pos + 1,
                                                         workers[w]->num_tokens - workers[w]->num_drafts));
        continue;
      }
      preempt_newest();
    }
    if (end <= i) break;
    for (size_t w = 0; w < work.size(); ++w) {
      std::vector<BlockPair> copies;
      kv.reserve(work[w].seq, work[w].first_write_pos, work[w].num_tokens_to_hold, copies);
      plan.copies.insert(plan.copies.end(), copies.begin(), copies.end());
      schedule(*workers[w], work[w].first_write_pos, work[w].num_tokens_to_hold - work[w].first_write_pos);
    }
    i = next;
  }
  int active = static_cast<int>(end);
  if (preempted) return plan;
  // The adapters of the running sequences; one more may join while they are fewer than max_loras.
  std::unordered_set<int32_t> loras;
  for (size_t i = 0; i < end; ++i)
    if (running[i]->lora != 0) loras.insert(running[i]->lora);
  const auto lora_fits = [&](const PlanSeq& s) {
    return s.lora == 0 || limits.max_loras <= 0 || loras.count(s.lora) ||
           static_cast<int>(loras.size()) < limits.max_loras;
  };

  // 2. Swapped units come back before any new admission.
  for (size_t i = 0; i < swapped.size();) {
    const size_t next = unit_end(swapped, i, swapped.size());
    std::vector<SeqId> ids;
    for (size_t k = i; k < next; ++k) ids.push_back(swapped[k]->id);
    if (active >= limits.max_num_seqs || !lora_fits(*swapped[i]) || !kv.can_swap_in(ids)) return plan;
    auto pairs = kv.swap_in(ids);
    if (!pairs) return plan;
    plan.swap_in.insert(plan.swap_in.end(), pairs->begin(), pairs->end());
    plan.swapping_in.insert(plan.swapping_in.end(), ids.begin(), ids.end());
    active += static_cast<int>(ids.size());
    if (swapped[i]->lora != 0) loras.insert(swapped[i]->lora);
    i = next;
  }
  if (!swapped.empty()) return plan;

  // 3. Waiting sequences, FCFS.
  for (const PlanSeq* s : waiting) {
    if (active >= limits.max_num_seqs || budget <= 0 || !lora_fits(*s)) break;
    if (!kv.could_ever_allocate(s->num_tokens, limits.max_num_batched_tokens)) {
      plan.rejected.push_back(s->id);
      continue;
    }
    const std::span<const TokenId> tokens = s->token_span();
    if (kv.load_from_disk(tokens, s->salt)) return plan;  // FCFS: it waits for its blocks from disk
    const std::optional<KvCacheManager::Admission> admitted =
        kv.admit(s->id, tokens, s->num_tokens, chunk_limit(budget), s->salt);
    if (!admitted) break;
    kv.register_planned(s->id, tokens, admitted->held);  // the sequences admitted after it share its full blocks
    plan.admitted.emplace_back(s->id, admitted->cached);
    schedule(*s, admitted->cached, admitted->held - admitted->cached);  // the tables hold `held` tokens
    ++active;
    if (s->lora != 0) loras.insert(s->lora);
  }

  // 4. Nothing moves: a whole request split between running and waiting waits for itself.
  if (!plan.chunks.empty() || !plan.admitted.empty() || !plan.rejected.empty()) return plan;
  for (size_t i = end; i-- > 0;) {
    const uint64_t arrival = running[i]->arrival;
    if (!running[i]->whole_request ||
        std::none_of(waiting.begin(), waiting.end(), [&](const PlanSeq* w) { return w->arrival == arrival; }))
      continue;
    for (size_t k = i + 1; k-- > 0 && running[k]->arrival == arrival;) {
      kv.free(running[k]->id);
      plan.preempted_recompute.push_back(running[k]->id);
    }
    break;
  }
  return plan;
}

// Drops drafts from the newest chunks of `plan` until it samples at most max_sampled_positions positions.
void limit_sampled_positions(StepPlan& plan, const std::vector<PlanSeq>& seqs, const PlanLimits& limits) {
  std::unordered_map<SeqId, const PlanSeq*> by_id;
  for (const PlanSeq& s : seqs)
    if (s.num_drafts > 0) by_id.emplace(s.id, &s);
  if (by_id.empty()) return;
  // The drafts chunk c computes: its positions past the sequence's known tokens.
  const auto drafts_in = [&](const PlannedChunk& c) {
    auto it = by_id.find(c.id);
    return it == by_id.end() ? 0
                             : std::max(0, c.start_pos + c.num_tokens - (it->second->num_tokens - it->second->num_drafts));
  };
  const int most = limits.max_sampled_positions > 0 ? limits.max_sampled_positions : limits.max_num_seqs;
  int positions = 0;
  for (const PlannedChunk& c : plan.chunks) positions += c.sample ? 1 + drafts_in(c) : 0;
  for (size_t i = plan.chunks.size(); i-- > 0 && positions > most;) {
    PlannedChunk& c = plan.chunks[i];
    const int cut = std::min(drafts_in(c), positions - most);
    c.num_tokens -= cut;
    positions -= cut;
  }
}

}  // namespace

StepPlan plan_step(KvCacheManager& kv, const std::vector<PlanSeq>& seqs, const PlanLimits& limits) {
  StepPlan plan = plan_queues(kv, seqs, limits);
  limit_sampled_positions(plan, seqs, limits);
  // Demotions go with the swap-outs, which executors run before the swap-ins (promotions may write their device
  // blocks) and before the step (which may overwrite them); promotions go with the swap-ins, before the step reads.
  KvCacheManager::TierCopies tier = kv.take_tier_copies();
  plan.swap_out.insert(plan.swap_out.end(), tier.demotions.begin(), tier.demotions.end());
  plan.swap_in.insert(plan.swap_in.end(), tier.promotions.begin(), tier.promotions.end());
  plan.disk_writes = std::move(tier.disk_writes);
  plan.disk_loads = std::move(tier.disk_loads);
  return plan;
}

std::vector<PlannedChunk> drop_ended_chunks(std::vector<PlannedChunk> chunks, const std::unordered_set<SeqId>& ended,
                                            int block_size) {
  const auto blocks_for = [&](int tokens) { return (tokens + block_size - 1) / block_size; };
  // Calls f(table) for each of the chunk's KV groups' tables.
  const auto each_table = [](PlannedChunk& c, auto&& f) {
    f(c.block_table);
    for (auto& t : c.group_tables) f(t);
  };
  std::unordered_set<int32_t> unwritten;  // blocks that a dropped chunk would have written and no kept one writes
  // Calls f(block) for the entries [first, end) that `table` has: those a chunk writes.
  const auto writes = [&](const std::vector<int32_t>& table, int first, int end, auto&& f) {
    for (int i = first; i < std::min(end, static_cast<int>(table.size())); ++i) f(table[i]);
  };
  for (PlannedChunk& c : chunks) {
    if (!ended.contains(c.id)) continue;
    const int first = c.start_pos / block_size, end = blocks_for(c.start_pos + c.num_tokens);
    each_table(c, [&](const std::vector<int32_t>& t) { writes(t, first, end, [&](int32_t b) { unwritten.insert(b); }); });
  }
  std::vector<PlannedChunk> kept;
  kept.reserve(chunks.size());
  for (PlannedChunk& c : chunks) {
    if (ended.contains(c.id)) continue;
    if (!unwritten.empty()) {
      int restart = c.start_pos / block_size;  // the first block before its start that it reads as computed and no
                                               // kept chunk writes: it computes from there
      each_table(c, [&](const std::vector<int32_t>& t) {
        for (int i = 0; i < std::min(restart, static_cast<int>(t.size())); ++i)
          if (unwritten.contains(t[i])) restart = i;
      });
      if (restart < c.start_pos / block_size) {
        c.num_tokens += c.start_pos - restart * block_size;
        c.start_pos = restart * block_size;
      }
      const int first = c.start_pos / block_size, end = blocks_for(c.start_pos + c.num_tokens);
      each_table(c, [&](const std::vector<int32_t>& t) { writes(t, first, end, [&](int32_t b) { unwritten.erase(b); }); });
    }
    kept.push_back(std::move(c));
  }
  return kept;
}

}  // namespace paged
