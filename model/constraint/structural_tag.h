// Structural tags (vLLM's response_format {"type": "structural_tag", "structures": [...], "triggers": [...]}, as
// xgrammar reads it): free text, in which each occurrence of a trigger opens one of the structures whose begin
// starts with it: the rest of that begin, a JSON value valid for the structure's schema, then its end; then free text
// again. Tool calls written as tags (<function=NAME>{...}</function>) are the usual use: the model may call a tool
// or not, anywhere in its answer, and every call it writes is valid.
#pragma once

#include <boost/json/value.hpp>

#include <string>
#include <vector>

#include "model/constraint/grammar.h"

namespace paged::constraint {

/// One structure: `begin`, a JSON value valid for `schema`, `end`.
struct TagStructure {
  std::string begin;
  boost::json::value schema;
  std::string end;
};

/// The grammar of free text in which every occurrence of a trigger (a non-empty byte string) starts a structure
/// whose begin starts with it (tracked byte by byte over all triggers at once, Aho-Corasick style: a trigger that
/// ends inside another's text counts too). Throws GrammarError for no structure or trigger, an empty trigger, a
/// structure whose begin starts with no trigger, or a schema json_schema.h refuses (named by its index).
Grammar compile_structural_tag(const std::vector<TagStructure>& structures, const std::vector<std::string>& triggers);

/// The same from the response_format object: "structures" (a non-empty list of {"begin", "schema", "end"}) and
/// "triggers" (a non-empty list of strings), "type" "structural_tag"; any other key or shape is a GrammarError
/// naming it.
Grammar compile_structural_tag(const boost::json::value& response_format);

}  // namespace paged::constraint
