// The tool calls in a model's answer, read by the format that writes them: the forced formats of tool_choice
// "required" and a named function, and the free formats of tool_choice "auto" that `--tool-call-parser` names
// (vLLM's llama3_json, hermes, mistral and pythonic). Pure: the same scan reads a whole answer and the prefix a stream
// has so far.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace paged::openai {

/// How an answer writes its tool calls. Each call is a JSON object {"name": NAME, "parameters" | "arguments": ARGS}
/// (keys in any order), but in `arguments`.
enum class ToolCallFormat {
  none,         // no calls: the answer is content
  arguments,    // the whole answer is the arguments of the one named function (tool_choice naming it)
  json_list,    // a JSON list of calls (tool_choice "required")
  llama3_json,  // Llama 3.x: an optional <|python_tag|>, then calls joined by ';', nothing before them
  hermes,       // Hermes / Qwen: content, then each call as <tool_call>CALL</tool_call> (the last may stay open)
  mistral,      // Mistral: content, then [TOOL_CALLS] and a JSON list of calls (v3 tokenizers) or, per call,
                // [TOOL_CALLS]NAME[ARGS]ARGUMENTS (v11+; [CALL_ID]ID before [ARGS] taken too)
  pythonic,     // Llama 3.2 / 4: the whole answer a Python list of calls [NAME(KEY=VALUE, ...), ...] with literal
                // values (<|python_start|> ... <|python_end|> around it allowed); arguments become JSON objects
};

/// The format a --tool-call-parser name gives (llama3_json, hermes, mistral, pythonic); nullopt for another name.
std::optional<ToolCallFormat> tool_call_parser_named(std::string_view name);

/// One call as far as the answer wrote it.
struct ToolCallText {
  std::string name;       // the decoded name; empty until its JSON string is complete
  std::string arguments;  // the raw JSON text of its arguments as far as written (the model's own bytes; pythonic:
                          // the JSON object of the keyword arguments complete so far, closed with the call)
  bool complete = false;  // its object is closed
};

/// An answer read in its format.
struct ToolCallScan {
  std::string content;             // the text that is no call (hermes: the text before the first call)
  std::vector<ToolCallText> calls;
};

/// Reads `text` in `format`; `function` names the call of ToolCallFormat::arguments.
/// `ended` true (the whole answer): the calls when every one is complete and a valid JSON object with a string name
/// and arguments, the text they leave as content (llama3_json, hermes; text between or after hermes calls is
/// dropped, as vLLM's parser does; mistral: the text before [TOOL_CALLS]); any other answer (malformed, cut short, no call) is content alone, whole.
/// `ended` false (a stream's prefix): the content that stays content however the answer goes on (a tail that may
/// open a call is held back), and the calls begun so far; a call may still prove malformed at the end.
ToolCallScan scan_tool_calls(ToolCallFormat format, std::string_view text, bool ended, std::string_view function = {});

}  // namespace paged::openai
