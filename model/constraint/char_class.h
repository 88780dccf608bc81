// Classes of Unicode code points (what GBNF's and regular expressions' [...] and '.' denote) as byte-level
// expressions over their UTF-8 encodings.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "model/constraint/grammar.h"

namespace paged::constraint {

/// Inclusive code point ranges, in any order, possibly overlapping.
using CodepointRanges = std::vector<std::pair<char32_t, char32_t>>;

/// The largest code point.
inline constexpr char32_t kMaxCodepoint = 0x10FFFF;

/// `ranges` sorted and merged (with `negate`, their complement), clipped to [0, kMaxCodepoint]; surrogates kept.
CodepointRanges normalize_ranges(CodepointRanges ranges, bool negate);

/// One character of `ranges` (or, with `negate`, of every other code point), encoded as UTF-8; surrogates
/// (U+D800..U+DFFF) are never matched. Throws GrammarError when the class is empty.
Expr codepoints(CodepointRanges ranges, bool negate = false);

/// One character of `ranges` (or, with `negate`, of every other code point) as written inside a JSON string: '"' as
/// \", '\' as \\, newline, return and tab as \n \r \t, other control characters as \u00XX (lowercase hex), the
/// rest as UTF-8. Throws GrammarError when the class is empty.
Expr json_string_char(CodepointRanges ranges, bool negate = false);

/// One UTF-8 character, any code point.
Expr any_codepoint();

/// The value of the `digits` hex digits of `text` from `pos` (which moves past them), as escapes write a code point;
/// nullopt when one is missing or not a hex digit (pos then stands at it).
std::optional<char32_t> hex_digits(std::string_view text, size_t& pos, int digits);

}  // namespace paged::constraint
