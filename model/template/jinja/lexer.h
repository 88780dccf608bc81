// The lexer: a template's source, after the renderer's preprocessing (lstrip_blocks, trim_blocks, one trailing
// newline dropped, {% generation %} markers removed), as tokens, with whitespace control ({%- -%} {{- -}} {#- -#})
// already applied to the text around it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace paged::jinja {

enum class Tok {
  text, number, string, ident, equals, lparen, rparen, open_stmt, close_stmt, open_expr, close_expr, lbracket,
  rbracket, lbrace, rbrace, comma, dot, colon, pipe, additive, multiplicative, power, comparison, unary, comment
};

/// One token; `value` is its text (a string literal's with escapes resolved, a number's with its sign).
struct Token {
  Tok type;
  std::string value;
};

/// The tokens of `source`. Throws TemplateError on a character or escape it does not know, or an unterminated
/// string or comment.
std::vector<Token> tokenize(std::string_view source);

}  // namespace paged::jinja
