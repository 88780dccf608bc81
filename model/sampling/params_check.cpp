#include "model/sampling/params_check.h"

#include <algorithm>
#include <string>

#include "model/unicode/utf8.h"

namespace paged {

namespace {

std::optional<FieldError> bad(std::string field, std::string message) {
  return FieldError{std::move(field), std::move(message)};
}

}  // namespace

std::optional<FieldError> check_sampling_params(const SamplingParams& p, int vocab) {
  const std::string most = std::to_string(kMaxCompletions);
  if (p.n < 1 || p.n > kMaxCompletions) return bad("n", "n must be in [1, " + most + "]");
  if (p.best_of != 0 && (p.best_of < p.n || p.best_of > kMaxCompletions))
    return bad("best_of", "best_of must be in [n, " + most + "]");
  if (p.max_tokens < 1) return bad("max_tokens", "max_tokens must be at least 1");
  if (p.min_tokens < 0 || p.min_tokens > p.max_tokens)
    return bad("min_tokens", "min_tokens must be in [0, max_tokens]");
  if (!(p.temperature >= 0.0f) || p.temperature > 100.0f)
    return bad("temperature", "temperature must be in [0, 100]");
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return bad("top_p", "top_p must be in (0, 1]");
  if (p.top_k < -1) return bad("top_k", "top_k must be -1 (off) or positive");
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) return bad("min_p", "min_p must be in [0, 1]");
  if (!(p.repetition_penalty > 0.0f && p.repetition_penalty <= 10.0f))
    return bad("repetition_penalty", "repetition_penalty must be in (0, 10]");
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f))
    return bad("presence_penalty", "presence_penalty must be in [-2, 2]");
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f))
    return bad("frequency_penalty", "frequency_penalty must be in [-2, 2]");
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || id >= vocab)
      return bad("logit_bias", "logit_bias key " + std::to_string(id) + " is outside the vocabulary [0, " +
                                   std::to_string(vocab) + ")");
    if (!(bias >= -100.0f && bias <= 100.0f)) return bad("logit_bias", "logit_bias values must be in [-100, 100]");
  }
  if (p.stop_token_ids.size() > kMaxStopTokenIds)
    return bad("stop_token_ids", "at most " + std::to_string(kMaxStopTokenIds) + " stop_token_ids");
  for (TokenId id : p.stop_token_ids)
    if (id < 0 || id >= vocab) return bad("stop_token_ids", "stop_token_ids entry outside the vocabulary");
  if (p.stop.size() > kMaxStopStrings) return bad("stop", "at most " + std::to_string(kMaxStopStrings) + " stop strings");
  size_t stop_bytes = 0;
  for (const auto& s : p.stop) {
    if (s.empty()) return bad("stop", "stop strings must not be empty");
    if (!utf8::is_valid(s)) return bad("stop", "stop strings must be valid UTF-8");
    stop_bytes += s.size();
  }
  if (stop_bytes > kMaxStopBytes)
    return bad("stop", "stop strings must total at most " + std::to_string(kMaxStopBytes) + " bytes");
  if (p.allowed_token_ids.size() > static_cast<size_t>(std::max(vocab, 0)))
    return bad("allowed_token_ids", "allowed_token_ids has more entries than the vocabulary has tokens");
  for (TokenId id : p.allowed_token_ids)
    if (id < 0 || id >= vocab)
      return bad("allowed_token_ids", "allowed_token_ids entry " + std::to_string(id) + " is outside the vocabulary [0, " +
                                          std::to_string(vocab) + ")");
  if (p.bad_words.size() > kMaxBadWords)
    return bad("bad_words", "at most " + std::to_string(kMaxBadWords) + " bad words");
  size_t bad_word_bytes = 0;
  for (const auto& w : p.bad_words) {
    if (w.find_first_not_of(" \t\n\r\f\v") == std::string::npos)
      return bad("bad_words", "bad words must not be empty or only whitespace");
    if (!utf8::is_valid(w)) return bad("bad_words", "bad words must be valid UTF-8");
    bad_word_bytes += w.size();
  }
  if (bad_word_bytes > kMaxBadWordBytes)
    return bad("bad_words", "bad words must total at most " + std::to_string(kMaxBadWordBytes) + " bytes");
  // What the engine made of the words (bad_words_token_ids): two spellings of each at most, none empty, each of at
  // most its bytes, a space and a tokenizer's prefix token.
  if (p.bad_words_token_ids.size() > 2 * kMaxBadWords)
    return bad("bad_words", "at most " + std::to_string(2 * kMaxBadWords) + " bad-word token sequences");
  size_t bad_word_tokens = 0;
  for (const auto& word : p.bad_words_token_ids) {
    if (word.empty()) return bad("bad_words", "a bad word's token sequence is empty");
    for (TokenId id : word)
      if (id < 0 || id >= vocab) return bad("bad_words", "a bad word's token is outside the vocabulary");
    bad_word_tokens += word.size();
  }
  if (bad_word_tokens > 2 * (kMaxBadWordBytes + 2 * kMaxBadWords))
    return bad("bad_words", "the bad words' token sequences are longer than their bytes allow");
  if (p.logprobs && (*p.logprobs < 0 || *p.logprobs > kMaxLogprobs))
    return bad("logprobs", "logprobs must be in [0, " + std::to_string(kMaxLogprobs) + "]");
  if (p.prompt_logprobs && (*p.prompt_logprobs < 0 || *p.prompt_logprobs > kMaxLogprobs))
    return bad("prompt_logprobs", "prompt_logprobs must be in [0, " + std::to_string(kMaxLogprobs) + "]");
  if (p.use_beam_search && p.temperature != 0.0f) return bad("temperature", "beam search requires temperature 0");
  if (!(p.length_penalty >= -100.0f && p.length_penalty <= 100.0f))
    return bad("length_penalty", "length_penalty must be in [-100, 100]");
  if (p.length_penalty != 1.0f && !p.use_beam_search)
    return bad("length_penalty", "length_penalty applies to beam search only (use_beam_search)");
  if (p.structured.kind != StructuredOutput::Kind::none) {
    // A structured output ends on EOS once its grammar is complete: masking EOS could leave no token allowed.
    const std::string& field = p.structured.field;
    if (p.use_beam_search) return bad(field, "structured outputs are not supported with beam search");
    if (p.ignore_eos) return bad(field, "structured outputs are not supported with ignore_eos");
    if (p.min_tokens > 0) return bad(field, "structured outputs are not supported with min_tokens");
    // Likewise: the grammar's tokens and the allowed ones might not meet.
    if (!p.allowed_token_ids.empty()) return bad(field, "structured outputs are not supported with allowed_token_ids");
  }
  return std::nullopt;
}

std::optional<FieldError> check_allowed_tokens_left(const SamplingParams& p, std::span<const TokenId> stop_ids) {
  if (p.allowed_token_ids.empty()) return std::nullopt;
  const auto allowed = [&](TokenId id) {
    return std::find(p.allowed_token_ids.begin(), p.allowed_token_ids.end(), id) != p.allowed_token_ids.end();
  };
  const auto masked = [&](TokenId id) {
    // A bad word ending in `id` whose other tokens an output of allowed tokens can end with.
    const bool bad_word = std::any_of(p.bad_words_token_ids.begin(), p.bad_words_token_ids.end(),
                                      [&](const std::vector<TokenId>& w) {
                                        return !w.empty() && w.back() == id && std::all_of(w.begin(), w.end() - 1, allowed);
                                      });
    const bool early_stop =
        p.min_tokens > 0 && std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end();
    return bad_word || early_stop;
  };
  if (std::all_of(p.allowed_token_ids.begin(), p.allowed_token_ids.end(), masked))
    return bad("allowed_token_ids", "every token of allowed_token_ids can be masked (a bad word made of allowed "
                                    "tokens ends with it, or it stops before min_tokens): nothing could be generated");
  return std::nullopt;
}

}  // namespace paged
