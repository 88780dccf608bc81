// One step of the engine as the executors see it: which sequences run, which of their tokens are computed, where
// their K/V goes, and what to sample. Built by the scheduler, executed by a ModelRunner (CPU or CUDA).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "model/sampling/sample.h"
#include "model/types.h"

namespace paged {

struct LoraAdapter;  // model/lora/lora_adapter.h

/// The prompt log-probabilities one chunk scores (vLLM's prompt_logprobs): the logits at each of its first `count`
/// tokens score the token after it, tokens[i + 1], or `next_token` after the last one.
struct PromptLogprobsSpec {
  int count = 0;            // tokens whose logits score their successor, from tokens[0]; 0: none
  int num_top = 0;          // alternatives returned per scored token, [0, kMaxLogprobs]
  TokenId next_token = -1;  // the token after tokens.back(); read only when count == tokens.size()
};

/// The part of one sequence computed in a step.
struct SeqChunk {
  SeqId seq = 0;
  std::vector<TokenId> tokens;       // the tokens whose K/V this step computes
  int32_t start_pos = 0;             // position of tokens[0] (= tokens already in the cache)
  std::vector<int32_t> block_table;  // physical blocks of positions 0 .. start_pos + tokens.size() - 1 (KV group 0)
  /// The tables of KV groups 1.. (model/kv/kv_groups.h: a model whose layers slide only partly), over the same
  /// positions; empty with one group.
  std::vector<std::vector<int32_t>> group_tables;
  /// Samples to draw from the logits of the last token (empty: none). Usually one; a parallel-sampling group
  /// draws one per completion at its first token, from the same logits.
  std::vector<SampleSpec> samples;
  PromptLogprobsSpec prompt_logprobs;
  /// tokens.back() is the token this sequence sampled in the step sent before this one, which had not returned when
  /// this one was sent (two steps in flight); the scheduler leaves it -1 and the executor fills it in, with each
  /// sample's pending_output (DeferredTokens, model/deferred_tokens.h).
  bool last_token_deferred = false;
  /// Speculative decoding (model/speculative/ngram.h): the last num_drafts tokens are drafts, proposed and not yet
  /// the sequence's. The chunk then has one sample spec, of one candidate, and the step samples the logits of each
  /// of its last num_drafts + 1 tokens with it (chunk_sample), in order; each sample takes the drafts before its
  /// position as generated. 0: the samples are of the last token's logits.
  int32_t num_drafts = 0;
  /// The LoRA adapter whose pairs join the base weights for this chunk's tokens (ModelRunner::add_lora's id); 0: none.
  int32_t lora = 0;
};

/// How many samples a step answers for chunk `c`: one per position verified (num_drafts + 1), else one per spec.
inline size_t samples_answered(const SeqChunk& c) {
  return c.num_drafts > 0 ? static_cast<size_t>(c.num_drafts) + 1 : c.samples.size();
}

/// Sample `k` of chunk `c` (k < samples_answered(c)): its spec, and which of the chunk's tokens' logits it samples.
/// The spec's `drafted` views c.tokens: it lives as long as the chunk, unmoved.
struct ChunkSample {
  SampleSpec spec;
  size_t token = 0;  // index into c.tokens
};
inline ChunkSample chunk_sample(const SeqChunk& c, size_t k) {
  if (c.num_drafts <= 0) return {c.samples.at(k), c.tokens.size() - 1};
  const size_t first_draft = c.tokens.size() - static_cast<size_t>(c.num_drafts);
  ChunkSample s{c.samples.at(0), first_draft - 1 + k};
  s.spec.drafted = std::span<const TokenId>(c.tokens).subspan(first_draft, k);
  return s;
}

/// The block table of KV group `group` of a chunk (block_table for group 0).
inline const std::vector<int32_t>& table_of(const SeqChunk& c, int group) {
  return group == 0 ? c.block_table : c.group_tables.at(static_cast<size_t>(group) - 1);
}

/// Cache slot of position `pos` in a sequence's `block_table`: block_table[pos / block_size] * block_size +
/// pos % block_size. Throws std::out_of_range when the table does not reach pos (pos >= 0).
inline int64_t kv_slot(const std::vector<int32_t>& block_table, int32_t pos, int block_size) {
  return int64_t{block_table.at(pos / block_size)} * block_size + pos % block_size;
}

struct StepBatch {
  std::vector<SeqChunk> seqs;
  std::vector<BlockPair> copies;     // copy-on-write orders, applied before this step's attention
  /// Sequences ended since the previous step (their blocks are freed): a runner that keeps per-sequence state (a
  /// worker's wire decoder) drops theirs. None of them appears in `seqs`.
  std::vector<SeqId> finished;
};

/// The prompt tokens one chunk scored: tokens[i] is the token at position first_pos + i, scored by the logits of
/// the position before it.
struct ChunkPromptLogprobs {
  SeqId seq = 0;
  int32_t first_pos = 0;  // the chunk's start_pos + 1
  std::vector<PromptLogprob> tokens;
};

/// What a step cost the device, for the metrics and the step profile (model/scheduling/step_profile.h).
struct StepCost {
  int64_t busy_us = 0;           // the device's time on the step's work (CUDA events; CPU: execute's own time)
  int64_t idle_before_us = 0;    // the device idle between the previous step's work and this one's
  int graphs_captured = 0;       // CUDA graphs captured for this step (the first steps of their shapes)
  int64_t graph_capture_us = 0;  // and the time their capture took
};

/// Result of a step: one entry of seqs and samples per SeqChunk with samples (samples_answered of them), one of
/// prompt_logprobs per SeqChunk whose prompt_logprobs.count > 0, each in batch order.
struct StepResult {
  std::vector<SeqId> seqs;
  std::vector<std::vector<std::vector<SampledToken>>> samples;  // [chunk][sample (samples_answered)][candidate]
  std::vector<ChunkPromptLogprobs> prompt_logprobs;
  StepCost cost;  // rank 0's runner
};

/// A device that runs steps: owns weights and its slice of every KV block. Not thread-safe: one caller at a time.
class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  /// Runs the step: applies batch.copies, computes K/V of every chunk into the cache, samples where asked.
  virtual StepResult execute(const StepBatch& batch) = 0;
  /// Copies device blocks to the CPU swap pool (src device block, dst cpu block).
  virtual void swap_out(const std::vector<BlockPair>& device_to_cpu) = 0;
  /// Copies CPU swap-pool blocks back to the device (src cpu block, dst device block).
  virtual void swap_in(const std::vector<BlockPair>& cpu_to_device) = 0;
  /// Bytes of one host-pool block, K and V of every layer: what the disk tier keeps of it. 0: no access.
  virtual int64_t host_block_bytes() const { return 0; }
  /// Host block `block` (after every copy ordered before) into `out`, host_block_bytes() long; `in` into it.
  /// Throw std::out_of_range for a block outside the host pool or a wrong size.
  virtual void read_host_block(int32_t /*block*/, std::span<std::byte> /*out*/) {
    throw std::logic_error("this runner gives no access to its host blocks");
  }
  virtual void write_host_block(int32_t /*block*/, std::span<const std::byte> /*in*/) {
    throw std::logic_error("this runner gives no access to its host blocks");
  }
  /// Takes LoRA adapter `id` (> 0, not taken before; loaded for this runner's rank) for the chunks whose lora is id.
  virtual void add_lora(int32_t /*id*/, const LoraAdapter& /*adapter*/) {
    throw std::logic_error("this runner does not run LoRA adapters");
  }
  /// Drops adapter `id` (no chunk of it may follow); an id not taken is ignored.
  virtual void remove_lora(int32_t /*id*/) {}
};

}  // namespace paged
