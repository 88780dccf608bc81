// Runs a Grammar over bytes: a pushdown recogniser that keeps every stack the input so far can be on. A stack is a
// chain of frames (a position in an alternative, the frame to return to); frames are interned, so a stack is one
// id, equal stacks are one id, and a set of stacks (a Frontier) is a list of ids. A finished alternative's frame is
// dropped before its last rule is entered (tail calls), so right recursion and repetition keep stacks short.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/constraint/grammar.h"

namespace paged::constraint {

/// Most stacks a frontier may hold, and most frames one step's expansion may visit. An ambiguous grammar's stacks
/// can double with every byte (root ::= "a" root "b" | "a" root "c" | "x": 2^n stacks after n a's) or with every
/// rule its start reaches (r0 ::= r1 "a" | r1 "b", r1 ::= r2 "a" | r2 "b", ...), which no compile-time size limit
/// sees: a byte that would pass either bound is refused (the language is cut there, so what is written stays in
/// it), and a start that passes one is a GrammarError.
inline constexpr size_t kMaxFrontierStacks = size_t{1} << 16;
inline constexpr size_t kMaxExpansionFrames = size_t{1} << 18;

class GrammarMatcher {
 public:
  /// Where the input so far can be: the stacks waiting for a byte, and whether the whole grammar may end here.
  struct Frontier {
    std::vector<uint32_t> stacks;  // each topped by a byte class; no repeats
    bool accepts = false;
    /// No byte and no end can follow: the input so far is not a prefix of the language.
    bool dead() const { return stacks.empty() && !accepts; }
  };

  /// At the start of the input. The grammar is shared (read only) by the matchers of one request. Throws GrammarError
  /// when the start's frontier passes kMaxFrontierStacks or kMaxExpansionFrames, or is dead (no text matches).
  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);

  /// The current frontier.
  const Frontier& frontier() const { return frontier_; }
  /// Whether the input so far is a sentence of the grammar.
  bool can_stop() const { return frontier_.accepts; }
  /// Whether some byte can follow the input so far.
  bool can_continue() const { return !frontier_.stacks.empty(); }

  /// Consumes `bytes` if the input so far followed by them is a prefix of the language; else returns false and
  /// changes nothing.
  bool accept(std::string_view bytes);

  /// The frontier after `byte` from `from` (dead when the byte cannot follow, or when the frontier would pass
  /// kMaxFrontierStacks or kMaxExpansionFrames), `from` being this matcher's (its stacks are ids in this matcher's
  /// arena). Interns the stacks it needs, which stay (none when it passes a bound).
  Frontier next(const Frontier& from, uint8_t byte);

 private:
  // The arena's size now, and forgetting what was interned since (accept undoes a refused input with them).
  size_t mark() const { return nodes_.size(); }
  void rollback(size_t mark);

  struct Node {
    uint32_t pos;     // index into the grammar's elements: the element this frame waits for
    uint32_t parent;  // frame to return to; kEmpty: none
  };
  static constexpr uint32_t kEmpty = 0;

  uint32_t intern(uint32_t pos, uint32_t parent);
  // The frame after the element at `pos` of frame `parent`'s child: `parent` itself when that element ends its
  // alternative (the tail call), else a new frame at pos + 1.
  uint32_t after(uint32_t pos, uint32_t parent);
  // Adds to `out` every stack topped by a byte class that `stack` reaches without consuming a byte. False once the
  // expansion under way (since the last ++generation_; visited_ is reset with it) passes kMaxFrontierStacks or
  // kMaxExpansionFrames.
  bool expand(uint32_t stack, Frontier& out);

  std::shared_ptr<const Grammar> grammar_;
  std::vector<Node> nodes_;                       // nodes_[0]: the empty stack
  std::unordered_map<uint64_t, uint32_t> index_;  // (pos, parent) -> id
  std::vector<uint32_t> seen_;                    // per node: the expansion that last visited it
  uint32_t generation_ = 0;
  size_t visited_ = 0;                            // frames the expansion under way visited
  std::vector<uint32_t> work_;
  Frontier frontier_;
};

}  // namespace paged::constraint
