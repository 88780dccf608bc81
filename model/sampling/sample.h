// What a runner samples for one sequence in one step, and what it returns: the inputs the sampler reads (parameters,
// seed, token histories) and a sampled token with its log-probabilities; and a prompt token scored.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "model/sampling/sampling_params.h"
#include "model/types.h"

namespace paged {

/// Structured outputs: where a sequence's allowed tokens come from. The runner that samples the sequence calls it
/// once per sample of a step, on its own thread, while the step runs (on the GPU, while the forward pass computes);
/// it does not change while a step that holds it is in flight.
class TokenMaskSource {
 public:
  virtual ~TokenMaskSource() = default;
  /// Writes the tokens allowed after `after` into `mask`, ceil(vocab / 32) words: bit id % 32 of word id / 32 set
  /// when id is. `after`: the ids the sequence generated that the source has not taken yet, oldest first: its newest
  /// token when the step before sampled it while this one was sent (SampleSpec::pending_output), then the drafts
  /// before the sampled position (SampleSpec::drafted); usually none. After an id the source refuses (a draft),
  /// what it writes does not matter: that position's sample is not taken.
  virtual void fill_mask(std::span<const TokenId> after, std::span<uint32_t> mask) const = 0;
};

/// Sampling inputs of one sequence in one step.
struct SampleSpec {
  const SamplingParams* params = nullptr;  // owned by the request; outlives the step
  uint64_t seed = 0;                       // the sequence's seed (request seed + completion index, or random)
  const std::vector<TokenId>* prompt = nullptr;   // prompt ids (repetition penalty)
  const std::vector<TokenId>* output = nullptr;   // ids generated so far (penalties, min_tokens, random stream)
  const std::vector<TokenId>* stop_ids = nullptr; // EOS (unless ignore_eos) and stop_token_ids: masked before min_tokens
  int num_logprobs = 0;                    // top alternatives to return (0: only the chosen token's)
  int num_candidates = 1;                  // beam search: how many best tokens to return
  /// The newest generated id when it is not in *output yet (a step sent before the one that sampled it returned:
  /// SeqChunk::last_token_deferred); -1: none. The ids generated so far are *output, then this one.
  TokenId pending_output = -1;
  const TokenMaskSource* mask_source = nullptr;  // structured outputs: the allowed tokens; null: every token
  /// Speculative decoding (SeqChunk::num_drafts): the drafts before this sample's position, which it takes as
  /// generated after *output and pending_output; empty otherwise. A view of the chunk's tokens (chunk_sample).
  std::span<const TokenId> drafted{};
};

/// How many ids the sequence has generated before this sample: its output, the pending one, the drafts before it.
inline size_t generated_count(const SampleSpec& spec) {
  return (spec.output ? spec.output->size() : 0) + (spec.pending_output >= 0 ? 1 : 0) + spec.drafted.size();
}

/// Calls f(id) for each id the sequence generated before this sample, oldest first: *output, pending_output, drafted.
template <class F>
void for_each_generated(const SampleSpec& spec, F&& f) {
  if (spec.output)
    for (TokenId id : *spec.output) f(id);
  if (spec.pending_output >= 0) f(spec.pending_output);
  for (TokenId id : spec.drafted) f(id);
}

/// The newest `n` ids generated before this sample (all when fewer), oldest first.
inline std::vector<TokenId> newest_generated(const SampleSpec& spec, size_t n) {
  std::vector<TokenId> newest;
  const size_t total = generated_count(spec), skip = total > n ? total - n : 0;
  size_t i = 0;
  for_each_generated(spec, [&](TokenId id) {
    if (i++ >= skip) newest.push_back(id);
  });
  return newest;
}

/// A sampled token with the log-probabilities the request asked for.
struct SampledToken {
  TokenId token = -1;
  float logprob = 0.0f;                                  // log-softmax of the processed logits
  std::vector<std::pair<TokenId, float>> top_logprobs;   // descending
};

/// A known token (of a prompt) scored by the logits of the position before it: log-softmax of the raw logits (no
/// penalties, no temperature), as vLLM's prompt_logprobs are.
struct PromptLogprob {
  TokenId token = -1;
  float logprob = 0.0f;
  int32_t rank = 0;  // vLLM's: how many tokens have a logprob at least this one's (1: the most likely)
  std::vector<std::pair<TokenId, float>> top_logprobs;  // the most likely tokens, descending, ties by lower id
};

}  // namespace paged
