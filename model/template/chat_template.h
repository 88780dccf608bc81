// A model's chat template: where it comes from (tokenizer_config.json, chat_template.jinja, or --chat-template)
// and how a conversation becomes the prompt text. The template renders BOS itself, so the engine tokenizes the
// result without adding special tokens again (Tokenizer::encode(text, false)).
#pragma once

#include <optional>
#include <string>

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>

#include "model/template/jinja.h"

namespace paged {

class Tokenizer;

/// `rendered` cut right after the last place `content` (a message's text) appears in it, so that what the template
/// writes after a message (an end-of-turn token) is gone: found by its text without surrounding whitespace, and
/// kept up to its end with its trailing whitespace only where the template kept it (Hugging Face's rule). Throws
/// jinja::TemplateError when `content` is blank or does not appear (the template rewrote it).
std::string cut_after_final_message(const std::string& rendered, const std::string& content);

class ChatTemplate {
 public:
  /// Parses `source`; `bos_token` / `eos_token` are the special-token strings the template may refer to (left
  /// undefined in the template when absent). Throws jinja::TemplateError on a syntax error.
  ChatTemplate(const std::string& source, std::optional<std::string> bos_token, std::optional<std::string> eos_token);

  /// The template of a model folder: `override_file` when non-empty, else DIR/chat_template.jinja, else the
  /// "chat_template" of DIR/tokenizer_config.json (a string, or the "default" entry of a list of {name, template}).
  /// bos_token / eos_token come from tokenizer_config.json (strings or {"content": ...}) when it exists.
  /// Returns nullopt when the model has no template. Throws std::runtime_error for an unreadable override file or
  /// malformed tokenizer_config.json, jinja::TemplateError for a template that does not parse.
  static std::optional<ChatTemplate> load(const std::string& model_dir, const std::string& override_file = "");

  /// Another template (a request's own, vLLM's `chat_template`) with this one's special tokens. Throws
  /// jinja::TemplateError on a syntax error.
  ChatTemplate with_source(const std::string& source) const;
  /// `source` with the special tokens of `tok` (its BOS and first EOS text, left undefined where it has none): a
  /// caller's template for a model that has none. Throws jinja::TemplateError on a syntax error.
  static ChatTemplate with_tokenizer_tokens(const std::string& source, const Tokenizer& tok);

  /// The prompt text of `messages` (OpenAI chat messages: role, content, and tool fields if any). `extra` holds
  /// further template variables (tools, enable_thinking, ...). Thread-safe. Throws jinja::TemplateError, e.g. when
  /// the template's raise_exception() rejects the conversation, or when its render passes jinja::RenderLimits.
  std::string apply(const boost::json::array& messages, bool add_generation_prompt,
                    const boost::json::object& extra = {}) const;

  /// The prompt text that continues the final message (vLLM's continue_final_message): rendered without the
  /// generation prompt, then cut right after the final message's content (cut_after_final_message). Throws
  /// jinja::TemplateError as apply(), and when the final message has no text content.
  std::string continue_final_message(const boost::json::array& messages, const boost::json::object& extra = {}) const;

 private:
  jinja::Template template_;
  std::optional<std::string> bos_token_;
  std::optional<std::string> eos_token_;
};

}  // namespace paged
