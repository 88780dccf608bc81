// The OpenAI API schema: /v1/completions and /v1/chat/completions request bodies parsed and validated into
// prompts + SamplingParams, and responses (whole or as SSE chunks, usage, logprobs) built from engine events.
// Pure: no sockets and no engine here, so all of it is unit-tested directly ([openai]).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/json/object.hpp>

#include "actors/engine.h"
#include "http/reasoning_parser.h"
#include "http/responses.h"
#include "http/tool_calls.h"
#include "model/template/chat_template.h"
#include "model/sampling/sampling_params.h"
#include "model/tokenizer/tokenizer.h"

namespace paged::openai {

/// What request parsing needs to know about the served model.
struct ModelInfo {
  const Tokenizer* tokenizer = nullptr;         // must be set
  int vocab_size = 0;                           // token ids, logit_bias keys and stop_token_ids must be below
  int max_model_len = 0;                        // prompt + max_tokens may not exceed it
  std::string served_model_name;                // the `model` accepted (absent is fine too), or model_path
  const ChatTemplate* chat_template = nullptr;  // null: chat requests answer 400
  std::string model_path;                       // the model folder as given to the server; empty: only the name
  size_t max_prompts = 256;                     // prompts one request may hold
  size_t max_sequences = 1024;                  // prompts x max(n, best_of) one request may generate
  bool trust_request_chat_template = false;     // a request may bring its own chat_template (else 400, as vLLM)
  ToolCallFormat tool_call_parser = ToolCallFormat::none;  // reads tool_choice "auto"'s answers; none: "auto" is a 400
  bool mistral_tool_ids = false;  // tool call ids of 9 letters and digits (a Mistral model, or --tool-call-parser mistral)
  ReasoningFormat reasoning_parser = ReasoningFormat::none;  // splits chat answers' reasoning off (--reasoning-parser)
  bool structured_in_reasoning = false;  // with reasoning_parser, constraints cover the think block too; else they
                                         // start after its end (StructuredOutput::after), as vLLM's
  SamplingDefaults sampling_defaults;    // what a request leaves out (--generation-config); max_tokens caps it too
  bool return_tokens_as_token_ids = false;  // logprobs name tokens "token_id:ID" unless a request says otherwise
  std::vector<std::string> other_names;  // more names `model` may be (--served-model-name's after the first)
  /// The LoRA adapters served now (Engine::lora_adapters; unset: none): a request whose `model` names one runs it
  /// (SamplingParams::lora); /v1/models lists each, its root its folder and its parent the served model.
  std::function<std::vector<LoraInfo>()> lora_adapters;
};

/// A request for a model this server does not serve: HTTP 404 with code model_not_found (OpenAI's and vLLM's).
struct ModelNotFound : InvalidRequest {
  using InvalidRequest::InvalidRequest;
};

/// responses: OpenAI's Responses API, served as chat (http/responses.h translates both ways).
enum class Endpoint { completions, chat, responses };

/// A validated request: one engine request per prompt, all with the same parameters.
struct Request {
  Endpoint endpoint = Endpoint::completions;
  std::vector<std::vector<TokenId>> prompts;
  std::vector<std::string> prompt_texts;  // the prompts as text (echoed when `echo`)
  SamplingParams params;
  bool stream = false;
  bool include_usage = false;             // stream_options.include_usage
  bool continuous_usage = false;          // stream_options.continuous_usage_stats (vLLM's): usage in every chunk
  bool echo = false;                      // completions: prepend the prompt to the text (and with logprobs, the
                                          // prompt's tokens to the logprobs: vLLM's prompt_logprobs = logprobs)
  bool echo_only = false;                 // completions: echo with max_tokens 0, the answer is the prompt alone (one
                                          // token is generated and dropped)
  bool show_prompt_logprobs = false;      // the response has "prompt_logprobs" (asked for by that name)
  bool tokens_as_ids = false;             // logprobs name tokens "token_id:ID" (vLLM's return_tokens_as_token_ids)
  bool return_token_ids = false;          // vLLM's: prompt_token_ids and each choice's token_ids in the response
  ToolRequest tools;                      // chat: tools and tool_choice
  ReasoningFormat reasoning = ReasoningFormat::none;  // chat: how the answers' reasoning is split off their content
  std::shared_ptr<const ResponsesForm> responses;  // responses: the request in chat's terms (its echo, store)
  std::string lora_name;                  // the LoRA adapter `model` named (params.lora its id); empty: none
};

/// Parses and validates a request body (a JSON object). Throws InvalidRequest naming the parameter for malformed
/// JSON or invalid UTF-8, wrong types, out-of-range values, an unknown model, token ids or logit_bias keys out of
/// the vocabulary, prompt + max_tokens over the context, messages the chat template rejects, or a chat request to
/// a model without a chat template. Completions tokenize with the tokenizer's special tokens (BOS); chat prompts
/// are the rendered template tokenized without them.
/// Responses: `store` holds the responses previous_response_id may name, `owner`'s (null: none kept).
Request parse_request(Endpoint endpoint, std::string_view body, const ModelInfo& model,
                      const ResponseStore* store = nullptr, std::string_view owner = {});
Request parse_request(Endpoint endpoint, const boost::json::object& body, const ModelInfo& model,
                      const ResponseStore* store = nullptr, std::string_view owner = {});

/// POST /invocations (SageMaker's inference route, as vLLM serves it): the endpoint a body is for, chat when it holds
/// "messages", else completions when it holds "prompt" (the body is then parsed as that endpoint's). Throws
/// InvalidRequest for a body that is not a JSON object or holds neither.
Endpoint invocation_endpoint(std::string_view body);

/// The OpenAI error body {"error": {"message", "type", "param", "code"}}; an empty param or code is null.
std::string error_body(std::string_view message, std::string_view type, std::string_view param = {},
                       std::string_view code = {});

/// GET /v1/models: the served model, a card under each of its names (vLLM's), the model folder as their root.
std::string models_body(const ModelInfo& model, int max_model_len, int64_t created);

/// GET /v1/models/{id} (OpenAI's retrieve, the official clients' models.retrieve): the card /v1/models lists under
/// `id`. Throws ModelNotFound (404, model_not_found) for any other name.
std::string model_body(const ModelInfo& model, int max_model_len, int64_t created, std::string_view id);

/// POST /tokenize (vLLM's): {"prompt": TEXT, "add_special_tokens"?: true} or {"messages": [...],
/// "add_generation_prompt"?: true, "add_special_tokens"?: false, "chat_template_kwargs"?} (rendered by the chat
/// template), "model" optional -> {"count", "max_model_len", "tokens"}. Throws InvalidRequest (ModelNotFound) as
/// parse_request does, also for a field it does not know.
std::string tokenize_body(std::string_view body, const ModelInfo& model);
/// vLLM's POST /v1/load_lora_adapter {"lora_name", "lora_path"} (load) and /v1/unload_lora_adapter {"lora_name"}.
struct LoraUpdate {
  std::string name, path;  // path: load only
};
/// Throws InvalidRequest naming a missing, empty, mistyped or unknown field.
LoraUpdate lora_update_body(std::string_view body, bool load);
/// POST /detokenize: {"tokens": [ids], "model"?} -> {"prompt": TEXT}. Throws InvalidRequest as tokenize_body.
std::string detokenize_body(std::string_view body, const ModelInfo& model);

/// A token as the logprobs formats show it: its text when that is valid UTF-8, else "bytes:\xNN..." (vLLM's form).
std::string token_text(const Tokenizer& tokenizer, TokenId id);

/// Builds the response of one request from the engine events of all its prompts: SSE chunks as events arrive
/// (stream) or the whole body at the end. Choice index of completion i of prompt p is p * n + i.
/// Not thread-safe: one per HTTP request, used on that session's strand.
class ResponseBuilder {
 public:
  /// `id` is the response id ("cmpl-..." / "chatcmpl-..."), `created` a Unix time.
  ResponseBuilder(const Request& request, const Tokenizer& tokenizer, std::string model_name, std::string id,
                  int64_t created);

  /// Feeds one event of prompt `prompt_index` (events of one prompt in order). Returns the SSE frames it
  /// produces ("data: {...}\n\n"), empty when not streaming.
  std::string add(size_t prompt_index, const RequestEvent& event);
  /// True once the final event of every prompt arrived.
  bool finished() const { return prompts_done_ == done_.size(); }
  /// The message of the first event that carried an engine error, if any.
  const std::optional<std::string>& error() const { return error_; }
  /// Whether that error means no replica can serve (HTTP 503 rather than 500).
  bool unavailable() const { return unavailable_; }
  /// The whole response body (not streaming). Call when finished().
  std::string body() const;
  /// The closing SSE frames: the usage chunk when include_usage, then "data: [DONE]" (responses: the closing
  /// events, the last with the whole response). Call when finished().
  std::string stream_end();
  /// Responses with store: what the store keeps of the answer (stored_response); none otherwise. Call when
  /// finished() without error().
  std::optional<StoredResponse> to_store() const;
  /// Usage so far, summed over prompts.
  int prompt_tokens() const;
  int completion_tokens() const;

 private:
  struct Choice {
    std::string text;
    std::vector<TokenId> token_ids;
    std::vector<SampledToken> logprobs;
    std::optional<std::string> finish_reason;
    bool started = false;       // a chunk of this choice was sent (chat: the role; completions: the echo)
    size_t text_offset = 0;     // completions logprobs: offset of the next token in the text
    std::optional<ToolCallStream> tool_stream;  // a streamed chat choice of a request with tool calls
    // A chat choice of a server with a reasoning parser: the answer read so far (streamed, it also splits the
    // deltas), and how many of its tokens came while it was inside its reasoning.
    std::optional<ReasoningStream> reasoning_stream;
    int reasoning_tokens = 0;
  };

  /// Chat and responses: the answers are chat messages (responses translate them).
  bool chat_like() const { return endpoint_ != Endpoint::completions; }
  /// The whole answer as a chat.completion or text_completion object.
  boost::json::object answer_object() const;
  boost::json::object chunk_header() const;
  /// The prefix of the ids of choice `choice`'s tool calls (the same streamed and whole).
  std::string call_id_prefix(size_t choice) const;
  boost::json::value logprobs_json(const std::vector<TokenId>& ids, const std::vector<SampledToken>& lps,
                                   size_t& text_offset) const;
  boost::json::object usage_json() const;
  boost::json::value prompt_logprobs_json(const std::vector<PromptLogprob>& scored) const;
  /// Completions' logprobs of an echoed prompt `prompt` followed by `generated` (logprobs_json's, or null): its
  /// tokens from text offset 0, null for the first (nothing scores it), each other's top alternatives with it.
  boost::json::value echoed_logprobs_json(size_t prompt, boost::json::value generated) const;

  Endpoint endpoint_;
  bool stream_;
  bool include_usage_;
  bool continuous_usage_;
  bool echo_;
  bool want_logprobs_;
  bool want_prompt_logprobs_;
  bool echo_logprobs_;  // echo with logprobs: the prompts' scores start each choice's logprobs
  bool echo_only_;
  bool tokens_as_ids_;
  bool return_token_ids_;
  bool prompt_ids_sent_ = false;  // return_token_ids, streamed chat: the first chunk carried prompt_token_ids
  /// A token as the logprobs name it: its text (token_text) or "token_id:ID".
  std::string shown(TokenId id) const;
  ToolRequest tools_;  // tools: the answers' tool calls become tool_calls
  ReasoningFormat reasoning_;  // chat: the answers' reasoning becomes reasoning_content / reasoning
  std::shared_ptr<const ResponsesForm> responses_;
  /// The response object of the answer (responses).
  boost::json::object response() const;
  std::unique_ptr<ResponsesEvents> responses_events_;  // a streamed response
  int n_;
  std::vector<std::string> prompt_texts_;
  const Tokenizer* tokenizer_;
  std::string model_name_;
  std::string id_;
  int64_t created_;
  std::vector<Choice> choices_;
  std::vector<bool> done_;
  std::vector<boost::json::value> prompt_logprobs_;  // per prompt, in vLLM's form once they came; null before
  std::vector<std::vector<TokenId>> prompt_ids_;     // echo_logprobs_ or return_token_ids_: per prompt, its tokens
  std::vector<std::vector<PromptLogprob>> prompt_scores_;  // echo_logprobs_: per prompt, its scores once they came
  std::vector<int> prompt_tokens_;
  std::vector<int> cached_tokens_;  // per prompt: its tokens found in the prefix cache
  std::vector<int> completion_tokens_;
  size_t prompts_done_ = 0;
  std::optional<std::string> error_;
  bool unavailable_ = false;
};

}  // namespace paged::openai
