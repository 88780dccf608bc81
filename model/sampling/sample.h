// What a runner samples for one sequence in one step, and what it returns: the inputs the sampler reads (parameters,
// seed, token histories) and a sampled token with its log-probabilities.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "model/sampling/sampling_params.h"
#include "model/types.h"

namespace paged {

/// Sampling inputs of one sequence in one step.
struct SampleSpec {
  const SamplingParams* params = nullptr;  // owned by the request; outlives the step
  uint64_t seed = 0;                       // the sequence's seed (request seed + completion index, or random)
  const std::vector<TokenId>* prompt = nullptr;   // prompt ids (repetition penalty)
  const std::vector<TokenId>* output = nullptr;   // ids generated so far (penalties, min_tokens, random stream)
  const std::vector<TokenId>* stop_ids = nullptr; // EOS (unless ignore_eos) and stop_token_ids: masked before min_tokens
  int num_logprobs = 0;                    // top alternatives to return (0: only the chosen token's)
  int num_candidates = 1;                  // beam search: how many best tokens to return
};

/// A sampled token with the log-probabilities the request asked for.
struct SampledToken {
  TokenId token = -1;
  float logprob = 0.0f;                                  // log-softmax of the processed logits
  std::vector<std::pair<TokenId, float>> top_logprobs;   // descending
};

}  // namespace paged
