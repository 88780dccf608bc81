// A byte-level context-free grammar: rules written as expressions (byte classes, sequences, alternatives, bounded or
// unbounded repetition, references to rules by name) and the flat form they are lowered to, which GrammarMatcher
// (matcher.h) runs. Every compiler of constraints (GBNF text, regular expressions, JSON schemas, choice lists)
// produces expressions; build_grammar checks and lowers them.
#pragma once

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace paged::constraint {

/// A grammar or constraint that cannot be compiled: the message names what is wrong or unsupported.
struct GrammarError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

/// A set of bytes (256 bits).
class ByteSet {
 public:
  /// The empty set.
  ByteSet() = default;
  /// {b}.
  static ByteSet of(uint8_t b);
  /// [lo, hi], empty when lo > hi.
  static ByteSet range(uint8_t lo, uint8_t hi);
  /// Every byte.
  static ByteSet all();
  void add(uint8_t b) { bits_[b >> 6] |= uint64_t{1} << (b & 63); }
  void add_range(uint8_t lo, uint8_t hi);
  void add(const ByteSet& other);
  /// The complement.
  ByteSet negated() const;
  bool contains(uint8_t b) const { return (bits_[b >> 6] >> (b & 63)) & 1; }
  bool empty() const { return (bits_[0] | bits_[1] | bits_[2] | bits_[3]) == 0; }
  bool operator==(const ByteSet&) const = default;

 private:
  std::array<uint64_t, 4> bits_{};
};

/// A grammar expression. Build with the helpers below; `repeat` max -1 is unbounded.
struct Expr {
  enum class Kind { bytes, seq, alt, repeat, ref };
  Kind kind = Kind::seq;
  ByteSet set;              // bytes: one byte of this set
  std::vector<Expr> items;  // seq: in order (empty: the empty string); alt: one of them; repeat: items[0]
  int min = 0, max = -1;    // repeat: between min and max times (max -1: no bound)
  std::string rule;         // ref: the rule of this name
};

/// One byte of `set`.
Expr bytes(ByteSet set);
/// The bytes of `text`, in order.
Expr literal(std::string_view text);
/// `items` in order; seq({}) is the empty string.
Expr seq(std::vector<Expr> items);
/// One of `items` (at least one).
Expr alt(std::vector<Expr> items);
/// `item` between `min` and `max` times (max -1: unbounded). Throws GrammarError when max < min.
Expr repeat(Expr item, int min, int max);
/// repeat(item, 0, 1).
Expr optional(Expr item);
/// The rule named `name`.
Expr ref(std::string name);

/// The byte strings of a's length lexicographically between `a` and `b` (inclusive; same length, a <= b) whose bytes
/// after the first are in [min, max]: e.g. the UTF-8 encodings of an interval of code points of one encoded length,
/// or the decimal numerals of an interval of numbers of one digit count.
Expr byte_strings_between(std::string_view a, std::string_view b, uint8_t min, uint8_t max);

/// Named rules, in definition order; a name defined twice is an error of build_grammar.
using Rules = std::vector<std::pair<std::string, Expr>>;

/// `rules` with `prefix` before every rule's name and every reference: to join rules of several compilations in one
/// grammar without their names meeting.
Rules with_prefix(Rules rules, const std::string& prefix);

/// The lowered grammar: rules are lists of alternatives, an alternative a run of elements in `elements` ending with
/// an `end` element. Immutable once built; shared by every matcher of a request.
class Grammar {
 public:
  enum class Op : uint8_t { end, bytes, ref };
  struct Element {
    Op op = Op::end;
    uint32_t arg = 0;  // bytes: index into sets(); ref: the rule's index
  };
  const std::vector<Element>& elements() const { return elements_; }
  const std::vector<ByteSet>& sets() const { return sets_; }
  /// Start index in elements() of each alternative of `rule`.
  const std::vector<uint32_t>& alternatives(uint32_t rule) const { return rule_alts_[rule]; }
  size_t num_rules() const { return rule_alts_.size(); }
  uint32_t root() const { return root_; }
  /// The name of `rule`: a named rule's own; an auxiliary rule's is its named rule's with a suffix.
  const std::string& rule_name(uint32_t rule) const { return rule_names_[rule]; }

 private:
  friend class GrammarBuilder;
  std::vector<Element> elements_;
  std::vector<ByteSet> sets_;
  std::vector<std::vector<uint32_t>> rule_alts_;
  std::vector<std::string> rule_names_;
  uint32_t root_ = 0;
};

/// Most elements a lowered grammar may have (bounded repetitions expand): beyond, build_grammar refuses it.
inline constexpr size_t kMaxGrammarElements = size_t{1} << 20;

/// Lowers `rules` with `root` as the start rule. Throws GrammarError for an undefined or twice-defined rule, a root
/// that is not defined, left recursion (a rule that can reach itself again before consuming a byte, other than as
/// its last element), an empty byte class, or a grammar beyond kMaxGrammarElements.
Grammar build_grammar(const Rules& rules, const std::string& root);

}  // namespace paged::constraint
