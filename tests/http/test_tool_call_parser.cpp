// The tool-call formats read from answers (http/tool_call_parser.h): whole answers against calls written out by hand,
// malformed and cut answers falling back to content, and every prefix of an answer read as a stream reads it
// (content and arguments only grow, toward the whole answer's).
#include <catch2/catch.hpp>

#include "http/tool_call_parser.h"

namespace paged::openai {

namespace {

struct Expected {
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, raw arguments
};

void check_whole(ToolCallFormat format, const std::string& text, const Expected& want) {
  INFO(text);
  const ToolCallScan got = scan_tool_calls(format, text, true);
  CHECK(got.content == want.content);
  REQUIRE(got.calls.size() == want.calls.size());
  for (size_t i = 0; i < want.calls.size(); ++i) {
    CHECK(got.calls[i].name == want.calls[i].first);
    CHECK(got.calls[i].arguments == want.calls[i].second);
    CHECK(got.calls[i].complete);
  }
}

// Every prefix, read as a stream's: its content is a prefix of the whole answer's (of the text when no call is
// read), each call's name is empty or final and its arguments a prefix of the final ones.
void check_prefixes(ToolCallFormat format, const std::string& text) {
  const ToolCallScan whole = scan_tool_calls(format, text, true);
  for (size_t k = 0; k <= text.size(); ++k) {
    INFO(text.substr(0, k));
    const ToolCallScan part = scan_tool_calls(format, std::string_view(text).substr(0, k), false);
    CHECK(whole.content.starts_with(part.content));
    if (whole.calls.empty()) continue;
    REQUIRE(part.calls.size() <= whole.calls.size());
    for (size_t i = 0; i < part.calls.size(); ++i) {
      CHECK((part.calls[i].name.empty() || part.calls[i].name == whole.calls[i].name));
      CHECK(whole.calls[i].arguments.starts_with(part.calls[i].arguments));
    }
  }
}

}  // namespace

TEST_CASE("hermes: content before <tool_call> blocks, the last may stay open; malformed answers are content",
          "[openai][tools]") {
  const auto H = ToolCallFormat::hermes;
  const std::string one = "Let me look.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
  check_whole(H, one, {"Let me look.", {{"get_weather", R"({"city": "Oslo"})"}}});
  const std::string two = "<tool_call>{\"arguments\": {\"q\": \"a}b{\\\"\"}, \"name\": \"get_\\u0077eather\"}</tool_call>\n"
                          "<tool_call> {\"name\": \"ping\", \"arguments\": {}} ";
  check_whole(H, two, {"", {{"get_weather", R"({"q": "a}b{\""})"}, {"ping", "{}"}}});
  check_whole(H, "no call here", {"no call here", {}});
  check_whole(H, "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}", {"<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}", {}});
  check_whole(H, "<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>", {"<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>", {}});
  check_whole(H, "<tool_call>{\"name\": \"f\"}</tool_call>", {"<tool_call>{\"name\": \"f\"}</tool_call>", {}});
  check_whole(H, "<tool_call>{\"name\": \"f\", \"arguments\": {}} junk", {"<tool_call>{\"name\": \"f\", \"arguments\": {}} junk", {}});
  check_whole(H, "<tool_call>{\"name\": \"f\", \"arguments\": [1,}</tool_call>", {"<tool_call>{\"name\": \"f\", \"arguments\": [1,}</tool_call>", {}});
  // A stream holds back a tail that may open a call, and sends the content before a call.
  CHECK(scan_tool_calls(H, "Hi <tool_c", false).content == "Hi ");
  CHECK(scan_tool_calls(H, "Hi <tool_x", false).content == "Hi <tool_x");
  CHECK(scan_tool_calls(H, "Hi <tool_call>{\"na", false).content == "Hi ");
  const ToolCallScan open = scan_tool_calls(H, "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": [1, 2", false);
  REQUIRE(open.calls.size() == 1);
  CHECK(open.calls[0].name == "f");
  CHECK(open.calls[0].arguments == R"({"x": [1, 2)");
  CHECK_FALSE(open.calls[0].complete);
  for (const std::string& text : {one, two, std::string("Plain <tool text <tool_call>{bad</tool_call>")}) check_prefixes(H, text);
}

TEST_CASE("llama3_json: calls joined by ';' after an optional <|python_tag|>, nothing before them", "[openai][tools]") {
  const auto L = ToolCallFormat::llama3_json;
  const std::string two = "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\", \"days\": 3}}; "
                          "{\"name\": \"ping\", \"arguments\": {}}";
  check_whole(L, two, {"", {{"get_weather", R"({"city": "Rome", "days": 3})"}, {"ping", "{}"}}});
  check_whole(L, " {\"name\":\"f\",\"parameters\":{\"n\":-1.5e3}}\n", {"", {{"f", R"({"n":-1.5e3})"}}});
  check_whole(L, "{\"name\": \"f\", \"parameters\": 7}", {"", {{"f", "7"}}});
  check_whole(L, "Once upon a time", {"Once upon a time", {}});
  check_whole(L, "Sure: {\"name\": \"f\", \"parameters\": {}}", {"Sure: {\"name\": \"f\", \"parameters\": {}}", {}});
  check_whole(L, "{\"name\": \"f\", \"parameters\": {\"x\": 1", {"{\"name\": \"f\", \"parameters\": {\"x\": 1", {}});
  check_whole(L, "{\"name\": \"f\", \"parameters\": {}} and more", {"{\"name\": \"f\", \"parameters\": {}} and more", {}});
  check_whole(L, "{\"story\": 1}", {"{\"story\": 1}", {}});
  CHECK(scan_tool_calls(L, "  <|pyth", false).content.empty());  // undecided: held back
  CHECK(scan_tool_calls(L, "Once", false).content == "Once");
  // A number at the end of a stream's prefix may go on: its bytes so far are the arguments'.
  const ToolCallScan part = scan_tool_calls(L, "{\"name\": \"f\", \"parameters\": 12", false);
  REQUIRE(part.calls.size() == 1);
  CHECK(part.calls[0].arguments == "12");
  for (const std::string& text : {two, std::string("{\"name\": \"f\", \"parameters\": {}} and more"),
                                  std::string("Once upon a {time}")})
    check_prefixes(L, text);
}

TEST_CASE("mistral: content, then [TOOL_CALLS] and a JSON list of calls or NAME[ARGS]ARGUMENTS per call",
          "[openai][tools]") {
  const auto M = ToolCallFormat::mistral;
  // Mistral 7B v0.3 / Mixtral / Nemo: a JSON list after the tag.
  const std::string list = "Checking.[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
                           "{\"name\": \"ping\", \"arguments\": {}}]";
  check_whole(M, list, {"Checking.", {{"get_weather", R"({"city": "Paris"})"}, {"ping", "{}"}}});
  // Newer tokenizers: NAME[ARGS]ARGUMENTS, each call after its own tag; [CALL_ID] before [ARGS] is passed over.
  const std::string named = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\", \"days\": [1, 2]}"
                            "[TOOL_CALLS]get_time[CALL_ID]a1B2c3D4e[ARGS]{\"zone\": \"utc\"}";
  check_whole(M, named, {"", {{"get_weather", R"({"city": "Oslo", "days": [1, 2]})"}, {"get_time", R"({"zone": "utc"})"}}});
  check_whole(M, "Just text [TOOL_ and more", {"Just text [TOOL_ and more", {}});
  check_whole(M, "[TOOL_CALLS]", {"[TOOL_CALLS]", {}});
  check_whole(M, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}", {"[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}", {}});
  check_whole(M, "[TOOL_CALLS]f[ARGS]{\"x\": 1", {"[TOOL_CALLS]f[ARGS]{\"x\": 1", {}});
  check_whole(M, "[TOOL_CALLS]f[ARGS][1]", {"[TOOL_CALLS]f[ARGS][1]", {}});  // arguments are an object
  check_whole(M, "[TOOL_CALLS]f g[ARGS]{}", {"[TOOL_CALLS]f g[ARGS]{}", {}});
  check_whole(M, "[TOOL_CALLS][ARGS]{}", {"[TOOL_CALLS][ARGS]{}", {}});
  // A stream holds back a tail that may open the tag; a call shows once its name is complete.
  CHECK(scan_tool_calls(M, "Hi [TOOL_CA", false).content == "Hi ");
  CHECK(scan_tool_calls(M, "Hi [TOOL_CALLS]get_wea", false).calls.empty());
  const ToolCallScan open = scan_tool_calls(M, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Os", false);
  REQUIRE(open.calls.size() == 1);
  CHECK(open.calls[0].name == "get_weather");
  CHECK(open.calls[0].arguments == R"({"city": "Os)");
  for (const std::string& text : {list, named, std::string("Plain [TOOL_ text [TOOL_CALLS]f[AR")}) check_prefixes(M, text);
}

TEST_CASE("pythonic: the answer a Python list of calls, keyword arguments' literals as JSON", "[openai][tools]") {
  const auto P = ToolCallFormat::pythonic;
  const std::string two = "[get_weather(city='Oslo', days=3, units=None), get_time(zone=\"utc\", exact=True)]";
  check_whole(P, two, {"", {{"get_weather", R"({"city": "Oslo", "days": 3, "units": null})"},
                            {"get_time", R"({"zone": "utc", "exact": true})"}}});
  // Llama 4's tags around it; nested lists, tuples and dicts; escapes; Python's numbers; no arguments.
  const std::string rich = "<|python_start|>[f(a=[1, 2.5, -3e2, (4, 'x')], b={'k': 'it\\'s', 2: [True]}, "
                           "c='\\u00e9\\n\\x41', d=.5, e=1_000,), ping()]<|python_end|>";
  check_whole(P, rich, {"", {{"f", R"({"a": [1, 2.5, -3e2, [4, "x"]], "b": {"k": "it's", "2": [true]}, )"
                                  R"("c": "é\nA", "d": 5E-1, "e": 1000})"},
                             {"ping", "{}"}}});
  check_whole(P, "Once upon a time", {"Once upon a time", {}});
  check_whole(P, "[1, 2]", {"[1, 2]", {}});
  check_whole(P, "[f(1)]", {"[f(1)]", {}});  // keyword arguments only
  check_whole(P, "[f(a=x)]", {"[f(a=x)]", {}});  // a name is no literal
  check_whole(P, "[f(a=1)] and more", {"[f(a=1)] and more", {}});
  check_whole(P, "[f(a='open)]", {"[f(a='open)]", {}});
  check_whole(P, "[f(a=1)", {"[f(a=1)", {}});
  check_whole(P, "[]", {"[]", {}});
  check_whole(P, "[f(a=" + std::string(40, '[') + std::string(40, ']') + ")]",
              {"[f(a=" + std::string(40, '[') + std::string(40, ']') + ")]", {}});  // nested too deep
  CHECK(scan_tool_calls(P, "  <|python_st", false).content.empty());  // undecided: held back
  CHECK(scan_tool_calls(P, "Once", false).content == "Once");
  // A call shows once its name is complete; its arguments grow by whole keyword arguments.
  const ToolCallScan part = scan_tool_calls(P, "[get_weather(city='Oslo', days=1", false);
  REQUIRE(part.calls.size() == 1);
  CHECK(part.calls[0].name == "get_weather");
  CHECK(part.calls[0].arguments == R"({"city": "Oslo")");
  for (const std::string& text : {two, rich, std::string("[f(a=1), g(b='x')] tail")}) check_prefixes(P, text);
}

TEST_CASE("the forced formats: a JSON list of calls, a named function's arguments", "[openai][tools]") {
  const std::string list = "[{\"name\": \"a\", \"parameters\": {\"s\": \"[x]\"}}, {\"name\":\"b\",\"parameters\":{}}]";
  check_whole(ToolCallFormat::json_list, list, {"", {{"a", R"({"s": "[x]"})"}, {"b", "{}"}}});
  check_whole(ToolCallFormat::json_list, "[{\"name\": \"a\", \"parameters\": {}},", {"[{\"name\": \"a\", \"parameters\": {}},", {}});
  check_prefixes(ToolCallFormat::json_list, list);
  const ToolCallScan named = scan_tool_calls(ToolCallFormat::arguments, R"({"city": "Rome"})", true, "get_weather");
  REQUIRE(named.calls.size() == 1);
  CHECK(named.calls[0].name == "get_weather");
  CHECK(named.calls[0].arguments == R"({"city": "Rome"})");
  CHECK(scan_tool_calls(ToolCallFormat::arguments, R"({"city": "Ro)", true, "get_weather").calls.empty());
  CHECK(scan_tool_calls(ToolCallFormat::none, "<tool_call>", true).content == "<tool_call>");
  CHECK(tool_call_parser_named("hermes") == ToolCallFormat::hermes);
  CHECK(tool_call_parser_named("llama3_json") == ToolCallFormat::llama3_json);
  CHECK_FALSE(tool_call_parser_named("json_list"));
}

}  // namespace paged::openai
