// Per-request generation parameters, with the meaning vLLM gives them.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "model/types.h"

namespace paged {

/// Most bytes of stop strings one request may have (check_sampling_params refuses more; a worker's step decoder
/// takes no more).
inline constexpr size_t kMaxStopBytes = size_t{1} << 20;
/// Most bytes of bad words one request may have (likewise).
inline constexpr size_t kMaxBadWordBytes = size_t{1} << 16;

/// Structured outputs: what every completion's text must be, as the request wrote it (compiled by the engine,
/// model/constraint/structured_output.h).
struct StructuredOutput {
  enum class Kind : uint8_t { none, json_schema, json_object, regex, choice, grammar, structural_tag };
  Kind kind = Kind::none;
  std::string spec;   // json_schema: the schema as JSON text; regex: the pattern; choice: a JSON list of strings;
                      // grammar: GBNF; structural_tag: {"structures": [...], "triggers": [...]} as JSON text
                      // (model/constraint/structural_tag.h); json_object, none: empty
  std::string field;  // the request field it came from (e.g. "response_format"), which errors name
  // The constraint starts after this text of the output (a reasoning parser's "</think>": the think block is free,
  // as vLLM's structured outputs with a reasoning parser); a prompt that already holds it starts it at once. Empty:
  // from the first token.
  std::string after;
  // json_schema, json_object: the whitespace between JSON tokens as a regex (vLLM's whitespace_pattern; "" for its
  // disable_any_whitespace); nullopt: the default (none, a space, or a newline and up to 20 spaces or tabs).
  std::optional<std::string> whitespace;
  auto operator<=>(const StructuredOutput&) const = default;  // field by field (== too)
};

struct SamplingParams {
  int n = 1;                       // completions returned
  int best_of = 0;                 // completions generated (0: same as n); the n best by cumulative logprob return
  bool use_beam_search = false;    // beam search of width max(n, best_of)
  float length_penalty = 1.0f;     // beam search: hypotheses rank by cumulative logprob / length^length_penalty
  int max_tokens = 16;             // generated tokens at most
  int min_tokens = 0;              // EOS/stop ids are masked before this many tokens
  float temperature = 1.0f;        // 0: greedy
  float top_p = 1.0f;              // (0, 1]
  int top_k = -1;                  // -1 or 0: off
  float min_p = 0.0f;              // [0, 1]
  std::optional<uint64_t> seed;    // reproducible sampling; completion i of n uses seed + i
  float repetition_penalty = 1.0f; // > 0; applies to prompt and output tokens (HF/vLLM)
  float presence_penalty = 0.0f;   // [-2, 2]; output tokens
  float frequency_penalty = 0.0f;  // [-2, 2]; output tokens
  std::map<TokenId, float> logit_bias;
  std::vector<TokenId> stop_token_ids;  // besides the model's EOS ids
  std::vector<std::string> stop;        // stop strings; the text is cut before them
  // vLLM's allowed_token_ids: the only tokens that may be generated; empty: every token.
  std::vector<TokenId> allowed_token_ids;
  // vLLM's bad_words: words never generated, as the request wrote them; the engine tokenizes them into
  // bad_words_token_ids (each word with and without a leading space, model/sampling/bad_words.h), which the samplers
  // read: a word's last token is masked when the output ends with the tokens before it.
  std::vector<std::string> bad_words;
  std::vector<std::vector<TokenId>> bad_words_token_ids;
  bool ignore_eos = false;
  std::optional<int> logprobs;          // return the chosen token's logprob and this many top alternatives
  std::optional<int> prompt_logprobs;   // return every prompt token's logprob (vLLM's) and this many top alternatives
  bool skip_special_tokens = true;
  bool include_stop_str_in_output = false;  // the stop string that ended a completion stays in its text
  StructuredOutput structured;              // none: free text
  // vLLM's cache_salt, hashed (0: none): a request finds in the prefix cache only the blocks of requests with the
  // same salt, so that tenants cannot learn each other's prompts from time to first token.
  uint64_t cache_salt = 0;
  // The LoRA adapter (EngineConfig::lora_modules' index + 1) whose weights join the model's for this request; 0: the
  // base model. The engine mixes the adapter's content into cache_salt: its KV is found only by its own requests.
  int32_t lora = 0;
  // vLLM's priority (with --scheduling-policy priority; else 0): lower values are admitted first and preempted last.
  int priority = 0;

  bool greedy() const { return temperature == 0.0f; }
  bool operator==(const SamplingParams&) const = default;  // every field equal
};

/// A model's defaults for what a request leaves out (vLLM's --generation-config: the model's generation_config.json,
/// or overrides); nullopt: the API's own default. max_tokens also caps what a request asks (max_new_tokens).
struct SamplingDefaults {
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int> top_k;
  std::optional<float> min_p;
  std::optional<float> repetition_penalty;
  std::optional<int> max_tokens;
  bool operator==(const SamplingDefaults&) const = default;
};

}  // namespace paged
