#include "actors/actors.h"

#include "model/config.h"

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
        std::vector<SamplingParams> params;
        return st->runner->execute(from_wire(wire, params));
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

caf::behavior remote_executor_proxy(caf::event_based_actor* self, caf::actor remote) {
  // Ends with the remote side: a lost worker fails the pending step, which ends the scheduler (as a failing local
  // executor does).
  self->monitor(remote);
  self->set_down_handler([self](const caf::down_msg& down) { self->quit(down.reason); });
  return {
      [self, remote](step_atom, const StepMsg& msg) {
        return self->delegate(remote, step_atom::value, to_wire(*msg.batch));
      },
      [self, remote](swap_out_atom a, const std::vector<BlockPair>& pairs) { return self->delegate(remote, a, pairs); },
      [self, remote](swap_in_atom a, const std::vector<BlockPair>& pairs) { return self->delegate(remote, a, pairs); },
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
