// Tokenizers: the interface the engine uses, the loader that picks an implementation from a model folder, and the
// incremental detokenizer that turns a stream of token ids into text without ever emitting broken UTF-8.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "model/types.h"

namespace paged {

/// Raised for a missing or malformed tokenizer and for text that cannot be encoded (e.g. invalid UTF-8).
struct TokenizerError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  /// Token ids of `text`. `add_special` adds what the tokenizer config asks for (BOS for Llama, nothing for Qwen).
  /// Throws TokenizerError when `text` is not valid UTF-8.
  virtual std::vector<TokenId> encode(std::string_view text, bool add_special) const = 0;

  /// The raw bytes `id` contributes to decoded text (may be a partial UTF-8 sequence; byte-fallback and byte-level
  /// tokens are single bytes). Special/control tokens yield "" (HF's skip_special_tokens; see special_token_text).
  /// `first` is true for the first token of a decoded span: SentencePiece drops its dummy-prefix space there.
  virtual std::string token_bytes(TokenId id, bool first) const = 0;

  /// The text a special token writes when it is not skipped, as HF's `decode(ids, skip_special_tokens=False)`
  /// gives it (e.g. "</s>", "<|eot_id|>"); "" for any other id. Special: SentencePiece's BOS, EOS and UNK pieces,
  /// tokenizer.json's added tokens marked "special".
  virtual std::string special_token_text(TokenId id) const = 0;

  virtual int32_t vocab_size() const = 0;
  /// -1 when the tokenizer has none.
  virtual TokenId bos_id() const = 0;
  virtual std::vector<TokenId> eos_ids() const = 0;
  /// Id of a token by its exact string form (e.g. "<|eot_id|>"), -1 if absent.
  virtual TokenId token_to_id(std::string_view token) const = 0;

  /// Text of `ids` as HF's `decode(ids, skip_special_tokens)` gives it; invalid UTF-8 becomes U+FFFD.
  std::string decode(std::span<const TokenId> ids, bool skip_special_tokens = true) const;
};

/// Turns token ids into text one token at a time. Each push returns only complete UTF-8 characters; bytes of a
/// character split across tokens are held back until it completes. Bytes that can never complete are replaced by
/// U+FFFD. The concatenation of every push() and the final finish() equals Tokenizer::decode of all ids (with the
/// same skip_special_tokens).
class IncrementalDetokenizer {
 public:
  /// `skip_special_tokens`: special tokens add nothing (vLLM's default); false: they add their special_token_text.
  /// `preceding`: the ids before the first one pushed (a completion's prompt), whose text is not returned: the pushed
  /// ids decode as their continuation, decode(preceding + pushed) minus decode(preceding), as vLLM's text is (a
  /// SentencePiece word's leading space stays, which a decode from the first id would drop).
  IncrementalDetokenizer(const Tokenizer& tok, bool skip_special_tokens, std::span<const TokenId> preceding = {});
  /// Text newly completed by `id`.
  std::string push(TokenId id);
  /// Whatever is still held back, with incomplete sequences replaced by U+FFFD. The detokenizer can be reused after.
  std::string finish();

 private:
  const Tokenizer* tok_;
  bool skip_special_tokens_;
  std::string pending_;  // bytes of an incomplete UTF-8 character
  bool first_ = true;
};

}  // namespace paged
