// The options of `paged serve`'s HTTP server, and their file (conf/serve.json).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "http/reasoning_parser.h"
#include "model/sampling/sampling_params.h"
#include "http/tool_call_parser.h"

namespace paged {

struct ServerOptions {
  std::string model;                    // the model folder when no --model / MODEL is given; empty: none
  std::string host = "127.0.0.1";      // loopback unless told otherwise (a name is resolved)
  uint16_t port = 8000;                 // 0: any free port (the bound one is printed)
  // Non-empty: /v1/* requires "Authorization: Bearer KEY" with one of them (vLLM's --api-key takes several); each
  // key's stored responses (/v1/responses) are its own.
  std::vector<std::string> api_keys;
  // The names the API answers to (vLLM's --served-model-name takes several): a request's `model` may be any, responses
  // and metrics carry the first; empty: the model folder's name.
  std::vector<std::string> served_model_names;
  std::string chat_template_file;       // empty: the model's own template (tokenizer_config.json)
  size_t body_limit = 1 << 20;          // request body bytes; more is answered 413
  int read_timeout_s = 30;              // an idle connection, or one slow to send its request, is closed
  int write_timeout_s = 30;             // a client that stops reading is dropped (and its requests aborted)
  size_t pipeline_limit = 16;           // requests queued per connection before reading pauses
  int io_threads = 2;                   // threads running the sockets (the engine has its own)
  int ws_max_generations = 16;          // concurrent generations per WebSocket
  size_t ws_max_outbox_bytes = 8 << 20; // frames queued for a client that does not read; past it: closed (1008)
  size_t max_prompts_per_request = 256;     // more prompts in one request: 400
  size_t max_sequences_per_request = 1024;  // more prompts x n in one request: 400
  int shutdown_timeout_s = 30;          // SIGTERM: how long running requests may finish (vLLM's --shutdown-timeout)
  int stats_interval_s = 10;            // a stats line this often while the engine works (0: none)
  bool log_requests = false;            // a line per request as it starts and as it ends (--enable-log-requests)
  bool trust_request_chat_template = false;  // requests may bring their own chat_template (bounded; vLLM's flag)
  std::vector<std::string> allowed_origins;  // CORS: origins browsers may call from ("*": any); empty: no CORS
  bool enable_auto_tool_choice = false;  // tool_choice "auto" is served, its answers read by tool_call_parser (vLLM's)
  std::string tool_call_parser;          // how the model writes tool calls: llama3_json | hermes; empty: none
  std::string reasoning_parser;          // how the model marks its reasoning: deepseek_r1 | qwen3; empty: none
  // With a reasoning parser, structured outputs cover the think block too (vLLM's enable_in_reasoning); else they
  // start after its "</think>".
  bool structured_outputs_in_reasoning = false;
  // vLLM's --generation-config: "auto" (the model folder's generation_config.json sets the defaults of the sampling
  // fields a request leaves out), "vllm" (none: the API's own defaults) or a folder holding a generation_config.json.
  std::string generation_config = "auto";
  std::string override_generation_config;  // vLLM's --override-generation-config: a JSON object over those defaults
  bool return_tokens_as_token_ids = false;  // logprobs name tokens "token_id:ID" unless a request says otherwise
  // /v1/responses answers kept in memory for GET /v1/responses/{id} and previous_response_id (the oldest go first);
  // 0: none (store: true is refused).
  size_t max_stored_responses = 1000;
  // HTTPS (vLLM's flags, http/tls_stream.h): a certificate chain and its key, both or neither; client certificates
  // checked against ssl_ca_certs when ssl_cert_reqs is 1 (optional) or 2 (required).
  std::string ssl_keyfile, ssl_certfile, ssl_ca_certs;
  int ssl_cert_reqs = 0;
};

/// The format tool_choice "auto"'s answers are read in: none unless enable_auto_tool_choice. Throws
/// std::invalid_argument for an unknown tool_call_parser, or enable_auto_tool_choice without one (as vLLM).
openai::ToolCallFormat auto_tool_call_format(const ServerOptions& options);

/// The format chat answers' reasoning is split off in (none for an empty reasoning_parser). Throws
/// std::invalid_argument for an unknown name.
openai::ReasoningFormat reasoning_format(const ServerOptions& options);

/// The sampling defaults the options give a model in `model_dir` (generation_config, then
/// override_generation_config). Throws std::invalid_argument naming the flag, file and field at fault.
SamplingDefaults sampling_defaults(const ServerOptions& options, const std::string& model_dir);

/// Reads server options from the "server" object of a JSON file (conf/serve.json), and "model" (a path relative to
/// the file's folder, unless absolute); keys absent keep their defaults; "engine" is left to the engine flags
/// (tools/cli.h). Throws std::runtime_error naming the file and the bad or unknown key.
ServerOptions load_server_options(const std::string& json_file);

}  // namespace paged
