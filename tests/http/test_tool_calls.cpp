// Tool calling: tools and tool_choice read (refusals by field), the schema a forced call is generated under
// (compiled here, admitting a call written out by hand and refusing others), and answers read back as tool_calls.
#include <catch2/catch.hpp>

#include <boost/json.hpp>

#include "http/tool_calls.h"
#include "model/constraint/matcher.h"
#include "model/constraint/structured_output.h"

namespace paged::openai {

namespace {

namespace json = boost::json;

const json::value kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "d",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                  "required": ["city"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "ping"}}])");

std::string refused(const json::value* tools, const json::value& choice) {
  try {
    parse_tools(tools, &choice);
  } catch (const InvalidRequest& e) {
    return e.param + ": " + e.what();
  }
  return "<accepted>";
}

bool admits(const StructuredOutput& s, std::string_view text) {
  constraint::GrammarMatcher m(constraint::compile_structured_output(s));
  return m.accept(text) && m.can_stop();
}

}  // namespace

TEST_CASE("tool_choice required and named: the schema of the call and the tool_calls read back", "[openai][tools]") {
  const json::value required_choice("required"), none_choice("none");
  const ToolRequest required = parse_tools(&kTools, &required_choice);
  CHECK(required.mode == ToolRequest::Mode::required);
  CHECK(required.tools == kTools.as_array());
  CHECK(required.constraint.field == "tool_choice");
  CHECK(admits(required.constraint, R"([{"name": "get_weather", "parameters": {"city": "Oslo", "days": 3}}])"));
  CHECK(admits(required.constraint, R"([{"name":"ping","parameters":{}},{"name":"get_weather","parameters":{"city":""}}])"));
  // A function without parameters takes none (OpenAI's: an empty parameter list).
  CHECK_FALSE(admits(required.constraint, R"([{"name":"ping","parameters":{"x":[1]}}])"));
  CHECK_FALSE(admits(required.constraint, "[]"));
  CHECK_FALSE(admits(required.constraint, R"([{"name": "nope", "parameters": {}}])"));
  CHECK_FALSE(admits(required.constraint, R"([{"name": "get_weather", "parameters": {"days": 3}}])"));
  const json::array calls = tool_calls_of(required, R"([{"name":"ping","parameters":{}},{"name":"get_weather","parameters":{"city":"A"}}])", "x_");
  REQUIRE(calls.size() == 2);
  CHECK(calls[1] == json::parse(R"({"id": "call_x_1", "type": "function",
                                    "function": {"name": "get_weather", "arguments": "{\"city\":\"A\"}"}})"));
  CHECK(tool_calls_of(required, R"([{"name":"ping","param)", "x_").empty());  // cut by max_tokens
  const ToolRequest single = parse_tools(&kTools, &required_choice, false);  // parallel_tool_calls false
  CHECK(admits(single.constraint, R"([{"name":"ping","parameters":{}}])"));
  CHECK_FALSE(admits(single.constraint, R"([{"name":"ping","parameters":{}},{"name":"ping","parameters":{}}])"));

  const json::value choice = json::parse(R"({"type": "function", "function": {"name": "get_weather"}})");
  const ToolRequest named = parse_tools(&kTools, &choice);
  CHECK(named.mode == ToolRequest::Mode::named);
  CHECK(admits(named.constraint, R"({"city": "Rome"})"));
  CHECK_FALSE(admits(named.constraint, R"({"town": "Rome"})"));
  const json::array one = tool_calls_of(named, R"({"city": "Rome"})", "y_");
  REQUIRE(one.size() == 1);
  CHECK(one[0].at("function") == json::parse(R"({"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"})"));

  const ToolRequest none = parse_tools(&kTools, &none_choice);
  CHECK(none.mode == ToolRequest::Mode::none);
  CHECK(none.constraint.kind == StructuredOutput::Kind::none);
  CHECK(none.tools.size() == 2);
}

TEST_CASE("tools and tool_choice that cannot be served are refused by field", "[openai][tools]") {
  CHECK_THAT(refused(&kTools, json::value("auto")), Catch::StartsWith("tool_choice") && Catch::Contains("parser"));
  CHECK_THAT(refused(nullptr, json::value("required")), Catch::StartsWith("tool_choice"));
  CHECK_THAT(refused(&kTools, json::parse(R"({"type": "function", "function": {"name": "other"}})")),
             Catch::Contains("'other'"));
  CHECK_THAT(refused(&kTools, json::value("sometimes")), Catch::StartsWith("tool_choice"));
  const json::value bad_tool = json::parse(R"([{"type": "function", "function": {"name": "f", "extra": 1}}])");
  CHECK_THAT(refused(&bad_tool, json::value("required")), Catch::StartsWith("tools") && Catch::Contains("extra"));
  const json::value not_function = json::parse(R"([{"type": "code_interpreter"}])");
  CHECK_THAT(refused(&not_function, json::value("required")), Catch::StartsWith("tools"));
  try {
    parse_tools(&kTools, nullptr);
    FAIL("tools without tool_choice (OpenAI's auto) was accepted");
  } catch (const InvalidRequest& e) {
    CHECK(e.param == "tool_choice");
  }
}

}  // namespace paged::openai
