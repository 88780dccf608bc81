// Structural tags (model/constraint/structural_tag.h): free text whose every trigger opens a structure (begin, JSON
// valid for its schema, end), found however the trigger is spelled into the text; and what is refused.
#include <catch2/catch.hpp>

#include <boost/json.hpp>
#include <memory>

#include "model/constraint/matcher.h"
#include "model/constraint/structural_tag.h"

namespace paged::constraint {

namespace {

bool admits(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  return m.accept(text) && m.can_stop();
}

// Whether `text` is a prefix of something the grammar admits.
bool continues(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  return m.accept(text);
}

std::shared_ptr<const Grammar> tag(std::string_view response_format) {
  return std::make_shared<const Grammar>(compile_structural_tag(boost::json::parse(response_format)));
}

const char* kWeather = R"({"type": "structural_tag", "triggers": ["<function="], "structures": [
    {"begin": "<function=get_weather>", "end": "</function>", "schema": {"type": "object",
     "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    {"begin": "<function=get_time>", "end": "</function>", "schema": {"type": "object",
     "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]}}]})";

}  // namespace

TEST_CASE("structural tag: free text, and each trigger opens a structure valid for its schema", "[constraint]") {
  const auto g = tag(kWeather);
  for (const char* ok : {"", "Hello, world.", "no call < here, function= either",
                         R"(<function=get_weather>{"city": "Paris"}</function>)",
                         R"(Let me check. <function=get_weather>{"city":"Oslo"}</function> and <function=get_time>{"zone": "CET"}</function> done)",
                         R"(<<function=get_time>{"zone":"UTC"}</function>)"})
    CHECK(admits(g, ok));
  for (const char* bad : {R"(<function=get_news>{}</function>)",               // no such structure
                          R"(<function=get_weather>{"town": "Paris"}</function>)",  // not the schema
                          R"(<function=get_time>{"zone": "PST"}</function>)",
                          R"(<function=get_weather>{"city": "Paris"})",            // no end: not finished
                          "<function="})
    CHECK_FALSE(admits(g, bad));
  CHECK_FALSE(continues(g, "<function=get_n"));
  CHECK(continues(g, R"(<function=get_weather>{"city": "Pa)"));
}

TEST_CASE("structural tag: a trigger is found wherever it ends, also after a partial one", "[constraint]") {
  // "aab" after "a": the text "aaab" ends with the trigger although "aaa" left the first partial match.
  const auto g = tag(R"({"type": "structural_tag", "triggers": ["aab"], "structures": [
      {"begin": "aab", "end": ".", "schema": {"type": "integer"}}]})");
  CHECK(admits(g, "aaa"));
  CHECK_FALSE(admits(g, "aaab"));  // the trigger is written: a structure must follow
  CHECK(admits(g, "aaab7."));
  CHECK(admits(g, "xaab12.aa"));
  CHECK_FALSE(admits(g, "aab7"));
  // Two triggers, one inside the other's text: "b>" ends inside "<b>" too, and either opens its structures.
  const auto two = tag(R"({"type": "structural_tag", "triggers": ["<b>", "b>"], "structures": [
      {"begin": "<b>", "end": "</b>", "schema": {"type": "boolean"}},
      {"begin": "b>", "end": "!", "schema": {"type": "null"}}]})");
  CHECK(admits(two, "<b>true</b>"));
  CHECK(admits(two, "<b>null!"));
  CHECK(admits(two, "ab>null!"));
  CHECK_FALSE(admits(two, "ab>true</b>"));
}

TEST_CASE("structural tag: what is refused, named", "[constraint]") {
  const auto error = [](std::string_view text) -> std::string {
    try {
      tag(text);
    } catch (const GrammarError& e) {
      return e.what();
    }
    return "";
  };
  CHECK(error(R"({"type": "structural_tag", "triggers": ["<f="], "structures": []})").find("at least one structure") !=
        std::string::npos);
  CHECK(error(R"({"type": "structural_tag", "triggers": [], "structures": [{"begin": "<f=a>", "end": "</f>",
      "schema": {}}]})").find("at least one trigger") != std::string::npos);
  CHECK(error(R"({"type": "structural_tag", "triggers": ["<g="], "structures": [{"begin": "<f=a>", "end": "</f>",
      "schema": {}}]})").find("starts with no trigger") != std::string::npos);
  CHECK(error(R"({"type": "structural_tag", "triggers": [""], "structures": [{"begin": "<f=a>", "end": "</f>",
      "schema": {}}]})").find("empty") != std::string::npos);
  CHECK(error(R"({"type": "structural_tag", "triggers": ["<f="], "structures": [{"begin": "<f=a>", "end": "</f>",
      "schema": {"type": "object", "frobnicate": 1}}]})").find("structures[0].schema") != std::string::npos);
  CHECK(error(R"({"type": "structural_tag", "format": {}, "triggers": ["<f="], "structures": []})").find("'format'") !=
        std::string::npos);
  CHECK(error(R"({"type": "structural_tag", "triggers": ["<f="], "structures": [{"begin": "<f=a>", "end": "</f>",
      "schema": {}, "x": 1}]})").find("structures[0].x") != std::string::npos);
}

}  // namespace paged::constraint
