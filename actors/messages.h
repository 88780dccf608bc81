// Every message type and atom the actors exchange, registered in one place (register_message_types) so that the
// same names work in-process and, for the serialisable ones, across CAF's network layer.
#pragma once

#include <caf/all.hpp>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cuda/nccl_comm.h"
#include "model/constraint/token_mask.h"
#include "model/kv/kv_snapshot.h"
#include "model/scheduling/resume.h"
#include "model/scheduling/scheduler_policy.h"
#include "model/step.h"
#include "actors/step_wire.h"

namespace paged {

using submit_atom = caf::atom_constant<caf::atom("submit")>;
using abort_atom = caf::atom_constant<caf::atom("abort")>;
using stop_atom = caf::atom_constant<caf::atom("stopseq")>;     // request -> scheduler: a stop string matched
using output_atom = caf::atom_constant<caf::atom("output")>;    // scheduler -> request: new tokens
using prompt_lp_atom = caf::atom_constant<caf::atom("promptlp")>;  // scheduler -> request: prompt tokens scored
using cancel_atom = caf::atom_constant<caf::atom("cancel")>;    // scheduler -> request: aborted
using scheduled_atom = caf::atom_constant<caf::atom("sched")>;  // scheduler -> request: first admitted to a step,
                                                                // with the prompt tokens its prefix-cache hit holds
using plan_atom = caf::atom_constant<caf::atom("plan")>;        // scheduler -> memory manager
using free_atom = caf::atom_constant<caf::atom("free")>;
using fork_atom = caf::atom_constant<caf::atom("fork")>;
using computed_atom = caf::atom_constant<caf::atom("computed")>;
using step_atom = caf::atom_constant<caf::atom("step")>;        // scheduler -> executors
using swap_out_atom = caf::atom_constant<caf::atom("swapout")>;
using swap_in_atom = caf::atom_constant<caf::atom("swapin")>;
using disk_write_atom = caf::atom_constant<caf::atom("diskwrite")>;  // scheduler -> executors: save, remove files
using disk_load_atom = caf::atom_constant<caf::atom("diskload")>;    // scheduler -> executors: load files
using loaded_atom = caf::atom_constant<caf::atom("loaded")>;         // scheduler -> memory manager: loads answered
using drained_atom = caf::atom_constant<caf::atom("drained")>;  // query: no request left
using kv_snapshot_atom = caf::atom_constant<caf::atom("kvsnap")>;  // engine -> memory manager: every block's cell
using init_atom = caf::atom_constant<caf::atom("init")>;        // engine -> executor of a CUDA tensor-parallel rank
using hello_atom = caf::atom_constant<caf::atom("hello")>;      // engine -> worker: what do you run?
using alive_atom = caf::atom_constant<caf::atom("alive")>;      // worker -> the engine it serves: still there?
using resume_atom = caf::atom_constant<caf::atom("resume")>;    // request -> router: my replica is gone, move me
using done_atom = caf::atom_constant<caf::atom("reqdone")>;     // request -> router: finished
using replica_atom = caf::atom_constant<caf::atom("replica")>;  // engine -> router: a replica (re)joined
using reconnect_atom = caf::atom_constant<caf::atom("reconn")>; // engine -> its reconnector: try a lost worker
using lora_atom = caf::atom_constant<caf::atom("lora")>;        // engine -> executors: take or drop a LoRA adapter

/// Why an executor refused a message or failed it: the codes of the caf::errors in its category ("executor"),
/// each with a message naming what was wrong (rendered "invalid step: seqs[0].tokens[3]: token 900 is ...").
enum class ExecutorError : uint8_t {
  invalid_step = 1,  // a step that does not unpack, or outside the runner's limits (model/step_check.h); nothing
                     // was executed
  invalid_swap,      // a swap order outside the KV pools; nothing was copied
  refused,           // the sender may not use this worker: it serves another engine, or none said hello yet
  runner_failed,     // the runner threw while executing (the executor stays up for the next message)
  invalid_result,    // a worker's answer to a step that does not unpack (actors/step_wire.h)
};

/// The category's name, e.g. "invalid step".
std::string to_string(ExecutorError code);

/// An error of the executor category with `message` as its context.
caf::error make_error(ExecutorError code, std::string message);

/// A step as sent to executors. SampleSpec pointers refer to scheduler-owned sequence data that `keep_alive`
/// holds until every executor has finished the step. In-process only: the proxy of a remote executor sends the
/// step on as a PackedStep (actors/step_wire.h).
struct StepMsg {
  /// Read by every executor of a replica; the one executor of a step with deferred tokens fills them in place.
  std::shared_ptr<StepBatch> batch;
  std::vector<std::shared_ptr<const void>> keep_alive;
};

/// A LoRA adapter for one executor's runner (ModelRunner::add_lora), loaded for its rank; a null adapter drops id
/// (remove_lora). In-process only.
struct LoraMsg {
  int32_t id = 0;
  std::shared_ptr<const LoraAdapter> adapter;
};

/// What the request actor gets for one of its completions after a step; the outputs of one step for one request
/// travel together, as a std::vector<SeqOutput>.
struct SeqOutput {
  int index = 0;
  std::vector<SampledToken> tokens;      // appended tokens (one per step; a whole beam at the end of beam search)
  std::string finish;                    // "stop" | "length" when the scheduler ended it, else empty
  double cumulative_logprob = 0.0;
  bool replace = false;                  // beam search: tokens replace everything sent before
};

/// What a step wrote into one sequence's KV, reported to the memory manager (every sequence of a step in one
/// `computed` message, as a std::vector<ComputedKv>): the KV now holds `num_computed` tokens.
struct ComputedKv {
  SeqId seq = 0;
  int tokens_offset = 0;                 // position of tokens[0]: a block start, not after the first unreported one
  std::vector<TokenId> tokens;           // the sequence's tokens from tokens_offset up to num_computed
  int num_computed = 0;
};

/// A request as the scheduler receives it.
struct RequestSpec {
  uint64_t id = 0;
  std::shared_ptr<const std::vector<TokenId>> prompt;
  std::shared_ptr<const SamplingParams> params;
  std::vector<TokenId> stop_ids;         // EOS (unless ignore_eos) + stop_token_ids
  /// Structured outputs: the constraint every completion starts from (each sequence advances its own copy); null:
  /// free text.
  std::shared_ptr<const constraint::TokenConstraint> constraint;
  uint64_t seed = 0;                     // completion i samples with seed + i
  caf::actor client;                     // the request actor
  /// A request moved from a lost replica: the completions that go on, each from its output so far (resume_point);
  /// empty: the request starts from its prompt.
  std::vector<ResumedSeq> resume;
};

/// An executor's answer to (init_atom, rank, NcclUniqueId): the KV pools its runner got, or why it has none.
struct RankReady {
  int num_blocks = 0;        // device KV blocks
  int num_swap_blocks = 0;   // host swap blocks
  std::string error;         // empty when the runner was built
  bool model_error = false;  // the error was a ModelError (the model or the options), not a device failure
};

/// A worker's answer to (hello_atom): the model shape and KV layout its runner holds, so that an engine can check
/// that it runs the same model before sending it steps.
struct WorkerInfo {
  std::string device;                      // cpu | cuda
  int num_layers = 0, hidden_size = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0, vocab_size = 0;
  int block_size = 0;
  int max_model_len = 0, max_num_seqs = 0, max_num_batched_tokens = 0;  // the largest step its runner takes
  int max_sampled_positions = 0;  // and the most positions it samples (max_sampled_positions of its flags)
  int num_blocks = 0, num_swap_blocks = 0;
  // kv_groups_of(its model): a step carries a table per group, with released entries before each group's window
  std::vector<int> kv_windows = {0};
  int layers_per_block = 0;
  // Its LoRA adapters (its --lora-modules, adapter i + 1 the i-th) by name and LoraAdapter::content_hash: the
  // engine's must be the same, in order
  std::vector<std::string> lora_names;
  std::vector<uint64_t> lora_hashes;
};

// CAF's inspect overloads (serialisation across the network layer, to_string) of the message types and what they
// hold.

// PAGED_INSPECT(Type, x.member...) defines one over the members given, in that order.
#define PAGED_INSPECT(Type, ...)                                   \
  template <class Inspector>                                       \
  typename Inspector::result_type inspect(Inspector& f, Type& x) { \
    return f(caf::meta::type_name(#Type), __VA_ARGS__);            \
  }

PAGED_INSPECT(SampledToken, x.token, x.logprob, x.top_logprobs)
PAGED_INSPECT(PromptLogprob, x.token, x.logprob, x.rank, x.top_logprobs)
PAGED_INSPECT(ChunkPromptLogprobs, x.seq, x.first_pos, x.tokens)
PAGED_INSPECT(SeqOutput, x.index, x.tokens, x.finish, x.cumulative_logprob, x.replace)
PAGED_INSPECT(ComputedKv, x.seq, x.tokens_offset, x.tokens, x.num_computed)
PAGED_INSPECT(PlanLimits, x.max_num_seqs, x.max_num_batched_tokens, x.preemption)
PAGED_INSPECT(PlannedChunk, x.id, x.start_pos, x.num_tokens, x.sample, x.block_table, x.group_tables)
PAGED_INSPECT(DiskOrder, x.kind, x.key, x.host_block, x.salt, x.tokens)
PAGED_INSPECT(StepPlan, x.chunks, x.copies, x.swap_out, x.swap_in, x.preempted_recompute, x.preempted_swap,
              x.swapping_in, x.admitted, x.rejected, x.disk_writes, x.disk_loads)
PAGED_INSPECT(StepResult, x.seqs, x.samples, x.prompt_logprobs)
PAGED_INSPECT(CellRun, x.cell, x.count)
PAGED_INSPECT(TierSnapshot, x.name, x.num_blocks, x.runs)
PAGED_INSPECT(SeqSnapshot, x.seq, x.swapped, x.num_blocks, x.num_computed)
PAGED_INSPECT(KvSnapshot, x.block_size, x.tiers, x.seqs)
PAGED_INSPECT(NcclUniqueId, x.bytes)
PAGED_INSPECT(RankReady, x.num_blocks, x.num_swap_blocks, x.error, x.model_error)
PAGED_INSPECT(PackedStep, x.bytes)
PAGED_INSPECT(PackedResult, x.bytes)
PAGED_INSPECT(WorkerInfo, x.device, x.num_layers, x.hidden_size, x.num_heads, x.num_kv_heads, x.head_dim,
              x.vocab_size, x.block_size, x.max_model_len, x.max_num_seqs, x.max_num_batched_tokens,
              x.max_sampled_positions, x.num_blocks, x.num_swap_blocks, x.kv_windows, x.layers_per_block,
              x.lora_names, x.lora_hashes)

#undef PAGED_INSPECT

/// Registers the message types above, and the executor's error category (its renderer), with an actor system
/// configuration.
void register_message_types(caf::actor_system_config& cfg);

}  // namespace paged

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(paged::StepMsg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(paged::LoraMsg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(paged::RequestSpec)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::vector<paged::PlanSeq>)
