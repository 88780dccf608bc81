// JSON Schema (the subset structured outputs use) and JSON itself compiled to grammar rules: the texts the grammar
// accepts are JSON values valid for the schema. Supported: type (one or a list), properties, required,
// additionalProperties (absent: false, as xgrammar's strict mode), minProperties, maxProperties, propertyNames (a
// list of names, or any string schema without properties), items, prefixItems (later elements: none unless items
// says; draft 4-7's items as a list with additionalItems likewise), minItems, maxItems, enum, const, anyOf, oneOf
// (as anyOf: exact when its branches are disjoint), allOf (and $ref beside other keywords) merged into one schema,
// minLength / maxLength, pattern (not with lengths), format (json_formats.h), minimum / maximum /
// exclusiveMinimum / exclusiveMaximum of integers and numbers (bounded numbers are written without exponent), $ref
// to "#..." pointers ($defs, definitions, the root), and annotations (title, description, default, examples,
// $schema, $id, $comment). Any other keyword, and a combination the grammar cannot express exactly, is refused
// with a GrammarError naming it.
//
// Whitespace: between tokens, none, one space, or a newline and up to 20 spaces or tabs (llama.cpp's policy), or
// what a JsonWhitespace pattern says; object members come in the order of `properties`. Numbers are written with at
// most 16 integer digits, 16 fraction digits and 3 exponent digits, strings with the escapes \" \\ \/ \b \f \n
// \r \t, so a sampled value ends.
#pragma once

#include <boost/json/value.hpp>
#include <optional>
#include <string>

#include "model/constraint/grammar.h"

namespace paged::constraint {

/// The whitespace between tokens: a regular expression (regex.h) whose strings hold only JSON whitespace (space, tab,
/// newline, carriage return), as vLLM's whitespace_pattern ("" for disable_any_whitespace: none); nullopt: the
/// default above. Throws GrammarError for a pattern that admits other characters.
using JsonWhitespace = std::optional<std::string>;

/// The JSON texts valid for `schema`, start rule "root".
Grammar compile_json_schema(const boost::json::value& schema, const JsonWhitespace& whitespace = std::nullopt);
/// The rules of compile_json_schema before they are lowered (start rule "root"), to be part of a larger grammar.
Rules json_schema_rules(const boost::json::value& schema, const JsonWhitespace& whitespace = std::nullopt);

/// Any JSON object (response_format json_object), the start rule "root".
Grammar compile_json_object(const JsonWhitespace& whitespace = std::nullopt);

}  // namespace paged::constraint
