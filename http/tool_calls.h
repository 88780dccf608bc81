// OpenAI tool calling for chat requests: `tools` and `tool_choice` read, and the answer of a forced call read back
// as `tool_calls`. tool_choice "required" and a named function are generated under a JSON-schema constraint built
// from the functions' parameters (vLLM's way: any chat template, no parser): "required" writes a JSON list of
// {"name", "parameters"} objects, a named function its arguments object. "none" renders the tools and answers in
// text; "auto" needs a tool-call parser and is refused.
#pragma once

#include <string>
#include <vector>

#include <boost/json/array.hpp>
#include <boost/json/value.hpp>

#include "actors/engine_types.h"
#include "model/sampling/sampling_params.h"

namespace paged::openai {

/// What a chat request asks of tools.
struct ToolRequest {
  enum class Mode { none, required, named };
  Mode mode = Mode::none;
  std::string function;                   // named: the function called
  boost::json::array tools;               // the request's tools, as the chat template's `tools` variable sees them
  StructuredOutput constraint;            // required, named: the schema the answer is generated under
};

/// Reads `tools` and `tool_choice` (either may be null); `parallel` (parallel_tool_calls, OpenAI's default true):
/// "required" may write several calls, else exactly one. Throws InvalidRequest naming the field for a malformed
/// tool, an unknown function, tool_choice "auto" (or absent with tools: OpenAI's default) and tool_choice without
/// tools.
ToolRequest parse_tools(const boost::json::value* tools, const boost::json::value* tool_choice, bool parallel = true);

/// The OpenAI `tool_calls` of a forced call's answer `text` (each with an id "call_" + `id_prefix` + its index):
/// empty when the text is not a complete call (an answer cut by max_tokens).
boost::json::array tool_calls_of(const ToolRequest& request, const std::string& text, const std::string& id_prefix);

}  // namespace paged::openai
