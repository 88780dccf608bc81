// The scheduling policy of one engine step, pure: no CAF, no CUDA. Given a snapshot of the sequences (running,
// swapped, waiting) and the KV-cache manager, it decides what runs in the next step: decodes and prefill chunks
// within a token budget (continuous batching with chunked prefill), preemption of the newest sequences when blocks
// run out (swap or recompute), swap-ins, and FCFS admission. The memory-manager actor runs it against the
// KvCacheManager it owns; the scheduler actor applies the resulting plan to its queues.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_set>
#include <vector>

#include "model/kv/kv_cache_manager.h"
#include "model/types.h"

namespace paged {

enum class PreemptionMode { recompute, swap };

/// One sequence as the policy sees it.
struct PlanSeq {
  enum class Phase { waiting, running, swapped };
  SeqId id = 0;
  int priority = 0;          // lower is served first and preempted last (--scheduling-policy priority; else 0);
                             // arrival decides between equals
  uint64_t arrival = 0;      // request order: lower is older, served first, preempted last
  // Beam search: the request's sequences (those of its arrival) make progress only together, as a step needs every
  // beam's offers: they are preempted together and swapped in together.
  bool whole_request = false;
  Phase phase = Phase::waiting;
  int num_computed = 0;      // tokens whose KV is (or, in flight, will be) in the cache
  int num_tokens = 0;        // tokens known so far plus one being sampled in flight (pending), plus the drafts
  /// Running only (speculative decoding): the last num_drafts of num_tokens are drafts (model/speculative), a guess
  /// at what follows: a chunk may stop anywhere in them and still samples, and they are the first thing dropped
  /// when blocks or sampled positions run short.
  int num_drafts = 0;
  bool last_token_in_flight = false;  // the token in flight ends the sequence (max_tokens, model length)
  // Waiting only: every token (prompt + output so far), for the prefix cache, shared with the scheduler (a request's
  // prompt is not copied for each plan); null: no prefix-cache lookup (a scored prompt).
  std::shared_ptr<const std::vector<TokenId>> tokens;
  uint64_t salt = 0;         // prefix-cache salt
  int32_t lora = 0;          // the request's LoRA adapter (SamplingParams::lora); 0: none

  std::span<const TokenId> token_span() const {
    return tokens ? std::span<const TokenId>(*tokens) : std::span<const TokenId>();
  }
};

struct PlanLimits {
  int max_num_seqs = 256;            // running sequences at most
  int max_num_batched_tokens = 2048; // tokens computed per step at most
  PreemptionMode preemption = PreemptionMode::recompute;
  /// Positions a step samples at most, drafts counted (max_sampled_positions, model/speculative); 0: max_num_seqs.
  int max_sampled_positions = 0;
  /// LoRA adapters the running sequences use at most at once (vLLM's --max-loras); 0: any number.
  int max_loras = 0;
  /// Tokens one sequence computes per step at most (vLLM's --long-prefill-token-threshold): a long prompt goes in
  /// chunks of this many, so that the steps it shares with decoding sequences stay short; 0: no limit.
  int long_prefill_token_threshold = 0;
};

/// Work of one sequence in the step: compute tokens [start_pos, start_pos + num_tokens).
struct PlannedChunk {
  SeqId id = 0;
  int start_pos = 0;
  int num_tokens = 0;
  bool sample = false;               // the chunk reaches the last known token: sample the next one (and the drafts)
  std::vector<int32_t> block_table;                // KV group 0's
  std::vector<std::vector<int32_t>> group_tables;  // KV groups 1.. (SeqChunk::group_tables)
};

struct StepPlan {
  std::vector<PlannedChunk> chunks;
  std::vector<BlockPair> copies;          // copy-on-write, before this step's attention
  std::vector<BlockPair> swap_out;        // device -> cpu, before this step: preempted sequences, then demotions
                                          // to the CPU tier; executors run them before swap_in
  std::vector<BlockPair> swap_in;         // cpu -> device, before this step: swapped sequences (which run from a
                                          // later step, once copied), then CPU-tier promotions (read by this step)
  std::vector<SeqId> preempted_recompute; // freed; back to waiting with num_computed = 0
  std::vector<SeqId> preempted_swap;      // now swapped
  std::vector<SeqId> swapping_in;         // become running after the swap-in copy completes
  std::vector<std::pair<SeqId, int>> admitted;  // (sequence, cached prefix tokens) admitted from waiting
  std::vector<SeqId> rejected;            // waiting sequences that can never fit the pool
  std::vector<DiskOrder> disk_writes;     // the disk tier's saves and removals, before swap_out
  std::vector<DiskOrder> disk_loads;      // the disk tier's loads, after swap_in: answered to the memory manager
};

/// Plans one step. "Oldest" and "newest" below order by (priority, arrival): with priorities, the most urgent first.
/// Order: running sequences oldest first (a decode costs 1 token of budget, a prefill chunk what is left of it, at
/// most long_prefill_token_threshold, as a waiting sequence's first chunk); when
/// one cannot grow, the newest running sequence is preempted (swap when asked, the CPU pool has room and its token in
/// flight does not end it; else recompute: freed), possibly itself. Then, if nothing was preempted, swapped sequences
/// oldest first while they fit above the watermark; then, if no sequence is swapped, waiting sequences FCFS while
/// blocks, budget and max_num_seqs allow (a waiting head that does not fit blocks those behind it). The running and
/// swapped sequences of a whole_request request go as one: they grow only if all of them can, are preempted together
/// (swapped out together, their shared blocks shared on the CPU) and swapped in together. When such a request has
/// sequences running and others waiting or swapped, and the plan runs, admits, swaps in and loads nothing, the newest
/// such request's running sequences are preempted (recompute): they wait for the others, which wait for blocks, and
/// without this the engine would wait for ever. An admitted sequence's full blocks enter the prefix cache as planned
/// (KvCacheManager::register_planned), so those admitted after it in the same step share its prefix: their chunks start
/// after the shared blocks. A waiting sequence whose prefix continues on disk waits (and those behind it) while its
/// blocks load into the CPU tier (KvCacheManager::load_from_disk). Last, the tiers' orders
/// (KvCacheManager::take_tier_copies) join swap_out and swap_in, and fill disk_writes and disk_loads. Drafts: a
/// running unit whose blocks do not suffice drops its drafts before anything is preempted; and when the positions
/// sampled (a chunk that samples is one, each draft in it one more) exceed max_sampled_positions, the newest chunks drop
/// drafts (their blocks stay reserved, for the tokens to come). LoRA: a swapped unit or waiting sequence whose adapter
/// would make the running sequences use more than max_loras adapters waits, and blocks those behind it as above.
StepPlan plan_step(KvCacheManager& kv, const std::vector<PlanSeq>& seqs, const PlanLimits& limits);

/// The chunks of a plan that still run once the sequences in `ended` ended after planning (aborted, stopped), in
/// plan order. A kept chunk whose tables hold, before its start, a block that a dropped chunk would have written (a
/// prefix shared within the step) starts at that block instead and computes it; later readers read it as planned.
std::vector<PlannedChunk> drop_ended_chunks(std::vector<PlannedChunk> chunks, const std::unordered_set<SeqId>& ended,
                                            int block_size);

}  // namespace paged
