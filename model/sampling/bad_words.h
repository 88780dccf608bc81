// vLLM's bad_words: words a request never wants generated. A word becomes token sequences (model/tokenizer); while
// sampling, a sequence's last token is masked whenever the output so far ends with the tokens before it, so that
// the word is never completed (a one-token word is masked always).
#pragma once

#include <span>
#include <string>
#include <vector>

#include "model/tokenizer/tokenizer.h"
#include "model/types.h"

namespace paged {

/// The token sequences of `words`, vLLM's: each word with its leading whitespace removed, encoded without special
/// tokens, and again after one space (a word inside text), the second kept only when it starts with another token
/// and has as many tokens (a space that only adds a token does not make a new spelling of the word). Throws
/// TokenizerError for a word that encodes to nothing or is not valid UTF-8.
std::vector<std::vector<TokenId>> bad_words_token_ids(const Tokenizer& tokenizer, std::span<const std::string> words);

/// Appends to `banned` the last token of each of `words` (token sequences) whose other tokens end the generated
/// ids, of which `newest` are the newest (oldest first; at least the longest word's length - 1 of them, or all).
/// A word longer than the generated ids plus one token bans nothing.
void append_bad_word_bans(std::span<const std::vector<TokenId>> words, std::span<const TokenId> newest,
                          std::vector<TokenId>& banned);

}  // namespace paged
