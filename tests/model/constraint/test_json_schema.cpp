// The JSON schema compiler: values each schema admits and refuses, written out by hand, and refused keywords.
#include <catch2/catch.hpp>

#include <boost/json.hpp>
#include <memory>

#include "model/constraint/json_schema.h"
#include "model/constraint/matcher.h"

namespace paged::constraint {

namespace {

bool admits(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  return m.accept(text) && m.can_stop();
}

std::shared_ptr<const Grammar> schema(std::string_view text) {
  return std::make_shared<const Grammar>(compile_json_schema(boost::json::parse(text)));
}

}  // namespace

TEST_CASE("JSON schema: objects, required and optional properties, whitespace", "[constraint]") {
  const auto g = schema(R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                            "c": {"type": "boolean"}}, "required": ["b"]})");
  for (const char* ok : {R"({"b":"x"})", R"({"a":1,"b":""})", R"({"a": -20, "b": "q", "c": true})",
                         R"({"b":"\n\"","c":false})", "{\n  \"b\": \"y\"\n}", R"({ "b" : "z" })"})
    CHECK(admits(g, ok));
  for (const char* bad : {R"({})", R"({"a":1})", R"({"b":"x","a":1})", R"({"b":"x",})", R"({"b":"x","d":1})",
                          R"({"b":3})", R"({"a":01,"b":""})", R"({"b":"x"} )", "{\"b\":\"\t\"}", "{  \"b\":\"x\"}"})
    CHECK_FALSE(admits(g, bad));
}

TEST_CASE("JSON schema: arrays, enums, const, anyOf, strings, integer ranges, $ref", "[constraint]") {
  CHECK(admits(schema(R"({"type":"array","items":{"type":"number"},"minItems":1,"maxItems":2})"), "[1.5e3, -0.25]"));
  CHECK_FALSE(admits(schema(R"({"type":"array","items":{"type":"number"},"minItems":1,"maxItems":2})"), "[]"));
  CHECK_FALSE(admits(schema(R"({"type":"array","items":{"type":"number"},"minItems":1,"maxItems":2})"), "[1,2,3]"));
  const auto e = schema(R"({"enum": ["red", 3, null, {"k": [1]}]})");
  for (const char* ok : {R"("red")", "3", "null", R"({"k":[1]})"}) CHECK(admits(e, ok));
  CHECK_FALSE(admits(e, R"("blue")"));
  CHECK(admits(schema(R"({"const": "x\"y"})"), R"("x\"y")"));
  const auto any = schema(R"({"anyOf": [{"type": "null"}, {"type": "string", "minLength": 2, "maxLength": 3}]})");
  for (const char* ok : {"null", R"("ab")", R"("é\\c")"}) CHECK(admits(any, ok));
  for (const char* bad : {R"("a")", R"("abcd")", "1"}) CHECK_FALSE(admits(any, bad));
  const auto range = schema(R"({"type": "integer", "minimum": -15, "exclusiveMaximum": 107})");
  for (int v = -30; v <= 130; ++v) CHECK(admits(range, std::to_string(v)) == (v >= -15 && v < 107));
  CHECK_FALSE(admits(range, "-0"));
  CHECK_FALSE(admits(range, "007"));
  const auto pattern = schema(R"({"type": "string", "pattern": "^[a-c]+\"?$"})");
  CHECK(admits(pattern, R"("abc\"")"));
  CHECK_FALSE(admits(pattern, R"("abd")"));
  const auto tree = schema(R"({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object",
      "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["v"]}}})");
  CHECK(admits(tree, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]})"));
  CHECK_FALSE(admits(tree, R"({"v":1,"kids":[{}]})"));
}

TEST_CASE("json_object admits any object", "[constraint]") {
  const auto g = std::make_shared<const Grammar>(compile_json_object());
  CHECK(admits(g, R"({"a": [1, {"b": null}], "c": "d"})"));
  CHECK(admits(g, "{}"));
  CHECK_FALSE(admits(g, "[]"));
  CHECK_FALSE(admits(g, R"({"a"})"));
}

TEST_CASE("JSON schema keywords that cannot be enforced are refused by name", "[constraint]") {
  for (const auto& [s, word] : std::vector<std::pair<std::string, std::string>>{
           {R"({"type": "string", "format": "email"})", "'format'"},
           {R"({"type": "array", "uniqueItems": true})", "'uniqueItems'"},
           {R"({"allOf": [{}]})", "'allOf'"},
           {R"({"type": "number", "minimum": 0})", "'minimum'"},
           {R"({"type": "object", "patternProperties": {}})", "'patternProperties'"},
           {R"({"$ref": "http://x/y"})", "'$ref'"},
           {R"j({"type": "string", "pattern": "a(?=b)"})j", "lookaround"},
           {R"({"type": "object", "required": ["x"]})", "'x'"},
           {R"({"type": "integer", "minimum": 5, "maximum": 4})", "no value"},
           {R"({"type": "strin"})", "'strin'"},
           {R"({"$ref": "#/$defs/d0", "$defs": {)" + [] {
              std::string defs;  // d0 -> d1 -> ... -> d99: a chain deeper than the nesting limit
              for (int i = 0; i < 100; ++i)
                defs += (i ? "," : "") + std::string("\"d") + std::to_string(i) + "\": {\"$ref\": \"#/$defs/d" +
                        std::to_string(i + 1) + "\"}";
              return defs + R"(, "d100": {"type": "null"}}})";
            }(), "nested deeper"}}) {
    INFO(s);
    CHECK_THROWS_WITH(compile_json_schema(boost::json::parse(s)), Catch::Contains(word));
  }
}

}  // namespace paged::constraint
