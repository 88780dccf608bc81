// What the sessions of one server share: the engine, the options, the served model's schema info, the gate that
// engine threads post events through, and the one place where exceptions become HTTP statuses.
#pragma once

#include <array>
#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ssl/context.hpp>

#include "actors/engine.h"
#include "model/template/chat_template.h"
#include "http/openai.h"
#include "http/server_options.h"

namespace paged::server {

/// Engine threads reach the server's sessions only through this. guard() keeps a sink (what posts an engine event
/// onto a session's executor) inside the gate and gives the engine a callback that refers to it by key: the sink runs
/// while the gate is open, and is destroyed when the engine drops the callback or when the gate closes, whichever
/// comes first. close() (the server stopping, before its io_context and context go) drops every sink, so that no
/// engine thread posts onto, or destroys, an executor, a session or a response of a server that is gone. Thread-safe.
class EventGate : public std::enable_shared_from_this<EventGate> {
 public:
  /// The engine's callback for `sink` (runs it under the gate's lock, which a sink only holds to post).
  template <class T>
  std::function<void(T)> guard(std::function<void(T)> sink);
  void close();

 private:
  // Shared by the copies of one guarded callback; the last copy's end drops the sink.
  class Ticket {
   public:
    Ticket(std::weak_ptr<EventGate> gate, uint64_t key) : gate_(std::move(gate)), key_(key) {}
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket();
    template <class T>
    void run(T value) const;

   private:
    std::weak_ptr<EventGate> gate_;
    uint64_t key_;
  };

  std::mutex mu_;
  bool open_ = true;
  uint64_t next_key_ = 0;
  std::unordered_map<uint64_t, std::shared_ptr<void>> sinks_;  // a std::function<void(T)> each
};

template <class T>
std::function<void(T)> EventGate::guard(std::function<void(T)> sink) {
  uint64_t key = 0;
  {
    std::lock_guard lock(mu_);
    key = next_key_++;
    if (open_) sinks_.emplace(key, std::make_shared<std::function<void(T)>>(std::move(sink)));
  }
  auto ticket = std::make_shared<const Ticket>(weak_from_this(), key);
  return [ticket](T value) { ticket->run(std::move(value)); };
}

template <class T>
void EventGate::Ticket::run(T value) const {
  const std::shared_ptr<EventGate> gate = gate_.lock();
  if (!gate) return;
  std::lock_guard lock(gate->mu_);
  if (!gate->open_) return;
  const auto it = gate->sinks_.find(key_);
  if (it != gate->sinks_.end()) (*static_cast<std::function<void(T)>*>(it->second.get()))(std::move(value));
}

/// Responses by status code, appended to /metrics as paged_http_responses_total. Thread-safe.
class HttpCounters {
 public:
  void count(unsigned status);
  /// Prometheus text of the counters.
  std::string prometheus() const;

 private:
  static constexpr std::array<unsigned, 10> kCodes = {101, 200, 400, 401, 404, 405, 413, 500, 503, 0};
  std::array<std::atomic<int64_t>, kCodes.size()> counts_{};
};

class ServerContext {
 public:
  /// Loads the chat template (options.chat_template_file, else the model's). Throws std::runtime_error or
  /// jinja::TemplateError when a template file is unreadable or does not parse.
  ServerContext(Engine& engine, ServerOptions options, std::shared_ptr<boost::asio::ssl::context> tls = nullptr);

  Engine& engine;
  const ServerOptions options;
  const std::string model_name;
  const int max_model_len;
  const openai::ModelInfo& model_info() const { return model_info_; }
  std::shared_ptr<EventGate> gate = std::make_shared<EventGate>();
  HttpCounters counters;
  /// The /v1/responses answers kept (options.max_stored_responses).
  openai::ResponseStore responses;
  /// HTTPS: the context every connection shakes hands with (http/tls_stream.h); null: plain HTTP.
  const std::shared_ptr<boost::asio::ssl::context> tls;
  /// Set once the server shuts down: generation requests answer 503 and connections close after their responses.
  std::atomic<bool> draining{false};
  /// What the server still owes its clients counts while such a token lives: an HTTP exchange that generates, until
  /// its response is written; a WebSocket session while it has generations or unwritten frames.
  std::shared_ptr<void> owe_client();
  /// The Access-Control-Allow-Origin value for a request from `origin` (its Origin header): "*" or the origin when
  /// options.allowed_origins lets it in; empty otherwise (no CORS headers).
  std::string allowed_origin(std::string_view origin) const;
  /// How many tokens of owe_client() live.
  int owed() const { return owed_.load(); }

  /// Whether the served model answers to `name` (--served-model-name's names, or its folder).
  bool serves_as_model(const std::string& name) const;
  /// POST /v1/load_lora_adapter (load) or /v1/unload_lora_adapter with `body`: vLLM's success text. Throws
  /// InvalidRequest (400: a bad body, a name taken or the model's own, an adapter that does not load) or
  /// ModelNotFound (404: unloading a name not served). Blocks while the adapter loads.
  std::string update_lora(bool load, std::string_view body);
  /// vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING (1 or true): the two endpoints above are open; else they answer 404.
  const bool runtime_lora_updating;

  /// A fresh response id: PREFIX-<24 random hex digits>. Thread-safe.
  std::string next_id(const char* prefix);
  /// True when the request may use /v1/* (no API key set, or "Bearer KEY" given with one of them).
  bool authorized(std::string_view authorization_header) const;
  /// Whose the request is, for what a key keeps to itself (stored responses): "key I" for the I-th API key it
  /// gives, "" without keys.
  std::string key_owner(std::string_view authorization_header) const;
  /// True when /dashboard* may be served: authorized(), or the key given as the query parameter `key` or the cookie
  /// paged_key (a browser cannot set a WebSocket's headers; http/dashboard.h).
  bool dashboard_authorized(std::string_view authorization_header, std::string_view target,
                            std::string_view cookie_header) const;

 private:
  std::optional<ChatTemplate> chat_template_;
  openai::ModelInfo model_info_;
  /// The index of the API key `given` is (all compared in constant time), if any.
  std::optional<size_t> key_of(std::string_view given) const;
  std::atomic<int> owed_{0};
};

/// Called on `executor` for each engine event of prompt `prompt_index`.
using EventHandler = std::function<void(size_t prompt_index, RequestEvent event)>;

/// Validates every prompt with the engine, then submits them all; their events run `on_event` on `executor`.
/// All or nothing: throws InvalidRequest, EngineOverloaded or EngineUnavailable after aborting whatever it had
/// submitted.
std::vector<RequestId> submit_prompts(ServerContext& ctx, const openai::Request& request,
                                      boost::asio::any_io_executor executor, EventHandler on_event);

/// The HTTP status and OpenAI error body of an exception (the one exception boundary of the server):
/// InvalidRequest 400 (ModelNotFound and ResponseNotFound 404), EngineOverloaded and EngineUnavailable 503, anything
/// else 500.
/// The request log (--enable-log-requests): one line as a response starts (its prompts and parameters) and one as each
/// of its prompts ends (tokens, finish reasons or the error).
void log_request_start(const std::string& id, const openai::Request& request);
void log_request_end(const std::string& id, size_t prompt_index, const RequestEvent& last);

struct ErrorReply {
  unsigned status;
  std::string body;
};
ErrorReply error_reply(std::exception_ptr error);
/// The error body of a status the server produces itself (401, 404, 405, 413).
ErrorReply error_reply(unsigned status, const std::string& message);

/// GET /health: 200 with {"status":"ok","replicas":[{"kind":"local"|"remote","address" (remote only),"state":"ready"
/// |"lost","reason" (lost only)}]} while a replica serves; 503 with {"status":"unavailable","reason",...} while none
/// does.
struct HealthReply {
  unsigned status;
  std::string body;
};
HealthReply health_reply(const EngineHealth& health);

}  // namespace paged::server
