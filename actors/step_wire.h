// Steps as deltas, for an executor in another process (a `paged worker` reached through CAF's network layer). The
// head's WireEncoder remembers what it has sent the worker about each sequence and the worker's WireDecoder holds
// the same, so that a step carries only what changed: each chunk's tokens, its block table and output ids past the
// prefix the worker already holds, a sequence's sampling context (parameters, prompt, stop ids) once, the first time
// it samples on the worker, and the sequences that ended. A decode step costs the same few dozen bytes per sequence
// whatever its history (plus the blocks that changed: all of them after a swap-in or a recompute), and nearly the
// same CPU time on both sides: neither reads a sequence's token ids again (only its block table, one id per
// block). Steps and their results travel as bytes packed here
// (pack_step, pack_result), which CAF carries as one string each: CAF 0.17 serialises a std::vector element by
// element (about 17 ns each), a std::string as one copy. Pure: no CAF.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "model/field_error.h"
#include "model/sampling/sampling_params.h"
#include "model/step.h"
#include "model/step_check.h"

namespace paged {

/// What the samples of a sequence read that stays fixed for its life: sent once per sequence and worker.
struct WireContext {
  SamplingParams params;
  std::vector<TokenId> prompt, stop_ids;
};

/// What differs between the samples of one chunk (they share the sequence's context and output ids).
struct WireSample {
  uint64_t seed = 0;
  int num_logprobs = 0, num_candidates = 1;
};

/// A SeqChunk as a delta against what the worker holds for its sequence. A list sent as (keep, tail) is the first
/// `keep` entries of the worker's copy, then `tail`; the worker's copy becomes that list.
struct WireChunk {
  SeqId seq = 0;
  std::vector<TokenId> tokens;
  bool last_token_deferred = false;    // SeqChunk's: the worker fills tokens.back() in from its last samples
  int32_t num_drafts = 0;              // SeqChunk's: the last tokens that are drafts (speculative decoding)
  int32_t lora = 0;                    // SeqChunk's: its LoRA adapter (0: none)
  int32_t start_pos = 0;
  int32_t table_keep = 0;                         // block_table (KV group 0's)
  std::vector<int32_t> table_tail;
  std::vector<int32_t> group_keeps;                // group_tables (KV groups 1..), as (keep, tail) each
  std::vector<std::vector<int32_t>> group_tails;
  std::optional<WireContext> context;  // chunks with samples only: the context, when the worker lacks it
  int32_t output_keep = 0;             // chunks with samples only: the output ids, as (keep, tail)
  std::vector<TokenId> output_tail;
  std::vector<WireSample> samples;
  PromptLogprobsSpec prompt_logprobs;  // as it is (a prefill of a request asking for prompt logprobs)
};

struct WireStep {
  std::vector<WireChunk> seqs;
  std::vector<BlockPair> copies;
  std::vector<SeqId> finished;  // sequences whose state both sides drop, before `seqs` apply
};

/// The head's side: turns each step into a delta against what it sent before. One per worker connection.
/// Contract: while a sequence id lives (until a step lists it in `finished`), its output ids only grow, as they do in
/// the scheduler (a fork, or a request moved from a lost replica, is a new SeqId). So the output sent is compared by
/// its last id only (O(new ids) per step): a held output whose last id is where it was counts as a prefix; else (the
/// contract broken: a shorter output, or its last held id changed) the whole output is compared. Block tables are
/// compared whole (they are short, and change in place: copy-on-write, swap-in, recompute).
class WireEncoder {
 public:
  /// `batch` as a delta against the steps encoded before, which it then remembers. The samples of a chunk must share
  /// their parameters, prompt, output and stop ids (by pointer or value, a null list counting as empty; the
  /// scheduler builds them so): else std::logic_error, with nothing remembered. A sequence's context goes once, so
  /// it must stay fixed for the sequence's life (it is its request's).
  WireStep encode(const StepBatch& batch);
  /// Forgets everything sent: the steps after it decode on any decoder, whatever that holds.
  void reset();

 private:
  // What the worker holds for one sequence, as sent.
  struct Sent {
    std::vector<int32_t> table;
    std::vector<std::vector<int32_t>> group_tables;
    std::vector<TokenId> output;
    bool context = false;
  };
  std::unordered_map<SeqId, Sent> sent_;
};

/// How much a WireDecoder holds at most, over all its sequences: a step that would hold more is refused.
struct WireBounds {
  size_t max_sequences = 65536;
  size_t max_tokens = size_t{1} << 26;  // ids held: prompt, output and stop ids, a context's lists and strings
                                        // (at 4 bytes an id)
};

/// The worker's side: rebuilds each step from its delta and what the steps before sent, checked against the
/// runner's limits before it is taken. O(what the step sends + block tables) per step: each output tail is appended
/// in place and the ids of each context and tail are checked against the vocabulary once, when they arrive (check_step
/// then checks the histories' lengths only); a refused step's changes are rolled back.
class WireDecoder {
 public:
  explicit WireDecoder(const StepLimits& limits, WireBounds bounds = {});

  /// The step `wire` describes (its lists taken over), checked by check_step, its SampleSpecs pointing into this
  /// decoder (valid until the next decode() or reset()); or the first field of `wire` or of that step that is wrong
  /// (a keep beyond what is held, a sample of a sequence whose context never came, an id of a context or an output
  /// tail outside the vocabulary, a bound passed, what check_step refuses), and then nothing has changed.
  /// `finished` drops those sequences (unknown ids are fine) before the chunks apply.
  std::variant<StepBatch, FieldError> decode(WireStep wire);
  /// Forgets every sequence (a new engine is served).
  void reset();
  /// Sequences and token ids held.
  size_t num_sequences() const { return seqs_.size(); }
  size_t num_tokens() const { return num_tokens_; }

 private:
  // What the decoder holds for one sequence, on the heap, so that a step's SampleSpecs stay valid while the map
  // changes.
  struct SeqState {
    std::vector<int32_t> table;
    std::vector<std::vector<int32_t>> group_tables;
    std::shared_ptr<const WireContext> context;  // null: never sent
    std::vector<TokenId> output;
  };
  struct Change;  // what a step changed of a sequence held before it, to put back when the step is refused
  static size_t tokens_of(const SeqState& s);  // its prompt, stop and output ids
  // The error of chunk `i` of a step against its sequence's state `old` (null: none held), which holds `tokens` ids
  // after it; nullopt when the chunk follows from `old`. Reads only what the chunk sends.
  std::optional<FieldError> check_chunk(size_t i, const WireChunk& wc, const SeqState* old, size_t& tokens) const;
  // Applies a checked chunk to `state` in place (taking its context), recording in `before` how to undo it.
  static void apply(WireChunk& wc, SeqState& state, Change& before);
  static void undo(Change& change);

  StepLimits limits_;
  WireBounds bounds_;
  std::unordered_map<SeqId, std::unique_ptr<SeqState>> seqs_;
  size_t num_tokens_ = 0;
};

/// A WireStep as bytes (pack_step), the message a head sends a worker.
struct PackedStep {
  std::string bytes;
};
/// A StepResult as bytes (pack_result), a worker's answer to a PackedStep.
struct PackedResult {
  std::string bytes;
};


// The bytes: fixed-width little-endian integers, floats as their IEEE-754 bits (an infinity or a NaN as it is); a
// list is a u32 count, then its entries; a flag one byte, 0 or 1; an optional a flag, then its value when set.
//   step:    chunks, copies (i32 source, i32 destination), finished (u64)
//   chunk:   u64 seq, tokens (i32), flag last_token_deferred, i32 num_drafts, i32 start_pos, i32 table_keep,
//            table_tail (i32), group tables (i32 keep, tail (i32)), optional context, i32 output_keep, output_tail
//            (i32), samples (u64 seed, i32 num_logprobs, i32 num_candidates), optional prompt logprobs (i32 count,
//            i32 num_top, i32 next_token), set when count > 0, i32 lora
//   context: parameters, prompt (i32), stop_ids (i32)
//   parameters: the fields of SamplingParams in declaration order; int as i32, bool as a flag; logit_bias as
//            (i32 token, f32 bias) in ascending token order; stop and bad_words as strings (u32 length, then the
//            bytes); bad_words_token_ids as a list of lists (i32)
//   result:  seqs (u64), then a list per chunk of a list per sample of candidates (i32 token, f32 logprob,
//            top_logprobs as (i32 token, f32 logprob)), then prompt_logprobs: per chunk u64 seq, i32 first_pos and
//            its tokens (i32 token, f32 logprob, i32 rank, top_logprobs as (i32 token, f32 logprob))

/// `step` as bytes. Throws std::length_error for a list of more than 2^32 - 1 entries.
std::string pack_step(const WireStep& step);
/// The step that `bytes` hold; or, for bytes that are no packed step (cut short, a count beyond the bytes left, a
/// flag neither 0 nor 1, logit_bias keys out of order or twice, stop strings over kMaxStopBytes, bad words over
/// kMaxBadWordBytes, a spec for a structured output of a kind that has none, bytes after the end), the field where
/// they fail, with its byte offset. Untrusted input: nothing is allocated before the bytes left are known to hold
/// it. Values are not checked (the WireDecoder and check_step do that).
std::variant<WireStep, FieldError> unpack_step(std::string_view bytes);
/// `result` as bytes. Throws std::length_error for a list of more than 2^32 - 1 entries.
std::string pack_result(const StepResult& result);
/// The result that `bytes` hold, or where they fail, as unpack_step. Values are not checked.
std::variant<StepResult, FieldError> unpack_result(std::string_view bytes);

}  // namespace paged
