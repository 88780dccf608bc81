#include "http/openai.h"

#include "http/strict_json.h"
#include "model/hash_mix.h"
#include "model/sampling/params_check.h"
#include "model/unicode/utf8.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <limits>
#include <sstream>

#include <boost/json.hpp>

namespace paged::openai {
namespace json = boost::json;
namespace {


[[noreturn]] void invalid(const std::string& message, const std::string& param) { throw InvalidRequest(message, param); }

using Structured = StructuredOutput::Kind;

// The JSON text of a schema given as an object or as a string holding one.
std::string schema_text(const json::value& v, const std::string& field) {
  if (v.is_object()) return json::serialize(v);
  if (v.is_string()) return std::string(v.get_string());
  invalid("'" + field + "' must be a JSON schema (an object)", field);
}

// A choice list: a non-empty list of strings, as JSON text.
std::string choice_text(const json::value& v, const std::string& field) {
  const json::array* a = v.if_array();
  if (!a || a->empty() || !std::all_of(a->begin(), a->end(), [](const json::value& c) { return c.is_string(); }))
    invalid("'" + field + "' must be a non-empty list of strings", field);
  return json::serialize(v);
}

std::string string_of(const json::value& v, const std::string& field) {
  if (!v.is_string()) invalid("'" + field + "' must be a string", field);
  return std::string(v.get_string());
}

std::string show(double d) {
  std::ostringstream ss;
  ss << d;
  return ss.str();
}

/// Typed, nullable access to the fields of a request body; every error names the field.
class Fields {
 public:
  /// `where` prefixes the names errors give this object's fields ("structured_outputs.").
  explicit Fields(const json::object& o, std::string where = "") : o_(o), where_(std::move(where)) {}

  /// The field, or nullptr when absent or null. The key counts as read (refuse_unread).
  const json::value* get(const char* key) const {
    read_.insert(key);
    const json::value* v = o_.if_contains(key);
    return v && !v->is_null() ? v : nullptr;
  }

  /// Refuses (400 naming it) the first field nothing read: a field this server does not act on is never ignored.
  /// `where` prefixes the name of a nested object's field ("stream_options.").
  void refuse_unread(std::string where = "") const {
    if (where.empty()) where = where_;
    for (const auto& kv : o_) {
      const std::string key(kv.key());
      if (!read_.count(key))
        invalid("'" + where + key + "' is not supported by this server", where.empty() ? key : where + key);
    }
  }

  std::optional<bool> boolean(const char* key) const {
    const json::value* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_bool()) invalid("'" + where_ + key + "' must be a boolean", where_ + key);
    return v->get_bool();
  }

  std::optional<int64_t> integer(const char* key, int64_t lo, int64_t hi) const {
    const json::value* v = get(key);
    if (!v) return std::nullopt;
    const std::string name = where_ + key;
    const int64_t i = as_integer(*v, name);
    if (i < lo || i > hi) {
      invalid("'" + name + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi) + ", got " +
                  std::to_string(i),
              name);
    }
    return i;
  }

  /// A number in [lo, hi] (or (lo, hi] when `lo_open`).
  std::optional<double> number(const char* key, double lo, double hi, bool lo_open = false) const {
    const json::value* v = get(key);
    if (!v) return std::nullopt;
    const std::string name = where_ + key;
    if (!v->is_number()) invalid("'" + name + "' must be a number", name);
    const double d = v->to_number<double>();
    if (!std::isfinite(d) || (lo_open ? d <= lo : d < lo) || d > hi) {
      invalid("'" + name + "' must be in " + (lo_open ? "(" : "[") + show(lo) + ", " + show(hi) + "], got " +
                  show(d),
              name);
    }
    return d;
  }

  std::optional<std::string> string(const char* key) const {
    const json::value* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) invalid("'" + where_ + key + "' must be a string", where_ + key);
    return std::string(v->get_string());
  }

  static int64_t as_integer(const json::value& v, const std::string& key) {
    if (v.is_int64()) return v.get_int64();
    if (v.is_uint64()) {
      if (v.get_uint64() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) invalid("'" + key + "' is too large", key);
      return static_cast<int64_t>(v.get_uint64());
    }
    if (v.is_double() && std::trunc(v.get_double()) == v.get_double() && std::abs(v.get_double()) < 9.0e15) {
      return static_cast<int64_t>(v.get_double());
    }
    invalid("'" + key + "' must be an integer", key);
  }

 private:
  const json::object& o_;
  std::string where_;
  mutable std::set<std::string, std::less<>> read_;
};

TokenId checked_token(const json::value& v, const std::string& param, int vocab_size) {
  const int64_t id = Fields::as_integer(v, param);
  if (id < 0 || id >= vocab_size) {
    invalid("token id " + std::to_string(id) + " is out of vocabulary (size " + std::to_string(vocab_size) + ")", param);
  }
  return static_cast<TokenId>(id);
}

std::vector<TokenId> token_list(const json::array& a, const std::string& param, int vocab_size) {
  std::vector<TokenId> ids;
  ids.reserve(a.size());
  for (const auto& v : a) ids.push_back(checked_token(v, param, vocab_size));
  return ids;
}

std::vector<TokenId> encode(const Tokenizer& tok, const std::string& text, bool add_special, const char* param) {
  try {
    return tok.encode(text, add_special);
  } catch (const TokenizerError& e) {
    invalid(e.what(), param);
  }
}

/// prompt: a string, a list of strings, a list of token ids, or a list of such lists.
void parse_prompt(const json::value* prompt, const ModelInfo& model, bool add_special_tokens, Request& req) {
  if (!prompt) invalid("'prompt' is required", "prompt");
  const Tokenizer& tok = *model.tokenizer;
  auto add_text = [&](std::string text) {
    req.prompts.push_back(encode(tok, text, add_special_tokens, "prompt"));
    req.prompt_texts.push_back(std::move(text));
  };
  auto add_ids = [&](std::vector<TokenId> ids) {
    if (ids.empty()) invalid("a prompt must not be empty", "prompt");
    req.prompt_texts.push_back(tok.decode(ids));
    req.prompts.push_back(std::move(ids));
  };
  if (prompt->is_string()) {
    add_text(std::string(prompt->get_string()));
    return;
  }
  if (!prompt->is_array() || prompt->get_array().empty()) {
    invalid("'prompt' must be a string, a list of strings, a list of token ids or a list of lists of token ids",
            "prompt");
  }
  const json::array& a = prompt->get_array();
  if (a[0].is_number()) {
    add_ids(token_list(a, "prompt", model.vocab_size));
    return;
  }
  for (const auto& item : a) {
    if (item.is_string()) {
      add_text(std::string(item.get_string()));
    } else if (item.is_array()) {
      add_ids(token_list(item.get_array(), "prompt", model.vocab_size));
    } else {
      invalid("every element of 'prompt' must be a string or a list of token ids", "prompt");
    }
  }
}

/// One chat message, normalised for the template: content as a string (text parts joined by newlines, null as "").
json::object normalise_message(const json::value& m, size_t index) {
  const std::string param = "messages[" + std::to_string(index) + "]";
  if (!m.is_object()) invalid(param + " must be an object", "messages");
  json::object out = m.get_object();
  const json::value* role = out.if_contains("role");
  if (!role || !role->is_string()) invalid(param + ".role must be a string", "messages");
  const std::string r(role->get_string());
  if (r != "system" && r != "user" && r != "assistant" && r != "tool" && r != "developer") {
    invalid(param + ".role must be one of system, developer, user, assistant, tool; got '" + r + "'", "messages");
  }
  json::value* content = out.if_contains("content");
  if (!content || content->is_null()) {
    if (r != "assistant") invalid(param + ".content is required", "messages");
    out["content"] = "";
  } else if (content->is_array()) {
    std::string text;
    bool first = true;
    for (const auto& part : content->get_array()) {
      const json::object* p = part.if_object();
      const json::value* type = p ? p->if_contains("type") : nullptr;
      const json::value* t = p ? p->if_contains("text") : nullptr;
      if (!type || !type->is_string() || type->get_string() != "text" || !t || !t->is_string()) {
        invalid(param + ".content: only text parts ({\"type\": \"text\", \"text\": ...}) are supported", "messages");
      }
      if (!first) text += "\n";
      text += t->get_string();
      first = false;
    }
    out["content"] = text;
  } else if (!content->is_string()) {
    invalid(param + ".content must be a string or a list of text parts", "messages");
  }
  return out;
}

/// The request's own `chat_template` (vLLM's), compiled for this request with the model's special tokens (or, for a
/// model without a template, the tokenizer's), or nullopt when it has none.
std::optional<ChatTemplate> request_template(const Fields& f, const ModelInfo& model) {
  const std::optional<std::string> source = f.string("chat_template");
  if (!source) return std::nullopt;
  if (!model.trust_request_chat_template)
    invalid("a request's own 'chat_template' needs a server started with --trust-request-chat-template",
            "chat_template");
  try {
    if (model.chat_template) return model.chat_template->with_source(*source);
    return ChatTemplate::with_tokenizer_tokens(*source, *model.tokenizer);
  } catch (const jinja::TemplateError& e) {
    invalid(std::string("'chat_template' does not parse: ") + e.what(), "chat_template");
  }
}

void parse_chat_prompt(const Fields& f, const ModelInfo& model, bool add_special_tokens, Request& req) {
  const json::value* messages = f.get("messages");
  if (!messages) invalid("'messages' is required", "messages");
  if (!messages->is_array() || messages->get_array().empty()) invalid("'messages' must be a non-empty list", "messages");
  const std::optional<ChatTemplate> own = request_template(f, model);
  const ChatTemplate* chat_template = own ? &*own : model.chat_template;
  if (!chat_template) {
    invalid("this model has no chat template; start the server with --chat-template FILE or send 'chat_template'",
            "messages");
  }
  json::array normalised;
  for (size_t i = 0; i < messages->get_array().size(); ++i) {
    normalised.push_back(normalise_message(messages->get_array()[i], i));
  }
  json::object extra;
  if (const json::value* kwargs = f.get("chat_template_kwargs")) {
    if (!kwargs->is_object()) invalid("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    for (const auto& kv : kwargs->get_object()) extra[kv.key()] = kv.value();
  }
  req.tools = parse_tools(f.get("tools"), f.get("tool_choice"), f.boolean("parallel_tool_calls").value_or(true),
                          model.tool_call_parser);
  req.tools.mistral_ids = model.mistral_tool_ids;
  req.reasoning = model.reasoning_parser;
  if (!req.tools.tools.empty()) extra["tools"] = req.tools.tools;  // the template's `tools` variable
  // continue_final_message (vLLM's): the prompt ends inside the final, assistant, message, for the model to go on.
  const bool continue_final = f.boolean("continue_final_message").value_or(false);
  const bool add_generation_prompt = f.boolean("add_generation_prompt").value_or(true);
  if (continue_final) {
    if (add_generation_prompt)
      invalid("'continue_final_message' and 'add_generation_prompt' cannot both be true (add_generation_prompt "
              "defaults to true: send false)",
              "continue_final_message");
    if (normalised.back().as_object().at("role").as_string() != "assistant")
      invalid("'continue_final_message' needs an assistant message last", "continue_final_message");
  }
  std::string text;
  try {
    text = continue_final ? chat_template->continue_final_message(normalised, extra)
                          : chat_template->apply(normalised, add_generation_prompt, extra);
  } catch (const jinja::TemplateError& e) {
    const char* param = continue_final ? "continue_final_message" : own ? "chat_template" : "messages";
    invalid(std::string("the chat template rejected the messages: ") + e.what(), param);
  }
  // The template renders BOS itself (add_special_tokens adds the tokenizer's on top, as vLLM does).
  req.prompts.push_back(encode(*model.tokenizer, text, add_special_tokens, "messages"));
  if (req.prompts.back().empty()) invalid("the rendered chat prompt is empty", "messages");
  req.prompt_texts.push_back(std::move(text));
}

std::vector<std::string> parse_stop(const json::value* stop) {
  std::vector<std::string> out;
  if (!stop) return out;
  auto add = [&](const json::value& s) {
    if (!s.is_string() || s.get_string().empty()) invalid("'stop' must be a non-empty string or a list of them", "stop");
    out.emplace_back(s.get_string());
  };
  if (stop->is_array()) {
    for (const auto& s : stop->get_array()) add(s);
  } else {
    add(*stop);
  }
  return out;
}

std::string valid_utf8_or_bytes(const std::string& bytes) {
  if (utf8::is_valid(bytes)) return bytes;
  std::string out = "bytes:";
  char buf[8];
  for (unsigned char c : bytes) {
    std::snprintf(buf, sizeof buf, "\\x%02x", c);
    out += buf;
  }
  return out;
}

double finite_logprob(float lp) { return std::isfinite(lp) ? static_cast<double>(lp) : -9999.0; }

json::array token_ids_json(const std::vector<TokenId>& ids) {
  json::array out;
  out.reserve(ids.size());
  for (TokenId t : ids) out.push_back(t);
  return out;
}

}  // namespace

namespace {

json::object parse_object(std::string_view body) {
  StrictJsonError error;
  std::optional<json::value> v = parse_strict(body, error);
  if (error.duplicate) invalid("the body is not valid: " + error.message(), *error.duplicate);
  if (!v) invalid("the body is not valid JSON (or not valid UTF-8): " + error.message(), "");
  if (!v->is_object()) invalid("the body must be a JSON object", "");
  return std::move(v->get_object());
}

// The `model` field, when present, names the served model or one of its LoRA adapters: that adapter, or none.
std::optional<LoraInfo> check_model(const Fields& f, const ModelInfo& model) {
  const std::optional<std::string> name = f.string("model");
  if (!name || *name == model.served_model_name || (!model.model_path.empty() && *name == model.model_path) ||
      std::find(model.other_names.begin(), model.other_names.end(), *name) != model.other_names.end())
    return std::nullopt;
  const std::vector<LoraInfo> loras = model.lora_adapters ? model.lora_adapters() : std::vector<LoraInfo>{};
  for (const LoraInfo& l : loras)
    if (l.name == *name) return l;
  throw ModelNotFound("The model `" + *name + "` does not exist; this server serves `" + model.served_model_name +
                          "`" + (loras.empty() ? "" : " and its LoRA adapters (GET /v1/models lists them)"),
                      "model");
}

}  // namespace

Request parse_request(Endpoint endpoint, std::string_view body, const ModelInfo& model, const ResponseStore* store,
                      std::string_view owner) {
  return parse_request(endpoint, parse_object(body), model, store, owner);
}

Endpoint invocation_endpoint(std::string_view body) {
  const json::object o = parse_object(body);
  if (o.contains("messages")) return Endpoint::chat;
  if (o.contains("prompt")) return Endpoint::completions;
  invalid("/invocations takes a chat completion body (with 'messages') or a completion body (with 'prompt')",
          "messages");
}

std::string tokenize_body(std::string_view body, const ModelInfo& model) {
  const json::object o = parse_object(body);
  const Fields f(o);
  check_model(f, model);
  const bool chat = f.get("messages") != nullptr;
  if (chat && o.contains("prompt")) invalid("/tokenize takes 'prompt' or 'messages', not both", "prompt");
  const bool add_special_tokens = f.boolean("add_special_tokens").value_or(!chat);
  Request req;
  if (chat)
    parse_chat_prompt(f, model, add_special_tokens, req);
  else
    parse_prompt(f.get("prompt"), model, add_special_tokens, req);
  if (req.prompts.size() != 1) invalid("/tokenize takes one prompt", "prompt");
  f.refuse_unread();
  return json::serialize(json::object{{"count", req.prompts[0].size()},
                                      {"max_model_len", model.max_model_len},
                                      {"tokens", token_ids_json(req.prompts[0])}});
}

LoraUpdate lora_update_body(std::string_view body, bool load) {
  const json::object o = parse_object(body);
  const Fields f(o);
  LoraUpdate u;
  for (auto [key, out] : {std::pair{"lora_name", &u.name}, std::pair{"lora_path", &u.path}}) {
    if (!load && out == &u.path) break;
    const std::optional<std::string> v = f.string(key);
    if (!v || v->empty()) invalid(std::string("'") + key + "' must be a non-empty string", key);
    *out = *v;
  }
  f.refuse_unread();
  return u;
}

std::string detokenize_body(std::string_view body, const ModelInfo& model) {
  const json::object o = parse_object(body);
  const Fields f(o);
  check_model(f, model);
  const json::value* tokens = f.get("tokens");
  if (!tokens || !tokens->is_array()) invalid("'tokens' must be a list of token ids", "tokens");
  const std::vector<TokenId> ids = token_list(tokens->get_array(), "tokens", model.vocab_size);
  f.refuse_unread();
  return json::serialize(json::object{{"prompt", model.tokenizer->decode(ids)}});
}

namespace {

// OpenAI's response_format, vLLM's structured_outputs and its older guided_* fields: at most one constraint. vLLM's
// options: disable_any_whitespace / whitespace_pattern (guided_whitespace_pattern) set a JSON output's whitespace;
// disable_fallback (there is one engine, it never falls back) and disable_additional_properties (an absent
// additionalProperties is already false) change nothing.
StructuredOutput parse_structured_output(const Fields& f) {
  std::vector<StructuredOutput> found;
  std::optional<std::string> whitespace;
  std::string whitespace_field;
  const auto set_whitespace = [&](std::string pattern, const std::string& field) {
    if (whitespace) invalid("'" + field + "' and '" + whitespace_field + "' are both given", field);
    whitespace = std::move(pattern);
    whitespace_field = field;
  };
  const auto add = [&](Structured kind, std::string spec, std::string field) {
    found.push_back({kind, std::move(spec), std::move(field)});
  };
  if (const json::value* format = f.get("response_format")) {
    if (!format->is_object()) invalid("'response_format' must be an object", "response_format");
    const Fields rf(format->get_object());
    const json::value* type = rf.get("type");
    const std::string t = type && type->is_string() ? std::string(type->get_string()) : "";
    if (t == "json_object") {
      add(Structured::json_object, "", "response_format");
    } else if (t == "json_schema") {
      const json::value* js = rf.get("json_schema");
      if (!js || !js->is_object()) invalid("'response_format.json_schema' must be an object", "response_format");
      const Fields schema(js->get_object());
      const json::value* name = schema.get("name");
      if (!name || !name->is_string()) invalid("'response_format.json_schema.name' must be a string", "response_format");
      schema.get("description");
      schema.boolean("strict");  // the schema is always enforced
      const json::value* s = schema.get("schema");
      add(Structured::json_schema, s ? schema_text(*s, "response_format.json_schema.schema") : "{}", "response_format");
      schema.refuse_unread("response_format.json_schema.");
    } else if (t == "structural_tag") {  // vLLM's (xgrammar's): {"structures": [...], "triggers": [...]}
      rf.get("structures");
      rf.get("triggers");
      add(Structured::structural_tag, json::serialize(*format), "response_format");
    } else if (t != "text") {
      invalid("'response_format.type' must be \"text\", \"json_object\", \"json_schema\" or \"structural_tag\"",
              "response_format");
    }
    rf.refuse_unread("response_format.");
  }
  if (const json::value* so = f.get("structured_outputs")) {
    if (!so->is_object()) invalid("'structured_outputs' must be an object", "structured_outputs");
    const Fields s(so->get_object(), "structured_outputs.");
    if (const json::value* v = s.get("json")) add(Structured::json_schema, schema_text(*v, "structured_outputs.json"), "structured_outputs");
    if (const json::value* v = s.get("regex")) add(Structured::regex, string_of(*v, "structured_outputs.regex"), "structured_outputs");
    if (const json::value* v = s.get("choice")) add(Structured::choice, choice_text(*v, "structured_outputs.choice"), "structured_outputs");
    if (const json::value* v = s.get("grammar")) add(Structured::grammar, string_of(*v, "structured_outputs.grammar"), "structured_outputs");
    if (const json::value* v = s.get("structural_tag"))  // vLLM's: the tag as JSON text (or here an object)
      add(Structured::structural_tag, v->is_string() ? string_of(*v, "structured_outputs.structural_tag") : json::serialize(*v),
          "structured_outputs");
    if (s.boolean("json_object").value_or(false)) add(Structured::json_object, "", "structured_outputs");
    if (s.boolean("disable_any_whitespace").value_or(false))
      set_whitespace("", "structured_outputs.disable_any_whitespace");
    if (const json::value* v = s.get("whitespace_pattern"))
      set_whitespace(string_of(*v, "structured_outputs.whitespace_pattern"), "structured_outputs.whitespace_pattern");
    s.boolean("disable_fallback");
    s.boolean("disable_additional_properties");
    s.refuse_unread("structured_outputs.");
  }
  if (const json::value* v = f.get("guided_json")) add(Structured::json_schema, schema_text(*v, "guided_json"), "guided_json");
  if (const json::value* v = f.get("guided_regex")) add(Structured::regex, string_of(*v, "guided_regex"), "guided_regex");
  if (const json::value* v = f.get("guided_choice")) add(Structured::choice, choice_text(*v, "guided_choice"), "guided_choice");
  if (const json::value* v = f.get("guided_grammar")) add(Structured::grammar, string_of(*v, "guided_grammar"), "guided_grammar");
  if (const json::value* v = f.get("guided_whitespace_pattern"))
    set_whitespace(string_of(*v, "guided_whitespace_pattern"), "guided_whitespace_pattern");
  if (found.size() > 1)
    invalid("only one structured output may be asked ('" + found[0].field + "' and '" + found[1].field + "' are both given)",
            found[1].field);
  if (whitespace) {
    if (found.empty() || (found[0].kind != Structured::json_schema && found[0].kind != Structured::json_object))
      invalid("'" + whitespace_field + "' applies to a JSON schema or json_object output only", whitespace_field);
    found[0].whitespace = std::move(whitespace);
  }
  return found.empty() ? StructuredOutput{} : found[0];
}

}  // namespace

Request parse_request(Endpoint endpoint, const json::object& body, const ModelInfo& model,
                      const ResponseStore* store, std::string_view owner) {
  if (endpoint == Endpoint::responses) {
    auto form = std::make_shared<ResponsesForm>(responses_form(body, store, owner));
    Request req;
    try {
      req = parse_request(Endpoint::chat, form->chat, model);
    } catch (const InvalidRequest& e) {
      // Named as the Responses request names them.
      static const std::map<std::string, std::string, std::less<>> kResponsesName = {
          {"messages", "input"}, {"max_tokens", "max_output_tokens"}, {"response_format", "text.format"}};
      const auto renamed = kResponsesName.find(e.param);
      if (renamed == kResponsesName.end()) throw;
      throw InvalidRequest(e.what(), renamed->second);
    }
    req.endpoint = Endpoint::responses;
    req.responses = std::move(form);
    return req;
  }
  const Fields f(body);
  const bool chat = endpoint == Endpoint::chat;
  Request req;
  req.endpoint = endpoint;
  SamplingParams& p = req.params;
  if (const std::optional<LoraInfo> lora = check_model(f, model)) {
    p.lora = lora->id;
    req.lora_name = lora->name;
  }
  req.stream = f.boolean("stream").value_or(false);
  if (const json::value* so = f.get("stream_options")) {
    if (!so->is_object()) invalid("'stream_options' must be an object", "stream_options");
    if (!req.stream) invalid("'stream_options' is only allowed when 'stream' is true", "stream_options");
    const Fields options(so->get_object());
    req.include_usage = options.boolean("include_usage").value_or(false);
    req.continuous_usage = options.boolean("continuous_usage_stats").value_or(false);
    options.refuse_unread("stream_options.");
  }
  p.n = static_cast<int>(f.integer("n", 1, kMaxCompletions).value_or(1));
  if (auto best_of = f.integer("best_of", 1, kMaxCompletions)) {
    if (*best_of < p.n) invalid("'best_of' must be at least 'n'", "best_of");
    if (req.stream && *best_of > p.n) invalid("'best_of' above 'n' cannot be streamed", "best_of");
    p.best_of = static_cast<int>(*best_of);
  }
  p.use_beam_search = f.boolean("use_beam_search").value_or(false);
  p.length_penalty = static_cast<float>(f.number("length_penalty", -100.0, 100.0).value_or(1.0));
  if (p.use_beam_search && req.stream) invalid("beam search cannot be streamed", "use_beam_search");
  // A field left out takes the model's default (--generation-config), else the API's.
  const SamplingDefaults& model_default = model.sampling_defaults;
  p.temperature =
      static_cast<float>(f.number("temperature", 0.0, 2.0).value_or(model_default.temperature.value_or(1.0f)));
  p.top_p = static_cast<float>(f.number("top_p", 0.0, 1.0, true).value_or(model_default.top_p.value_or(1.0f)));
  p.top_k = static_cast<int>(
      f.integer("top_k", -1, std::numeric_limits<int32_t>::max()).value_or(model_default.top_k.value_or(-1)));
  p.min_p = static_cast<float>(f.number("min_p", 0.0, 1.0).value_or(model_default.min_p.value_or(0.0f)));
  if (auto seed = f.integer("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max())) {
    p.seed = static_cast<uint64_t>(*seed);
  }
  p.presence_penalty = static_cast<float>(f.number("presence_penalty", -2.0, 2.0).value_or(0.0));
  p.frequency_penalty = static_cast<float>(f.number("frequency_penalty", -2.0, 2.0).value_or(0.0));
  p.repetition_penalty = static_cast<float>(
      f.number("repetition_penalty", 0.0, 2.0, true).value_or(model_default.repetition_penalty.value_or(1.0f)));
  p.stop = parse_stop(f.get("stop"));
  if (const json::value* ids = f.get("stop_token_ids")) {
    if (!ids->is_array()) invalid("'stop_token_ids' must be a list of token ids", "stop_token_ids");
    p.stop_token_ids = token_list(ids->get_array(), "stop_token_ids", model.vocab_size);
  }
  if (const json::value* ids = f.get("allowed_token_ids")) {
    if (!ids->is_array() || ids->get_array().empty())
      invalid("'allowed_token_ids' must be a non-empty list of token ids", "allowed_token_ids");
    p.allowed_token_ids = token_list(ids->get_array(), "allowed_token_ids", model.vocab_size);
  }
  if (const json::value* words = f.get("bad_words")) {
    if (!words->is_array()) invalid("'bad_words' must be a list of strings", "bad_words");
    for (const json::value& w : words->get_array()) {
      if (!w.is_string()) invalid("'bad_words' must be a list of strings", "bad_words");
      p.bad_words.emplace_back(w.get_string());
    }
  }
  if (const json::value* bias = f.get("logit_bias")) {
    if (!bias->is_object()) invalid("'logit_bias' must be an object mapping token ids to biases", "logit_bias");
    for (const auto& kv : bias->get_object()) {
      const std::string key(kv.key());
      // Written as JSON writes an integer ("-" or a digit first, no leading zero): std::stoll alone also takes
      // " 5", "+5" and "05", so that two keys could name one id and one of their biases be dropped.
      const size_t digits = key.starts_with('-') ? 1 : 0;
      const bool canonical = key.size() > digits && key.size() <= digits + 18 &&
                             std::all_of(key.begin() + digits, key.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
                             (key[digits] != '0' || key == "0");  // "-0" and "05" name 0 and 5 again
      if (!canonical) invalid("logit_bias key '" + key + "' is not a token id", "logit_bias");
      const int64_t id = std::stoll(key);
      if (id < 0 || id >= model.vocab_size) {
        invalid("logit_bias key " + key + " is out of vocabulary (size " + std::to_string(model.vocab_size) + ")",
                "logit_bias");
      }
      if (!kv.value().is_number()) invalid("logit_bias values must be numbers", "logit_bias");
      const double b = kv.value().to_number<double>();
      if (!(b >= -100.0 && b <= 100.0)) invalid("logit_bias values must be in [-100, 100]", "logit_bias");
      p.logit_bias[static_cast<TokenId>(id)] = static_cast<float>(b);
    }
  }
  if (chat) {
    const bool logprobs = f.boolean("logprobs").value_or(false);
    auto top = f.integer("top_logprobs", 0, kMaxLogprobs);
    if (top && !logprobs) invalid("'top_logprobs' requires 'logprobs' to be true", "top_logprobs");
    if (logprobs) p.logprobs = static_cast<int>(top.value_or(0));
  } else {
    if (auto lp = f.integer("logprobs", 0, kMaxLogprobs)) p.logprobs = static_cast<int>(*lp);
    req.echo = f.boolean("echo").value_or(false);
    if (f.get("suffix")) invalid("'suffix' is not supported", "suffix");
  }
  if (auto k = f.integer("prompt_logprobs", 0, kMaxLogprobs)) {
    if (req.stream) invalid("'prompt_logprobs' is not available when 'stream' is true", "prompt_logprobs");
    p.prompt_logprobs = static_cast<int>(*k);
    req.show_prompt_logprobs = true;
  }
  // vLLM's echo with logprobs: the prompt's tokens are scored too, with as many alternatives (unless asked apart).
  if (req.echo && p.logprobs && !p.prompt_logprobs) p.prompt_logprobs = p.logprobs;
  p.ignore_eos = f.boolean("ignore_eos").value_or(false);
  p.skip_special_tokens = f.boolean("skip_special_tokens").value_or(true);
  // Special tokens are written without spaces around them (what Hugging Face's fast tokenizers, and so vLLM with
  // them, do): `true` is refused where it would change the text, with special tokens written.
  if (f.boolean("spaces_between_special_tokens").value_or(false) && !p.skip_special_tokens)
    invalid("'spaces_between_special_tokens' true is not supported with 'skip_special_tokens' false: special tokens "
            "are written without spaces around them",
            "spaces_between_special_tokens");
  p.include_stop_str_in_output = f.boolean("include_stop_str_in_output").value_or(false);
  req.tokens_as_ids = f.boolean("return_tokens_as_token_ids").value_or(model.return_tokens_as_token_ids);
  req.return_token_ids = f.boolean("return_token_ids").value_or(false);
  p.priority = static_cast<int>(f.integer("priority", std::numeric_limits<int32_t>::min(),
                                          std::numeric_limits<int32_t>::max()).value_or(0));
  if (auto salt = f.string("cache_salt")) {
    if (salt->empty()) invalid("'cache_salt' must be a non-empty string", "cache_salt");
    p.cache_salt = std::max<uint64_t>(1, hash_bytes(*salt));  // 0 is no salt
  }
  f.string("user");  // accepted, only type-checked
  p.structured = parse_structured_output(f);

  // vLLM's defaults: completions add the tokenizer's special tokens (BOS), chat leaves them to the template.
  const bool add_special_tokens = f.boolean("add_special_tokens").value_or(!chat);
  if (chat) {
    parse_chat_prompt(f, model, add_special_tokens, req);
  } else {
    parse_prompt(f.get("prompt"), model, add_special_tokens, req);
  }
  if (req.tools.constraint.kind != StructuredOutput::Kind::none) {
    // A forced call is generated under its functions' schema.
    if (p.structured.kind != StructuredOutput::Kind::none)
      invalid("'tool_choice' forcing a call cannot go with '" + p.structured.field + "'", "tool_choice");
    p.structured = req.tools.constraint;
  }
  // With a reasoning parser the think block is free and the constraint starts after it (vLLM's default).
  if (chat && model.reasoning_parser != ReasoningFormat::none && !model.structured_in_reasoning &&
      p.structured.kind != StructuredOutput::Kind::none)
    p.structured.after = std::string(kReasoningEnd);
  // Hermes and Mistral models write <tool_call> / [TOOL_CALLS] as special tokens: kept in the text unless the request
  // says otherwise (vLLM).
  if ((req.tools.format == ToolCallFormat::hermes || req.tools.format == ToolCallFormat::mistral) &&
      !f.boolean("skip_special_tokens"))
    p.skip_special_tokens = false;
  // truncate_prompt_tokens: keep each prompt's last k tokens (vLLM truncates from the left).
  if (auto keep = f.integer("truncate_prompt_tokens", 1, std::numeric_limits<int32_t>::max())) {
    for (size_t i = 0; i < req.prompts.size(); ++i) {
      std::vector<TokenId>& ids = req.prompts[i];
      if (static_cast<int64_t>(ids.size()) <= *keep) continue;
      ids.erase(ids.begin(), ids.end() - *keep);
      req.prompt_texts[i] = model.tokenizer->decode(ids);
    }
  }

  if (req.prompts.size() > model.max_prompts)
    invalid("a request holds at most " + std::to_string(model.max_prompts) + " prompts (the server's " +
                "max_prompts_per_request); this one has " + std::to_string(req.prompts.size()),
            "prompt");
  const size_t width = static_cast<size_t>(std::max({1, p.n, p.best_of}));
  if (req.prompts.size() * width > model.max_sequences)
    invalid("a request generates at most " + std::to_string(model.max_sequences) + " sequences (prompts x n, the " +
                "server's max_sequences_per_request); this one asks for " + std::to_string(req.prompts.size()) +
                " x " + std::to_string(width),
            p.best_of > p.n ? "best_of" : "n");
  size_t longest = 0;
  for (const auto& prompt : req.prompts) longest = std::max(longest, prompt.size());
  const char* prompt_param = chat ? "messages" : "prompt";
  if (static_cast<int64_t>(longest) >= model.max_model_len) {
    invalid("This model's maximum context length is " + std::to_string(model.max_model_len) +
                " tokens; the prompt has " + std::to_string(longest) + " tokens, leaving none to generate",
            prompt_param);
  }
  const char* max_key = chat && f.get("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (chat) f.get("max_tokens");  // the older name; max_completion_tokens wins when both are given
  // max_tokens 0 asks for the echoed prompt alone (vLLM's); the engine generates one token, dropped.
  auto max_tokens = f.integer(max_key, req.echo ? 0 : 1, std::numeric_limits<int32_t>::max());
  if (max_tokens == 0) {
    req.echo_only = true;
    max_tokens = 1;
  }
  if (max_tokens) {
    if (static_cast<int64_t>(longest) + *max_tokens > model.max_model_len) {
      invalid("This model's maximum context length is " + std::to_string(model.max_model_len) +
                  " tokens. However, you requested " + std::to_string(longest + *max_tokens) + " tokens (" +
                  std::to_string(longest) + " in the prompt, " + std::to_string(*max_tokens) +
                  " in the completion).",
              max_key);
    }
    p.max_tokens = static_cast<int>(*max_tokens);
  } else {
    // OpenAI's legacy default of 16 for completions; chat generates up to the context.
    p.max_tokens = chat ? model.max_model_len - static_cast<int>(longest)
                        : std::min(16, model.max_model_len - static_cast<int>(longest));
  }
  // The model's max_new_tokens caps what a request asks, as vLLM's generation config does.
  if (model.sampling_defaults.max_tokens) p.max_tokens = std::min(p.max_tokens, *model.sampling_defaults.max_tokens);
  p.min_tokens = static_cast<int>(f.integer("min_tokens", 0, req.echo_only ? 0 : p.max_tokens).value_or(0));
  f.refuse_unread();
  return req;
}

std::string error_body(std::string_view message, std::string_view type, std::string_view param,
                       std::string_view code) {
  json::object err;
  err["message"] = message;
  err["type"] = type;
  err["param"] = param.empty() ? json::value(nullptr) : json::value(param);
  err["code"] = code.empty() ? json::value(nullptr) : json::value(code);
  return json::serialize(json::object{{"error", std::move(err)}});
}

namespace {

// The cards of /v1/models: the served model under each of its names, then each LoRA adapter.
json::array model_cards(const ModelInfo& model, int max_model_len, int64_t created) {
  const std::string root = model.model_path.empty() ? model.served_model_name : model.model_path;
  json::array data;
  const auto card = [&](const std::string& name) {
    data.push_back(json::object{{"id", name},         {"object", "model"}, {"created", created},
                                {"owned_by", "paged"}, {"root", root},     {"max_model_len", max_model_len}});
  };
  card(model.served_model_name);
  for (const std::string& name : model.other_names) card(name);
  if (model.lora_adapters)
    for (const LoraInfo& l : model.lora_adapters()) {  // vLLM's cards of adapters: root their folder, parent the model
      card(l.name);
      data.back().get_object()["root"] = l.path;
      data.back().get_object()["parent"] = model.served_model_name;
    }
  return data;
}

}  // namespace

std::string models_body(const ModelInfo& model, int max_model_len, int64_t created) {
  return json::serialize(json::object{{"object", "list"}, {"data", model_cards(model, max_model_len, created)}});
}

std::string model_body(const ModelInfo& model, int max_model_len, int64_t created, std::string_view id) {
  for (const json::value& card : model_cards(model, max_model_len, created))
    if (card.as_object().at("id").as_string() == id) return json::serialize(card);
  throw ModelNotFound("The model `" + std::string(id) + "` does not exist", "model");
}

std::string token_text(const Tokenizer& tokenizer, TokenId id) {
  return valid_utf8_or_bytes(tokenizer.token_bytes(id, false));
}

// ---- responses ----------------------------------------------------------------------------------------------

ResponseBuilder::ResponseBuilder(const Request& request, const Tokenizer& tokenizer, std::string model_name,
                                 std::string id, int64_t created)
    : endpoint_(request.endpoint),
      stream_(request.stream),
      include_usage_(request.include_usage),
      continuous_usage_(request.continuous_usage),
      echo_(request.echo),
      want_logprobs_(request.params.logprobs.has_value()),
      want_prompt_logprobs_(request.show_prompt_logprobs),
      echo_logprobs_(request.echo && request.params.logprobs.has_value()),
      echo_only_(request.echo_only),
      tokens_as_ids_(request.tokens_as_ids),
      return_token_ids_(request.return_token_ids),
      tools_(request.tools),
      reasoning_(request.reasoning),
      responses_(request.responses),
      n_(request.params.n),
      prompt_texts_(request.prompt_texts),
      tokenizer_(&tokenizer),
      model_name_(std::move(model_name)),
      id_(std::move(id)),
      created_(created),
      choices_(request.prompts.size() * request.params.n),
      done_(request.prompts.size(), false),
      prompt_logprobs_(request.prompts.size()),
      prompt_ids_(echo_logprobs_ || return_token_ids_ ? request.prompts : std::vector<std::vector<TokenId>>{}),
      prompt_scores_(echo_logprobs_ ? request.prompts.size() : 0),
      prompt_tokens_(request.prompts.size(), 0),
      cached_tokens_(request.prompts.size(), 0),
      completion_tokens_(request.prompts.size(), 0) {
  for (size_t p = 0; p < request.prompts.size(); ++p) {
    prompt_tokens_[p] = static_cast<int>(request.prompts[p].size());
    // A one-token prompt has nothing to score: its list is the first entry's null alone.
    if (want_prompt_logprobs_ && request.prompts[p].size() == 1) prompt_logprobs_[p] = json::array{nullptr};
  }
  if (echo_) {
    for (size_t c = 0; c < choices_.size(); ++c) choices_[c].text_offset = prompt_texts_[c / n_].size();
  }
  if (stream_ && chat_like() && tools_.format != ToolCallFormat::none)
    for (size_t c = 0; c < choices_.size(); ++c) choices_[c].tool_stream.emplace(tools_, call_id_prefix(c));
  if (chat_like() && reasoning_ != ReasoningFormat::none)
    for (Choice& c : choices_) c.reasoning_stream.emplace(reasoning_);
  if (stream_ && endpoint_ == Endpoint::responses)
    responses_events_ = std::make_unique<ResponsesEvents>(responses_->echo, id_, model_name_, created_);
}

std::string ResponseBuilder::call_id_prefix(size_t choice) const { return id_ + "_" + std::to_string(choice) + "_"; }

int ResponseBuilder::prompt_tokens() const {
  int sum = 0;
  for (int t : prompt_tokens_) sum += t;
  return sum;
}

int ResponseBuilder::completion_tokens() const {
  int sum = 0;
  for (int t : completion_tokens_) sum += t;
  return sum;
}

json::object ResponseBuilder::usage_json() const {
  const int p = prompt_tokens(), c = completion_tokens();
  int cached = 0;
  for (int t : cached_tokens_) cached += t;
  // OpenAI's prompt_tokens_details.cached_tokens: the prompt tokens the prefix cache held.
  json::object usage{{"prompt_tokens", p},
                     {"completion_tokens", c},
                     {"total_tokens", p + c},
                     {"prompt_tokens_details", json::object{{"cached_tokens", cached}}}};
  // With a reasoning parser, OpenAI's completion_tokens_details.reasoning_tokens: the tokens generated inside the
  // think blocks (ReasoningStream::in_reasoning).
  if (chat_like() && reasoning_ != ReasoningFormat::none) {
    int reasoning = 0;
    for (const Choice& choice : choices_) reasoning += choice.reasoning_tokens;
    usage["completion_tokens_details"] = json::object{{"reasoning_tokens", reasoning}};
  }
  return usage;
}

json::object ResponseBuilder::chunk_header() const {
  json::object o;
  o["id"] = id_;
  o["object"] = endpoint_ == Endpoint::chat ? "chat.completion.chunk" : "text_completion";
  o["created"] = created_;
  o["model"] = model_name_;
  return o;
}

std::string ResponseBuilder::shown(TokenId id) const {
  return tokens_as_ids_ ? "token_id:" + std::to_string(id) : token_text(*tokenizer_, id);
}

json::value ResponseBuilder::logprobs_json(const std::vector<TokenId>& ids, const std::vector<SampledToken>& lps,
                                           size_t& text_offset) const {
  const size_t count = std::min(ids.size(), lps.size());
  if (chat_like()) {
    auto bytes_of = [](const std::string& s) {
      json::array b;
      for (unsigned char c : s) b.push_back(c);
      return b;
    };
    json::array content;
    // A token's bytes are its own, or with token ids shown those of "token_id:ID" (vLLM's).
    const auto raw_of = [&](TokenId id) { return tokens_as_ids_ ? shown(id) : tokenizer_->token_bytes(id, false); };
    for (size_t i = 0; i < count; ++i) {
      const std::string raw = raw_of(ids[i]);
      json::array top;
      for (const auto& [alt, lp] : lps[i].top_logprobs) {
        const std::string alt_raw = raw_of(alt);
        top.push_back(json::object{{"token", valid_utf8_or_bytes(alt_raw)}, {"logprob", finite_logprob(lp)},
                                   {"bytes", bytes_of(alt_raw)}});
      }
      content.push_back(json::object{{"token", valid_utf8_or_bytes(raw)}, {"logprob", finite_logprob(lps[i].logprob)},
                                     {"bytes", bytes_of(raw)}, {"top_logprobs", std::move(top)}});
    }
    return json::object{{"content", std::move(content)}};
  }
  json::array tokens, token_logprobs, top_logprobs, offsets;
  for (size_t i = 0; i < count; ++i) {
    tokens.push_back(json::string(shown(ids[i])));
    token_logprobs.push_back(finite_logprob(lps[i].logprob));
    json::object top;
    for (const auto& [alt, lp] : lps[i].top_logprobs) top[shown(alt)] = finite_logprob(lp);
    top_logprobs.push_back(std::move(top));
    offsets.push_back(static_cast<int64_t>(text_offset));
    text_offset += tokenizer_->token_bytes(ids[i], false).size();
  }
  return json::object{{"tokens", std::move(tokens)},
                      {"token_logprobs", std::move(token_logprobs)},
                      {"top_logprobs", std::move(top_logprobs)},
                      {"text_offset", std::move(offsets)}};
}

json::value ResponseBuilder::echoed_logprobs_json(size_t prompt, json::value generated) const {
  json::array tokens, token_logprobs, top_logprobs, offsets;
  const std::vector<TokenId>& ids = prompt_ids_[prompt];
  const std::vector<PromptLogprob>& scored = prompt_scores_[prompt];
  size_t offset = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string text = shown(ids[i]);
    tokens.push_back(json::string(text));
    offsets.push_back(static_cast<int64_t>(offset));
    offset += tokenizer_->token_bytes(ids[i], false).size();
    if (i == 0 || i > scored.size()) {
      token_logprobs.push_back(nullptr);
      top_logprobs.push_back(nullptr);
      continue;
    }
    const PromptLogprob& t = scored[i - 1];
    token_logprobs.push_back(finite_logprob(t.logprob));
    json::object top{{text, finite_logprob(t.logprob)}};  // the prompt's token, then the most likely ones
    for (const auto& [alt, lp] : t.top_logprobs) top.emplace(shown(alt), finite_logprob(lp));
    top_logprobs.push_back(std::move(top));
  }
  if (generated.is_object()) {
    const auto append = [&](json::array& to, const char* key) {
      for (const json::value& v : generated.as_object().at(key).as_array()) to.push_back(v);
    };
    append(tokens, "tokens");
    append(token_logprobs, "token_logprobs");
    append(top_logprobs, "top_logprobs");
    append(offsets, "text_offset");
  }
  return json::object{{"tokens", std::move(tokens)},
                      {"token_logprobs", std::move(token_logprobs)},
                      {"top_logprobs", std::move(top_logprobs)},
                      {"text_offset", std::move(offsets)}};
}

json::value ResponseBuilder::prompt_logprobs_json(const std::vector<PromptLogprob>& scored) const {
  // vLLM's form: one entry per prompt token, null for the first; each maps token ids to {logprob, rank,
  // decoded_token}: the prompt's token first, then the most likely ones.
  json::array out{nullptr};
  for (const PromptLogprob& t : scored) {
    json::object entry;
    const auto add = [&](TokenId id, float logprob, int64_t rank) {
      const std::string key = std::to_string(id);
      if (entry.contains(key)) return;
      entry[key] = json::object{{"logprob", finite_logprob(logprob)}, {"rank", rank},
                                {"decoded_token", token_text(*tokenizer_, id)}};
    };
    add(t.token, t.logprob, t.rank);
    for (size_t j = 0; j < t.top_logprobs.size(); ++j)
      add(t.top_logprobs[j].first, t.top_logprobs[j].second, static_cast<int64_t>(j) + 1);
    out.push_back(std::move(entry));
  }
  return out;
}

std::string ResponseBuilder::add(size_t prompt_index, const RequestEvent& event) {
  if (want_prompt_logprobs_ && !event.prompt_logprobs.empty())
    prompt_logprobs_[prompt_index] = prompt_logprobs_json(event.prompt_logprobs);
  if (echo_logprobs_ && !event.prompt_logprobs.empty()) prompt_scores_[prompt_index] = event.prompt_logprobs;
  if (event.error && !error_) {
    error_ = *event.error;
    unavailable_ = event.unavailable;
  }
  prompt_tokens_[prompt_index] = event.prompt_tokens > 0 ? event.prompt_tokens : prompt_tokens_[prompt_index];
  cached_tokens_[prompt_index] = std::max(cached_tokens_[prompt_index], event.cached_tokens);
  completion_tokens_[prompt_index] = echo_only_ ? 0 : event.completion_tokens;
  std::string frames;
  for (const CompletionDelta& given : event.deltas) {
    const size_t index = prompt_index * n_ + static_cast<size_t>(given.index);
    if (index >= choices_.size()) continue;
    Choice& c = choices_[index];
    // echo_only: the prompt is the answer; the generated token is dropped, the choice ends with it.
    CompletionDelta ending;
    if (echo_only_) {
      if (c.started || !given.finish_reason) continue;
      ending = {.index = given.index, .finish_reason = given.finish_reason == "cancelled" ? "cancelled" : "length"};
    }
    const CompletionDelta& d = echo_only_ ? ending : given;
    if (c.reasoning_stream && c.reasoning_stream->in_reasoning())
      c.reasoning_tokens += static_cast<int>(d.token_ids.size());
    if (!stream_ || responses_events_) {  // a streamed response ends with the whole response object too
      c.text += d.text;
      c.token_ids.insert(c.token_ids.end(), d.token_ids.begin(), d.token_ids.end());
      c.logprobs.insert(c.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
      if (d.finish_reason) c.finish_reason = d.finish_reason;
      if (!stream_) {
        // The whole answer is split at its end; the stream only follows where it is.
        if (c.reasoning_stream) c.reasoning_stream->add(d.text, d.finish_reason.has_value());
        continue;
      }
    }
    if (d.text.empty() && d.token_ids.empty() && !d.finish_reason && c.started) continue;
    json::object choice;
    choice["index"] = index;
    std::optional<std::string> finish = d.finish_reason;
    if (chat_like()) {
      json::object delta;
      if (!c.started) delta["role"] = "assistant";
      const bool ended = d.finish_reason.has_value();
      // The reasoning goes out under both of vLLM's names; the tool calls are read from the content alone.
      std::string content = d.text;
      if (c.reasoning_stream) {
        ReasoningSplit piece = c.reasoning_stream->add(d.text, ended);
        if (responses_events_) frames += responses_events_->add(piece.reasoning, "");
        if (!piece.reasoning.empty()) {
          delta["reasoning"] = piece.reasoning;
          delta["reasoning_content"] = std::move(piece.reasoning);
        }
        content = std::move(piece.content);
      }
      if (responses_events_) {
        // Tool calls leave the text (they come whole with the response); the rest is the message's.
        if (c.tool_stream) {
          const json::object fields = c.tool_stream->add(content, ended);
          const json::value* text = fields.if_contains("content");
          content = text && text->is_string() ? std::string(text->get_string()) : std::string();
        }
        frames += responses_events_->add("", content);
        c.started = true;
        continue;
      }
      if (c.tool_stream) {
        for (auto& field : c.tool_stream->add(content, ended)) delta[field.key()] = field.value();
        if (finish == "stop" && c.tool_stream->called()) finish = "tool_calls";
      } else if (!content.empty() || (!c.started && !c.reasoning_stream)) {
        delta["content"] = std::move(content);
      }
      const bool parsed = c.tool_stream || c.reasoning_stream;  // a piece may settle nothing yet: no chunk then
      if (parsed && delta.empty() && c.started && !finish &&
          !((want_logprobs_ || return_token_ids_) && !d.token_ids.empty()))
        continue;
      choice["delta"] = std::move(delta);
    } else {
      choice["text"] = (echo_ && !c.started) ? prompt_texts_[prompt_index] + d.text : d.text;
    }
    choice["logprobs"] = want_logprobs_ && !d.token_ids.empty() ? logprobs_json(d.token_ids, d.logprobs, c.text_offset)
                                                                 : json::value(nullptr);
    if (echo_logprobs_ && !c.started) choice["logprobs"] = echoed_logprobs_json(prompt_index, choice["logprobs"]);
    choice["finish_reason"] = finish ? json::value(*finish) : json::value(nullptr);
    json::object chunk = chunk_header();
    // vLLM's return_token_ids, streamed: the prompt's tokens in the first chunk (completions: each choice's first),
    // each chunk's new tokens.
    if (return_token_ids_) {
      if (!chat_like() && !c.started) choice["prompt_token_ids"] = token_ids_json(prompt_ids_[prompt_index]);
      if (chat_like() && !std::exchange(prompt_ids_sent_, true)) chunk["prompt_token_ids"] = token_ids_json(prompt_ids_[0]);
      choice["token_ids"] = token_ids_json(d.token_ids);
    }
    c.started = true;
    chunk["choices"] = json::array{std::move(choice)};
    // vLLM's continuous_usage_stats: every chunk carries the usage so far; else include_usage's null.
    if (continuous_usage_) chunk["usage"] = usage_json();
    else if (include_usage_) chunk["usage"] = nullptr;
    frames += "data: " + json::serialize(chunk) + "\n\n";
  }
  if (event.done && !done_[prompt_index]) {
    done_[prompt_index] = true;
    ++prompts_done_;
  }
  return frames;
}

std::string ResponseBuilder::body() const {
  return json::serialize(endpoint_ == Endpoint::responses ? response() : answer_object());
}

json::object ResponseBuilder::response() const {
  return response_object(answer_object(), responses_->echo, id_, created_);
}

std::optional<StoredResponse> ResponseBuilder::to_store() const {
  if (endpoint_ != Endpoint::responses || !responses_->store) return std::nullopt;
  const json::object answer = answer_object();
  return stored_response(*responses_, response_object(answer, responses_->echo, id_, created_),
                         answer.at("choices").as_array().at(0).at("message").as_object());
}

json::object ResponseBuilder::answer_object() const {
  json::array choices;
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    size_t offset = c.text_offset;
    json::object choice;
    choice["index"] = i;
    const json::value logprobs = want_logprobs_ ? logprobs_json(c.token_ids, c.logprobs, offset) : json::value(nullptr);
    std::optional<std::string> finish = c.finish_reason;
    if (chat_like()) {
      const ReasoningSplit split = split_reasoning(reasoning_, c.text);
      json::array calls = tool_calls_of(tools_, split.content, call_id_prefix(i));
      json::object message{{"role", "assistant"}};
      if (calls.empty()) {
        // With a reasoning parser an empty content is null, as vLLM's.
        message["content"] = split.content.empty() && reasoning_ != ReasoningFormat::none ? json::value(nullptr)
                                                                                          : json::value(split.content);
      } else {
        message["content"] = content_of(tools_, split.content);
        message["tool_calls"] = std::move(calls);
        if (finish == "stop") finish = "tool_calls";
      }
      if (reasoning_ != ReasoningFormat::none) {
        const json::value reasoning = split.reasoning.empty() ? json::value(nullptr) : json::value(split.reasoning);
        message["reasoning"] = reasoning;
        message["reasoning_content"] = reasoning;
      }
      choice["message"] = std::move(message);
      choice["logprobs"] = logprobs;
    } else {
      choice["text"] = echo_ ? prompt_texts_[i / n_] + c.text : c.text;
      choice["logprobs"] = echo_logprobs_ ? echoed_logprobs_json(i / n_, logprobs) : logprobs;
    }
    choice["finish_reason"] = finish ? json::value(*finish) : json::value(nullptr);
    // vLLM's places: each completion choice carries its prompt's, a chat response carries them at the top level.
    if (want_prompt_logprobs_ && endpoint_ == Endpoint::completions)
      choice["prompt_logprobs"] = prompt_logprobs_[i / n_];
    if (return_token_ids_) {
      if (endpoint_ == Endpoint::completions) choice["prompt_token_ids"] = token_ids_json(prompt_ids_[i / n_]);
      choice["token_ids"] = token_ids_json(c.token_ids);
    }
    choices.push_back(std::move(choice));
  }
  json::object o;
  o["id"] = id_;
  o["object"] = chat_like() ? "chat.completion" : "text_completion";
  o["created"] = created_;
  o["model"] = model_name_;
  o["choices"] = std::move(choices);
  o["usage"] = usage_json();
  if (want_prompt_logprobs_ && endpoint_ == Endpoint::chat) o["prompt_logprobs"] = prompt_logprobs_[0];
  if (return_token_ids_ && endpoint_ == Endpoint::chat) o["prompt_token_ids"] = token_ids_json(prompt_ids_[0]);
  return o;
}

std::string ResponseBuilder::stream_end() {
  if (responses_events_) return responses_events_->finish(response());
  std::string frames;
  if (include_usage_) {
    json::object chunk = chunk_header();
    chunk["choices"] = json::array{};
    chunk["usage"] = usage_json();
    frames += "data: " + json::serialize(chunk) + "\n\n";
  }
  return frames + "data: [DONE]\n\n";
}

}  // namespace paged::openai
