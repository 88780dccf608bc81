// The parser: tokens to a syntax tree, by recursive descent with Jinja's operator precedence.
#pragma once

#include <vector>

#include "model/template/jinja/ast.h"
#include "model/template/jinja/lexer.h"

namespace paged::jinja {

/// The program of `tokens` (tokenize's output). Throws TemplateError on a syntax error.
Program parse(std::vector<Token> tokens);

}  // namespace paged::jinja
