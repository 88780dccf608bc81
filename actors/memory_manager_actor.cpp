#include "actors/actors.h"

namespace paged {

namespace {

struct MemoryManagerState {
  std::unique_ptr<KvCacheManager> kv;
  Metrics* metrics = nullptr;

  void publish() {
    const KvMetrics m = kv->metrics();
    metrics->kv_blocks_total = m.device_total;
    metrics->kv_blocks_free = m.device_free;
    metrics->kv_blocks_cached = m.device_cached;
    metrics->cpu_blocks_total = m.cpu_total;
    metrics->cpu_blocks_free = m.cpu_free;
    metrics->swapped_out_blocks = m.swapped_out_blocks;
    metrics->swapped_in_blocks = m.swapped_in_blocks;
    metrics->prefix_cache_hit_tokens = m.prefix_hit_tokens;
    metrics->evicted_blocks = m.evicted_blocks;
    const int64_t used = m.device_total - m.device_free;
    if (used > metrics->kv_blocks_peak_used) metrics->kv_blocks_peak_used = used;  // the only writer
  }
};

}  // namespace

MemoryManager::behavior_type memory_manager_actor(KvCacheOptions options, Metrics* metrics) {
  auto st = std::make_shared<MemoryManagerState>();
  st->kv = std::make_unique<KvCacheManager>(options);
  st->metrics = metrics;
  st->publish();
  return {
      [st](plan_atom, const std::vector<PlanSeq>& seqs, const PlanLimits& limits) -> StepPlan {
        StepPlan plan = plan_step(*st->kv, seqs, limits);
        st->publish();
        const KvMetrics m = st->kv->metrics();
        st->metrics->kv_reserved_slots_sum += m.reserved_slots;
        st->metrics->kv_used_slots_sum += m.used_slots;
        return plan;
      },
      [st](free_atom, const std::vector<SeqId>& ids) {
        for (SeqId id : ids) st->kv->free(id);
        st->publish();
      },
      [st](fork_atom, SeqId parent, SeqId child) {
        st->kv->fork(parent, child);
        st->publish();
      },
      [st](computed_atom, const std::vector<ComputedKv>& reports) {
        // A sequence may have been preempted or freed since the scheduler sent this.
        for (const ComputedKv& r : reports)
          if (st->kv->contains(r.seq) && !st->kv->is_swapped(r.seq) && r.num_computed > st->kv->num_computed(r.seq))
            st->kv->mark_computed(r.seq, r.tokens, r.num_computed, r.tokens_offset);
      },
      [](drained_atom) { return true; },
  };
}

}  // namespace paged
