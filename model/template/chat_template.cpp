#include "model/template/chat_template.h"

#include <filesystem>
#include <stdexcept>

#include <boost/json.hpp>

#include "model/json_file.h"
#include "model/template/jinja/text.h"
#include "model/tokenizer/tokenizer.h"

namespace paged {
namespace {

// The template source in `path`; throws std::runtime_error when it cannot be read.
std::string read_template(const std::filesystem::path& path) {
  std::optional<std::string> source = read_file(path);
  if (!source) throw std::runtime_error("cannot read " + path.string());
  return std::move(*source);
}

/// A special token as tokenizer_config.json writes it: "<s>", {"content": "<s>", ...}, or null.
std::optional<std::string> token_string(const boost::json::object& config, const char* key) {
  const auto* v = config.if_contains(key);
  if (!v) return std::nullopt;
  if (v->is_string()) return std::string(v->get_string());
  if (v->is_object()) {
    if (const auto* content = v->get_object().if_contains("content"); content && content->is_string()) {
      return std::string(content->get_string());
    }
  }
  return std::nullopt;
}

/// The "chat_template" entry: a string, or a list of {name, template} of which "default" is taken.
std::optional<std::string> config_template(const boost::json::object& config) {
  const auto* t = config.if_contains("chat_template");
  if (!t || t->is_null()) return std::nullopt;
  if (t->is_string()) return std::string(t->get_string());
  if (t->is_array()) {
    for (const auto& entry : t->get_array()) {
      const auto* obj = entry.if_object();
      if (!obj) continue;
      const auto* name = obj->if_contains("name");
      const auto* source = obj->if_contains("template");
      if (name && name->is_string() && name->get_string() == "default" && source && source->is_string()) {
        return std::string(source->get_string());
      }
    }
    return std::nullopt;
  }
  throw std::runtime_error("tokenizer_config.json: chat_template must be a string or a list of {name, template}");
}

}  // namespace

ChatTemplate::ChatTemplate(const std::string& source, std::optional<std::string> bos_token,
                           std::optional<std::string> eos_token)
    : template_(source), bos_token_(std::move(bos_token)), eos_token_(std::move(eos_token)) {}

std::optional<ChatTemplate> ChatTemplate::load(const std::string& model_dir, const std::string& override_file) {
  namespace fs = std::filesystem;
  const fs::path dir(model_dir);
  boost::json::object config;
  if (fs::exists(dir / "tokenizer_config.json"))
    config = read_json_object<std::runtime_error>(dir / "tokenizer_config.json");
  std::optional<std::string> source;
  if (!override_file.empty()) {
    source = read_template(override_file);
  } else if (fs::exists(dir / "chat_template.jinja")) {
    source = read_template(dir / "chat_template.jinja");
  } else {
    source = config_template(config);
  }
  if (!source) return std::nullopt;
  return ChatTemplate(*source, token_string(config, "bos_token"), token_string(config, "eos_token"));
}

std::string cut_after_final_message(const std::string& rendered, const std::string& content) {
  const std::string stripped = jinja::trim(content, jinja::Trim::both);
  if (stripped.empty()) throw jinja::TemplateError("continue_final_message needs a final message with text");
  const size_t at = rendered.rfind(stripped);
  if (at == std::string::npos)
    throw jinja::TemplateError(
        "continue_final_message: the final message does not appear in the prompt the chat template renders (the "
        "template changes it)");
  const std::string from_start = jinja::trim(content, jinja::Trim::start);
  const bool kept_whole = rendered.compare(at, from_start.size(), from_start) == 0;
  return rendered.substr(0, at + (kept_whole ? from_start.size() : stripped.size()));
}

ChatTemplate ChatTemplate::with_source(const std::string& source) const {
  return ChatTemplate(source, bos_token_, eos_token_);
}

ChatTemplate ChatTemplate::with_tokenizer_tokens(const std::string& source, const Tokenizer& tok) {
  const std::vector<TokenId> eos = tok.eos_ids();
  return ChatTemplate(source, tok.bos_id() >= 0 ? std::optional(tok.special_token_text(tok.bos_id())) : std::nullopt,
                      eos.empty() ? std::nullopt : std::optional(tok.special_token_text(eos[0])));
}

std::string ChatTemplate::continue_final_message(const boost::json::array& messages,
                                                 const boost::json::object& extra) const {
  const boost::json::object* last = messages.empty() ? nullptr : messages.back().if_object();
  const boost::json::value* content = last ? last->if_contains("content") : nullptr;
  if (!content || !content->is_string())
    throw jinja::TemplateError("continue_final_message needs a final message with text");
  return cut_after_final_message(apply(messages, false, extra), std::string(content->get_string()));
}

std::string ChatTemplate::apply(const boost::json::array& messages, bool add_generation_prompt,
                                const boost::json::object& extra) const {
  boost::json::object vars = extra;
  vars["messages"] = messages;
  vars["add_generation_prompt"] = add_generation_prompt;
  if (bos_token_) vars["bos_token"] = *bos_token_;
  if (eos_token_) vars["eos_token"] = *eos_token_;
  return template_.render(vars);
}

}  // namespace paged
