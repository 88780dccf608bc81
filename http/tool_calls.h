// OpenAI tool calling for chat requests: `tools` and `tool_choice` read, and the answer of a forced call read back
// as `tool_calls`. tool_choice "required" and a named function are generated under a JSON-schema constraint built
// from the functions' parameters (vLLM's way: any chat template, no parser): "required" writes a JSON list of
// {"name", "parameters"} objects, a named function its arguments object. "none" renders the tools and answers in
// text; "auto" lets the model answer in text or call, read by the server's tool-call parser (refused without one).
// Streamed, the calls go out as OpenAI streams them (ToolCallStream).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <boost/json/array.hpp>
#include <boost/json/value.hpp>

#include "actors/engine_types.h"
#include "http/tool_call_parser.h"
#include "model/sampling/sampling_params.h"

namespace paged::openai {

/// What a chat request asks of tools.
struct ToolRequest {
  enum class Mode { none, required, named, automatic };
  Mode mode = Mode::none;
  ToolCallFormat format = ToolCallFormat::none;  // how the answer writes its calls
  bool parallel = true;                   // several calls may be read (parallel_tool_calls), else the first alone
  std::string function;                   // named: the function called
  boost::json::array tools;               // the request's tools, as the chat template's `tools` variable sees them
  StructuredOutput constraint;            // required, named: the schema the answer is generated under
  bool mistral_ids = false;  // call ids of 9 letters and digits: Mistral's chat templates take back no others
};

/// Reads `tools` and `tool_choice` (either may be null); `parallel` (parallel_tool_calls, OpenAI's default true):
/// "required" may write several calls, else exactly one; "auto" reads the first call alone. `auto_format`: the
/// server's tool-call parser (--tool-call-parser with --enable-auto-tool-choice), none when it has none. Throws
/// InvalidRequest naming the field for a malformed tool, an unknown function, tool_choice "auto" (or absent with
/// tools: OpenAI's default) without a parser, and tool_choice without tools.
ToolRequest parse_tools(const boost::json::value* tools, const boost::json::value* tool_choice, bool parallel = true,
                        ToolCallFormat auto_format = ToolCallFormat::none);

/// The OpenAI `tool_calls` of the answer `text` (each with an id "call_" + `id_prefix` + its index; with mistral_ids 9
/// letters and digits derived from that): empty when the
/// text holds no complete, valid call in the request's format (an answer cut by max_tokens, plain text).
boost::json::array tool_calls_of(const ToolRequest& request, const std::string& text, const std::string& id_prefix);

/// The message content that goes with tool_calls_of's calls: null where there are none of it (forced calls,
/// llama3_json), the text before the calls (hermes, mistral), the whole text where no call was read.
boost::json::value content_of(const ToolRequest& request, const std::string& text);

/// One streamed chat choice of a request with tool calls (a format other than none), as OpenAI streams them: the
/// content as far as it stays content, then per call a first `delta.tool_calls` entry {index, id, type, function:
/// {name, arguments so far}} once its name is complete and entries {index, function: {arguments}} with each
/// further fragment of the arguments' raw text. The pieces join to the calls and content of the whole answer
/// (tool_calls_of, content_of), unless a call begun proves malformed at the end: a stream cannot take back what it
/// sent, so it then ends as it stands (the whole answer would be content).
class ToolCallStream {
 public:
  /// Calls get their ids as tool_calls_of gives them with `id_prefix`.
  ToolCallStream(const ToolRequest& request, std::string id_prefix);
  /// The delta fields ("content", "tool_calls") that the answer's next piece `text` adds (none: an empty object);
  /// `ended`: the answer ends with it.
  boost::json::object add(std::string_view text, bool ended);
  /// Whether a call was sent (its finish reason "stop" becomes "tool_calls").
  bool called() const { return !arguments_sent_.empty(); }

 private:
  ToolCallFormat format_;
  bool parallel_;
  bool mistral_ids_;
  std::string function_;
  std::string id_prefix_;
  std::string text_;                    // the answer so far
  size_t content_sent_ = 0;             // bytes of its content sent
  std::vector<size_t> arguments_sent_;  // per call sent: bytes of its arguments sent
};

}  // namespace paged::openai
