#include "http/responses.h"

#include <algorithm>
#include <set>

#include "actors/engine_types.h"

namespace paged::openai {

namespace json = boost::json;

namespace {

[[noreturn]] void refuse(const std::string& field, const std::string& why) {
  throw InvalidRequest("'" + field + "' " + why, field);
}

// The fields both APIs take with one meaning: passed to the chat request, which checks them (vLLM's extensions
// included).
const std::set<std::string, std::less<>> kShared = {
    "model", "temperature", "top_p", "stream", "user", "seed", "stop", "top_k", "min_p", "repetition_penalty",
    "presence_penalty", "frequency_penalty", "logit_bias", "ignore_eos", "min_tokens", "priority", "cache_salt",
    "chat_template_kwargs", "allowed_token_ids", "bad_words", "skip_special_tokens"};

// A message's content: a string, or input_text / output_text parts, as one string (joined by newlines, as chat
// joins text parts).
json::string content_text(const json::value& content, const std::string& field) {
  if (content.is_string()) return content.get_string();
  if (!content.is_array()) refuse(field, "must be a string or a list of input_text parts");
  json::string text;
  for (const json::value& part : content.get_array()) {
    const json::object* p = part.if_object();
    const json::value* type = p ? p->if_contains("type") : nullptr;
    const json::value* t = p ? p->if_contains("text") : nullptr;
    if (!type || !type->is_string() || (type->get_string() != "input_text" && type->get_string() != "output_text"))
      refuse(field, "parts must be of type input_text or output_text (images, files and audio are not supported)");
    if (!t || !t->is_string()) refuse(field, "parts must have a string 'text'");
    if (&part != &content.get_array().front()) text.append("\n");
    text.append(t->get_string());
  }
  return text;
}

// A message's text as an item's content: one input_text part (output_text for the assistant's), as OpenAI lists it.
json::array item_content(const std::string& role, const json::string& text) {
  return json::array{json::object{{"type", role == "assistant" ? "output_text" : "input_text"}, {"text", text}}};
}

// `input` as chat messages; `items` gets it as Responses items (no ids yet).
json::array input_messages(const json::value& input, json::array& items) {
  if (input.is_string()) {
    items.push_back(json::object{{"type", "message"}, {"role", "user"}, {"content", item_content("user", input.get_string())}});
    return json::array{json::object{{"role", "user"}, {"content", input.get_string()}}};
  }
  if (!input.is_array() || input.get_array().empty()) refuse("input", "must be a string or a non-empty list of messages");
  json::array messages;
  for (size_t i = 0; i < input.get_array().size(); ++i) {
    const std::string field = "input[" + std::to_string(i) + "]";
    const json::object* m = input.get_array()[i].if_object();
    if (!m) refuse(field, "must be a message object");
    const json::value* type = m->if_contains("type");
    const auto string_field = [&](const char* key) -> json::string {
      const json::value* v = m->if_contains(key);
      if (!v || !v->is_string()) refuse(field + "." + key, "must be a string");
      return v->get_string();
    };
    if (type && type->is_string() && type->get_string() == "function_call") {
      // A call the model made earlier: an assistant message's tool call (consecutive calls share one message).
      json::object call{{"id", string_field("call_id")}, {"type", "function"},
                        {"function", json::object{{"name", string_field("name")}, {"arguments", string_field("arguments")}}}};
      items.push_back(json::object{{"type", "function_call"}, {"call_id", string_field("call_id")},
                                   {"name", string_field("name")}, {"arguments", string_field("arguments")},
                                   {"status", "completed"}});
      json::object* last = messages.empty() ? nullptr : &messages.back().as_object();
      if (last && last->at("role") == "assistant" && last->contains("tool_calls"))
        last->at("tool_calls").as_array().push_back(std::move(call));
      else
        messages.push_back(json::object{{"role", "assistant"}, {"content", ""}, {"tool_calls", json::array{std::move(call)}}});
      continue;
    }
    if (type && type->is_string() && type->get_string() == "function_call_output") {
      messages.push_back(json::object{{"role", "tool"}, {"tool_call_id", string_field("call_id")},
                                      {"content", string_field("output")}});
      items.push_back(json::object{{"type", "function_call_output"}, {"call_id", string_field("call_id")},
                                   {"output", string_field("output")}, {"status", "completed"}});
      continue;
    }
    if (type && !(type->is_string() && type->get_string() == "message"))
      refuse(field + ".type", "must be message, function_call or function_call_output (other items are not supported)");
    for (const auto& kv : *m)
      if (kv.key() != "type" && kv.key() != "role" && kv.key() != "content")
        refuse(field + "." + std::string(kv.key()), "is not supported by this server");
    const json::value* role = m->if_contains("role");
    const json::value* content = m->if_contains("content");
    if (!role || !role->is_string()) refuse(field + ".role", "must be user, assistant, system or developer");
    std::string r(role->get_string());
    if (r == "developer") r = "system";
    if (r != "user" && r != "assistant" && r != "system")
      refuse(field + ".role", "must be user, assistant, system or developer");
    if (!content) refuse(field + ".content", "is required");
    const json::string text = content_text(*content, field + ".content");
    items.push_back(json::object{{"type", "message"}, {"role", role->get_string()}, {"content", item_content(r, text)}});
    messages.push_back(json::object{{"role", r}, {"content", text}});
  }
  return messages;
}

// text.format as a chat response_format (absent: plain text).
json::value response_format(const json::value& text) {
  const json::object* t = text.if_object();
  if (!t) refuse("text", "must be an object");
  for (const auto& kv : *t)
    if (kv.key() != "format") refuse("text." + std::string(kv.key()), "is not supported by this server");
  const json::value* format = t->if_contains("format");
  if (!format || format->is_null()) return nullptr;
  const json::object* f = format->if_object();
  const json::value* type = f ? f->if_contains("type") : nullptr;
  if (!type || !type->is_string()) refuse("text.format", "must be an object with a type");
  if (type->get_string() == "text") return nullptr;
  if (type->get_string() == "json_object") return json::object{{"type", "json_object"}};
  if (type->get_string() != "json_schema") refuse("text.format.type", "must be text, json_object or json_schema");
  json::object schema;
  for (const auto& kv : *f) {
    if (kv.key() == "type") continue;
    if (kv.key() != "name" && kv.key() != "schema" && kv.key() != "strict" && kv.key() != "description")
      refuse("text.format." + std::string(kv.key()), "is not supported by this server");
    schema[kv.key()] = kv.value();
  }
  return json::object{{"type", "json_schema"}, {"json_schema", std::move(schema)}};
}

// Function tools ({"type": "function", "name", "description", "parameters", "strict"}) as chat's.
json::value chat_tools(const json::value& tools) {
  if (!tools.is_array()) refuse("tools", "must be a list");
  json::array out;
  for (size_t i = 0; i < tools.get_array().size(); ++i) {
    const std::string field = "tools[" + std::to_string(i) + "]";
    const json::object* t = tools.get_array()[i].if_object();
    const json::value* type = t ? t->if_contains("type") : nullptr;
    if (!type || !(type->is_string() && type->get_string() == "function"))
      refuse(field + ".type", "must be 'function' (built-in tools are not supported)");
    json::object function;
    for (const auto& kv : *t) {
      if (kv.key() == "type") continue;
      if (kv.key() != "name" && kv.key() != "description" && kv.key() != "parameters" && kv.key() != "strict")
        refuse(field + "." + std::string(kv.key()), "is not supported by this server");
      function[kv.key()] = kv.value();
    }
    out.push_back(json::object{{"type", "function"}, {"function", std::move(function)}});
  }
  return out;
}

// tool_choice: "auto", "none", "required", or {"type": "function", "name"} as chat's.
json::value chat_tool_choice(const json::value& choice) {
  if (choice.is_string()) return choice;
  const json::object* c = choice.if_object();
  const json::value* type = c ? c->if_contains("type") : nullptr;
  const json::value* name = c ? c->if_contains("name") : nullptr;
  if (!type || !(type->is_string() && type->get_string() == "function") || !name || !name->is_string())
    refuse("tool_choice", "must be auto, none, required or {\"type\": \"function\", \"name\": ...}");
  return json::object{{"type", "function"}, {"function", json::object{{"name", *name}}}};
}

json::string item_id(std::string_view prefix, const std::string& response_id) {
  const size_t cut = response_id.find('_');
  return json::string(std::string(prefix) + response_id.substr(cut == std::string::npos ? 0 : cut));
}

json::object message_item(const std::string& response_id, const json::string& text, const char* status) {
  return json::object{{"type", "message"},
                      {"id", item_id("msg", response_id)},
                      {"status", status},
                      {"role", "assistant"},
                      {"content", json::array{json::object{{"type", "output_text"},
                                                           {"text", text},
                                                           {"annotations", json::array{}},
                                                           {"logprobs", json::array{}}}}}};
}

// A chat tool call {"id", "function": {"name", "arguments"}} as a function_call item.
json::object function_call_item(const json::object& call) {
  const json::string& call_id = call.at("id").as_string();
  const json::object& function = call.at("function").as_object();
  return json::object{{"type", "function_call"},
                      {"id", "fc_" + std::string(call_id)},
                      {"call_id", call_id},
                      {"name", function.at("name")},
                      {"arguments", function.at("arguments")},
                      {"status", "completed"}};
}

json::object reasoning_item(const std::string& response_id, const json::string& text) {
  return json::object{{"type", "reasoning"},
                      {"id", item_id("rs", response_id)},
                      {"status", "completed"},
                      {"summary", json::array{}},
                      {"content", json::array{json::object{{"type", "reasoning_text"}, {"text", text}}}}};
}

}  // namespace

ResponsesForm responses_form(const json::object& body, const ResponseStore* store, std::string_view owner) {
  ResponsesForm form;
  json::object& chat = form.chat;
  json::object& echo = form.echo;
  const bool keeps = store && store->enabled();
  form.store = keeps;  // OpenAI's default where responses are kept
  std::shared_ptr<const StoredResponse> previous;
  echo = json::object{{"instructions", nullptr}, {"max_output_tokens", nullptr}, {"metadata", json::object{}},
                      {"parallel_tool_calls", true}, {"previous_response_id", nullptr},
                      {"reasoning", json::object{{"effort", nullptr}, {"summary", nullptr}}}, {"store", false},
                      {"temperature", nullptr}, {"text", json::object{{"format", json::object{{"type", "text"}}}}},
                      {"tool_choice", "auto"}, {"tools", json::array{}}, {"top_p", nullptr},
                      {"truncation", "disabled"}, {"user", nullptr}};
  json::array messages;
  for (const auto& kv : body) {
    const std::string key(kv.key());
    const json::value& v = kv.value();
    if (v.is_null()) continue;  // the API's default
    if (kShared.count(key)) {
      chat[key] = v;
      if (echo.contains(key)) echo[key] = v;
    } else if (key == "input") {
      messages = input_messages(v, form.input_items);
    } else if (key == "instructions") {
      if (!v.is_string()) refuse(key, "must be a string");
      echo[key] = v;
    } else if (key == "max_output_tokens") {
      if (!v.is_int64() || v.get_int64() < 1) refuse(key, "must be a positive integer");
      chat["max_tokens"] = v;
      echo[key] = v;
    } else if (key == "text") {
      if (json::value format = response_format(v); !format.is_null()) chat["response_format"] = std::move(format);
      echo[key] = v;
    } else if (key == "metadata") {
      const json::object* m = v.if_object();
      if (!m || m->size() > 16) refuse(key, "must be an object of at most 16 string values");
      for (const auto& entry : *m)
        if (!entry.value().is_string()) refuse(key, "must be an object of at most 16 string values");
      echo[key] = v;
    } else if (key == "store") {
      if (!v.is_bool()) refuse(key, "must be a boolean");
      if (v.get_bool() && !keeps) refuse(key, "is not supported: this server keeps no responses (send false)");
      form.store = v.get_bool();
    } else if (key == "previous_response_id") {
      if (!v.is_string()) refuse(key, "must be a string");
      if (!keeps) refuse(key, "is not supported: this server keeps no responses");
      previous = store->get(v.get_string(), owner, key);
      echo[key] = v;
    } else if (key == "truncation") {
      if (!(v.is_string() && v.get_string() == "disabled")) refuse(key, "must be 'disabled' (no truncation)");
    } else if (key == "parallel_tool_calls") {
      chat[key] = v;
      echo[key] = v;
    } else if (key == "tool_choice") {
      chat[key] = chat_tool_choice(v);
      echo[key] = v;
    } else if (key == "tools") {
      chat[key] = chat_tools(v);
      echo[key] = v;
    } else if (key == "include") {
      if (!v.is_array()) refuse(key, "must be a list");
      if (!v.get_array().empty()) refuse(key, "is not supported on /v1/responses by this server");
    } else {
      refuse(key, "is not supported by this server");
    }
  }
  if (messages.empty()) refuse("input", "is required");
  echo["store"] = form.store;
  if (previous) form.conversation = previous->conversation;
  for (json::value& m : messages) form.conversation.push_back(std::move(m));
  json::array all;
  if (const json::value& instructions = echo["instructions"]; instructions.is_string())
    all.push_back(json::object{{"role", "system"}, {"content", instructions}});
  for (const json::value& m : form.conversation) all.push_back(m);
  chat["messages"] = std::move(all);
  return form;
}

StoredResponse stored_response(const ResponsesForm& form, json::object response, const json::object& message) {
  StoredResponse stored;
  const std::string id(response.at("id").as_string());
  stored.conversation = form.conversation;
  json::object answer{{"role", "assistant"}, {"content", message.at("content").is_string() ? message.at("content")
                                                                                           : json::value("")}};
  if (const json::value* calls = message.if_contains("tool_calls")) answer["tool_calls"] = *calls;
  stored.conversation.push_back(std::move(answer));
  for (size_t i = 0; i < form.input_items.size(); ++i) {
    json::object item = form.input_items[i].as_object();
    const json::string& type = item.at("type").as_string();
    const char* prefix = type == "message" ? "msg" : type == "function_call" ? "fc" : "fco";
    item["id"] = std::string(item_id(prefix, id)) + "_in" + std::to_string(i);
    stored.input_items.push_back(std::move(item));
  }
  stored.response = std::move(response);
  return stored;
}

json::object response_object(const json::object& chat, const json::object& echo, const std::string& id,
                             int64_t created_at) {
  const json::object& choice = chat.at("choices").as_array().at(0).as_object();
  const json::object& message = choice.at("message").as_object();
  const bool cut = choice.at("finish_reason") == "length";
  json::array output;
  if (const json::value* r = message.if_contains("reasoning_content"); r && r->is_string() && !r->get_string().empty())
    output.push_back(reasoning_item(id, r->get_string()));
  const json::value& content = message.at("content");
  const json::value* calls = message.if_contains("tool_calls");
  const bool called = calls && calls->is_array() && !calls->get_array().empty();
  // An answer that only calls tools has no message item (OpenAI's).
  if (!called || (content.is_string() && !content.get_string().empty()))
    output.push_back(message_item(id, content.is_string() ? content.get_string() : json::string(),
                                  cut ? "incomplete" : "completed"));
  if (called)
    for (const json::value& call : calls->get_array()) output.push_back(function_call_item(call.as_object()));
  const json::object& usage = chat.at("usage").as_object();
  const json::value* details = usage.if_contains("completion_tokens_details");
  const json::value reasoning_tokens = details ? details->at("reasoning_tokens") : json::value(0);
  json::object o = echo;
  o["id"] = id;
  o["object"] = "response";
  o["created_at"] = created_at;
  o["status"] = cut ? "incomplete" : "completed";
  o["error"] = nullptr;
  o["incomplete_details"] = cut ? json::value(json::object{{"reason", "max_output_tokens"}}) : json::value(nullptr);
  o["model"] = chat.at("model");
  o["output"] = std::move(output);
  o["usage"] = json::object{
      {"input_tokens", usage.at("prompt_tokens")},
      {"input_tokens_details", json::object{{"cached_tokens", usage.at("prompt_tokens_details").at("cached_tokens")}}},
      {"output_tokens", usage.at("completion_tokens")},
      {"output_tokens_details", json::object{{"reasoning_tokens", reasoning_tokens}}},
      {"total_tokens", usage.at("total_tokens")}};
  return o;
}

ResponsesEvents::ResponsesEvents(json::object echo, std::string id, std::string model, int64_t created_at)
    : echo_(std::move(echo)), id_(std::move(id)), model_(std::move(model)), created_at_(created_at) {}

std::string ResponsesEvents::event(json::object payload) {
  payload["sequence_number"] = sequence_++;
  const std::string type(payload.at("type").as_string());
  return "event: " + type + "\ndata: " + json::serialize(payload) + "\n\n";
}

json::object ResponsesEvents::skeleton() const {
  json::object o = echo_;
  o["id"] = id_;
  o["object"] = "response";
  o["created_at"] = created_at_;
  o["status"] = "in_progress";
  o["error"] = nullptr;
  o["incomplete_details"] = nullptr;
  o["model"] = model_;
  o["output"] = json::array{};
  o["usage"] = nullptr;
  return o;
}

json::object ResponsesEvents::item_json(bool done) const {
  const json::string text = done ? json::string(text_) : json::string();
  json::object item = item_ == Item::reasoning ? reasoning_item(id_, text) : message_item(id_, text, "completed");
  if (!done) {
    item["status"] = "in_progress";
    item["content"] = json::array{};
  }
  return item;
}

std::string ResponsesEvents::open(Item item) {
  item_ = item;
  message_opened_ = message_opened_ || item == Item::message;
  ++output_index_;
  text_.clear();
  const json::object shown = item_json(false);
  std::string out = event({{"type", "response.output_item.added"}, {"output_index", output_index_}, {"item", shown}});
  const json::object part = item == Item::message ? json::object{{"type", "output_text"}, {"text", ""},
                                                                 {"annotations", json::array{}}}
                                                  : json::object{{"type", "reasoning_text"}, {"text", ""}};
  out += event({{"type", "response.content_part.added"}, {"item_id", shown.at("id")}, {"output_index", output_index_},
                {"content_index", 0}, {"part", part}});
  return out;
}

std::string ResponsesEvents::close() {
  if (item_ == Item::none) return "";
  const json::object done = item_json(true);
  const json::value& id = done.at("id");
  const bool message = item_ == Item::message;
  std::string out = event({{"type", message ? "response.output_text.done" : "response.reasoning_text.done"},
                           {"item_id", id}, {"output_index", output_index_}, {"content_index", 0}, {"text", text_}});
  out += event({{"type", "response.content_part.done"}, {"item_id", id}, {"output_index", output_index_},
                {"content_index", 0}, {"part", done.at("content").as_array().at(0)}});
  out += event({{"type", "response.output_item.done"}, {"output_index", output_index_}, {"item", done}});
  item_ = Item::none;
  return out;
}

std::string ResponsesEvents::add(std::string_view reasoning, std::string_view text) {
  std::string out;
  if (!started_) {
    started_ = true;
    out += event({{"type", "response.created"}, {"response", skeleton()}});
    out += event({{"type", "response.in_progress"}, {"response", skeleton()}});
  }
  const auto piece = [&](Item item, std::string_view delta) {
    if (delta.empty()) return;
    if (item_ != item) {
      out += close();
      out += open(item);
    }
    text_ += delta;
    json::object e{{"type", item == Item::message ? "response.output_text.delta" : "response.reasoning_text.delta"},
                   {"item_id", item_json(false).at("id")}, {"output_index", output_index_}, {"content_index", 0},
                   {"delta", delta}};
    if (item == Item::message) e["logprobs"] = json::array{};
    out += event(std::move(e));
  };
  piece(Item::reasoning, reasoning);
  piece(Item::message, text);
  return out;
}

std::string ResponsesEvents::finish(const json::object& response) {
  std::string out = add("", "");
  const json::array& output = response.at("output").as_array();
  // An answer with no text still has its message item when the whole response does.
  const bool has_message =
      std::any_of(output.begin(), output.end(), [](const json::value& o) { return o.at("type") == "message"; });
  if (!message_opened_ && has_message) {
    out += close();
    out += open(Item::message);
  }
  out += close();
  // Tool calls, each whole (the chat stream settles a call's arguments as they parse; here they come at the end).
  for (const json::value& o : output) {
    if (o.at("type") != "function_call") continue;
    json::object added = o.as_object();
    added["status"] = "in_progress";
    added["arguments"] = "";
    const int index = ++output_index_;
    out += event({{"type", "response.output_item.added"}, {"output_index", index}, {"item", std::move(added)}});
    out += event({{"type", "response.function_call_arguments.delta"}, {"item_id", o.at("id")}, {"output_index", index},
                  {"delta", o.at("arguments")}});
    out += event({{"type", "response.function_call_arguments.done"}, {"item_id", o.at("id")}, {"output_index", index},
                  {"arguments", o.at("arguments")}});
    out += event({{"type", "response.output_item.done"}, {"output_index", index}, {"item", o}});
  }
  const bool cut = response.at("status") == "incomplete";
  out += event({{"type", cut ? "response.incomplete" : "response.completed"}, {"response", response}});
  return out;
}

}  // namespace paged::openai
