// Steps as deltas, for an executor in another process (a `paged worker` reached through CAF's network layer). The
// head's WireEncoder remembers what it has sent the worker about each sequence and the worker's WireDecoder holds
// the same, so that a step carries only what changed: each chunk's tokens, its block table and output ids past the
// prefix the worker already holds, a sequence's sampling context (parameters, prompt, stop ids) once, the first time
// it samples on the worker, and the sequences that ended. A decode step costs the same few dozen bytes per sequence
// whatever its history (plus the blocks that changed: all of them after a swap-in or a recompute). Pure: no CAF (its
// inspect overloads are in actors/messages.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
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
  int32_t start_pos = 0;
  int32_t table_keep = 0;
  std::vector<int32_t> table_tail;
  std::optional<WireContext> context;  // chunks with samples only: the context, when the worker lacks it
  int32_t output_keep = 0;             // chunks with samples only: the output ids, as (keep, tail)
  std::vector<TokenId> output_tail;
  std::vector<WireSample> samples;
};

struct WireStep {
  std::vector<WireChunk> seqs;
  std::vector<BlockPair> copies;
  std::vector<SeqId> finished;  // sequences whose state both sides drop, before `seqs` apply
};

/// The head's side: turns each step into a delta against what it sent before. One per worker connection.
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
    std::vector<TokenId> output;
    bool context = false;
  };
  std::unordered_map<SeqId, Sent> sent_;
};

/// How much a WireDecoder holds at most, over all its sequences: a step that would hold more is refused.
struct WireBounds {
  size_t max_sequences = 65536;
  size_t max_tokens = size_t{1} << 26;  // prompt, output and stop ids
};

/// The worker's side: rebuilds each step from its delta and what the steps before sent, checked against the
/// runner's limits before anything is kept. Each step copies the output ids of the sequences it samples (staged
/// beside the state, so that a refused step leaves it as it was).
class WireDecoder {
 public:
  explicit WireDecoder(const StepLimits& limits, WireBounds bounds = {});

  /// The step `wire` describes, checked by check_step, its SampleSpecs pointing into this decoder (valid until the
  /// next decode() or reset()); or the first field of `wire` or of that step that is wrong (a keep beyond what is
  /// held, a sample of a sequence whose context never came, a bound passed, what check_step refuses), and then
  /// nothing has changed. `finished` drops those sequences (unknown ids are fine) before the chunks apply.
  std::variant<StepBatch, FieldError> decode(const WireStep& wire);
  /// Forgets every sequence (a new engine is served).
  void reset();
  /// Sequences and token ids held.
  size_t num_sequences() const { return seqs_.size(); }
  size_t num_tokens() const { return num_tokens_; }

 private:
  // What the decoder holds for one sequence. Context and output on the heap, so that a step's SampleSpecs stay
  // valid while the state moves.
  struct SeqState {
    std::vector<int32_t> table;
    std::shared_ptr<const WireContext> context;          // null: never sent
    std::shared_ptr<const std::vector<TokenId>> output;  // null: the sequence never sampled
  };
  static size_t tokens_of(const SeqState& s);  // its prompt, stop and output ids
  // What chunk `i` of a step makes of its sequence's state `old` (null: none held), each list bounded by
  // max_model_len before it is copied; or why the chunk does not follow from `old`.
  std::variant<SeqState, FieldError> next_state(size_t i, const WireChunk& wc, const SeqState* old) const;

  StepLimits limits_;
  WireBounds bounds_;
  std::unordered_map<SeqId, SeqState> seqs_;
  size_t num_tokens_ = 0;
};

}  // namespace paged
