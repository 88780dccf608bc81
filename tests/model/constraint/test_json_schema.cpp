// The JSON schema compiler: values each schema admits and refuses, written out by hand, and refused keywords.
#include <catch2/catch.hpp>

#include <boost/json.hpp>
#include <cmath>
#include <cstdio>
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

TEST_CASE("JSON schema: string formats", "[constraint]") {
  const auto check = [](const char* format, std::initializer_list<const char*> ok, std::initializer_list<const char*> bad) {
    const auto g = schema(std::string(R"({"type": "string", "format": ")") + format + "\"}");
    for (const char* s : ok) {
      INFO(format << ": " << s);
      CHECK(admits(g, std::string("\"") + s + "\""));
    }
    for (const char* s : bad) {
      INFO(format << ": " << s);
      CHECK_FALSE(admits(g, std::string("\"") + s + "\""));
    }
  };
  check("date", {"2024-02-29", "2000-02-29", "1999-12-31", "0000-02-29", "2023-04-30"},
        {"2023-02-29", "1900-02-29", "2024-04-31", "2024-13-01", "2024-00-10", "2024-1-01", "24-01-01"});
  check("time", {"23:59:59Z", "00:00:00.123456789+05:30", "12:30:00-00:00"},
        {"24:00:00Z", "12:60:00Z", "12:00:00", "12:00Z", "12:00:00+5:30", "12:00:00.Z"});
  check("date-time", {"2026-12-02T07:45:00Z", "1996-12-19T16:39:57.25Z"},
        {"2026-12-02 07:45:00Z", "2026-12-02T07:45:00", "1996-12-19T16:39:57-08:00"});
  check("duration", {"P3Y6M4DT12H30M5S", "P1W", "PT1S", "P2D", "P1MT2M"}, {"P", "PT", "P1YT", "P1S", "P1W2D"});
  check("uuid", {"123e4567-e89b-12d3-a456-426614174000", "ABCDEF01-2345-6789-abcd-ef0123456789"},
        {"123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400",
         "123e4567-e89b-02d3-a456-426614174000", "123e4567-e89b-12d3-7456-426614174000"});
  check("ipv4", {"0.0.0.0", "255.255.255.255", "192.168.1.10"}, {"256.1.1.1", "1.2.3", "01.2.3.4", "1.2.3.4.5"});
  check("ipv6", {"::", "::1", "2001:db8::8a2e:370:7334", "fe80::", "1:2:3:4:5:6:7:8", "1::8"},
        {":::", "1:2:3:4:5:6:7:8:9", "12345::", "1::2::3", "g::1"});
  check("hostname", {"localhost", "api.example.com", "a-b.c1"}, {"-a.com", "a-.com", "a..b", "a_b.com", ""});
  check("email", {"jane.doe@example.com", "x+tag@mail.co.uk", "a_b-c@d.io"},
        {"jane@localhost", "@example.com", "a@@b.c", "a.@b.c", "a!b@c.de", "a@b.c1"});
  check("uri", {"https://example.com/a/b?q=1&r=%20#top", "ftp://10.0.0.1:21/", "urn://x"},
        {"example.com", "http:/x", "https://exa mple.com", "https://x/%zz"});
  check("password", {"", "any \\\" thing"}, {});
  // A maxLength: the open-ended formats shrink to fit it; minLength / maxLength the format implies are accepted.
  const auto url = schema(R"({"type": "string", "format": "uri", "minLength": 1, "maxLength": 2083})");
  CHECK(admits(url, R"("https://example.com/path?x=1")"));
  CHECK(admits(schema(R"({"type": "string", "format": "uuid", "minLength": 36, "maxLength": 36})"),
               R"("123e4567-e89b-12d3-a456-426614174000")"));
  const auto short_mail = schema(R"({"type": "string", "format": "email", "maxLength": 12})");
  CHECK(admits(short_mail, R"("ab@cd.ef")"));
  CHECK_FALSE(admits(short_mail, R"("abcdefgh@cd.ef")"));
}

TEST_CASE("JSON schema: prefixItems, allOf, $ref beside other keywords", "[constraint]") {
  const auto pair = schema(R"({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
                               "minItems": 2, "maxItems": 2})");
  CHECK(admits(pair, R"([1, "a"])"));
  for (const char* bad : {R"([1])", R"(["a", 1])", R"([1, "a", 2])", "[]"}) CHECK_FALSE(admits(pair, bad));
  const auto open = schema(R"({"type": "array", "prefixItems": [{"const": 0}], "items": {"type": "boolean"}, "maxItems": 3})");
  for (const char* ok : {"[]", "[0]", "[0, true]", "[0,false,true]"}) CHECK(admits(open, ok));
  for (const char* bad : {"[1]", "[0, 1]", "[0, true, true, true]"}) CHECK_FALSE(admits(open, bad));
  // pydantic v1's way of naming a model with a description, and joined branches.
  const auto joined = schema(R"({"definitions": {"P": {"type": "object", "properties": {"x": {"type": "integer"}},
      "required": ["x"]}}, "type": "object", "properties": {"p": {"allOf": [{"$ref": "#/definitions/P"}],
      "description": "a point"}, "q": {"allOf": [{"type": "integer", "minimum": 0}, {"maximum": 9}, {"minimum": 3}]}},
      "required": ["p", "q"]})");
  CHECK(admits(joined, R"({"p": {"x": -4}, "q": 3})"));
  for (const char* bad : {R"({"p": {}, "q": 3})", R"({"p": {"x": 1}, "q": 2})", R"({"p": {"x": 1}, "q": 10})"})
    CHECK_FALSE(admits(joined, bad));
  const auto both = schema(R"({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
      {"properties": {"b": {"type": "string"}, "a": {"minimum": 1}}, "required": ["b"]}]})");
  CHECK(admits(both, R"({"a": 1, "b": "x"})"));
  for (const char* bad : {R"({"a": 0, "b": "x"})", R"({"a": 1})", R"({"b": "x"})"}) CHECK_FALSE(admits(both, bad));
  // Draft 4-7 tuples: items as a list, additionalItems for the rest.
  const auto old = schema(R"({"type": "array", "items": [{"type": "integer"}, {"type": "string"}], "additionalItems": {"type": "null"}})");
  for (const char* ok : {"[]", "[1]", R"([1, "a"])", R"([1, "a", null, null])"}) CHECK(admits(old, ok));
  for (const char* bad : {R"(["a"])", R"([1, "a", 2])"}) CHECK_FALSE(admits(old, bad));
  const auto sibling = schema(R"({"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n", "maximum": 5})");
  CHECK(admits(sibling, "5"));
  CHECK_FALSE(admits(sibling, "6"));
}

TEST_CASE("JSON schema: number bounds, exclusive ones read back as doubles", "[constraint]") {
  // Every plain decimal of a grid (1 to 3 fraction digits, signs, zeros) against the bounds read as doubles.
  std::vector<std::string> texts{"0", "-0.5", "0.0", "-0.0001", "1e0", "0.1", "0.30000000000000004", "0.3",
                                 "0.2999999999999999", "0.3000000000000001", "9999999999999999", "-9999999999999999.5"};
  for (int v = -3000; v <= 3000; v += 7) {
    char buf[32];
    for (int digits : {1, 2, 3}) {
      std::snprintf(buf, sizeof buf, "%.*f", digits, v / 1000.0);
      texts.emplace_back(buf);
    }
    if (v % 1000 == 0) texts.push_back(std::to_string(v / 1000));
  }
  struct Case {
    const char* schema;
    double lo, hi;
    bool lo_open, hi_open;
  };
  const double inf = HUGE_VAL;
  for (const Case& c : std::vector<Case>{{R"({"type": "number", "minimum": -1.5, "exclusiveMaximum": 2.25})", -1.5, 2.25, false, true},
                                         {R"({"type": "number", "exclusiveMinimum": 0})", 0, inf, true, false},
                                         {R"({"type": "number", "minimum": 0.1, "maximum": 0.3})", 0.1, 0.3, false, false},
                                         {R"({"maximum": -0.5})", -inf, -0.5, false, false},
                                         {R"({"type": "number", "exclusiveMinimum": -2.999, "exclusiveMaximum": -0.001})", -2.999, -0.001, true, true},
                                         {R"({"type": "number", "minimum": 0, "maximum": 0})", 0, 0, false, false}}) {
    const auto g = schema(c.schema);
    for (const std::string& t : texts) {
      INFO(c.schema << " on " << t);
      const double x = std::strtod(t.c_str(), nullptr);
      const bool in = (c.lo_open ? x > c.lo : x >= c.lo) && (c.hi_open ? x < c.hi : x <= c.hi);
      const size_t dot = t.find('.');  // written without exponent, 16 fraction digits at most, no "-0"
      const bool plain = t.find('e') == std::string::npos && !(t[0] == '-' && x == 0) &&
                         (dot == std::string::npos || t.size() - dot - 1 <= 16);
      if (admits(g, t)) CHECK(in);
      else if (in && plain) FAIL("a plain decimal within the bounds is refused");
    }
  }
  CHECK_THROWS_WITH(compile_json_schema(boost::json::parse(R"({"type": "number", "exclusiveMinimum": 1, "maximum": 1})")),
                    Catch::Contains("admit no value"));
}

TEST_CASE("JSON schema: formats bind their own type only; OpenAPI's integer formats", "[constraint]") {
  const auto i32 = schema(R"({"type": "integer", "format": "int32"})");
  for (const char* ok : {"2147483647", "-2147483648", "0"}) CHECK(admits(i32, ok));
  for (const char* bad : {"2147483648", "-2147483649"}) CHECK_FALSE(admits(i32, bad));
  CHECK(admits(schema(R"({"type": "integer", "format": "int64", "minimum": -9223372036854775808})"), "-42"));
  CHECK(admits(schema(R"({"type": "number", "format": "double"})"), "1.5e3"));
  const auto mixed = schema(R"({"type": ["string", "object"], "format": "uuid"})");
  CHECK(admits(mixed, "{}"));
  CHECK(admits(mixed, R"("123e4567-e89b-12d3-a456-426614174000")"));
  CHECK_FALSE(admits(mixed, R"("abc")"));
}

TEST_CASE("JSON schema: the whitespace between tokens as a pattern", "[constraint]") {
  const auto json = boost::json::parse(R"({"type": "object", "properties": {"a": {"type": "array", "items": {}}},
                                         "required": ["a"]})");
  const auto none = std::make_shared<const Grammar>(compile_json_schema(json, ""));
  CHECK(admits(none, R"({"a":[1,{"b":"c d"}]})"));
  for (const char* bad : {R"({"a": []})", R"({ "a":[]})", R"({"a":[1, 2]})", "{\"a\":[]\n}"}) CHECK_FALSE(admits(none, bad));
  const auto tabs = std::make_shared<const Grammar>(compile_json_schema(json, "\\t?"));
  CHECK(admits(tabs, "{\t\"a\":\t[\t1,\t{}\t]\t}"));
  CHECK_FALSE(admits(tabs, R"({"a": []})"));
  const auto object = std::make_shared<const Grammar>(compile_json_object("[ \\n]{0,2}"));
  CHECK(admits(object, "{\n \"k\" : 1}"));
  CHECK_FALSE(admits(object, "{   \"k\":1}"));
  CHECK_THROWS_WITH(compile_json_schema(json, "[ a]"), Catch::Contains("other than JSON whitespace"));
  CHECK_THROWS_WITH(compile_json_object("(?=x)"), Catch::Contains("lookaround"));
}

TEST_CASE("JSON schema: additional members never take a declared property's name", "[constraint]") {
  const auto g = schema(R"({"type": "object", "properties": {"a": {"type": "string"}, "ab": {"type": "null"},
                            "é": {"type": "boolean"}}, "additionalProperties": {"type": "integer"}})");
  for (const char* ok : {R"({"a": "x", "b": 1})", R"({"abc": 1})", R"({"": 2, "A": 3})", R"({"ab": null, "é1": 4})",
                         R"({"e": 5, "éé": 6})"})
    CHECK(admits(g, ok));
  for (const char* bad : {R"({"a": 1})", R"({"b": 1, "a": 2})", R"({"ab": 1})", R"({"é": 1})", R"({"\u0061": 1})",
                          R"({"b\n": 1})"})
    CHECK_FALSE(admits(g, bad));
}

TEST_CASE("JSON schema: minProperties / maxProperties and propertyNames", "[constraint]") {
  const auto counted = schema(R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                                  "additionalProperties": {"type": "null"}, "minProperties": 2, "maxProperties": 3})");
  for (const char* ok : {R"({"a": 1, "b": 2})", R"({"a": 1, "x": null})", R"({"x": null, "y": null})",
                         R"({"a": 1, "b": 2, "c": null})"})
    CHECK(admits(counted, ok));
  for (const char* bad : {"{}", R"({"a": 1})", R"({"x": null})", R"({"a": 1, "b": 2, "c": null, "d": null})"})
    CHECK_FALSE(admits(counted, bad));
  // pydantic's Dict[Literal["red", "blue"], int] = Field(min_length=1), a declared name outside the list dropped.
  const auto keyed = schema(R"({"type": "object", "properties": {"red": {"type": "integer", "minimum": 0},
      "green": {"type": "integer"}}, "additionalProperties": {"type": "integer"},
      "propertyNames": {"enum": ["red", "blue"]}, "minProperties": 1})");
  for (const char* ok : {R"({"red": 1})", R"({"blue": -1})", R"({"red": 0, "blue": 5})"}) CHECK(admits(keyed, ok));
  for (const char* bad : {"{}", R"({"red": -1})", R"({"green": 1})", R"({"x": 1})"}) CHECK_FALSE(admits(keyed, bad));
  const auto patterned = schema(R"({"type": "object", "additionalProperties": {"type": "boolean"},
                                    "propertyNames": {"pattern": "^[a-z]{1,3}$"}, "maxProperties": 2})");
  CHECK(admits(patterned, R"({"ab": true, "c": false})"));
  for (const char* bad : {R"({"AB": true})", R"({"abcd": true})", R"({"a": true, "b": true, "c": true})"})
    CHECK_FALSE(admits(patterned, bad));
  const auto no_keys = schema(R"({"type": "object", "additionalProperties": true, "propertyNames": {"type": "integer"}})");
  CHECK(admits(no_keys, "{}"));
  CHECK_FALSE(admits(no_keys, R"({"1": 1})"));
  // Without additional members, minProperties counts the declared ones only.
  const auto two = schema(R"({"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "minProperties": 2})");
  CHECK(admits(two, R"({"a": 1, "c": 2})"));
  CHECK_FALSE(admits(two, R"({"b": 1})"));
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
           {R"({"type": "string", "format": "iri"})", "'iri'"},
           {R"({"type": "string", "format": "date", "maxLength": 8})", "'format' 'date' with values of 10-10"},
           {R"({"type": "string", "format": "email", "maxLength": 4})", "no 'email' value fits"},
           {R"({"type": "string", "format": "uuid", "pattern": "a"})", "'pattern' together"},
           {R"({"type": "array", "uniqueItems": true})", "'uniqueItems'"},
           {R"({"allOf": [{"const": 1}, {"const": 2}]})", "allOf: 'const'"},
           {R"({"allOf": [{"type": "string"}, {"type": "integer"}]})", "admit no value"},
           {R"({"allOf": [{"properties": {"a": {}}, "additionalProperties": false}, {"properties": {"b": {}}}]})",
            "the property 'b'"},
           {R"({"type": "array", "prefixItems": [{}], "minItems": 2})", "'minItems' is above"},
           {R"({"$ref": "#/$defs/d0", "$defs": {)" + [] {
              std::string defs;  // each allOf names the next twice: 2^25 branches to merge
              for (int i = 0; i < 25; ++i)
                defs += "\"d" + std::to_string(i) + "\": {\"allOf\": [{\"$ref\": \"#/$defs/d" + std::to_string(i + 1) +
                        "\"}, {\"$ref\": \"#/$defs/d" + std::to_string(i + 1) + "\"}]},";
              return defs + R"("d25": {"type": "null"}}})";
            }(), "more than 4096 schemas"},
           {R"({"type": "array", "items": {}, "additionalItems": false})", "'additionalItems' needs"},
           {R"({"type": "number", "format": "int32"})", "on a number"},
           {R"({"type": "integer", "format": "int128"})", "'int128'"},
           {R"({"type": "integer", "minimum": 1e20})", "admit no value"},
           {R"({"type": "object", "patternProperties": {}})", "'patternProperties'"},
           {R"({"type": "object", "properties": {"a": {}}, "required": ["a"], "maxProperties": 0})", "admit no value"},
           {R"({"type": "object", "properties": {"a": {}}, "minProperties": 2})", "admit no value"},
           {R"({"type": "object", "properties": {"a": {}}, "required": ["a"], "propertyNames": {"enum": ["b"]}})",
            "not one of 'propertyNames'"},
           {R"({"type": "object", "properties": {"a": {}}, "propertyNames": {"pattern": "a"}})", "beside 'properties'"},
           {R"({"type": "object", "additionalProperties": true, "minProperties": 100000})", "states"},
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
