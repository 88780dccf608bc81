// Token masks: which tokens of a vocabulary may come next under a grammar. The vocabulary is kept as its tokens'
// byte strings sorted (a trie flattened in order: consecutive strings share their common prefix), built once per
// tokenizer; a mask walks it against a matcher's frontier, advancing one byte per trie edge and skipping every
// token below a byte the grammar refuses.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "model/constraint/matcher.h"
#include "model/tokenizer/tokenizer.h"

namespace paged::constraint {

/// Words of a token bitmask over `vocab` tokens: bit (id % 32) of word id / 32 is set when id is allowed.
inline size_t mask_words(int32_t vocab) { return (static_cast<size_t>(vocab) + 31) / 32; }
inline bool mask_allows(std::span<const uint32_t> mask, int32_t id) { return (mask[id >> 5] >> (id & 31)) & 1; }

/// The bytes every token writes as the detokenizer writes them (IncrementalDetokenizer), sorted. Immutable; shared
/// by every request of a tokenizer.
class TokenTrie {
 public:
  /// Reads every token's bytes from `tok`. Tokens that write nothing (special tokens) are never allowed by a mask.
  explicit TokenTrie(const Tokenizer& tok);

  int32_t vocab_size() const { return vocab_; }
  /// The bytes `id` writes after some text (token_bytes(id, false)).
  const std::string& bytes(TokenId id) const { return bytes_[id]; }
  /// The bytes `id` writes at the start of a text, where they differ from bytes(id) (SentencePiece drops the
  /// dummy-prefix space there): (id, bytes) pairs.
  const std::vector<std::pair<TokenId, std::string>>& leading() const { return leading_; }

  /// Sets in `mask` (mask_words(vocab_size()) words, cleared first) every token whose bytes the matcher accepts from
  /// its frontier, written at the start of the text when `at_start`; `stop_ids` are allowed when the matcher can
  /// stop. Leaves the matcher as it was.
  void fill_mask(GrammarMatcher& matcher, bool at_start, std::span<const TokenId> stop_ids,
                 std::span<uint32_t> mask) const;

 private:
  int32_t vocab_ = 0;
  std::vector<std::string> bytes_;                         // by id
  std::vector<TokenId> order_;                             // ids with bytes, sorted by their bytes
  std::vector<uint32_t> shared_;                           // shared_[k]: common prefix of order_[k - 1] and order_[k]
  std::vector<std::pair<TokenId, std::string>> leading_;
};

/// One sequence's constraint: a matcher over its output text, advanced token by token, and the mask of what may
/// come next. Not thread-safe.
class TokenConstraint {
 public:
  /// `at_start`: the sequence's text so far (its prompt's decode) is empty, so the first token writes its leading
  /// form. `stop_ids` end the sequence: allowed when the grammar can stop.
  TokenConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> trie,
                  std::vector<TokenId> stop_ids, bool at_start);

  /// Takes an accepted token: advances over its bytes. A token the mask did not allow leaves the state unchanged
  /// and returns false.
  bool accept(TokenId id);
  /// The allowed next tokens (mask_words(vocab) words).
  void fill_mask(std::span<uint32_t> mask);
  /// A stop token was accepted.
  bool stopped() const { return stopped_; }
  int32_t vocab_size() const { return trie_->vocab_size(); }

 private:
  GrammarMatcher matcher_;
  std::shared_ptr<const TokenTrie> trie_;
  std::vector<TokenId> stop_ids_;
  bool at_start_;
  bool stopped_ = false;
};

}  // namespace paged::constraint
