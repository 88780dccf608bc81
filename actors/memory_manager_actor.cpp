#include "actors/actors.h"

namespace paged {

namespace {

struct MemoryManagerState {
  std::unique_ptr<KvCacheManager> kv;
  ReplicaMetricsWriter metrics;
  KvMetrics published;  // the manager's running totals as last added to the counters

  void publish() {
    const KvMetrics m = kv->metrics();
    metrics.set(&Metrics::kv_blocks_total, m.device_total);
    metrics.set(&Metrics::kv_blocks_free, m.device_free);
    metrics.set(&Metrics::kv_blocks_cached, m.device_cached);
    metrics.set(&Metrics::cpu_blocks_total, m.cpu_total);
    metrics.set(&Metrics::cpu_blocks_free, m.cpu_free);
    metrics.set(&Metrics::offload_blocks_total, m.offload_total);
    metrics.set(&Metrics::offload_blocks_cached, m.offload_cached);
    metrics.add(&Metrics::offload_query_tokens, m.offload_query_tokens - published.offload_query_tokens);
    metrics.add(&Metrics::offload_hit_tokens, m.offload_hit_tokens - published.offload_hit_tokens);
    metrics.add(&Metrics::offloaded_blocks, m.offloaded_blocks - published.offloaded_blocks);
    metrics.set(&Metrics::disk_blocks_total, m.disk_total);
    metrics.set(&Metrics::disk_blocks_stored, m.disk_stored);
    metrics.add(&Metrics::disk_query_tokens, m.disk_query_tokens - published.disk_query_tokens);
    metrics.add(&Metrics::disk_hit_tokens, m.disk_hit_tokens - published.disk_hit_tokens);
    metrics.add(&Metrics::disk_saved_blocks, m.disk_saved_blocks - published.disk_saved_blocks);
    metrics.add(&Metrics::swapped_out_blocks, m.swapped_out_blocks - published.swapped_out_blocks);
    metrics.add(&Metrics::swapped_in_blocks, m.swapped_in_blocks - published.swapped_in_blocks);
    metrics.add(&Metrics::prefix_cache_hit_tokens, m.prefix_hit_tokens - published.prefix_hit_tokens);
    metrics.add(&Metrics::evicted_blocks, m.evicted_blocks - published.evicted_blocks);
    published = m;
    metrics.raise_peak(&Metrics::kv_blocks_peak_used,
                       [](const Metrics& x) -> int64_t { return x.kv_blocks_total - x.kv_blocks_free; });
  }
};

}  // namespace

MemoryManager::behavior_type memory_manager_actor(MemoryManager::pointer self, KvCacheOptions options,
                                                  ReplicaMetricsWriter metrics) {
  auto st = std::make_shared<MemoryManagerState>(
      MemoryManagerState{std::make_unique<KvCacheManager>(options), metrics, KvMetrics{}});
  st->publish();
  self->attach_functor([metrics](const caf::error&) mutable {
    metrics.clear({&Metrics::kv_blocks_total, &Metrics::kv_blocks_free, &Metrics::kv_blocks_cached,
                   &Metrics::cpu_blocks_total, &Metrics::cpu_blocks_free, &Metrics::offload_blocks_total,
                   &Metrics::offload_blocks_cached, &Metrics::disk_blocks_total, &Metrics::disk_blocks_stored});
  });
  return {
      [st](plan_atom, const std::vector<PlanSeq>& seqs, const PlanLimits& limits) -> StepPlan {
        StepPlan plan = plan_step(*st->kv, seqs, limits);
        st->publish();
        const KvMetrics m = st->kv->metrics();
        st->metrics.add(&Metrics::kv_reserved_slots_sum, m.reserved_slots);
        st->metrics.add(&Metrics::kv_used_slots_sum, m.used_slots);
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
      [st](loaded_atom, const std::vector<uint64_t>& ok, const std::vector<uint64_t>& failed) {
        for (uint64_t key : ok) st->kv->finish_load(key, true);
        for (uint64_t key : failed) st->kv->finish_load(key, false);
        st->publish();
      },
      [](drained_atom) { return true; },
      [st](kv_snapshot_atom) { return st->kv->snapshot(); },
  };
}

void collect_kv_snapshots(caf::actor_system& system, std::vector<MemoryManager> managers,
                          std::function<void(std::vector<std::optional<KvSnapshot>>)> done,
                          std::chrono::milliseconds timeout) {
  if (managers.empty()) {
    done({});
    return;
  }
  system.spawn([managers = std::move(managers), done = std::move(done), timeout](caf::event_based_actor* self) {
    struct Pending {
      std::vector<std::optional<KvSnapshot>> answers;
      size_t left = 0;
    };
    auto pending = std::make_shared<Pending>(Pending{std::vector<std::optional<KvSnapshot>>(managers.size()),
                                                     managers.size()});
    auto answered = [self, pending, done] {
      if (--pending->left > 0) return;
      done(std::move(pending->answers));
      self->quit();
    };
    for (size_t i = 0; i < managers.size(); ++i)
      self->request(managers[i], timeout, kv_snapshot_atom::value)
          .then([pending, answered, i](KvSnapshot& snap) {
            pending->answers[i] = std::move(snap);
            answered();
          }, [answered](caf::error&) { answered(); });
  });
}

}  // namespace paged
