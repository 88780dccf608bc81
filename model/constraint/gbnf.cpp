#include "model/constraint/gbnf.h"

#include <cctype>

#include "model/constraint/char_class.h"
#include "model/unicode/utf8.h"

namespace paged::constraint {

namespace {

constexpr int kMaxGroupDepth = 256;  // the parser and the lowering recurse once per level

bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; }

class GbnfParser {
 public:
  explicit GbnfParser(std::string_view text) : s_(text) {}

  Rules parse() {
    Rules rules;
    skip_space();
    while (pos_ < s_.size()) {
      std::string name = read_name();
      if (name.empty()) fail("expected a rule name");
      skip_space();
      if (s_.substr(pos_, 3) != "::=") fail("expected '::=' after '" + name + "'");
      pos_ += 3;
      rules.emplace_back(std::move(name), alternatives(false));
    }
    if (rules.empty()) throw GrammarError("the grammar has no rules");
    return rules;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    int line = 1;
    for (size_t i = 0; i < pos_ && i < s_.size(); ++i) line += s_[i] == '\n';
    throw GrammarError("grammar line " + std::to_string(line) + ": " + what);
  }

  void skip_space() {
    while (pos_ < s_.size()) {
      if (s_[pos_] == '#') {
        while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
      } else if (utf8::is_ascii_space(s_[pos_])) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string read_name() {
    const size_t start = pos_;
    while (pos_ < s_.size() && is_name_char(s_[pos_])) ++pos_;
    return std::string(s_.substr(start, pos_ - start));
  }

  // Whether a rule definition (`name ::=`) starts at the current position.
  bool at_definition() const {
    size_t p = pos_;
    while (p < s_.size() && is_name_char(s_[p])) ++p;
    if (p == pos_) return false;
    while (p < s_.size() && utf8::is_ascii_space(s_[p])) ++p;
    return s_.substr(p, 3) == "::=";
  }

  Expr alternatives(bool nested) {
    std::vector<Expr> alts{sequence(nested)};
    while (pos_ < s_.size() && s_[pos_] == '|') {
      ++pos_;
      alts.push_back(sequence(nested));
    }
    return alt(std::move(alts));
  }

  Expr sequence(bool nested) {
    std::vector<Expr> items;
    for (;;) {
      skip_space();
      if (pos_ >= s_.size() || s_[pos_] == '|' || (nested && s_[pos_] == ')')) break;
      if (!nested && at_definition()) break;
      items.push_back(postfix(primary()));
    }
    return seq(std::move(items));
  }

  Expr primary() {
    const char c = s_[pos_];
    if (c == '"') return quoted();
    if (c == '[') return char_class();
    if (c == '.') {
      ++pos_;
      return any_codepoint();
    }
    if (c == '(') {
      ++pos_;
      if (++depth_ > kMaxGroupDepth) fail("groups nested deeper than " + std::to_string(kMaxGroupDepth));
      Expr inner = alternatives(true);
      --depth_;
      skip_space();
      if (pos_ >= s_.size() || s_[pos_] != ')') fail("expected ')'");
      ++pos_;
      return inner;
    }
    std::string name = read_name();
    if (name.empty()) fail(std::string("unexpected character '") + c + "'");
    return ref(std::move(name));
  }

  Expr postfix(Expr e) {
    for (;;) {
      if (pos_ >= s_.size()) return e;
      const char c = s_[pos_];
      if (c == '*') {
        e = repeat(std::move(e), 0, -1);
      } else if (c == '+') {
        e = repeat(std::move(e), 1, -1);
      } else if (c == '?') {
        e = optional(std::move(e));
      } else if (c == '{') {
        ++pos_;
        const int min = number();
        int max = min;
        if (pos_ < s_.size() && s_[pos_] == ',') {
          ++pos_;
          max = pos_ < s_.size() && s_[pos_] == '}' ? -1 : number();
        }
        if (pos_ >= s_.size() || s_[pos_] != '}') fail("expected '}' to close a repetition");
        e = repeat(std::move(e), min, max);
      } else {
        return e;
      }
      ++pos_;
    }
  }

  int number() {
    const size_t start = pos_;
    long long v = 0;
    while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) {
      v = v * 10 + (s_[pos_++] - '0');
      if (v > 100000) fail("a repetition count is too large");
    }
    if (pos_ == start) fail("expected a number in a repetition");
    return static_cast<int>(v);
  }

  // One character of a literal or class: an escape or a UTF-8 character.
  char32_t character() {
    if (pos_ >= s_.size()) fail("unexpected end of the grammar");
    if (s_[pos_] != '\\') {
      const utf8::Char ch = utf8::next(s_.substr(pos_));
      if (!ch.complete) fail("invalid UTF-8");
      pos_ += ch.length;
      return ch.code_point;
    }
    if (++pos_ >= s_.size()) fail("unexpected end after '\\'");
    const char e = s_[pos_++];
    switch (e) {
      case 'n': return '\n';
      case 'r': return '\r';
      case 't': return '\t';
      case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '/': return static_cast<char32_t>(e);
      case 'x': return hex(2);
      case 'u': return hex(4);
      case 'U': return hex(8);
      default: fail(std::string("unknown escape '\\") + e + "'");
    }
  }

  char32_t hex(int digits) {
    const std::optional<char32_t> value = hex_digits(s_, pos_, digits);
    if (!value) fail("expected a hex digit");
    const char32_t v = *value;
    if (v > kMaxCodepoint || (v >= 0xD800 && v <= 0xDFFF)) fail("an escape names no Unicode character");
    return v;
  }

  Expr quoted() {
    ++pos_;
    std::string text;
    while (pos_ < s_.size() && s_[pos_] != '"') utf8::append(text, character());
    if (pos_ >= s_.size()) fail("unterminated string literal");
    ++pos_;
    return literal(text);
  }

  Expr char_class() {
    ++pos_;
    const bool negate = pos_ < s_.size() && s_[pos_] == '^';
    if (negate) ++pos_;
    CodepointRanges ranges;
    while (pos_ < s_.size() && s_[pos_] != ']') {
      const char32_t lo = character();
      char32_t hi = lo;
      if (pos_ + 1 < s_.size() && s_[pos_] == '-' && s_[pos_ + 1] != ']') {
        ++pos_;
        hi = character();
        if (hi < lo) fail("a character range runs backwards");
      }
      ranges.emplace_back(lo, hi);
    }
    if (pos_ >= s_.size()) fail("unterminated character class");
    ++pos_;
    try {
      return codepoints(std::move(ranges), negate);
    } catch (const GrammarError& e) {
      fail(e.what());
    }
  }

  std::string_view s_;
  size_t pos_ = 0;
  int depth_ = 0;  // groups open
};

}  // namespace

Rules parse_gbnf(std::string_view text) { return GbnfParser(text).parse(); }

Grammar compile_gbnf(std::string_view text) { return build_grammar(parse_gbnf(text), "root"); }

}  // namespace paged::constraint
