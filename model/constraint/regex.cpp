#include "model/constraint/regex.h"

#include <cctype>

#include "model/constraint/char_class.h"
#include "model/unicode/utf8.h"

namespace paged::constraint {

namespace {

constexpr int kMaxGroupDepth = 256;  // the parser and the lowering recurse once per level

const CodepointRanges kDigit{{'0', '9'}};
const CodepointRanges kWord{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
// ECMA-262's WhiteSpace and LineTerminator.
const CodepointRanges kSpace{{'\t', '\r'}, {' ', ' '},       {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
                             {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
const CodepointRanges kLineTerminator{{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}};

class RegexParser {
 public:
  RegexParser(std::string_view pattern, RegexMatch match, RegexOutput output)
      : s_(pattern), match_(match), output_(output) {}

  Expr parse() {
    std::vector<Expr> alts;
    for (;;) {
      bool anchored_start = false, anchored_end = false;
      if (peek('^')) {
        ++pos_;
        anchored_start = true;
      }
      std::vector<Expr> items = sequence(0);
      if (peek('$')) {
        ++pos_;
        anchored_end = true;
        if (pos_ < s_.size() && s_[pos_] != '|') fail("'$' is supported only at the end of the pattern");
      }
      if (match_ == RegexMatch::search) {
        if (!anchored_start) items.insert(items.begin(), repeat(any(), 0, -1));
        if (!anchored_end) items.push_back(repeat(any(), 0, -1));
      }
      alts.push_back(seq(std::move(items)));
      if (pos_ >= s_.size()) break;
      if (s_[pos_] == ')') fail("unbalanced ')'");
      ++pos_;  // '|'
    }
    return alt(std::move(alts));
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw GrammarError("regex '" + std::string(s_) + "' at " + std::to_string(pos_) + ": " + what);
  }
  bool peek(char c) const { return pos_ < s_.size() && s_[pos_] == c; }

  Expr chars(CodepointRanges ranges, bool negate = false) {
    try {
      return output_ == RegexOutput::json_string ? json_string_char(std::move(ranges), negate)
                                                 : codepoints(std::move(ranges), negate);
    } catch (const GrammarError& e) {
      fail(e.what());
    }
  }
  Expr any() { return chars({}, true); }

  Expr alternation(int depth) {
    std::vector<Expr> alts{seq(sequence(depth))};
    while (peek('|')) {
      ++pos_;
      alts.push_back(seq(sequence(depth)));
    }
    return alt(std::move(alts));
  }

  std::vector<Expr> sequence(int depth) {
    std::vector<Expr> items;
    while (pos_ < s_.size() && s_[pos_] != '|' && s_[pos_] != ')') {
      if (s_[pos_] == '$') {
        if (depth == 0) break;
        fail("'$' is supported only at the end of the pattern");
      }
      if (s_[pos_] == '^') fail("'^' is supported only at the start of the pattern");
      Expr a = atom(depth);
      items.push_back(quantified(std::move(a)));
    }
    return items;
  }

  Expr quantified(Expr a) {
    for (;;) {
      if (pos_ >= s_.size()) return a;
      const char c = s_[pos_];
      int min = 0, max = -1;
      if (c == '*') {
        ++pos_;
      } else if (c == '+') {
        ++pos_;
        min = 1;
      } else if (c == '?') {
        ++pos_;
        max = 1;
      } else if (c == '{' && braces(min, max)) {
      } else {
        return a;
      }
      if (peek('?')) ++pos_;  // lazy: the same strings
      if (pos_ < s_.size() && (s_[pos_] == '*' || s_[pos_] == '+' || s_[pos_] == '?'))
        fail("nothing to repeat (a quantifier follows a quantifier)");
      a = repeat(std::move(a), min, max);
      int unused_min = 0, unused_max = 0;
      if (peek('{') && braces(unused_min, unused_max)) fail("nothing to repeat (a quantifier follows a quantifier)");
    }
  }

  // {m}, {m,} or {m,n} at pos_: consumes it and returns true; anything else is a literal '{' (Annex B).
  bool braces(int& min, int& max) {
    size_t p = pos_ + 1;
    auto digits = [&](int& out) {
      const size_t start = p;
      long long v = 0;
      while (p < s_.size() && std::isdigit(static_cast<unsigned char>(s_[p]))) {
        v = std::min<long long>(v * 10 + (s_[p++] - '0'), 1 << 30);
      }
      out = static_cast<int>(v);
      return p > start;
    };
    if (!digits(min)) return false;
    max = min;
    if (p < s_.size() && s_[p] == ',') {
      ++p;
      if (!digits(max)) max = -1;
    }
    if (p >= s_.size() || s_[p] != '}') return false;
    if (max >= 0 && max < min) fail("numbers out of order in a {} quantifier");
    if (min > 100000 || max > 100000) fail("a repetition count is too large");
    pos_ = p + 1;
    return true;
  }

  Expr atom(int depth) {
    const char c = s_[pos_];
    if (c == '(') {
      ++pos_;
      if (depth >= kMaxGroupDepth) fail("groups nested deeper than " + std::to_string(kMaxGroupDepth));
      if (peek('?')) {
        ++pos_;
        if (peek(':')) {
          ++pos_;
        } else if (peek('<') && pos_ + 1 < s_.size() && s_[pos_ + 1] != '=' && s_[pos_ + 1] != '!') {
          while (pos_ < s_.size() && s_[pos_] != '>') ++pos_;
          if (pos_ >= s_.size()) fail("unterminated group name");
          ++pos_;
        } else {
          fail("lookaround assertions are not supported");
        }
      }
      Expr inner = alternation(depth + 1);
      if (!peek(')')) fail("missing ')'");
      ++pos_;
      return inner;
    }
    if (c == '[') return char_class();
    if (c == '.') {
      ++pos_;
      return chars(kLineTerminator, true);
    }
    if (c == '*' || c == '+' || c == '?') fail("nothing to repeat");
    if (c == '\\') {
      CodepointRanges ranges;
      bool negate = false;
      escape(ranges, negate, false);
      return chars(std::move(ranges), negate);
    }
    const char32_t ch = character();
    return chars({{ch, ch}});
  }

  // The literal character at pos_ (UTF-8).
  char32_t character() {
    const utf8::Char ch = utf8::next(s_.substr(pos_));
    if (!ch.complete) fail("invalid UTF-8");
    pos_ += ch.length;
    return ch.code_point;
  }

  char32_t hex(int digits) {
    const std::optional<char32_t> value = hex_digits(s_, pos_, digits);
    if (!value) fail("expected a hex digit");
    return *value;
  }

  // An escape at pos_ ('\'): adds its characters to `ranges`; a negated class escape outside a class sets `negate`
  // (inside one, its complement is added). Returns the single character it denotes, or -1 for a class escape.
  int64_t escape(CodepointRanges& ranges, bool& negate, bool in_class) {
    ++pos_;
    if (pos_ >= s_.size()) fail("'\\' at the end of the pattern");
    const char e = s_[pos_++];
    const CodepointRanges* cls = nullptr;
    bool neg = false;
    switch (e) {
      case 'd': cls = &kDigit; break;
      case 'D': cls = &kDigit, neg = true; break;
      case 'w': cls = &kWord; break;
      case 'W': cls = &kWord, neg = true; break;
      case 's': cls = &kSpace; break;
      case 'S': cls = &kSpace, neg = true; break;
      default: break;
    }
    if (cls) {
      if (!neg) {
        ranges.insert(ranges.end(), cls->begin(), cls->end());
      } else if (in_class) {
        const CodepointRanges c = normalize_ranges(*cls, true);
        ranges.insert(ranges.end(), c.begin(), c.end());
      } else {
        ranges.insert(ranges.end(), cls->begin(), cls->end());
        negate = true;
      }
      return -1;
    }
    char32_t c = 0;
    switch (e) {
      case 'n': c = '\n'; break;
      case 'r': c = '\r'; break;
      case 't': c = '\t'; break;
      case 'f': c = '\f'; break;
      case 'v': c = '\v'; break;
      case '0': c = 0; break;
      case 'x': c = hex(2); break;
      case 'u':
        if (peek('{')) fail("\\u{...} escapes are not supported");
        c = hex(4);
        break;
      case 'b':
        if (in_class) {
          c = '\b';
          break;
        }
        fail("word boundaries (\\b) are not supported");
      case 'B': fail("word boundaries (\\B) are not supported");
      case 'c': case 'k': case 'p': case 'P': fail(std::string("the escape \\") + e + " is not supported");
      default:
        if (std::isdigit(static_cast<unsigned char>(e))) fail("backreferences are not supported");
        if (std::isalnum(static_cast<unsigned char>(e))) fail(std::string("unknown escape \\") + e);
        --pos_;
        c = character();
    }
    ranges.emplace_back(c, c);
    return c;
  }

  Expr char_class() {
    ++pos_;
    const bool negate = peek('^');
    if (negate) ++pos_;
    CodepointRanges ranges;
    while (pos_ < s_.size() && s_[pos_] != ']') {
      const int64_t lo = class_atom(ranges);
      if (lo >= 0 && peek('-') && pos_ + 1 < s_.size() && s_[pos_ + 1] != ']') {
        ++pos_;
        CodepointRanges ignored;
        const int64_t hi = class_atom(ignored);
        if (hi < 0) fail("a class escape cannot end a range");
        if (hi < lo) fail("a character range runs backwards");
        ranges.pop_back();
        ranges.emplace_back(static_cast<char32_t>(lo), static_cast<char32_t>(hi));
      }
    }
    if (pos_ >= s_.size()) fail("unterminated character class");
    ++pos_;
    if (ranges.empty() && !negate) fail("an empty class [] matches nothing");
    return chars(std::move(ranges), negate);
  }

  // One member of a class: adds it to `ranges`; returns its character, or -1 for a class escape.
  int64_t class_atom(CodepointRanges& ranges) {
    if (s_[pos_] == '\\') {
      bool unused = false;
      return escape(ranges, unused, true);
    }
    const char32_t c = character();
    ranges.emplace_back(c, c);
    return c;
  }

  std::string_view s_;
  RegexMatch match_;
  RegexOutput output_;
  size_t pos_ = 0;
};

}  // namespace

Expr compile_regex(std::string_view pattern, RegexMatch match, RegexOutput output) {
  return RegexParser(pattern, match, output).parse();
}

}  // namespace paged::constraint
