#include "model/constraint/structured_output.h"

#include <boost/json.hpp>

#include "model/constraint/gbnf.h"
#include "model/constraint/json_schema.h"
#include "model/constraint/regex.h"
#include "model/constraint/structural_tag.h"

namespace paged::constraint {

namespace {

boost::json::value parse_json(const std::string& text, const char* what) {
  boost::system::error_code ec;
  boost::json::value v = boost::json::parse(text, ec);
  if (ec) throw GrammarError(std::string(what) + " is not valid JSON (" + ec.message() + ")");
  return v;
}

}  // namespace

std::shared_ptr<const Grammar> compile_structured_output(const StructuredOutput& s) {
  using Kind = StructuredOutput::Kind;
  if (s.whitespace && s.kind != Kind::json_schema && s.kind != Kind::json_object)
    throw GrammarError("a whitespace pattern applies to JSON outputs only");
  switch (s.kind) {
    case Kind::none: return nullptr;
    case Kind::json_object: return std::make_shared<const Grammar>(compile_json_object(s.whitespace));
    case Kind::json_schema:
      return std::make_shared<const Grammar>(compile_json_schema(parse_json(s.spec, "the JSON schema"), s.whitespace));
    case Kind::regex:
      return std::make_shared<const Grammar>(build_grammar({{"root", compile_regex(s.spec, RegexMatch::full)}}, "root"));
    case Kind::grammar: return std::make_shared<const Grammar>(compile_gbnf(s.spec));
    case Kind::structural_tag:
      return std::make_shared<const Grammar>(compile_structural_tag(parse_json(s.spec, "the structural tag")));
    case Kind::choice: {
      const boost::json::value list = parse_json(s.spec, "the choice list");
      if (!list.is_array() || list.get_array().empty()) throw GrammarError("the choices must be a non-empty list of strings");
      std::vector<Expr> choices;
      for (const boost::json::value& c : list.get_array()) {
        if (!c.is_string()) throw GrammarError("the choices must be a non-empty list of strings");
        choices.push_back(literal(c.get_string()));
      }
      return std::make_shared<const Grammar>(build_grammar({{"root", alt(std::move(choices))}}, "root"));
    }
  }
  throw GrammarError("unknown structured output kind");
}

}  // namespace paged::constraint
