#include "model/scheduling/scheduler_policy.h"

#include <algorithm>

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
  auto older = [](const PlanSeq* a, const PlanSeq* b) { return a->arrival < b->arrival || (a->arrival == b->arrival && a->id < b->id); };
  std::sort(running.begin(), running.end(), older);
  std::sort(swapped.begin(), swapped.end(), older);
  std::sort(waiting.begin(), waiting.end(), older);

  int budget = limits.max_num_batched_tokens;
  auto schedule = [&](const PlanSeq& s, int start, int n) {
    PlannedChunk& c =
        plan.chunks.emplace_back(PlannedChunk{s.id, start, n, start + n == s.num_tokens, kv.block_table(s.id), {}});
    for (int g = 1; g < kv.num_groups(); ++g) c.group_tables.push_back(kv.block_table(s.id, g));
    budget -= n;
  };

  // 1. Running sequences, oldest first; victims are taken from the newest end.
  size_t end = running.size();  // running[end..] were preempted
  bool preempted = false;
  auto preempt = [&](const PlanSeq& victim) {
    preempted = true;
    // A victim whose token in flight ends it is freed: a swap-out would copy blocks that are never swapped back in.
    if (limits.preemption == PreemptionMode::swap && !victim.last_token_in_flight) {
      if (auto pairs = kv.swap_out(victim.id)) {
        plan.swap_out.insert(plan.swap_out.end(), pairs->begin(), pairs->end());
        plan.preempted_swap.push_back(victim.id);
        return;
      }
    }
    kv.free(victim.id);
    plan.preempted_recompute.push_back(victim.id);
  };
  for (size_t i = 0; i < end; ++i) {
    // Forks (n > 1, beam search) can run more sequences than max_num_seqs: a step takes the oldest that many, the
    // others keep their blocks and run in a later step.
    if (static_cast<int>(plan.chunks.size()) >= limits.max_num_seqs) break;
    const PlanSeq& s = *running[i];
    const int remaining = s.num_tokens - s.num_computed;
    const int n = std::min(remaining, budget);
    if (n <= 0) continue;  // out of budget this step (or nothing to do)
    while (!kv.can_reserve(s.id, s.num_computed, s.num_computed + n)) {
      preempt(*running[--end]);
      if (end == i) break;  // s itself was the newest: it is preempted
    }
    if (end == i) break;
    std::vector<BlockPair> copies;
    kv.reserve(s.id, s.num_computed, s.num_computed + n, copies);
    plan.copies.insert(plan.copies.end(), copies.begin(), copies.end());
    schedule(s, s.num_computed, n);
  }
  int active = static_cast<int>(end);
  if (preempted) return plan;

  // 2. Swapped sequences come back before any new admission.
  for (const PlanSeq* s : swapped) {
    if (active >= limits.max_num_seqs || !kv.can_swap_in(s->id)) return plan;
    auto pairs = kv.swap_in(s->id);
    if (!pairs) return plan;
    plan.swap_in.insert(plan.swap_in.end(), pairs->begin(), pairs->end());
    plan.swapping_in.push_back(s->id);
    ++active;
  }
  if (!swapped.empty()) return plan;

  // 3. Waiting sequences, FCFS.
  for (const PlanSeq* s : waiting) {
    if (active >= limits.max_num_seqs || budget <= 0) break;
    if (!kv.could_ever_allocate(s->num_tokens, limits.max_num_batched_tokens)) {
      plan.rejected.push_back(s->id);
      continue;
    }
    const std::span<const TokenId> tokens = s->token_span();
    if (kv.load_from_disk(tokens, s->salt)) break;  // FCFS: it waits for its blocks from disk
    const std::optional<KvCacheManager::Admission> admitted =
        kv.admit(s->id, tokens, s->num_tokens, budget, s->salt);
    if (!admitted) break;
    kv.register_planned(s->id, tokens, admitted->held);  // the sequences admitted after it share its full blocks
    plan.admitted.emplace_back(s->id, admitted->cached);
    schedule(*s, admitted->cached, admitted->held - admitted->cached);  // the tables hold `held` tokens
    ++active;
  }
  return plan;
}

}  // namespace

StepPlan plan_step(KvCacheManager& kv, const std::vector<PlanSeq>& seqs, const PlanLimits& limits) {
  StepPlan plan = plan_queues(kv, seqs, limits);
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
