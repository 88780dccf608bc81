#include "actors/actors.h"

#include <chrono>
#include <map>
#include <type_traits>
#include <variant>

#include "actors/step_wire.h"
#include "actors/tls.h"
#include "model/constraint/sequence_constraints.h"
#include "model/deferred_tokens.h"
#include "model/loader/config.h"
#include "model/kv/kv_disk_file.h"
#include "model/step_check.h"

namespace paged {

namespace {

// What an executor owns. A rank executor's group share is released after its runner (which may use it).
struct ExecutorState {
  std::shared_ptr<ModelRunner> runner;
  std::shared_ptr<void> group;
  DeferredTokens deferred;  // what the last step sampled, for a step sent before it returned
  std::shared_ptr<const KvDiskStore> disk;  // this rank's files of the disk tier; null: none
};

// The disk tier's saves and removals, in order, over the runner's host blocks.
void write_disk(ExecutorState& st, const std::vector<DiskOrder>& orders) {
  if (!st.disk) throw std::logic_error("disk-tier orders for an executor without a disk tier");
  std::vector<std::byte> kv(st.runner->host_block_bytes());
  for (const DiskOrder& o : orders) {
    if (o.kind == DiskOrder::Kind::remove) {
      st.disk->remove(o.key);
    } else if (o.kind == DiskOrder::Kind::save) {
      st.runner->read_host_block(o.host_block, kv);
      if (!st.disk->save(o.key, o.salt, o.tokens, kv)) st.disk->remove(o.key);  // not written: a miss later
    }
  }
}

// The disk tier's loads into the runner's host blocks: the keys whose file held the block (verified).
std::vector<uint64_t> load_disk(ExecutorState& st, const std::vector<DiskOrder>& orders) {
  if (!st.disk) throw std::logic_error("disk-tier orders for an executor without a disk tier");
  std::vector<std::byte> kv(st.runner->host_block_bytes());
  std::vector<uint64_t> loaded;
  for (const DiskOrder& o : orders) {
    if (o.kind != DiskOrder::Kind::load || !st.disk->load(o.key, o.salt, o.tokens, kv)) continue;
    st.runner->write_host_block(o.host_block, kv);
    loaded.push_back(o.key);
  }
  return loaded;
}

// The answer of a runner call, or what it threw as an error reply: a runner that throws (a GPU error, kv_slot's
// std::out_of_range) fails that message, and the executor stays up for the next one.
template <class Call>
caf::result<std::invoke_result_t<Call>> guarded(Call&& call) {
  try {
    return call();
  } catch (const std::exception& e) {
    return make_error(ExecutorError::runner_failed, e.what());
  }
}

// `batch` run on `runner`, its deferred tokens first filled in from the step before (which `deferred` remembers,
// and then this one's samples; nothing after a failure, so a later deferred step is refused).
caf::expected<StepResult> run_step(ModelRunner& runner, DeferredTokens& deferred, StepBatch& batch) {
  const std::optional<FieldError> unresolved = deferred.resolve(batch);
  deferred.remember({});
  if (unresolved) return make_error(ExecutorError::invalid_step, unresolved->describe());
  try {
    StepResult result = runner.execute(batch);
    deferred.remember(result);
    return result;
  } catch (const std::exception& e) {
    return make_error(ExecutorError::runner_failed, e.what());
  }
}

// The step and swap handlers, over the runner the state holds when a message arrives.
caf::message_handler runner_handlers(std::shared_ptr<ExecutorState> st) {
  return {
      [st](step_atom, const StepMsg& msg) -> caf::result<StepResult> {
        return run_step(*st->runner, st->deferred, *msg.batch);
      },
      [st](swap_out_atom, const std::vector<BlockPair>& pairs) {
        return guarded([&] {
          st->runner->swap_out(pairs);
          return true;
        });
      },
      [st](swap_in_atom, const std::vector<BlockPair>& pairs) {
        return guarded([&] {
          st->runner->swap_in(pairs);
          return true;
        });
      },
      [st](lora_atom, const LoraMsg& msg) {
        return guarded([&] {
          if (msg.adapter)
            st->runner->add_lora(msg.id, *msg.adapter);
          else
            st->runner->remove_lora(msg.id);
          return true;
        });
      },
      [st](disk_write_atom, const std::vector<DiskOrder>& orders) {
        return guarded([&] {
          write_disk(*st, orders);
          return true;
        });
      },
      [st](disk_load_atom, const std::vector<DiskOrder>& orders) { return guarded([&] { return load_disk(*st, orders); }); },
  };
}

// What a worker's executor owns: its runner, the limits every step and swap order is checked against, the engine
// it serves and what that engine's steps have sent about each sequence.
struct WorkerState {
  std::shared_ptr<ModelRunner> runner;
  WorkerInfo info;
  StepLimits limits;
  caf::actor head;  // the proxy of the engine served, which said hello (monitored); null: none
  WireDecoder decoder;
  DeferredTokens deferred;
  std::shared_ptr<constraint::SequenceConstraints> constraints;  // the masks of its sequences' structured outputs
};

// How long a second engine's hello waits for the engine served to answer that it is still there: longer than the
// transport takes to count a silent engine as lost, so a frozen engine's down message comes first.
constexpr auto kHeadProbeTimeout = kSilentPeerTimeout + 2 * kHeartbeatInterval;

caf::error serving_another_engine() {
  return make_error(ExecutorError::refused, "the worker is already serving another engine (one at a time)");
}

// The refusal of the message being handled when its sender is not of the engine served (on another node); nullopt
// when it may use the runner.
std::optional<caf::error> foreign_sender(caf::event_based_actor* self, const WorkerState& st) {
  if (!st.head) return make_error(ExecutorError::refused, "no engine said hello to this worker");
  const caf::strong_actor_ptr& sender = self->current_sender();
  if (!sender || sender->node() != st.head.node()) return serving_another_engine();
  return std::nullopt;
}

// Serves `head` from now on, until it goes down, knowing none of its sequences yet.
void serve(caf::event_based_actor* self, WorkerState& st, const caf::actor& head) {
  st.head = head;
  st.decoder.reset();
  st.deferred.remember({});
  st.constraints->reset();
  self->monitor(head);
}

// (hello_atom) -> WorkerInfo. The first engine to say hello is served while its proxy lives; another's hello is
// refused while that proxy answers `alive` (asked so that an engine that has just ended, whose down message is not
// here yet, does not keep the worker; no answer within kHeadProbeTimeout counts as still there unless the engine's
// down message came meanwhile, as it does for a silent engine).
caf::response_promise hello(caf::event_based_actor* self, const std::shared_ptr<WorkerState>& st) {
  const auto sender = caf::actor_cast<caf::actor>(self->current_sender());  // the promise takes it from the message
  caf::response_promise rp = self->make_response_promise();
  if (!sender) {
    rp.deliver(make_error(ExecutorError::refused, "a hello must come from the actor that will send the steps"));
    return rp;
  }
  if (!st->head || st->head == sender) {
    if (!st->head) serve(self, *st, sender);
    rp.deliver(st->info);
    return rp;
  }
  const caf::actor held = st->head;
  self->request(held, kHeadProbeTimeout, alive_atom::value)
      .then([rp](bool) mutable { rp.deliver(serving_another_engine()); },
            [self, st, rp, sender, held](caf::error& e) mutable {
              if (e != caf::sec::request_timeout && st->head == held) {
                self->demonitor(held);
                st->head = nullptr;
              }
              if (st->head) {
                rp.deliver(serving_another_engine());
                return;
              }
              serve(self, *st, sender);
              rp.deliver(st->info);
            });
  return rp;
}

// A swap order from the engine served, checked against the pools before the runner copies anything.
caf::result<bool> checked_swap(caf::event_based_actor* self, WorkerState& st, const std::vector<BlockPair>& pairs,
                               PairOrder order) {
  if (auto refusal = foreign_sender(self, st)) return std::move(*refusal);
  if (auto bad = check_block_pairs(pairs, order, st.limits.num_blocks, st.limits.num_swap_blocks))
    return make_error(ExecutorError::invalid_swap, bad->describe());
  return guarded([&] {
    if (order == PairOrder::swap_out)
      st.runner->swap_out(pairs);
    else
      st.runner->swap_in(pairs);
    return true;
  });
}

}  // namespace

caf::behavior executor_actor(caf::event_based_actor* /*self*/, std::shared_ptr<ModelRunner> runner,
                             std::shared_ptr<const KvDiskStore> disk) {
  return runner_handlers(
      std::make_shared<ExecutorState>(ExecutorState{std::move(runner), nullptr, {}, std::move(disk)}));
}

caf::behavior worker_executor_actor(caf::event_based_actor* self, std::shared_ptr<ModelRunner> runner,
                                    WorkerInfo info, std::shared_ptr<constraint::SequenceConstraints> constraints,
                                    std::shared_ptr<const std::atomic<bool>> stopping) {
  const StepLimits limits{.vocab_size = info.vocab_size,
                          .block_size = info.block_size,
                          .num_blocks = info.num_blocks,
                          .num_swap_blocks = info.num_swap_blocks,
                          .max_model_len = info.max_model_len,
                          .max_num_batched_tokens = info.max_num_batched_tokens,
                          .kv_windows = info.kv_windows,
                          .num_loras = static_cast<int>(info.lora_names.size())};
  auto st = std::make_shared<WorkerState>(
      WorkerState{std::move(runner), std::move(info), limits, nullptr, WireDecoder(limits), {}, std::move(constraints)});
  self->set_down_handler([st](const caf::down_msg& down) {
    if (st->head && down.source == st->head.address()) st->head = nullptr;  // the engine served went away
  });
  // CAF's system messages come from the network like any other: under CAF's defaults an exit or an unsolicited error
  // from a peer would end this actor (any node that reaches the port could stop the worker), and an exit's source
  // is whatever the sender wrote. So an exit ends it only once Worker's shutdown set `stopping`; errors and unknown
  // messages are dropped. (CAF ends any actor on exit_reason::kill before a handler sees it: that one stays with
  // the transport's trust, plain TCP on loopback only, else TLS with the deployment's certificate.)
  self->set_exit_handler([self, stopping](caf::exit_msg& exit) {
    if (stopping->load()) self->quit(std::move(exit.reason));
  });
  self->set_error_handler([](caf::error&) {});
  self->set_default_handler(caf::drop);
  return {
      [self, st](hello_atom) { return hello(self, st); },
      [self, st](step_atom, const PackedStep& packed) -> caf::result<PackedResult> {
        if (auto refusal = foreign_sender(self, *st)) return std::move(*refusal);
        auto wire = unpack_step(packed.bytes);
        if (const auto* bad = std::get_if<FieldError>(&wire))
          return make_error(ExecutorError::invalid_step, bad->describe());
        auto decoded = st->decoder.decode(std::get<WireStep>(std::move(wire)));
        if (const auto* bad = std::get_if<FieldError>(&decoded))
          return make_error(ExecutorError::invalid_step, bad->describe());
        try {
          st->constraints->attach(std::get<StepBatch>(decoded));
        } catch (const std::exception& e) {
          return make_error(ExecutorError::invalid_step, e.what());
        }
        caf::expected<StepResult> result = run_step(*st->runner, st->deferred, std::get<StepBatch>(decoded));
        if (!result) return std::move(result.error());
        return PackedResult{pack_result(*result)};
      },
      [self, st](swap_out_atom, const std::vector<BlockPair>& pairs) {
        return checked_swap(self, *st, pairs, PairOrder::swap_out);
      },
      [self, st](swap_in_atom, const std::vector<BlockPair>& pairs) {
        return checked_swap(self, *st, pairs, PairOrder::swap_in);
      },
  };
}

namespace {

// Callers' promises the proxy still owes, by request number.
struct ProxyPending {
  std::map<uint64_t, caf::response_promise> promises;
  uint64_t next = 0;
};

// What a worker's answer to a step must fit before the engine takes it: the step it answers (null: not a step).
using AnsweredStep = std::shared_ptr<const StepBatch>;

// Delivers the reply `r` through `settle`: as it is, or for a PackedResult the StepResult it unpacks to once
// check_result passes it against `step` (an invalid_result error when it does not).
template <class Reply, class Settle>
void settle_reply(Reply& r, const Settle& settle, const AnsweredStep&, int) {
  settle(std::move(r));
}
template <class Settle>
void settle_reply(PackedResult& r, const Settle& settle, const AnsweredStep& step, int vocab_size) {
  auto result = unpack_result(r.bytes);
  if (const auto* bad = std::get_if<FieldError>(&result)) {
    settle(make_error(ExecutorError::invalid_result, bad->describe()));
    return;
  }
  if (auto bad = check_result(std::get<StepResult>(result), *step, vocab_size)) {
    settle(make_error(ExecutorError::invalid_result, bad->describe()));
    return;
  }
  settle(std::get<StepResult>(std::move(result)));
}

// Sends `xs...` to the remote actor and answers the caller when the reply (a Reply, as settle_reply delivers it) or
// an error comes back.
template <class Reply, class... Ts>
caf::response_promise forward_to(caf::event_based_actor* self, const caf::actor& remote,
                                 const std::shared_ptr<ProxyPending>& pending, AnsweredStep step, int vocab_size,
                                 Ts&&... xs) {
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
      .then([settle, step, vocab_size](Reply& r) { settle_reply(r, settle, step, vocab_size); },
            [settle](caf::error& e) { settle(std::move(e)); });
  return rp;
}

}  // namespace

caf::behavior remote_executor_proxy(caf::event_based_actor* self, caf::actor remote, int vocab_size) {
  // Requests rather than delegation: the proxy keeps every caller's promise, so a lost worker fails them all (CAF
  // answers nothing for a message already forwarded to a node that went away), and then the proxy ends, which
  // ends the scheduler (as a failing local executor does) and with it the requests, with the reason.
  auto pending = std::make_shared<ProxyPending>();
  auto encoder = std::make_shared<WireEncoder>();  // what the worker was sent about each sequence
  self->monitor(remote);
  self->set_down_handler([self, pending](const caf::down_msg& down) {
    for (auto& [id, rp] : pending->promises) rp.deliver(down.reason);
    pending->promises.clear();
    self->quit(down.reason);
  });
  return {
      [self, remote, pending](hello_atom a) { return forward_to<WorkerInfo>(self, remote, pending, nullptr, 0, a); },
      [](alive_atom) { return true; },  // the worker asks whether this engine is still there
      [self, remote, pending, encoder, vocab_size](step_atom a, const StepMsg& msg) {
        PackedStep packed{pack_step(encoder->encode(*msg.batch))};
        return forward_to<PackedResult>(self, remote, pending, msg.batch, vocab_size, a, std::move(packed));
      },
      [self, remote, pending](swap_out_atom a, const std::vector<BlockPair>& pairs) {
        return forward_to<bool>(self, remote, pending, nullptr, 0, a, pairs);
      },
      [self, remote, pending](swap_in_atom a, const std::vector<BlockPair>& pairs) {
        return forward_to<bool>(self, remote, pending, nullptr, 0, a, pairs);
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
          if (setup.disk) st->disk = setup.disk(rank);
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
