// The actors of the runtime and how to start them. Each is a thin shell around a pure object (ModelRunner,
// KvCacheManager, the scheduling policy, an IncrementalDetokenizer); docs/ARCHITECTURE.md shows the message flow.
#pragma once

#include <caf/all.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>

#include "actors/engine_types.h"
#include "actors/messages.h"
#include "actors/metrics.h"
#include "model/constraint/sequence_constraints.h"
#include "model/kv/kv_cache_manager.h"
#include "model/kv/kv_disk_file.h"
#include "model/loader/safetensors.h"
#include "model/routing/router_policy.h"
#include "model/tokenizer/tokenizer.h"

namespace paged {

/// Executor: owns a ModelRunner (one device, or one tensor-parallel rank). Handles
/// (step_atom, StepMsg) -> StepResult, (swap_out_atom, pairs) -> ok, (swap_in_atom, pairs) -> ok, in arrival
/// order, so swaps and copies ordered before a step complete before it; what the runner throws comes back as an
/// ExecutorError::runner_failed error and the executor stays up. The steps come from this engine's scheduler and are
/// not checked again (the runners keep their own bounds checks). Spawn detached: a step blocks its thread (and
/// tensor-parallel ranks wait on each other in the all-reduce).
/// With `disk` (this runner's files of the disk tier) it carries out the disk tier's orders (disk_write_atom,
/// disk_load_atom -> the keys loaded) over the runner's host blocks.
caf::behavior executor_actor(caf::event_based_actor* self, std::shared_ptr<ModelRunner> runner,
                             std::shared_ptr<const KvDiskStore> disk);

/// The executor of a `paged worker`, for an engine in another process: (hello_atom) -> WorkerInfo,
/// (step_atom, PackedStep) -> PackedResult (actors/step_wire.h) and the swap orders. It serves one engine at a time:
/// the first whose proxy says hello, until that proxy goes down; another engine's hello, and any message from another
/// node, gets an ExecutorError::refused error. Every step (check_step) and swap order (check_block_pairs) is checked
/// against the runner's limits in `info` before the runner sees it: a bad one (or bytes that are no packed step) gets
/// an invalid_step / invalid_swap error, a runner that throws a runner_failed one, and the next good message is
/// executed as usual. Published by a Worker (actors/worker.h). `constraints` gives the samples of structured outputs
/// their masks (a step whose output ids a constraint refuses is an invalid_step error). CAF's exit and error messages
/// reach it from the network like any other (an exit's source is the sender's to write): it quits on an exit only
/// once `stopping` is set (Worker's own shutdown), drops errors and messages it does not take.
caf::behavior worker_executor_actor(caf::event_based_actor* self, std::shared_ptr<ModelRunner> runner,
                                    WorkerInfo info, std::shared_ptr<constraint::SequenceConstraints> constraints,
                                    std::shared_ptr<const std::atomic<bool>> stopping);

/// Stands in the engine for a worker's executor (`remote`, reached through CAF's middleman): forwards the hello,
/// steps as PackedSteps (deltas, actors/step_wire.h) and the swap orders as they are, in arrival order, and answers
/// each caller with the worker's answer (a PackedResult unpacked: an invalid_result error when it does not); answers
/// the worker's (alive_atom) with true. The hello must go through it: the worker serves the engine whose proxy said
/// hello while that proxy lives. Quits when the remote actor goes down.
/// A worker's result is unpacked and checked against its step (check_result, ids within `vocab_size`) before it goes
/// on: a worker cannot hand the engine a token its tokenizer does not have.
caf::behavior remote_executor_proxy(caf::event_based_actor* self, caf::actor remote, int vocab_size);

/// A runner built for one tensor-parallel rank, with the KV pools it got.
struct RankRunner {
  std::shared_ptr<ModelRunner> runner;
  int num_blocks = 0;
  int num_swap_blocks = 0;  // the host pool: swap space and the CPU tier (split_host_pool)
};

/// A host pool of `host_blocks` split into (swap-space blocks, CPU-tier blocks) in the proportion of
/// config.swap_space_gib to config.kv_offloading_gib, CPU-tier blocks rounded down.
std::pair<int, int> split_host_pool(int host_blocks, const EngineConfig& config);

/// Checks the engine options against the model and returns the maximum model length. With `local_device` it also
/// resolves device "auto" and checks that the device exists (a remote executor's device is the worker's).
/// Throws ModelError.
int resolve_config(EngineConfig& config, const ModelConfig& model, bool local_device);

/// The runner of one whole model on this process (tensor_parallel_size 1) on config.device, with its KV pools:
/// CPU pools from max_num_seqs (at most 4 GiB) or num_kv_blocks, CUDA pools from gpu_memory_utilization.
/// `groups`: kv_groups_of(model), which sizes the CPU pools' blocks. `weights` null: random weights (load_format
/// dummy, CUDA only).
RankRunner make_local_runner(const EngineConfig& config, const ModelConfig& model, const KvGroups& groups,
                             int max_model_len, const SafeTensors* weights);

/// How an executor builds its rank on its own thread. `join` sets up the rank's share of the group's communication
/// (NCCL: blocks until every rank has joined); `build` makes the runner over it. The share is kept apart from the
/// runner so that it outlives a failed build: the executor releases it only when it terminates, after the runner
/// (NCCL's teardown waits for every rank's, so all ranks' executors must terminate).
struct RankSetup {
  std::function<std::shared_ptr<void>(int rank, const NcclUniqueId& id)> join;
  std::function<RankRunner(int rank, const std::shared_ptr<void>& group)> build;
  std::function<std::shared_ptr<const KvDiskStore>(int rank)> disk;  // the rank's disk-tier files; empty: none
};

/// Executor of one rank of a CUDA tensor-parallel group whose runner does not exist yet. Answers
/// (init_atom, rank, NcclUniqueId) -> RankReady by calling setup.join then setup.build (errors come back in the
/// RankReady); from then on it handles what executor_actor handles, which must not arrive before a successful init.
/// Spawn detached, one per rank, and send every rank its init before waiting for any answer. On termination it
/// releases the runner, then the group share, on its own thread.
caf::behavior rank_executor_actor(caf::event_based_actor* self, RankSetup setup);

/// Memory manager: owns the KvCacheManager. A typed actor: the compiler checks every message sent to it.
/// plan: runs the scheduling policy against the manager and returns the step plan; free / fork: release or share a
/// sequence's blocks; computed (one message per step): each reported sequence's KV now holds its num_computed
/// tokens (full blocks enter the prefix cache; reports for sequences freed or swapped out since are dropped);
/// drained: answers once every earlier message was processed; kv_snapshot: every block's cell (KvCacheManager::
/// snapshot). Gauges in `metrics` follow every change.
using MemoryManager = caf::typed_actor<
    caf::replies_to<plan_atom, std::vector<PlanSeq>, PlanLimits>::with<StepPlan>,
    caf::reacts_to<free_atom, std::vector<SeqId>>,
    caf::reacts_to<fork_atom, SeqId, SeqId>,
    caf::reacts_to<computed_atom, std::vector<ComputedKv>>,
    caf::reacts_to<loaded_atom, std::vector<uint64_t>, std::vector<uint64_t>>,  // disk loads: keys ok, keys failed
    caf::replies_to<drained_atom>::with<bool>,
    caf::replies_to<kv_snapshot_atom>::with<KvSnapshot>>;

/// It publishes the KV gauges of its replica through `metrics` and clears them when it ends.
MemoryManager::behavior_type memory_manager_actor(MemoryManager::pointer self, KvCacheOptions options,
                                                  ReplicaMetricsWriter metrics);

/// Asks every manager of `managers` for its KvSnapshot, at most `timeout` each, and calls `done` once with the answers
/// in the same order (nullopt for a manager that failed or did not answer), on an actor thread. Never blocks.
void collect_kv_snapshots(caf::actor_system& system, std::vector<MemoryManager> managers,
                          std::function<void(std::vector<std::optional<KvSnapshot>>)> done,
                          std::chrono::milliseconds timeout);

struct SchedulerSetup {
  PlanLimits limits;
  int max_model_len = 0;
  int block_size = 16;
  std::vector<caf::actor> executors;   // one per tensor-parallel rank; rank 0 returns the samples
  /// With one executor: send step N+1 as soon as it is planned, before step N returned, its sequences' newest
  /// tokens deferred to the executor (SeqChunk::last_token_deferred); else N+1 waits for N's results.
  bool async_scheduling = true;
  /// Speculative decoding (model/speculative/ngram.h; off when num_speculative_tokens is 0): sequences that decode
  /// alone propose n-gram drafts, verified in one step. Every step is then planned after the results of the one
  /// before (the drafts continue the newest token), so async_scheduling does not apply.
  NgramSpeculation speculation;
  MemoryManager memory_manager;
  ReplicaMetricsWriter metrics{nullptr, nullptr};  // the replica's figures and the engine's totals
};

/// Scheduler of one replica: owns the queues and every sequence's tokens. (submit_atom, RequestSpec) adds a request
/// (a moved one goes on from RequestSpec::resume), (abort_atom, id, reason) cancels one (a non-empty reason ends it
/// with that error, as unavailable), (stop_atom, id, index) ends a
/// completion (stop string). Runs steps as long as there is work, planning step N+1 while step N executes when no
/// sequence of step N forks on its result. Quits with the error when an executor fails a message (the replica is
/// lost); publishes its queue gauges and clears them when it ends.
caf::actor spawn_scheduler(caf::actor_system& system, SchedulerSetup setup);

/// What the router is started with: one scheduler per replica (null: the replica is not serving yet), the replicas'
/// own metrics (free blocks) and the engine's (whose unqueued_requests it decrements for a request it refuses).
struct RouterSetup {
  std::vector<caf::actor> schedulers;
  std::vector<const Metrics*> replica_metrics;
  Metrics* metrics = nullptr;
  RoutingOptions options;
};

/// Router: sends each request to a replica's scheduler (model/routing/router_policy.h: least loaded, with prefix
/// affinity). (submit_atom, RequestSpec) -> the scheduler chosen; (resume_atom, RequestSpec) moves a request whose
/// replica was lost -> the new scheduler (never the lost one); both answer an error when no replica serves.
/// (done_atom, id): the request ended; (abort_atom, id, reason) goes on to the request's scheduler, (abort_atom,
/// reason) to every request's, and a request aborted
/// so is not moved (its resume is answered with a null actor: cancelled); (replica_atom, index,
/// scheduler): the replica serves (again). It monitors the schedulers: a replica whose scheduler ended gets nothing
/// until it joins again.
caf::actor spawn_router(caf::actor_system& system, RouterSetup setup);

/// Request actor: one per request. Asks the router for a replica, detokenizes incrementally, applies stop strings,
/// feeds the sink, records TTFT and TPOT, and stops once every completion ended (telling the router). When its
/// replica's scheduler ends on a failure, it moves to another replica from where it stood (model/scheduling/
/// resume.h), so the sink sees one stream; with none left it ends with the error.
caf::actor spawn_request(caf::actor_system& system, RequestSpec spec, const Tokenizer* tokenizer, RequestSink sink,
                         caf::actor router, Metrics* metrics);

}  // namespace paged
