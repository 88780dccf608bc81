// Regular expressions (the ECMA-262 subset JSON Schema's `pattern` uses) compiled to a grammar expression:
// literals, escapes (\d \w \s and their negations, \n \r \t \f \v \0 \xHH \uHHHH, escaped punctuation), classes
// with ranges and negation, '.', groups ((...), (?:...), (?<name>...)), alternation, quantifiers (* + ? {m} {m,}
// {m,n}, lazy forms matching the same strings), and ^ / $ at the ends of a top-level alternative. Refused, naming
// the construct: lookarounds, backreferences, word boundaries, anchors elsewhere.
#pragma once

#include <string_view>

#include "model/constraint/grammar.h"

namespace paged::constraint {

/// How a pattern relates to the text.
enum class RegexMatch {
  full,    // the whole text matches (vLLM's guided_regex); ^ and $ at the ends change nothing
  search,  // the text contains a match (JSON Schema's pattern): unanchored ends take any characters
};

/// How the matched characters are written.
enum class RegexOutput {
  raw,          // as UTF-8
  json_string,  // as the inside of a JSON string: '"', '\' and control characters escaped
};

/// The strings of `pattern`. Throws GrammarError naming an unsupported construct or a malformed pattern.
Expr compile_regex(std::string_view pattern, RegexMatch match, RegexOutput output = RegexOutput::raw);

}  // namespace paged::constraint
