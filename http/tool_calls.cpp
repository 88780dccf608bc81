#include "http/tool_calls.h"

#include <algorithm>
#include <initializer_list>
#include <string_view>

#include <boost/json.hpp>

#include "model/hash_mix.h"

namespace paged::openai {

namespace json = boost::json;

namespace {

[[noreturn]] void invalid(const std::string& message, const std::string& param) { throw InvalidRequest(message, param); }

// Refuses, naming it, any key of `object` (the request's `where`) not in `allowed`.
void refuse_other_keys(const json::object& object, std::initializer_list<std::string_view> allowed,
                       const std::string& where, const std::string& param) {
  for (const auto& kv : object)
    if (std::find(allowed.begin(), allowed.end(), kv.key()) == allowed.end())
      invalid("'" + where + "." + std::string(kv.key()) + "' is not supported by this server", param);
}

// The function object of a tool: {"type": "function", "function": {"name", "description"?, "parameters"?,
// "strict"?}}.
const json::object& function_of(const json::value& tool, size_t i) {
  const std::string at = "tools[" + std::to_string(i) + "]";
  const json::object* t = tool.if_object();
  const json::value* type = t ? t->if_contains("type") : nullptr;
  if (!type || !type->is_string() || type->get_string() != "function")
    invalid("'" + at + ".type' must be \"function\"", "tools");
  refuse_other_keys(*t, {"type", "function"}, at, "tools");
  const json::value* f = t->if_contains("function");
  if (!f || !f->is_object()) invalid("'" + at + ".function' must be an object", "tools");
  refuse_other_keys(f->get_object(), {"name", "description", "parameters", "strict"}, at + ".function", "tools");
  const json::value* name = f->get_object().if_contains("name");
  if (!name || !name->is_string() || name->get_string().empty())
    invalid("'" + at + ".function.name' must be a non-empty string", "tools");
  const json::value* params = f->get_object().if_contains("parameters");
  if (params && !params->is_object()) invalid("'" + at + ".function.parameters' must be a JSON schema", "tools");
  return f->get_object();
}

// A function's parameters schema; absent: an empty parameter list (OpenAI's), an object with no properties.
json::value parameters_of(const json::object& function) {
  const json::value* p = function.if_contains("parameters");
  return p ? *p : json::value(json::object{{"type", "object"}});
}

}  // namespace

ToolRequest parse_tools(const json::value* tools, const json::value* tool_choice, bool parallel,
                        ToolCallFormat auto_format) {
  ToolRequest r;
  r.parallel = parallel;
  if (!tools) {
    if (tool_choice && !(tool_choice->is_string() && tool_choice->get_string() == "none"))
      invalid("'tool_choice' needs 'tools'", "tool_choice");
    return r;
  }
  if (!tools->is_array() || tools->get_array().empty()) invalid("'tools' must be a non-empty list of tools", "tools");
  std::vector<const json::object*> functions;
  for (size_t i = 0; i < tools->get_array().size(); ++i) functions.push_back(&function_of(tools->get_array()[i], i));
  r.tools = tools->get_array();
  if (!tool_choice || (tool_choice->is_string() && tool_choice->get_string() == "auto")) {
    if (auto_format == ToolCallFormat::none)
      invalid("'tool_choice' \"auto\" (OpenAI's default with tools) needs a server started with "
              "--enable-auto-tool-choice and --tool-call-parser: send \"required\", \"none\" or a named function",
              "tool_choice");
    r.mode = ToolRequest::Mode::automatic;
    r.format = auto_format;
    return r;
  }
  if (tool_choice->is_string() && tool_choice->get_string() == "none") return r;
  if (tool_choice->is_string() && tool_choice->get_string() == "required") {
    // A list of calls, each the name of one function with its parameters.
    json::array calls;
    for (const json::object* f : functions)
      calls.push_back(json::object{
          {"type", "object"},
          {"properties", json::object{{"name", json::object{{"enum", json::array{f->at("name")}}}},
                                      {"parameters", parameters_of(*f)}}},
          {"required", json::array{"name", "parameters"}},
          {"additionalProperties", false}});
    r.mode = ToolRequest::Mode::required;
    r.format = ToolCallFormat::json_list;
    json::object list{{"type", "array"}, {"minItems", 1}, {"items", json::object{{"anyOf", std::move(calls)}}}};
    if (!parallel) list["maxItems"] = 1;
    r.constraint = {StructuredOutput::Kind::json_schema, json::serialize(list), "tool_choice"};
    return r;
  }
  // A named function: {"type": "function", "function": {"name": NAME}}, nothing else.
  const json::object* named = tool_choice->if_object();
  const json::value* type = named ? named->if_contains("type") : nullptr;
  const json::value* fn = named ? named->if_contains("function") : nullptr;
  const json::value* name = fn && fn->is_object() ? fn->get_object().if_contains("name") : nullptr;
  if (named) refuse_other_keys(*named, {"type", "function"}, "tool_choice", "tool_choice");
  if (fn && fn->is_object()) refuse_other_keys(fn->get_object(), {"name"}, "tool_choice.function", "tool_choice");
  if (!type || !type->is_string() || type->get_string() != "function" || !name || !name->is_string())
    invalid("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": "
            "{\"name\": NAME}}",
            "tool_choice");
  for (const json::object* f : functions)
    if (f->at("name") == *name) {
      r.mode = ToolRequest::Mode::named;
      r.format = ToolCallFormat::arguments;
      r.function = std::string(name->get_string());
      r.constraint = {StructuredOutput::Kind::json_schema, json::serialize(parameters_of(*f)), "tool_choice"};
      return r;
    }
  invalid("'tool_choice' names '" + std::string(name->get_string()) + "', which is not in 'tools'", "tool_choice");
}

namespace {

// The answer's calls as tool_calls_of reads them: the first alone unless `parallel`.
ToolCallScan calls_read(ToolCallFormat format, const std::string& function, bool parallel, std::string_view text,
                        bool ended) {
  ToolCallScan scan = scan_tool_calls(format, text, ended, function);
  if (!parallel && scan.calls.size() > 1) scan.calls.resize(1);
  return scan;
}

// A call of `tool_calls` as OpenAI writes it.
json::object call_json(const std::string& id, const std::string& name, const std::string& arguments) {
  return json::object{{"id", id}, {"type", "function"},
                      {"function", json::object{{"name", name}, {"arguments", arguments}}}};
}

// The id of call `index` of an answer: "call_" + prefix + index; for Mistral 9 letters and digits drawn from them
// (its chat templates refuse other ids when the calls come back in the conversation, as vLLM knows).
std::string call_id(bool mistral_ids, const std::string& prefix, size_t index) {
  const std::string id = "call_" + prefix + std::to_string(index);
  if (!mistral_ids) return id;
  static constexpr char kDigits[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  uint64_t h = hash_bytes(id);
  std::string out;
  for (int i = 0; i < 9; ++i, h /= 62) out += kDigits[h % 62];
  return out;
}

}  // namespace

json::array tool_calls_of(const ToolRequest& request, const std::string& text, const std::string& id_prefix) {
  json::array calls;
  for (const ToolCallText& c : calls_read(request.format, request.function, request.parallel, text, true).calls)
    calls.push_back(call_json(call_id(request.mistral_ids, id_prefix, calls.size()), c.name, c.arguments));
  return calls;
}

json::value content_of(const ToolRequest& request, const std::string& text) {
  const ToolCallScan scan = calls_read(request.format, request.function, request.parallel, text, true);
  if (scan.calls.empty()) return json::value(text);
  return scan.content.empty() ? json::value(nullptr) : json::value(scan.content);
}

ToolCallStream::ToolCallStream(const ToolRequest& request, std::string id_prefix)
    : format_(request.format),
      parallel_(request.parallel),
      mistral_ids_(request.mistral_ids),
      function_(request.function),
      id_prefix_(std::move(id_prefix)) {}

json::object ToolCallStream::add(std::string_view text, bool ended) {
  text_ += text;
  const ToolCallScan scan = calls_read(format_, function_, parallel_, text_, ended);
  json::object delta;
  // Content is sent while no call was: once one was, an answer that proves malformed cannot become content.
  if (!called() && scan.content.size() > content_sent_) {
    delta["content"] = scan.content.substr(content_sent_);
    content_sent_ = scan.content.size();
  }
  json::array entries;
  for (size_t i = 0; i < scan.calls.size() && !scan.calls[i].name.empty(); ++i) {
    const ToolCallText& c = scan.calls[i];
    if (i == arguments_sent_.size()) {
      json::object first = call_json(call_id(mistral_ids_, id_prefix_, i), c.name, c.arguments);
      first["index"] = i;
      entries.push_back(std::move(first));
      arguments_sent_.push_back(c.arguments.size());
    } else if (c.arguments.size() > arguments_sent_[i]) {
      entries.push_back(json::object{{"index", i},
                                     {"function", json::object{{"arguments", c.arguments.substr(arguments_sent_[i])}}}});
      arguments_sent_[i] = c.arguments.size();
    }
  }
  if (!entries.empty()) delta["tool_calls"] = std::move(entries);
  return delta;
}

}  // namespace paged::openai
