// The ranges the sampling parameters of a request must be in (vLLM's), as one pure check: the engine refuses a
// request outside them, and a worker refuses a step whose samples are (model/step_check.h), so that no NaN, no
// division by zero and no id outside the vocabulary reaches the sampler.
#pragma once

#include <optional>
#include <span>

#include "model/field_error.h"
#include "model/sampling/sampling_params.h"

namespace paged {

/// Most completions of one request (n, best_of).
inline constexpr int kMaxCompletions = 128;
/// Most top alternatives returned per token (logprobs, prompt_logprobs).
inline constexpr int kMaxLogprobs = 20;
/// Most stop strings and stop token ids of one request: each token of each completion is checked against all of
/// them (the strings by the request's actor, the ids on the scheduler's thread, which every request shares), so
/// that a 1 MiB body of 200,000 ids or 100,000 strings made a request 2-3 times slower to serve here.
inline constexpr size_t kMaxStopStrings = 256;
inline constexpr size_t kMaxStopTokenIds = 1024;
/// Most bad words of one request (each is matched against every completion's output at every step, like a stop
/// string), and most token sequences they may become (each word spelled alone and after a space).
inline constexpr size_t kMaxBadWords = 256;

/// The first parameter of `p` outside its range, named as in the request ("top_p", "logit_bias", ...), with token ids
/// checked against a vocabulary of `vocab_size`; nullopt when every one is in range. The prompt's length is not
/// its business (the engine checks the context against max_model_len).
std::optional<FieldError> check_sampling_params(const SamplingParams& p, int vocab_size);

/// With allowed_token_ids: an error when every allowed token can be masked (the last token of a bad word whose other
/// tokens are allowed, or a stop id in `stop_ids` before min_tokens), which could leave nothing to sample. Bans of
/// different tokens may need different outputs, so this refuses some requests that would never be stuck; it lets
/// none through that could be.
std::optional<FieldError> check_allowed_tokens_left(const SamplingParams& p, std::span<const TokenId> stop_ids);

}  // namespace paged
