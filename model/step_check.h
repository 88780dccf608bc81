// Checks a step against the runner it is for, before any memory is touched. A worker executes steps and swap orders
// that arrive from another process (actors/executor_actor.cpp): a bad one must fail alone, not write outside the KV
// pools, read past a block table or feed the sampler NaN. Pure: no CAF, no CUDA; O(tokens + blocks + sampling
// inputs) per step, or O(tokens + blocks + sampling parameters) for a caller that has checked the histories' ids.
#pragma once

#include <optional>
#include <span>
#include <vector>

#include "model/field_error.h"
#include "model/sampling/params_check.h"
#include "model/step.h"

namespace paged {

/// What a runner was built to take: its vocabulary, its KV pools and the largest step it was sized for.
struct StepLimits {
  int vocab_size = 0;              // token ids in [0, vocab_size)
  int block_size = 16;             // tokens per KV block (at least 1)
  int num_blocks = 0;              // the device pool: block ids in [0, num_blocks)
  int num_swap_blocks = 0;         // the CPU swap pool: swap block ids in [0, num_swap_blocks)
  int max_model_len = 0;           // positions in [0, max_model_len)
  int max_num_batched_tokens = 0;  // tokens per step, over all chunks (and so chunks: each has a token)
  std::vector<int> kv_windows = {0};  // per KV group (KvGroups::windows): a chunk has a table per group, whose entries
                                      // before the chunk's first_window_block with its window may be kReleasedBlock
                                      // (read by no layer); 0: none may
  int num_loras = 0;                  // LoRA adapters: a chunk's lora in [0, num_loras]
};

/// Most samples one chunk draws: a parallel-sampling group draws one per completion at its first token.
inline constexpr int kMaxSamplesPerChunk = kMaxCompletions;
/// Most candidates one sample returns: beam search asks for two per beam.
inline constexpr int kMaxCandidates = 2 * kMaxCompletions;

/// Which order a list of block pairs (src, dst) is, and so which pool each side of a pair is in.
enum class PairOrder {
  copy_on_write,  // device block -> device block, applied before a step (StepBatch::copies)
  swap_out,       // device block -> CPU swap block
  swap_in,        // CPU swap block -> device block
};

/// The first bad pair of `pairs`, or nullopt when all are good: each side inside its pool (`num_blocks` device
/// blocks, `num_swap_blocks` swap blocks), no destination twice and, for copy-on-write, no destination that is also
/// a source (the result would depend on the order the copies run in, and the CUDA runner runs them at once).
/// Fields are named "copies[i]", "swap_out[i]" or "swap_in[i]" with ".first" (source) or ".second" (destination).
std::optional<FieldError> check_block_pairs(const std::vector<BlockPair>& pairs, PairOrder order, int num_blocks,
                                            int num_swap_blocks);

/// The first bad block table of chunk `c` for KV groups of these windows (KvGroups::windows): a table per group
/// (".group_tables" names a wrong count), each reaching the chunk's last position and, with max_blocks > 0, no longer
/// than max_blocks (".block_table" for group 0, ".group_tables[g - 1]" for group g), every entry in the device pool
/// [0, num_blocks) ("[b]") but for kReleasedBlock entries before first_window_block(start_pos, window, block_size) of
/// its group (no layer of the group reads them); nullopt when all are good. check_step and the runners check tables
/// with it.
std::optional<FieldError> check_chunk_tables(const SeqChunk& c, std::span<const int> windows, int num_blocks,
                                             int block_size, int64_t max_blocks = 0);

/// The first id of `ids` outside the vocabulary [0, vocab_size), named "[i]"; nullopt when all are in it.
std::optional<FieldError> check_token_ids(std::span<const TokenId> ids, int vocab_size);

/// How much of each sample's history (its prompt, output and stop ids) check_step reads.
enum class HistoryCheck {
  full,          // every id, against the vocabulary, and the length of prompt and output
  lengths_only,  // the length only: the caller has checked every id already (a WireDecoder, as each arrives)
};

/// The first field of `step` that `limits` do not allow, or nullopt when the step is safe to execute. The step: at
/// most max_num_batched_tokens tokens in all, in chunks of distinct sequences (not bounded by max_num_seqs, which
/// bounds admissions: the forks of parallel sampling and beam search run beside the sequences admitted); its copies
/// as check_block_pairs says. A chunk: at least one token, each in the vocabulary; start_pos >= 0 and start_pos +
/// tokens <= max_model_len; a block table per KV group (block_table, then group_tables), each covering every position
/// written (and so every one read before them), of at most ceil(max_model_len / block_size) blocks of the device
/// pool, but for kReleasedBlock entries before the first block the chunk's queries see (first_window_block with the
/// group's window); at most kMaxSamplesPerChunk samples. A
/// sample: parameters, in range (check_sampling_params); num_logprobs in [0, kMaxLogprobs]; num_candidates in
/// [1, kMaxCandidates]; prompt, output and stop ids (each may be null) in the vocabulary, unless `history` is
/// lengths_only; a history (prompt and output) of at most max_model_len tokens. Drafts (num_drafts): in [0,
/// kMaxSpeculativeTokens], fewer than the chunk's tokens, with one sample of one candidate, no deferred token and no
/// prompt logprobs. Prompt logprobs: count in [0, the
/// chunk's tokens], num_top in [0, kMaxLogprobs], next_token in the vocabulary when count reaches the chunk's end
/// (".prompt_logprobs.count"). Fields are named by path:
/// "seqs[2].block_table[0]", "seqs[1].group_tables[0][3]", "seqs[0].samples[1].params.top_p".
std::optional<FieldError> check_step(const StepBatch& step, const StepLimits& limits,
                                     HistoryCheck history = HistoryCheck::full);

/// The first field of a worker's `result` for `step` that does not answer it, or nullopt: one entry per chunk with
/// samples, in the step's order and with its sequence ids; per chunk samples_answered candidate lists (one per spec,
/// or with drafts one per position verified), of 1 to num_candidates tokens; each token, and each of its at most
/// num_logprobs alternatives, in [0, vocab_size); one prompt_logprobs entry per chunk with prompt_logprobs.count > 0,
/// in order, with its sequence, first position (start_pos + 1) and one token per position scored: the token the
/// chunk asked about, a rank in [1, vocab_size], at most num_top alternatives in the vocabulary. Fields: "seqs",
/// "samples[i][k][c].token", "samples[i][k][c].top_logprobs[j]", "prompt_logprobs[i].tokens[j].rank". The engine
/// checks every result from another process with it before a token id reaches its tokenizer.
std::optional<FieldError> check_result(const StepResult& result, const StepBatch& step, int vocab_size);

}  // namespace paged
