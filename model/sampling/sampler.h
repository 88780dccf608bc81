// Logits processing and sampling of one sequence, the reference the GPU sampler reproduces.
// Deterministic: the random number used for output token i of a sequence with seed s is random_uniform(s, i), so a
// seeded request gives the same tokens whatever it is batched with, on CPU or GPU.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "model/sampling/sample.h"

namespace paged {

/// Uniform in [0, 1) from (seed, index): splitmix64 of seed + (index + 1) * golden ratio, top 53 bits.
double random_uniform(uint64_t seed, uint64_t index);

/// log-softmax of `logits` at `ids`' positions, computed in double for stability.
void log_softmax(std::span<const float> logits, std::vector<float>& out);

/// Scores `token` under `logits` (one position, raw): its log-softmax, its rank (how many logits are at least its
/// own) and the `num_top` most likely tokens (largest logits, ties by lower id) with their logprobs. The CPU twin of
/// cuda::score_tokens (kernels/cuda/sampling.h).
PromptLogprob score_token(std::span<const float> logits, TokenId token, int num_top);

/// A sequence's logits processing as lists, applied in this order (vLLM's): logit_bias adds `bias` values at their
/// ids, min_tokens masks `masked` ids to -inf, the repetition penalty (HF: each id of prompt and output once) divides
/// a positive logit by `repetition` and multiplies a negative one, presence and frequency penalties subtract
/// `subtract` values (frequency x count + presence, one per id of the output); bad words mask their next token as
/// `masked` too (append_bad_word_bans). Ids within the vocabulary only. The
/// one description of the processing, which apply_penalty_ops (CPU) and cuda::apply_penalties (GPU) both apply.
struct PenaltyOps {
  std::vector<std::pair<TokenId, float>> bias;
  std::vector<TokenId> masked;
  float repetition = 1.0f;
  std::vector<TokenId> repeated;  // empty when repetition is 1
  std::vector<std::pair<TokenId, float>> subtract;
  bool empty() const { return bias.empty() && masked.empty() && repeated.empty() && subtract.empty(); }
};
PenaltyOps penalty_ops(const SampleSpec& spec, int vocab);
/// Applies `ops` to one row of logits, in place.
void apply_penalty_ops(std::span<float> logits, const PenaltyOps& ops);

/// The tokens `spec` may sample, as a token bitmask (TokenMaskSource's layout, ceil(vocab / 32) words): its
/// structured output's (mask_source) within its allowed_token_ids. False, `mask` untouched, when neither restricts.
bool fill_token_mask(const SampleSpec& spec, std::span<uint32_t> mask);

/// Sets to -inf every logit whose bit in `allowed` (a token bitmask, TokenMaskSource's layout) is clear. The CPU
/// twin of cuda::apply_token_bitmask.
void apply_token_mask(std::span<float> logits, std::span<const uint32_t> allowed);

/// apply_penalty_ops(logits, penalty_ops(spec, logits.size())).
void apply_penalties(std::span<float> logits, const SampleSpec& spec);

/// Samples from `logits` (one sequence, vocab entries): penalties, the token mask (fill_token_mask), then greedy or temperature / top-k / top-p /
/// min-p and inverse-CDF sampling over probabilities sorted descending (ties by lower id). Logprobs are the
/// log-softmax of the logits after penalties, before temperature (what the request is billed against).
/// With spec.num_candidates > 1 (beam search) returns that many best tokens by logprob instead of sampling.
std::vector<SampledToken> sample_logits(std::span<float> logits, const SampleSpec& spec);

}  // namespace paged
