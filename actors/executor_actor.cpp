#include "actors/actors.h"

#include <map>

#include "model/loader/config.h"

namespace paged {

namespace {

// What an executor owns. A rank executor's group share is released after its runner (which may use it).
struct ExecutorState {
  std::shared_ptr<ModelRunner> runner;
  std::shared_ptr<void> group;
};

// The step and swap handlers, over the runner the state holds when a message arrives.
caf::message_handler runner_handlers(std::shared_ptr<ExecutorState> st) {
  return {
      [st](step_atom, const StepMsg& msg) -> StepResult { return st->runner->execute(*msg.batch); },
      [st](step_atom, const WireStep& wire) -> StepResult {  // from an engine in another process
        return st->runner->execute(from_wire(wire));
      },
      [st](swap_out_atom, const std::vector<BlockPair>& pairs) -> bool {
        st->runner->swap_out(pairs);
        return true;
      },
      [st](swap_in_atom, const std::vector<BlockPair>& pairs) -> bool {
        st->runner->swap_in(pairs);
        return true;
      },
  };
}

}  // namespace

caf::behavior executor_actor(caf::event_based_actor* /*self*/, std::shared_ptr<ModelRunner> runner) {
  return runner_handlers(std::make_shared<ExecutorState>(ExecutorState{std::move(runner), nullptr}));
}

caf::behavior worker_executor_actor(caf::event_based_actor* /*self*/, std::shared_ptr<ModelRunner> runner,
                                    WorkerInfo info) {
  return runner_handlers(std::make_shared<ExecutorState>(ExecutorState{std::move(runner), nullptr}))
      .or_else([info](hello_atom) { return info; });
}

namespace {

// Callers' promises the proxy still owes, by request number.
struct ProxyPending {
  std::map<uint64_t, caf::response_promise> promises;
  uint64_t next = 0;
};

// Sends `xs...` to the remote actor and answers the caller when the reply (a Reply) or an error comes back.
template <class Reply, class... Ts>
caf::response_promise forward_to(caf::event_based_actor* self, const caf::actor& remote,
                                 const std::shared_ptr<ProxyPending>& pending, Ts&&... xs) {
  caf::response_promise rp = self->make_response_promise();
  const uint64_t id = pending->next++;
  pending->promises.emplace(id, rp);
  const auto settle = [pending, id](auto&&... answer) {
    auto it = pending->promises.find(id);
    if (it == pending->promises.end()) return;
    it->second.deliver(std::forward<decltype(answer)>(answer)...);
    pending->promises.erase(it);
  };
  self->request(remote, caf::infinite, std::forward<Ts>(xs)...)
      .then([settle](Reply& r) { settle(std::move(r)); }, [settle](caf::error& e) { settle(std::move(e)); });
  return rp;
}

}  // namespace

caf::behavior remote_executor_proxy(caf::event_based_actor* self, caf::actor remote) {
  // Requests rather than delegation: the proxy keeps every caller's promise, so a lost worker fails them all (CAF
  // answers nothing for a message already forwarded to a node that went away), and then the proxy ends, which
  // ends the scheduler (as a failing local executor does) and with it the requests, with the reason.
  auto pending = std::make_shared<ProxyPending>();
  self->monitor(remote);
  self->set_down_handler([self, pending](const caf::down_msg& down) {
    for (auto& [id, rp] : pending->promises) rp.deliver(down.reason);
    pending->promises.clear();
    self->quit(down.reason);
  });
  return {
      [self, remote, pending](step_atom a, const StepMsg& msg) {
        return forward_to<StepResult>(self, remote, pending, a, to_wire(*msg.batch));
      },
      [self, remote, pending](swap_out_atom a, const std::vector<BlockPair>& pairs) {
        return forward_to<bool>(self, remote, pending, a, pairs);
      },
      [self, remote, pending](swap_in_atom a, const std::vector<BlockPair>& pairs) {
        return forward_to<bool>(self, remote, pending, a, pairs);
      },
  };
}

caf::behavior rank_executor_actor(caf::event_based_actor* self, RankSetup setup) {
  auto st = std::make_shared<ExecutorState>();
  // On this executor's thread, whatever ends it: the ranks' NCCL teardowns wait for each other, so each rank must
  // release its own, concurrently with the others (not one after another wherever the actors happen to be freed).
  self->attach_functor([st](const caf::error&) {
    st->runner.reset();
    st->group.reset();
  });
  return {
      [self, st, setup](init_atom, int rank, const NcclUniqueId& id) -> RankReady {
        RankReady ready;
        try {
          st->group = setup.join(rank, id);
          RankRunner built = setup.build(rank, st->group);
          st->runner = std::move(built.runner);
          ready.num_blocks = built.num_blocks;
          ready.num_swap_blocks = built.num_swap_blocks;
        } catch (const ModelError& e) {
          ready.error = e.what();
          ready.model_error = true;
        } catch (const std::exception& e) {
          ready.error = e.what();
        }
        self->become(runner_handlers(st));  // drops the setup (and what it refers to) once this handler returns
        return ready;
      },
  };
}

}  // namespace paged
