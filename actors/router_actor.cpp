#include <unordered_map>

#include "actors/actors.h"

namespace paged {

namespace {

struct RoutedRequest {
  size_t replica = 0;
  int64_t weight = 0;
  bool aborted = false;  // an abort went to its scheduler, which may have been gone: it is not moved
};

struct RouterState {
  RouterSetup setup;
  std::vector<ReplicaLoad> loads;                      // available, active requests and tokens; free blocks at use
  std::unordered_map<uint64_t, RoutedRequest> routed;  // requests on a replica, until done
  std::unique_ptr<PrefixAffinity> affinity;
};

using Self = caf::stateful_actor<RouterState>;

void take_out(RouterState& st, std::unordered_map<uint64_t, RoutedRequest>::iterator it) {
  ReplicaLoad& load = st.loads[it->second.replica];
  load.active_requests -= 1;
  load.active_tokens -= it->second.weight;
  st.routed.erase(it);
}

// The replica is no longer served through its scheduler: nothing goes there until it joins again.
void mark_lost(RouterState& st, size_t replica) {
  if (!st.loads[replica].available) return;
  st.loads[replica].available = false;
  st.setup.schedulers[replica] = nullptr;
  st.affinity->forget(replica);
}

// Sends `spec` to a replica (not `exclude`) and answers its scheduler, or an error when none serves.
caf::result<caf::actor> route(Self* self, RequestSpec spec, std::optional<size_t> exclude) {
  auto& st = self->state;
  for (size_t i = 0; i < st.loads.size(); ++i) {
    st.loads[i].free_blocks = st.setup.replica_metrics[i]->kv_blocks_free;
    st.loads[i].total_blocks = st.setup.replica_metrics[i]->kv_blocks_total;
  }
  const std::vector<int> matched = st.affinity->matched_blocks(*spec.prompt, st.loads.size());
  const std::optional<size_t> chosen = choose_replica(st.loads, matched, st.setup.options, exclude);
  if (!chosen) return make_error(caf::sec::runtime_error, "no replica of the model is serving");
  const auto& p = *spec.params;
  const RoutedRequest routed{*chosen, request_weight(spec.prompt->size(), p.max_tokens, std::max({1, p.n, p.best_of}))};
  st.routed[spec.id] = routed;
  st.loads[*chosen].active_requests += 1;
  st.loads[*chosen].active_tokens += routed.weight;
  st.affinity->record(*chosen, *spec.prompt);
  caf::actor scheduler = st.setup.schedulers[*chosen];
  self->send(scheduler, submit_atom::value, std::move(spec));
  return scheduler;
}

caf::behavior router_actor(Self* self, RouterSetup setup) {
  auto& st = self->state;
  st.affinity = std::make_unique<PrefixAffinity>(setup.options);
  st.loads.resize(setup.schedulers.size());
  for (size_t i = 0; i < setup.schedulers.size(); ++i) {
    st.loads[i].available = setup.schedulers[i] != nullptr;
    if (setup.schedulers[i]) self->monitor(setup.schedulers[i]);
  }
  st.setup = std::move(setup);
  self->set_down_handler([self](const caf::down_msg& down) {
    auto& st = self->state;
    for (size_t i = 0; i < st.setup.schedulers.size(); ++i)
      if (st.setup.schedulers[i] && st.setup.schedulers[i].address() == down.source) mark_lost(st, i);
  });
  return {
      [self](submit_atom, RequestSpec& spec) -> caf::result<caf::actor> {
        caf::result<caf::actor> chosen = route(self, std::move(spec), std::nullopt);
        if (chosen.flag == caf::rt_error) self->state.setup.metrics->unqueued_requests -= 1;
        return chosen;
      },
      [self](resume_atom, RequestSpec& spec) -> caf::result<caf::actor> {
        // The request asks because its scheduler ended: that replica is lost even if its down message is not here yet.
        auto& st = self->state;
        std::optional<size_t> from;
        if (auto it = st.routed.find(spec.id); it != st.routed.end()) {
          if (it->second.aborted) {
            take_out(st, it);
            return caf::actor{};  // cancelled: the request ends as such
          }
          from = it->second.replica;
          mark_lost(st, *from);
          take_out(st, it);
        }
        return route(self, std::move(spec), from);
      },
      [self](done_atom, uint64_t id) {
        auto& st = self->state;
        if (auto it = st.routed.find(id); it != st.routed.end()) take_out(st, it);
      },
      [self](abort_atom a, uint64_t id, const std::string& reason) {
        auto& st = self->state;
        auto it = st.routed.find(id);
        if (it == st.routed.end()) return;
        it->second.aborted = true;
        if (const caf::actor& scheduler = st.setup.schedulers[it->second.replica])
          self->send(scheduler, a, id, reason);
      },
      [self](abort_atom a, const std::string& reason) {
        auto& st = self->state;
        for (auto& [id, routed] : st.routed) {
          routed.aborted = true;
          if (const caf::actor& scheduler = st.setup.schedulers[routed.replica]) self->send(scheduler, a, id, reason);
        }
      },
      [self](replica_atom, size_t index, caf::actor& scheduler) {
        auto& st = self->state;
        if (index >= st.loads.size()) return;
        self->monitor(scheduler);
        st.setup.schedulers[index] = std::move(scheduler);
        st.loads[index].available = true;
        st.affinity->forget(index);  // a rejoined replica's cache starts empty
      },
  };
}

}  // namespace

caf::actor spawn_router(caf::actor_system& system, RouterSetup setup) {
  return system.spawn(router_actor, std::move(setup));
}

}  // namespace paged
