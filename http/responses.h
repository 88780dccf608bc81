// POST /v1/responses (OpenAI's Responses API, as vLLM serves it) on top of chat completions: a request becomes the
// chat-completions request that asks the same (responses_form), and the chat answer becomes the response object
// (response_object) or, streamed, the Responses events (ResponsesEvents). Text output, with the reasoning of a
// server's reasoning parser as a reasoning item and function tools as chat's (calls as function_call items, earlier
// calls and their outputs as input items); responses kept in a ResponseStore (store, previous_response_id); no
// built-in tools (a request for them is a 400).
#pragma once

#include <boost/json.hpp>
#include <cstdint>
#include <string>
#include <string_view>

#include "http/response_store.h"

namespace paged::openai {

/// What a Responses request asks, in chat's terms.
struct ResponsesForm {
  boost::json::object chat;         // the chat-completions body that asks the same
  boost::json::object echo;         // the request's fields that the response object repeats
  bool store = false;               // keep the answer (store; true by default where the server keeps responses)
  boost::json::array conversation;  // the stored turns previous_response_id continues, then this input, as chat
                                    // messages (no instructions: a later turn does not inherit them)
  boost::json::array input_items;   // this request's input as items, without ids
};

/// The chat-completions body asking what the Responses body `body` asks: `input` (a string, or messages whose
/// content is a string or input_text / output_text parts, function_call and function_call_output items as an
/// assistant's tool calls and tool messages) after the conversation previous_response_id names in `store` and
/// (`owner`'s) after `instructions` as a system message, max_output_tokens as max_tokens, text.format as response_format,
/// function tools and tool_choice as chat's, and the sampling fields both APIs share.
/// Throws InvalidRequest naming a field it does not support or a malformed one (store: true or
/// previous_response_id where `store` is null or off), ResponseNotFound for a previous_response_id not stored.
ResponsesForm responses_form(const boost::json::object& body, const ResponseStore* store, std::string_view owner = {});

/// What `store` keeps of a finished response: `response` (response_object's) and, after the request's
/// conversation, the answer `message` (a chat assistant message: content, tool_calls) and the input items with ids.
StoredResponse stored_response(const ResponsesForm& form, boost::json::object response,
                               const boost::json::object& message);

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
