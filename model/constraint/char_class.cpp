#include "model/constraint/char_class.h"

#include <algorithm>
#include <cctype>
#include <array>
#include <string>

#include "model/unicode/utf8.h"

namespace paged::constraint {

namespace {

void add_interval(char32_t lo, char32_t hi, std::vector<Expr>& out) {
  std::string a, b;
  utf8::append(a, lo);
  utf8::append(b, hi);
  out.push_back(byte_strings_between(a, b, 0x80, 0xBF));  // continuation bytes
}

}  // namespace

CodepointRanges normalize_ranges(CodepointRanges ranges, bool negate) {
  for (auto& [lo, hi] : ranges) hi = std::min(hi, kMaxCodepoint);
  std::sort(ranges.begin(), ranges.end());
  CodepointRanges merged;
  for (const auto& [lo, hi] : ranges) {
    if (lo > hi) continue;
    if (!merged.empty() && lo <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, hi);
    } else {
      merged.emplace_back(lo, hi);
    }
  }
  if (!negate) return merged;
  CodepointRanges complement;
  char32_t next = 0;
  for (const auto& [lo, hi] : merged) {
    if (lo > next) complement.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodepoint) complement.emplace_back(next, kMaxCodepoint);
  return complement;
}

Expr codepoints(CodepointRanges ranges, bool negate) {
  const CodepointRanges merged = normalize_ranges(std::move(ranges), negate);
  // Split at the surrogates (never encoded) and at the boundaries of the encoded lengths.
  std::vector<Expr> parts;
  constexpr std::array<std::pair<char32_t, char32_t>, 5> kPieces{
      {{0, 0x7F}, {0x80, 0x7FF}, {0x800, 0xD7FF}, {0xE000, 0xFFFF}, {0x10000, kMaxCodepoint}}};
  ByteSet ascii;
  for (const auto& [lo, hi] : merged)
    for (const auto& [plo, phi] : kPieces) {
      const char32_t l = std::max(lo, plo), h = std::min(hi, phi);
      if (l > h) continue;
      if (h <= 0x7F) {
        ascii.add_range(static_cast<uint8_t>(l), static_cast<uint8_t>(h));
      } else {
        add_interval(l, h, parts);
      }
    }
  if (!ascii.empty()) parts.insert(parts.begin(), bytes(ascii));
  if (parts.empty()) throw GrammarError("a character class matches no character");
  return alt(std::move(parts));
}

Expr json_string_char(CodepointRanges ranges, bool negate) {
  const CodepointRanges set = normalize_ranges(std::move(ranges), negate);
  // The characters written as themselves: the set less '"', '\\' and the controls, each of which is escaped.
  CodepointRanges plain;
  std::vector<Expr> parts;
  for (const auto& [lo, hi] : set) {
    for (char32_t c = lo; c <= std::min<char32_t>(hi, 0x1F); ++c) {
      static constexpr char kHex[] = "0123456789abcdef";
      switch (c) {
        case '\n': parts.push_back(literal("\\n")); break;
        case '\r': parts.push_back(literal("\\r")); break;
        case '\t': parts.push_back(literal("\\t")); break;
        default: parts.push_back(literal(std::string("\\u00") + kHex[c >> 4] + kHex[c & 15]));
      }
    }
    char32_t from = std::max<char32_t>(lo, 0x20);
    for (char32_t special : {U'"', U'\\'}) {
      if (special < from || special > hi) continue;
      if (special > from) plain.emplace_back(from, special - 1);
      parts.push_back(literal(special == U'"' ? "\\\"" : "\\\\"));
      from = special + 1;
    }
    if (from <= hi) plain.emplace_back(from, hi);
  }
  if (!plain.empty()) parts.insert(parts.begin(), codepoints(std::move(plain)));
  if (parts.empty()) throw GrammarError("a character class matches no character");
  return alt(std::move(parts));
}

Expr any_codepoint() { return codepoints({}, true); }

std::optional<char32_t> hex_digits(std::string_view text, size_t& pos, int digits) {
  char32_t v = 0;
  for (int i = 0; i < digits; ++i) {
    if (pos >= text.size() || !std::isxdigit(static_cast<unsigned char>(text[pos]))) return std::nullopt;
    const char c = static_cast<char>(std::tolower(static_cast<unsigned char>(text[pos++])));
    v = v * 16 + static_cast<char32_t>(c <= '9' ? c - '0' : c - 'a' + 10);
  }
  return v;
}

}  // namespace paged::constraint
