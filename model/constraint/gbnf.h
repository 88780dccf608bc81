// GBNF, llama.cpp's grammar notation, read into rules: `name ::= alternatives`, alternatives separated by `|`,
// sequences of "literals", [character classes] (ranges, ^ negation), `.` (any character), rule names and
// ( groups ), each optionally followed by *, +, ?, {m}, {m,} or {m,n}; # comments. Escapes in literals and classes:
// \n \r \t \\ \" \' \[ \] \- \^ \xHH \uHHHH \UHHHHHHHH. Literals and classes are of Unicode characters, matched as
// UTF-8. A rule may continue over several lines; the next one starts at `name ::=`.
#pragma once

#include <string_view>

#include "model/constraint/grammar.h"

namespace paged::constraint {

/// The rules of `text`. Throws GrammarError naming the line and what is wrong.
Rules parse_gbnf(std::string_view text);

/// build_grammar(parse_gbnf(text), "root").
Grammar compile_gbnf(std::string_view text);

}  // namespace paged::constraint
