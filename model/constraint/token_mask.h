// Token masks: which tokens of a vocabulary may come next under a grammar. The vocabulary is kept as its tokens'
// byte strings sorted (a trie flattened in order: consecutive strings share their common prefix), built once per
// tokenizer; a mask walks it against a matcher's frontier, advancing one byte per trie edge and skipping every
// token below a byte the grammar refuses.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "model/constraint/matcher.h"
#include "model/sampling/sample.h"
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
  /// The ids that write bytes, sorted by their bytes.
  const std::vector<TokenId>& order() const { return order_; }
  /// shared()[k]: how many leading bytes order()[k] shares with order()[k - 1] (0 for k = 0).
  const std::vector<uint32_t>& shared() const { return shared_; }
  /// The bytes of order()[k]: bytes(order()[k]), stored in sorted order (a mask's walk reads them one after the
  /// other).
  std::string_view sorted_bytes(size_t k) const {
    return std::string_view(sorted_.data() + sorted_offsets_[k], sorted_offsets_[k + 1] - sorted_offsets_[k]);
  }
  /// The bytes `id` writes at the start of a text, where they differ from bytes(id) (SentencePiece drops the
  /// dummy-prefix space there): (id, bytes) pairs.
  const std::vector<std::pair<TokenId, std::string>>& leading() const { return leading_; }

 private:
  int32_t vocab_ = 0;
  std::vector<std::string> bytes_;  // by id
  std::vector<TokenId> order_;
  std::vector<uint32_t> shared_;
  std::string sorted_;                   // every token's bytes of order_, concatenated
  std::vector<uint32_t> sorted_offsets_;  // where each begins in sorted_, and its end last
  std::vector<std::pair<TokenId, std::string>> leading_;
};

/// A grammar's automaton over the matcher's frontiers, built as it is used and shared by the sequences of one
/// request: each frontier gets an id, each (frontier, byte) transition is computed once, and so is each frontier's
/// token mask (a sequence writing the inside of a JSON string meets the same frontier step after step). Thread-safe:
/// a runner's thread fills masks while the scheduler's or the engine's thread starts or advances other sequences.
class ConstraintAutomaton {
 public:
  /// `stop_ids` end a sequence: allowed exactly where the grammar can stop.
  ConstraintAutomaton(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> trie,
                      std::vector<TokenId> stop_ids);

  /// The state no input leads out of.
  static constexpr uint32_t kDead = 0;
  /// The state before any input.
  uint32_t start() const { return start_; }
  /// Whether the input that led to `state` is a sentence of the grammar.
  bool can_stop(uint32_t state) const;
  /// The state after `bytes` from `state` (kDead as soon as one is refused).
  uint32_t walk(uint32_t state, std::string_view bytes);
  const TokenTrie& trie() const { return *trie_; }
  const std::vector<TokenId>& stop_ids() const { return stop_ids_; }

  /// Sets in `mask` (mask_words(vocab) words) every token whose bytes lead out of `state` to a live state (its
  /// leading form when `at_start`), and the stop ids when the state can stop or no token leads out of it (a dead
  /// end of a grammar cut at kMaxFrontierStacks: the sequence ends there instead of leaving the grammar).
  void fill_mask(uint32_t state, bool at_start, std::span<uint32_t> mask);

 private:
  // With mu_ held: the state of a frontier, the state after `byte` / `bytes` from `state` (kDead: refused).
  uint32_t intern(GrammarMatcher::Frontier f);
  uint32_t next(uint32_t state, uint8_t byte);
  uint32_t advance(uint32_t state, std::string_view bytes);

  std::shared_ptr<const TokenTrie> trie_;
  std::vector<TokenId> stop_ids_;
  GrammarMatcher matcher_;                                          // its arena interns the stacks
  std::vector<GrammarMatcher::Frontier> frontiers_;                 // by state; [kDead]: the dead one
  std::vector<uint8_t> live_;                                       // by state: its frontier has a stack
  std::map<std::pair<bool, std::vector<uint32_t>>, uint32_t> ids_;  // (accepts, sorted stacks) -> state
  // next_[state][byte]: the state after byte, kUnknown until computed (a table, not a map: a mask's walk over a
  // large vocabulary looks up hundreds of thousands of transitions).
  std::vector<std::array<uint32_t, 256>> next_;
  static constexpr uint32_t kUnknown = ~uint32_t{0};
  std::unordered_map<uint32_t, std::vector<uint32_t>> masks_;       // state -> mask (not at the start)
  std::deque<uint32_t> mask_order_;                                 // masks_'s states, oldest first
  // At most this many bytes of masks (4,096 of a 128K vocabulary: a nested schema's strings and numbers pass 256
  // states, and a mask missed costs up to milliseconds; a cache cleared at 256 made a constrained batch of 256
  // sequences redo them step after step).
  static constexpr size_t kMaxCachedMaskBytes = size_t{64} << 20;
  uint32_t start_ = kDead;
  mutable std::mutex mu_;  // guards all of the above but start_ (set once) and the immutable trie and stop ids
};

/// One sequence's constraint: its state in the request's automaton, advanced token by token, and the source of its
/// token masks. Copies share the automaton (forks of a sequence).
class TokenConstraint final : public TokenMaskSource {
 public:
  /// `at_start`: the sequence's text so far (its prompt's decode) is empty, so the first token writes its leading
  /// form. `after` (StructuredOutput::after): every token is allowed until the output has written this text, the
  /// grammar starts on the bytes after it; empty: at once.
  TokenConstraint(std::shared_ptr<ConstraintAutomaton> automaton, bool at_start, std::string after = {});

  /// Takes an accepted token: advances over its bytes. A token the mask did not allow leaves the state unchanged
  /// and returns false. Before `after` is written, every token is taken (and its bytes looked through for it; those
  /// after it go to the grammar, unless it refuses them).
  bool accept(TokenId id);
  /// The allowed next tokens (mask_words(vocab_size()) words) once the ids of `after` are accepted too, as accept()
  /// would take them (up to one it refuses); the stop ids alone once a stop token was accepted. Leaves this
  /// constraint as it is.
  void fill_mask(std::span<const TokenId> after, std::span<uint32_t> mask) const override;
  /// A stop token was accepted.
  bool stopped() const { return stopped_; }
  int32_t vocab_size() const { return automaton_->trie().vocab_size(); }

 private:
  std::shared_ptr<ConstraintAutomaton> automaton_;
  uint32_t state_;
  bool at_start_;
  bool stopped_ = false;
  std::string after_;  // not yet written: the grammar has not started
  std::string tail_;   // before that: the output's last bytes, fewer than after_'s (it may be written across tokens)
};

}  // namespace paged::constraint
