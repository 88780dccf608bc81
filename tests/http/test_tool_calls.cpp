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

// What a stream's deltas join to, as OpenAI's clients join them: the content (null when none came) and the calls,
// each started by an entry with its id and completed by the arguments of the entries after it.
struct Joined {
  json::value content;
  json::array calls;
};

Joined join(const std::vector<json::object>& deltas) {
  Joined j;
  for (const json::object& d : deltas) {
    if (const json::value* c = d.if_contains("content"))
      j.content = j.content.is_null() ? *c : json::value(std::string(j.content.as_string()) + std::string(c->as_string()));
    const json::value* entries = d.if_contains("tool_calls");
    for (const json::value& e : entries ? entries->as_array() : json::array{}) {
      const size_t index = e.at("index").to_number<size_t>();
      if (e.as_object().contains("id")) {
        REQUIRE(index == j.calls.size());
        j.calls.push_back(json::object{{"id", e.at("id")}, {"type", e.at("type")}, {"function", e.at("function")}});
      } else {
        REQUIRE(index < j.calls.size());
        json::object& f = j.calls[index].as_object()["function"].as_object();
        f["arguments"] = std::string(f["arguments"].as_string()) + std::string(e.at("function").at("arguments").as_string());
      }
    }
  }
  return j;
}

// `text` streamed in pieces of `piece` bytes, then an empty last piece (a finish without text).
Joined streamed(const ToolRequest& request, const std::string& text, size_t piece) {
  ToolCallStream stream(request, "x_");
  std::vector<json::object> deltas;
  for (size_t at = 0; at < text.size(); at += piece) deltas.push_back(stream.add(text.substr(at, piece), false));
  deltas.push_back(stream.add("", true));
  return join(deltas);
}

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
  CHECK_THAT(refused(&kTools, json::value("auto")), Catch::StartsWith("tool_choice") &&
                                                        Catch::Contains("--enable-auto-tool-choice") &&
                                                        Catch::Contains("--tool-call-parser"));
  CHECK_THAT(refused(nullptr, json::value("required")), Catch::StartsWith("tool_choice"));
  CHECK_THAT(refused(&kTools, json::parse(R"({"type": "function", "function": {"name": "other"}})")),
             Catch::Contains("'other'"));
  CHECK_THAT(refused(&kTools, json::value("sometimes")), Catch::StartsWith("tool_choice"));
  const json::value bad_tool = json::parse(R"([{"type": "function", "function": {"name": "f", "extra": 1}}])");
  CHECK_THAT(refused(&bad_tool, json::value("required")), Catch::StartsWith("tools") && Catch::Contains("extra"));
  const json::value not_function = json::parse(R"([{"type": "code_interpreter"}])");
  CHECK_THAT(refused(&not_function, json::value("required")), Catch::StartsWith("tools"));
  // Keys no tool or tool_choice of OpenAI's has are refused by name, not passed over.
  const json::value tool_extra = json::parse(R"([{"type": "function", "function": {"name": "f"}, "bogus": 1}])");
  CHECK_THAT(refused(&tool_extra, json::value("required")), Catch::StartsWith("tools") && Catch::Contains("bogus"));
  CHECK_THAT(refused(&kTools, json::parse(R"({"type": "banana", "function": {"name": "get_weather"}})")),
             Catch::StartsWith("tool_choice"));
  CHECK_THAT(refused(&kTools, json::parse(R"({"function": {"name": "get_weather"}})")),
             Catch::StartsWith("tool_choice"));
  CHECK_THAT(refused(&kTools, json::parse(R"({"type": "function", "function": {"name": "get_weather"}, "x": 2})")),
             Catch::StartsWith("tool_choice") && Catch::Contains("'tool_choice.x'"));
  CHECK_THAT(refused(&kTools, json::parse(R"({"type": "function", "function": {"name": "get_weather", "zzz": 1}})")),
             Catch::StartsWith("tool_choice") && Catch::Contains("'tool_choice.function.zzz'"));
  try {
    parse_tools(&kTools, nullptr);
    FAIL("tools without tool_choice (OpenAI's auto) was accepted");
  } catch (const InvalidRequest& e) {
    CHECK(e.param == "tool_choice");
  }
}

TEST_CASE("tool_choice auto: the parser's calls and content; streamed in any pieces, the same", "[openai][tools]") {
  const json::value auto_choice("auto"), required_choice("required");
  const json::value named_choice = json::parse(R"({"type": "function", "function": {"name": "get_weather"}})");
  const ToolRequest hermes = parse_tools(&kTools, &auto_choice, true, ToolCallFormat::hermes);
  CHECK(hermes.mode == ToolRequest::Mode::automatic);
  CHECK(hermes.constraint.kind == StructuredOutput::Kind::none);  // the model answers freely
  const ToolRequest hermes_one = parse_tools(&kTools, &auto_choice, false, ToolCallFormat::hermes);
  const ToolRequest llama3 = parse_tools(&kTools, nullptr, true, ToolCallFormat::llama3_json);  // absent: auto
  CHECK(llama3.format == ToolCallFormat::llama3_json);
  const ToolRequest required = parse_tools(&kTools, &required_choice);
  const ToolRequest named = parse_tools(&kTools, &named_choice);
  const auto call = [](size_t i, const std::string& name, const std::string& arguments) {
    return json::value{{"id", "call_x_" + std::to_string(i)}, {"type", "function"},
                       {"function", {{"name", name}, {"arguments", arguments}}}};
  };
  const std::string two_calls = "I will check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"
                                "</tool_call><tool_call>{\"name\": \"ping\", \"arguments\": {}}</tool_call>";
  struct Case {
    const ToolRequest* request;
    std::string text;
    json::value content;
    json::array calls;
  };
  const std::vector<Case> cases = {
      {&hermes, two_calls, "I will check.", {call(0, "get_weather", R"({"city": "Oslo"})"), call(1, "ping", "{}")}},
      {&hermes_one, two_calls, "I will check.", {call(0, "get_weather", R"({"city": "Oslo"})")}},
      {&hermes, "Just text, <tool_ not a call", "Just text, <tool_ not a call", {}},
      {&hermes, "<tool_call>{\"nam", "<tool_call>{\"nam", {}},  // cut before a call was sent: text
      {&llama3, "<|python_tag|>{\"name\": \"ping\", \"parameters\": {}}; {\"name\": \"get_weather\", \"parameters\": "
                "{\"city\": \"A;B\"}}",
       nullptr, {call(0, "ping", "{}"), call(1, "get_weather", R"({"city": "A;B"})")}},
      {&llama3, "Once upon a time {there} was", "Once upon a time {there} was", {}},
      {&llama3, "{\"title\": \"a story\"}", "{\"title\": \"a story\"}", {}},
      {&required, R"([{"name": "get_weather", "parameters": {"city": "Oslo", "days": 2}}])", nullptr,
       {call(0, "get_weather", R"({"city": "Oslo", "days": 2})")}},
      {&named, R"({"city": "Rome"})", nullptr, {call(0, "get_weather", R"({"city": "Rome"})")}},
  };
  for (const Case& c : cases) {
    INFO(c.text);
    CHECK(tool_calls_of(*c.request, c.text, "x_") == c.calls);
    CHECK(content_of(*c.request, c.text) == (c.calls.empty() ? json::value(c.text) : c.content));
    for (size_t piece : {size_t{1}, size_t{2}, size_t{5}, size_t{11}, c.text.size()}) {
      INFO("pieces of " << piece);
      const Joined got = streamed(*c.request, c.text, piece);
      CHECK(got.calls == c.calls);
      CHECK(got.content == (c.calls.empty() ? json::value(c.text) : c.content));
    }
  }
  // Mistral: the ids are 9 letters and digits (what its chat templates take back), the same streamed and whole.
  ToolRequest mistral = parse_tools(&kTools, &auto_choice, true, ToolCallFormat::mistral);
  mistral.mistral_ids = true;  // a Mistral model's server
  const std::string mistral_calls = "Let me see.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}[TOOL_CALLS]ping[ARGS]{}";
  const json::array mistral_whole = tool_calls_of(mistral, mistral_calls, "x_");
  REQUIRE(mistral_whole.size() == 2);
  for (const json::value& c : mistral_whole) {
    const json::string& id = c.at("id").as_string();
    CHECK(id.size() == 9);
    CHECK(std::all_of(id.begin(), id.end(), [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)); }));
  }
  CHECK(mistral_whole[0].at("id") != mistral_whole[1].at("id"));
  CHECK(mistral_whole[1].at("function") == json::parse(R"({"name": "ping", "arguments": "{}"})"));
  CHECK(content_of(mistral, mistral_calls) == "Let me see.");
  for (size_t piece : {size_t{1}, size_t{3}, size_t{7}}) {
    const Joined got = streamed(mistral, mistral_calls, piece);
    CHECK(got.calls == mistral_whole);
    CHECK(got.content == "Let me see.");
  }
  // Cut after a call was sent: the stream cannot take it back, the whole answer is text.
  const std::string cut = "<tool_call>{\"name\": \"ping\", \"argu";
  CHECK(tool_calls_of(hermes, cut, "x_").empty());
  CHECK(streamed(hermes, cut, 3).calls == json::array{call(0, "ping", "")});
  // A named call is sent at once, before its arguments.
  ToolCallStream stream(named, "x_");
  const json::object first = stream.add("", false);
  CHECK(first.at("tool_calls").at(0).at("function") == json::parse(R"({"name": "get_weather", "arguments": ""})"));
  CHECK(stream.called());
}

}  // namespace paged::openai

