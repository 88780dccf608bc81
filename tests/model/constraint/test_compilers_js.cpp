// The JSON schema and regex compilers against independent validators, npm's ajv and JavaScript's RegExp, over
// generated strings: random walks of each grammar (accept cases) and their one-character mutations (mostly reject
// cases). A regex grammar must agree with RegExp on every string; a schema grammar must accept only strings ajv
// finds valid, and must accept the compact form (JSON.stringify) of every valid one. (The schemas state
// additionalProperties: the compiler's default, false, is stricter than JSON Schema's.) String formats generate a
// subset of what ajv-formats admits (RFC forms a program writes: no lower-case 't', no leap second): for their
// schemas every accepted string must be valid, and each format's hand-picked examples, valid to ajv, accepted; the
// same for bounded numbers (written without exponent).
#include <catch2/catch.hpp>

#include <boost/json.hpp>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>

#include "model/constraint/json_schema.h"
#include "model/constraint/matcher.h"
#include "model/constraint/regex.h"
#include "tests/http/node_env.h"

namespace paged::constraint {

namespace {

namespace json = boost::json;

bool admits(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  return m.accept(text) && m.can_stop();
}

// A random sentence of `g` of printable ASCII (and newlines and tabs): each step picks one of the bytes the
// matcher takes, ending with probability 1/4 where it can stop; empty when no sentence ends within 300 bytes.
std::string random_sentence(const std::shared_ptr<const Grammar>& g, std::mt19937& rng) {
  GrammarMatcher m(g);
  std::string out;
  for (int i = 0; i < 300; ++i) {
    if (m.can_stop() && (!m.can_continue() || rng() % 4 == 0)) return out;
    std::vector<char> next;
    for (int b = 9; b < 127; ++b) {
      GrammarMatcher copy = m;
      if ((b >= 32 || b == '\n' || b == '\t') && copy.accept(std::string(1, static_cast<char>(b))))
        next.push_back(static_cast<char>(b));
    }
    if (next.empty()) break;
    const char c = next[rng() % next.size()];
    m.accept(std::string(1, c));
    out += c;
  }
  return m.can_stop() ? out : std::string();
}

// `s` with one character deleted, replaced or inserted (printable ASCII).
std::string mutated(std::string s, std::mt19937& rng) {
  const char c = static_cast<char>(32 + rng() % 95);
  const size_t at = s.empty() ? 0 : rng() % s.size();
  switch (s.empty() ? 2 : rng() % 3) {
    case 0: s.erase(at, 1); break;
    case 1: s[at] = c; break;
    default: s.insert(s.begin() + static_cast<std::ptrdiff_t>(at), c);
  }
  return s;
}

}  // namespace

TEST_CASE("Schema and regex compilers agree with ajv and RegExp on generated strings", "[constraint][node]") {
  const std::vector<std::string> schemas{
      R"({"type": "object", "properties": {"a": {"type": "integer", "minimum": -5, "maximum": 250},
          "b": {"type": "string", "minLength": 1, "maxLength": 4}, "c": {"type": "array", "items": {"type": "boolean"},
          "minItems": 1, "maxItems": 3}}, "required": ["a"], "additionalProperties": false})",
      R"({"anyOf": [{"type": "null"}, {"type": "number"}, {"enum": ["x", [1, 2], {"k": true}]}]})",
      R"({"type": "object", "properties": {"id": {"type": "string", "pattern": "^[a-f0-9]{2,4}-[0-9]+$"},
          "n": {"type": "integer", "exclusiveMinimum": 0}}, "required": ["id", "n"], "additionalProperties": false})",
      R"({"$defs": {"t": {"type": "object", "properties": {"v": {"const": 1}, "k": {"type": "array",
          "items": {"$ref": "#/$defs/t"}, "maxItems": 2}}, "required": ["v"], "additionalProperties": false}},
          "$ref": "#/$defs/t"})",
      R"({"type": "object", "additionalProperties": {"type": "integer", "maximum": 9}})",
      R"({"type": ["string", "integer"], "maxLength": 2, "maximum": 3})",
      R"({"type": "array", "prefixItems": [{"type": "integer", "maximum": 3}, {"enum": ["a", "b"]}],
          "items": {"type": "boolean"}, "maxItems": 4})",
      R"({"$defs": {"b": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0}, "y": {"type": "null"}},
          "required": ["x"], "additionalProperties": false}},
          "allOf": [{"$ref": "#/$defs/b"}, {"properties": {"x": {"maximum": 20}}, "required": ["y"]}]})"};
  // (format, examples) for the subset schemas.
  const std::vector<std::pair<std::string, std::vector<std::string>>> formats{
      {"date", {"2024-02-29", "1999-12-31"}},
      {"time", {"23:59:59Z", "08:15:00.5+01:00"}},
      {"date-time", {"2026-12-02T07:45:00Z", "1985-04-12T23:20:50.52Z"}},
      {"duration", {"P3Y6M4DT12H30M5S", "PT15M", "P2W"}},
      {"uuid", {"123e4567-e89b-12d3-a456-426614174000"}},
      {"email", {"jane.doe@example.com", "o_hara+x@sub.example.org"}},
      {"hostname", {"api.example.com", "localhost"}},
      {"ipv4", {"192.168.0.1", "8.8.8.8"}},
      {"ipv6", {"2001:db8::ff00:42:8329", "::1", "fe80::"}},
      {"uri", {"https://example.com/a/b?q=1#frag", "ftp://files.example.org:2121/pub/%7Euser/"}}};
  const std::vector<std::string> regexes{"[a-c]{1,3}(-[0-9]+)?", "(foo|ba[rz])+\\.", "\\w+@\\w+\\.(com|org)",
                                         "[^,]{0,3},\\s?\\d{2}", "(a|b)*c?d{2,}", "x(?:yz|y)*[.?!]"};
  std::mt19937 rng(2026);
  json::array cases;
  std::vector<std::shared_ptr<const Grammar>> grammars;
  std::vector<std::vector<std::string>> strings;
  std::vector<size_t> examples_from;  // per case: index of its first example string (the end when none)
  const auto add = [&](const char* kind, const std::string& spec, std::shared_ptr<const Grammar> g,
                       const std::vector<std::string>& examples = {}) {
    std::vector<std::string> s;
    for (int i = 0; i < 60; ++i) {
      std::string sentence = random_sentence(g, rng);
      if (sentence.empty()) continue;
      s.push_back(sentence);
      s.push_back(mutated(sentence, rng));
      s.push_back(mutated(mutated(sentence, rng), rng));
    }
    REQUIRE(s.size() > 60);
    examples_from.push_back(s.size());
    s.insert(s.end(), examples.begin(), examples.end());
    json::array list;
    for (const std::string& x : s) list.emplace_back(x);
    cases.push_back(json::object{{"kind", kind}, {"spec", spec}, {"strings", std::move(list)}});
    grammars.push_back(std::move(g));
    strings.push_back(std::move(s));
  };
  for (const std::string& s : schemas)
    add("schema", s, std::make_shared<const Grammar>(compile_json_schema(json::parse(s))));
  for (const std::string& r : regexes)
    add("regex", r, std::make_shared<const Grammar>(build_grammar({{"root", compile_regex(r, RegexMatch::full)}}, "root")));
  const size_t first_format = grammars.size();
  for (const auto& [format, examples] : formats) {
    const std::string spec = R"({"type": "string", "format": ")" + format + "\"}";
    std::vector<std::string> quoted;
    for (const std::string& e : examples) quoted.push_back(json::serialize(json::value(e)));
    add("schema", spec, std::make_shared<const Grammar>(compile_json_schema(json::parse(spec))), quoted);
  }
  // Additional members beside properties: their keys are written without escapes, a subset too.
  const std::string extra = R"({"type": "object", "properties": {"a": {"type": "string", "maxLength": 3},
      "ab": {"type": "boolean"}}, "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9}})";
  add("schema", extra, std::make_shared<const Grammar>(compile_json_schema(json::parse(extra))),
      {R"({"a": "x", "b": 1})", R"({"ab": true, "abc": 2, "": 3})"});
  const std::string counted = R"({"type": "object", "properties": {"a": {"type": "integer", "maximum": 5}},
      "additionalProperties": {"type": "boolean"}, "propertyNames": {"enum": ["a", "b", "c"]}, "minProperties": 1,
      "maxProperties": 2})";
  add("schema", counted, std::make_shared<const Grammar>(compile_json_schema(json::parse(counted))),
      {R"({"a": 5})", R"({"b": true, "c": false})"});
  // Bounded numbers are written without exponents (JSON.stringify writes 1e-7): a subset too.
  const std::string bounded = R"({"type": "array", "items": {"anyOf": [{"type": "number", "exclusiveMinimum": 0,
      "maximum": 99.5}, {"type": "number", "minimum": -0.001, "exclusiveMaximum": 0}]}, "maxItems": 3})";
  add("schema", bounded, std::make_shared<const Grammar>(compile_json_schema(json::parse(bounded))),
      {"[99.5, 0.0000000000000001]", "[-0.001, -0.0000000000000001, 7]"});

  const auto node_dir = test::install_node_packages();
  const auto in = node_dir / "constraint_strings.json", out = node_dir / "constraint_verdicts.json";
  std::ofstream(in) << json::serialize(json::object{{"cases", cases}});
  const std::string cmd = "cd '" + node_dir.string() + "' && node check_constraint_strings.mjs '" + in.string() +
                          "' '" + out.string() + "' > constraint_strings.log 2>&1";
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::stringstream text;
  text << std::ifstream(out).rdbuf();
  const json::array results = json::parse(text.str()).at("results").as_array();
  REQUIRE(results.size() == grammars.size());
  int accepted = 0, rejected = 0;
  for (size_t c = 0; c < grammars.size(); ++c) {
    const json::object& r = results[c].as_object();
    const bool regex = c >= schemas.size() && c < first_format, subset = c >= first_format;
    for (size_t i = 0; i < strings[c].size(); ++i) {
      const std::string& s = strings[c][i];
      INFO(cases[c].as_object().at("spec").as_string() << "\non '" << s << "'");
      const bool mine = admits(grammars[c], s), reference = r.at("valid").as_array()[i].as_bool();
      (mine ? accepted : rejected) += 1;
      if (regex) {
        CHECK(mine == reference);
      } else if (subset) {
        if (mine) CHECK(reference);
        if (i >= examples_from[c]) CHECK((mine && reference));
      } else {
        if (mine) CHECK(reference);
        if (reference) CHECK(admits(grammars[c], std::string(r.at("compact").as_array()[i].as_string())));
      }
    }
  }
  CHECK(accepted > 300);
  CHECK(rejected > 300);
}

}  // namespace paged::constraint
