// POST /v1/responses (OpenAI's Responses API, as vLLM serves it) on top of chat completions: a request becomes the
// chat-completions request that asks the same (chat_form), and the chat answer becomes the response object
// (response_object) or, streamed, the Responses events (ResponsesEvents). Text output, with the reasoning of a
// server's reasoning parser as a reasoning item and function tools as chat's (calls as function_call items, earlier
// calls and their outputs as input items); no built-in tools, no stored responses (a request for them is a 400).
#pragma once

#include <boost/json.hpp>
#include <cstdint>
#include <string>
#include <string_view>

namespace paged::openai {

/// The chat-completions body asking what the Responses body `body` asks: `input` (a string, or messages whose
/// content is a string or input_text / output_text parts, function_call and function_call_output items as an
/// assistant's tool calls and tool messages) after `instructions` as a system message, max_output_tokens as
/// max_tokens, text.format as response_format, function tools and tool_choice as chat's, and the sampling fields
/// both APIs share.
/// `echo` receives the request's fields that the response object repeats. Throws InvalidRequest naming a field it
/// does not support or a malformed one.
boost::json::object chat_form(const boost::json::object& body, boost::json::object& echo);

/// The response object of a finished chat.completion `chat` (one choice): its message as an output_text message
/// item (none when it only calls tools), its reasoning (reasoning_content) as a reasoning item before it, its tool
/// calls as function_call items after it, usage as input/output tokens, status
/// "completed", or "incomplete" when it stopped at max_output_tokens; the `echo` fields repeated.
boost::json::object response_object(const boost::json::object& chat, const boost::json::object& echo,
                                    const std::string& id, int64_t created_at);

/// The server-sent events of one streamed response: response.created and .in_progress first, then per item
/// output_item.added, its text's deltas and .done events (a reasoning item, then the message, then each function
/// call whole), and response.completed with the whole response object.
class ResponsesEvents {
 public:
  ResponsesEvents(boost::json::object echo, std::string id, std::string model, int64_t created_at);
  /// Events for the next pieces of reasoning and of answer text (either may be empty).
  std::string add(std::string_view reasoning, std::string_view text);
  /// The closing events, with the finished response object (response_object's).
  std::string finish(const boost::json::object& response);

 private:
  enum class Item { none, reasoning, message };
  std::string event(boost::json::object payload);
  std::string open(Item item);
  std::string close();
  boost::json::object item_json(bool done) const;
  boost::json::object skeleton() const;  // the response object while in progress: no output yet

  boost::json::object echo_;
  std::string id_, model_;
  int64_t created_at_ = 0;
  int64_t sequence_ = 0;
  bool started_ = false;
  bool message_opened_ = false;
  Item item_ = Item::none;
  int output_index_ = -1;
  std::string text_;  // the open item's text so far
};

}  // namespace paged::openai
