// Logits processing and sampling of one sequence, the reference the GPU sampler reproduces.
// Deterministic: the random number used for output token i of a sequence with seed s is random_uniform(s, i), so a
// seeded request gives the same tokens whatever it is batched with, on CPU or GPU.
#pragma once

#include <cstdint>
#include <span>
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

/// Applies, in vLLM's order, logit_bias, min_tokens masking of `stop_ids`, the repetition penalty (HF: prompt and
/// output tokens), presence and frequency penalties (output tokens). In place.
void apply_penalties(std::span<float> logits, const SampleSpec& spec);

/// Samples from `logits` (one sequence, vocab entries): penalties, then greedy or temperature / top-k / top-p /
/// min-p and inverse-CDF sampling over probabilities sorted descending (ties by lower id). Logprobs are the
/// log-softmax of the logits after penalties, before temperature (what the request is billed against).
/// With spec.num_candidates > 1 (beam search) returns that many best tokens by logprob instead of sampling.
std::vector<SampledToken> sample_logits(std::span<float> logits, const SampleSpec& spec);

}  // namespace paged
