#include "http/http_session.h"

#include <algorithm>
#include <chrono>
#include <ctime>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/websocket/rfc6455.hpp>

#include "http/dashboard.h"
#include "http/dashboard_session.h"
#include "http/websocket_session.h"

namespace paged::server {
namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

/// One request's response: whole (ready at once, or when the engine finishes) or streamed as SSE chunks.
struct HttpExchange {
  unsigned version = 11;
  bool keep_alive = true;
  std::string cors_origin;     // Access-Control-Allow-Origin of its response; empty: none
  std::shared_ptr<void> owed;  // a generation: the server owes its response (ServerContext::owe_client)
  std::string id;              // the response's id (cmpl-..., chatcmpl-...), for the request log
  std::string request_id;      // the client's X-Request-Id, echoed in the response's; empty: none given
  std::string owner;           // whose a stored response is (ServerContext::key_owner)
  std::shared_ptr<void> held;  // a response to store: its id, held while it is generated (ResponseStore::reserve)
  std::shared_ptr<http::response<http::string_body>> complete;  // a whole response, ready to write
  // SSE: the header once, then frames as they come, then the last chunk.
  bool streaming = false;
  std::shared_ptr<http::response<http::empty_body>> stream_header;
  std::shared_ptr<http::response_serializer<http::empty_body>> serializer;
  bool header_sent = false;
  std::string pending;  // frames not yet written
  bool stream_finished = false;
  // The generation behind it.
  std::unique_ptr<openai::ResponseBuilder> builder;
  std::vector<RequestId> engine_ids;  // aborted if the client leaves before the end
};

namespace {

constexpr auto kDrainTime = std::chrono::seconds(2);

std::string_view path_of(std::string_view target) { return target.substr(0, target.find('?')); }

// CORS: the response says which origin may read it (nothing when `origin` is empty).
template <class Response>
void allow_origin(Response& res, const std::string& origin) {
  if (origin.empty()) return;
  res.set(http::field::access_control_allow_origin, origin);
  if (origin != "*") res.set(http::field::vary, "Origin");
}

}  // namespace

template <class Stream>
void HttpSession<Stream>::respond_preflight(const Request& req) {
  if (request_cors_origin_.empty()) {
    respond(400, openai::error_body("this origin may not call this server (--allowed-origins)", "invalid_request_error"),
            "application/json");
    return;
  }
  auto ex = std::make_shared<Exchange>();
  ex->version = request_version_;
  ex->keep_alive = request_keep_alive_ && !ctx_.draining;
  auto res = std::make_shared<http::response<http::string_body>>(http::status::ok, ex->version);
  allow_origin(*res, request_cors_origin_);
  res->set(http::field::server, "paged");
  res->set(http::field::access_control_allow_methods, "GET, POST, DELETE, OPTIONS");
  const std::string_view asked = req[http::field::access_control_request_headers];
  res->set(http::field::access_control_allow_headers,
           asked.empty() ? std::string_view("Authorization, Content-Type") : asked);
  res->set(http::field::access_control_max_age, "600");
  res->keep_alive(ex->keep_alive);
  res->prepare_payload();
  ex->complete = std::move(res);
  ctx_.counters.count(200);
  queue_.push_back(std::move(ex));
  update_read_deadline();
  do_write();
}

template <class Stream>
HttpSession<Stream>::HttpSession(Stream&& stream, ServerContext& ctx)
    : stream_(std::move(stream)), ctx_(ctx), read_deadline_(stream_.get_executor()) {}

template <class Stream>
HttpSession<Stream>::~HttpSession() { abort_all(); }

template <class Stream>
void HttpSession<Stream>::run() {
  net::dispatch(stream_.get_executor(), [self = this->shared_from_this()] {
    if constexpr (kIsTls<Stream>) self->handshake();
    else self->do_read();
  });
}

template <class Stream>
void HttpSession<Stream>::handshake() {
  if constexpr (kIsTls<Stream>) {
    // A client that does not finish the handshake in the read timeout is dropped, as one that does not send.
    beast::get_lowest_layer(stream_).expires_after(std::chrono::seconds(ctx_.options.read_timeout_s));
    stream_.async_handshake(net::ssl::stream_base::server, [self = this->shared_from_this()](beast::error_code ec) {
      if (ec) {  // not TLS, an untrusted client certificate (--ssl-cert-reqs), or too slow: nothing to answer
        self->closed_ = true;
        beast::error_code ignored;
        beast::get_lowest_layer(self->stream_).socket().close(ignored);
        return;
      }
      self->do_read();
    });
  }
}

template <class Stream>
void HttpSession<Stream>::abort_all() {
  for (auto& ex : queue_) {
    for (RequestId id : ex->engine_ids) ctx_.engine.abort(id);
    ex->engine_ids.clear();
  }
  held_while_answering_.reset();  // callers run in a handler that holds the session
}

// ---- reading ----------------------------------------------------------------------------------------------------

template <class Stream>
void HttpSession<Stream>::do_read() {
  if (!reading_ && !stop_reading_ && !closed_ && queue_.size() < ctx_.options.pipeline_limit) {
    parser_.emplace();
    parser_->body_limit(ctx_.options.body_limit);
    // No stream timeout on reads (a read stays pending through long generations); update_read_deadline() bounds
    // the time a connection may sit idle or take to send its request.
    beast::get_lowest_layer(stream_).expires_never();
    reading_ = true;
    update_read_deadline();
    http::async_read(stream_, buffer_, *parser_,
                     beast::bind_front_handler(&HttpSession::on_read, this->shared_from_this()));
  } else if (stop_reading_ && !queue_.empty()) {
    do_watch();
  }
  // Every caller runs in a handler holding the session, so letting go here never ends it mid-call.
  if (!reading_ && !queue_.empty() && !closed_)
    held_while_answering_ = this->shared_from_this();
  else
    held_while_answering_.reset();
}

// After a request that closes the connection nothing more is read as a request, but a read stays pending all the same
// while its answer is due: a client that goes away is seen then (its generations aborted, as on a keep-alive
// connection), not only when the answer fails to go out. What it still sends is dropped.
template <class Stream>
void HttpSession<Stream>::do_watch() {
  if (reading_ || closed_) return;
  reading_ = true;
  auto scratch = std::make_shared<std::array<char, 512>>();
  stream_.async_read_some(net::buffer(*scratch), [self = this->shared_from_this(), scratch](beast::error_code ec,
                                                                                             size_t) {
    self->reading_ = false;
    if (self->closed_) return;
    if (ec) {  // the client went away before its answer
      self->abort_all();
      self->closed_ = true;
      beast::error_code ignored;
      beast::get_lowest_layer(self->stream_).socket().close(ignored);
      return;
    }
    self->do_watch();
  });
}

template <class Stream>
void HttpSession<Stream>::update_read_deadline() {
  const bool want = reading_ && queue_.empty() && !closed_;
  if (want == deadline_armed_) return;
  deadline_armed_ = want;
  const uint64_t generation = ++deadline_generation_;
  if (!want) {
    read_deadline_.cancel();
    return;
  }
  read_deadline_.expires_after(std::chrono::seconds(ctx_.options.read_timeout_s));
  read_deadline_.async_wait([self = this->shared_from_this(), generation](beast::error_code ec) {
    if (ec || generation != self->deadline_generation_ || !self->deadline_armed_) return;
    beast::error_code ignored;
    beast::get_lowest_layer(self->stream_).socket().close(ignored);  // the pending read fails; the session ends
  });
}

template <class Stream>
void HttpSession<Stream>::on_read(beast::error_code ec, size_t) {
  reading_ = false;
  update_read_deadline();
  if (closed_) return;
  if (ec == http::error::body_limit) {
    request_version_ = parser_->get().version();
    respond(413, error_reply(413, "request body over the limit of " + std::to_string(ctx_.options.body_limit) +
                                      " bytes").body,
            "application/json", true);
    return;
  }
  if (ec && ec.category() == http::make_error_code(http::error::bad_target).category() &&
      ec != http::error::end_of_stream && ec != http::error::partial_message) {
    respond(400, openai::error_body("malformed HTTP request: " + ec.message(), "invalid_request_error"),
            "application/json", true);
    return;
  }
  if (ec) {  // the client went away (or timed out): nothing to answer
    abort_all();
    closed_ = true;
    beast::error_code ignored;
    beast::get_lowest_layer(stream_).socket().close(ignored);
    return;
  }
  Request req = parser_->release();
  request_version_ = req.version();
  request_keep_alive_ = req.keep_alive();
  request_cors_origin_ = ctx_.allowed_origin(req[http::field::origin]);
  if (beast::websocket::is_upgrade(req)) {
    const std::string_view path = path_of(req.target());
    const bool dashboard = path == "/dashboard/ws";  // the browser's: the key may come as ?key= or its cookie
    if (!dashboard && path != "/v1/stream") {
      respond(404, error_reply(404, "no WebSocket endpoint at " + std::string(req.target())).body, "application/json", true);
    } else if (dashboard ? !ctx_.dashboard_authorized(req[http::field::authorization], req.target(),
                                                      req[http::field::cookie])
                         : !ctx_.authorized(req[http::field::authorization])) {
      respond(401, error_reply(401, "missing or invalid API key").body, "application/json", true);
    } else if (!queue_.empty()) {
      respond(400, openai::error_body("WebSocket upgrade while responses are pending", "invalid_request_error"),
              "application/json", true);
    } else if (const HandshakeFault fault = websocket_handshake_fault(req); fault.status != 0) {
      // Answered here, as every other refusal is, rather than by Beast's accept in plain text.
      respond(fault.status, openai::error_body(fault.message, "invalid_request_error"), "application/json", true,
              {{http::field::sec_websocket_version, fault.status == 426 ? "13" : ""}});
    } else {
      // The socket moves to the WebSocket session; this session ends here.
      ctx_.counters.count(101);
      closed_ = true;
      if (dashboard) {
        std::make_shared<DashboardSession<Stream>>(std::move(stream_), ctx_)->run(std::move(req));
      } else {
        std::make_shared<WebSocketSession<Stream>>(std::move(stream_), ctx_)->run(std::move(req));
      }
    }
    return;
  }
  if (!request_keep_alive_) stop_reading_ = true;
  if (req.method() == http::verb::options && !ctx_.options.allowed_origins.empty() &&
      req.count(http::field::origin)) {
    respond_preflight(req);
  } else {
    handle(std::move(req));
  }
  do_read();
}

// ---- routing ----------------------------------------------------------------------------------------------------

template <class Stream>
void HttpSession<Stream>::respond(unsigned status, std::string body, const char* content_type, bool close,
                                  std::initializer_list<std::pair<http::field, std::string_view>> headers) {
  auto ex = std::make_shared<Exchange>();
  ex->version = request_version_;
  ex->keep_alive = request_keep_alive_ && !close && !ctx_.draining;
  ex->cors_origin = request_cors_origin_;
  auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(status), ex->version);
  allow_origin(*res, ex->cors_origin);
  res->set(http::field::server, "paged");
  res->set(http::field::content_type, content_type);
  for (const auto& [field, value] : headers)
    if (!value.empty()) res->set(field, value);
  res->keep_alive(ex->keep_alive);
  res->body() = std::move(body);
  res->prepare_payload();
  ex->complete = std::move(res);
  ctx_.counters.count(status);
  if (close) stop_reading_ = true;
  queue_.push_back(std::move(ex));
  update_read_deadline();
  do_write();
}

template <class Stream>
void HttpSession<Stream>::respond_dashboard(const Request& req) {
  const std::string_view path = path_of(req.target());
  const DashboardAsset* asset = find_dashboard_asset(path);
  if (path == "/dashboard/ws") {
    respond(400, openai::error_body("/dashboard/ws is a WebSocket endpoint: send an upgrade request",
                                    "invalid_request_error"),
            "application/json");
  } else if (!asset) {
    respond(404, error_reply(404, "no route for " + std::string(path)).body, "application/json");
  } else if (req.method() != http::verb::get) {
    respond_not_allowed(req, "GET");
  } else if (!ctx_.dashboard_authorized(req[http::field::authorization], req.target(), req[http::field::cookie])) {
    respond(401, error_reply(401, "missing or invalid API key: open /dashboard?key=KEY").body, "application/json");
  } else {
    // A key given in the URL becomes the cookie that the page's files and its WebSocket send.
    const std::string key = query_param(req.target(), "key");
    const std::string cookie = key.empty() ? std::string() : dashboard_key_cookie(key);
    respond(200, std::string(asset->body), asset->content_type, false, {{http::field::set_cookie, cookie}});
  }
}

template <class Stream>
void HttpSession<Stream>::respond_not_allowed(const Request& req, std::string_view allow) {
  respond(405, error_reply(405, std::string(req.method_string()) + " is not allowed on " +
                                    std::string(path_of(req.target())) + "; use " + std::string(allow)).body,
          "application/json", false, {{http::field::allow, allow}});
}

template <class Stream>
void HttpSession<Stream>::respond_unauthorized() {
  respond(401, error_reply(401, "missing or invalid API key (expected \"Authorization: Bearer KEY\")").body,
          "application/json");
}

template <class Stream>
void HttpSession<Stream>::respond_stored_response(const Request& req) {
  // /v1/responses/{id} (GET, DELETE) and /v1/responses/{id}/input_items (GET).
  const std::string_view path = path_of(req.target());
  std::string_view id = path.substr(std::string_view("/v1/responses/").size());
  const bool items = id.ends_with("/input_items");
  if (items) id.remove_suffix(std::string_view("/input_items").size());
  const http::verb method = req.method();
  if (id.empty() || id.find('/') != std::string_view::npos) {
    respond(404, error_reply(404, "no route for " + std::string(path)).body, "application/json");
  } else if (method != http::verb::get && (items || method != http::verb::delete_)) {
    respond_not_allowed(req, items ? "GET" : "GET, DELETE");
  } else if (!ctx_.authorized(req[http::field::authorization])) {
    respond_unauthorized();
  } else {
    try {
      // A key finds only what it stored itself.
      const std::string owner = ctx_.key_owner(req[http::field::authorization]);
      if (method == http::verb::delete_) {
        if (!ctx_.responses.erase(id, owner)) ctx_.responses.get(id, owner, "");  // throws: not stored
        respond(200, boost::json::serialize(boost::json::object{{"id", id}, {"object", "response"}, {"deleted", true}}),
                "application/json");
      } else {
        const auto stored = ctx_.responses.get(id, owner, "");
        respond(200,
                boost::json::serialize(items ? openai::input_items_page(*stored, query_params(req.target()))
                                             : stored->response),
                "application/json");
      }
    } catch (...) {
      const ErrorReply err = error_reply(std::current_exception());
      respond(err.status, err.body, "application/json");
    }
  }
}

template <class Stream>
void HttpSession<Stream>::respond_model(const Request& req) {
  // /v1/models/{id} (GET): the id percent-decoded, so that a name with a slash ("org/model") matches however the
  // client sent it (the official clients encode it as %2F).
  const std::string_view path = path_of(req.target());
  const std::string id = percent_decoded(path.substr(std::string_view("/v1/models/").size()));
  if (req.method() != http::verb::get) {
    respond_not_allowed(req, "GET");
  } else if (!ctx_.authorized(req[http::field::authorization])) {
    respond_unauthorized();
  } else {
    try {
      respond(200, openai::model_body(ctx_.model_info(), ctx_.max_model_len, std::time(nullptr), id),
              "application/json");
    } catch (...) {
      const ErrorReply err = error_reply(std::current_exception());
      respond(err.status, err.body, "application/json");
    }
  }
}

template <class Stream>
void HttpSession<Stream>::handle(Request&& req) {
  const std::string_view path = path_of(req.target());
  const http::verb method = req.method();
  if (path == "/dashboard" || path.starts_with("/dashboard/")) {
    respond_dashboard(req);
    return;
  }
  if (path.starts_with("/v1/responses/")) {
    respond_stored_response(req);
    return;
  }
  if (path.starts_with("/v1/models/")) {
    respond_model(req);
    return;
  }
  struct Route {
    std::string_view path;
    http::verb method;
    bool needs_key;
  };
  static constexpr Route kRoutes[] = {
      {"/health", http::verb::get, false},           {"/metrics", http::verb::get, false},
      {"/v1/models", http::verb::get, true},         {"/v1/completions", http::verb::post, true},
      {"/v1/chat/completions", http::verb::post, true}, {"/v1/responses", http::verb::post, true},
      {"/v1/stream", http::verb::get, true},
      {"/tokenize", http::verb::post, true},         {"/detokenize", http::verb::post, true},
      {"/version", http::verb::get, false},          {"/ping", http::verb::get, false},
      {"/ping", http::verb::post, false},
      {"/v1/load_lora_adapter", http::verb::post, true}, {"/v1/unload_lora_adapter", http::verb::post, true},
      {"/invocations", http::verb::post, true},       {"/load", http::verb::get, false},
  };
  // The route of this path and method; else one of this path (405 names its method).
  const Route* route = nullptr;
  for (const Route& r : kRoutes) {
    if (r.path == path && (!route || r.method == method)) route = &r;
  }
  if (!route) {
    respond(404, error_reply(404, "no route for " + std::string(path)).body, "application/json");
    return;
  }
  if (method != route->method) {
    respond_not_allowed(req, http::to_string(route->method));
    return;
  }
  if (route->needs_key && !ctx_.authorized(req[http::field::authorization])) {
    respond_unauthorized();
    return;
  }
  if (path == "/health") {
    const HealthReply health = health_reply(ctx_.engine.health());
    respond(health.status, health.body, "application/json");
  } else if (path == "/metrics") {
    respond(200,
            ctx_.engine.prometheus() + ctx_.engine.metrics().vllm_prometheus(ctx_.model_name) +
                ctx_.engine.lora_prometheus() + ctx_.counters.prometheus(),
            "text/plain; version=0.0.4");
  } else if (path == "/v1/models") {
    respond(200, openai::models_body(ctx_.model_info(), ctx_.max_model_len, std::time(nullptr)), "application/json");
  } else if (path == "/load") {  // vLLM's server load: the requests in flight, for a load balancer
    respond(200, R"({"server_load":)" + std::to_string(ctx_.owed()) + "}", "application/json");
  } else if (path == "/ping") {
    respond(200, "", "application/json");
  } else if (path == "/version") {
    respond(200, R"({"version":")" + std::string(PAGED_VERSION) + R"("})", "application/json");
  } else if (path == "/tokenize" || path == "/detokenize") {
    try {
      respond(200,
              path == "/tokenize" ? openai::tokenize_body(req.body(), ctx_.model_info())
                                  : openai::detokenize_body(req.body(), ctx_.model_info()),
              "application/json");
    } catch (...) {
      const ErrorReply err = error_reply(std::current_exception());
      respond(err.status, err.body, "application/json");
    }
  } else if (path == "/v1/load_lora_adapter" || path == "/v1/unload_lora_adapter") {
    if (!ctx_.runtime_lora_updating) {
      respond(404, error_reply(404, std::string(path) + " is off: start the server with "
                                    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True to load and unload LoRA adapters").body,
              "application/json");
      return;
    }
    try {
      respond(200, ctx_.update_lora(path == "/v1/load_lora_adapter", req.body()), "text/plain; charset=utf-8");
    } catch (...) {
      const ErrorReply err = error_reply(std::current_exception());
      respond(err.status, err.body, "application/json");
    }
  } else if (path == "/v1/stream") {
    respond(400, openai::error_body("/v1/stream is a WebSocket endpoint: send an upgrade request",
                                    "invalid_request_error"),
            "application/json");
  } else if (ctx_.draining) {
    respond(503, openai::error_body("the server is shutting down", "server_error", "", "shutting_down"),
            "application/json", true);
  } else {
    openai::Endpoint endpoint = path == "/v1/completions" ? openai::Endpoint::completions
                                : path == "/v1/responses"  ? openai::Endpoint::responses
                                                           : openai::Endpoint::chat;
    if (path == "/invocations") {  // SageMaker's: chat or a completion, by the body's fields
      try {
        endpoint = openai::invocation_endpoint(req.body());
      } catch (...) {
        const ErrorReply err = error_reply(std::current_exception());
        respond(err.status, err.body, "application/json");
        return;
      }
    }
    auto ex = std::make_shared<Exchange>();
    ex->version = request_version_;
    ex->keep_alive = request_keep_alive_;
    ex->cors_origin = request_cors_origin_;
    ex->owed = ctx_.owe_client();
    queue_.push_back(ex);
    update_read_deadline();
    start_generation(endpoint, req, *ex, ex);
    do_write();
  }
}

template <class Stream>
void HttpSession<Stream>::start_generation(openai::Endpoint endpoint, const Request& req, Exchange& ex,
                                   const std::shared_ptr<Exchange>& handle) {
  try {
    // vLLM's: a client's X-Request-Id names the response (cmpl-ID) and comes back in the response's header.
    if (const auto given = req.find("X-Request-Id"); given != req.end()) {
      const std::string_view value = given->value();
      if (value.empty() || value.size() > 256 ||
          !std::all_of(value.begin(), value.end(), [](char c) { return c > ' ' && c < 0x7f; }))
        throw InvalidRequest("the X-Request-Id header must be 1 to 256 visible ASCII characters", "X-Request-Id");
      ex.request_id = std::string(value);
    }
    ex.owner = ctx_.key_owner(req[http::field::authorization]);
    const openai::Request request =
        openai::parse_request(endpoint, req.body(), ctx_.model_info(), &ctx_.responses, ex.owner);
    const char* prefix = endpoint == openai::Endpoint::chat        ? "chatcmpl"
                         : endpoint == openai::Endpoint::responses ? "resp"
                                                                   : "cmpl";
    ex.id = ex.request_id.empty() ? ctx_.next_id(prefix) : std::string(prefix) + "-" + ex.request_id;
    if (endpoint == openai::Endpoint::responses) ex.id[4] = '_';  // OpenAI's response ids: resp_...
    // A response to store holds its id from now on: two requests naming one X-Request-Id at once cannot both be
    // answered as the response stored under it.
    if (request.responses && request.responses->store && !(ex.held = ctx_.responses.reserve(ex.id, ex.owner)))
      throw InvalidRequest(
          "X-Request-Id " + ex.request_id + " names a stored response, or one being generated, already",
          "X-Request-Id");
    // The model the request named: an adapter's name for its requests (as vLLM answers them).
    const std::string& model = request.lora_name.empty() ? ctx_.model_name : request.lora_name;
    ex.builder = std::make_unique<openai::ResponseBuilder>(request, ctx_.engine.tokenizer(), model, ex.id,
                                                           std::time(nullptr));
    if (ctx_.options.log_requests) log_request_start(ex.id, request);
    ex.streaming = request.stream;
    std::weak_ptr<HttpSession> weak = this->weak_from_this();
    ex.engine_ids = submit_prompts(ctx_, request, stream_.get_executor(),
                                   [weak, handle](size_t prompt_index, RequestEvent event) {
                                     if (auto self = weak.lock()) self->on_event(handle, prompt_index, std::move(event));
                                   });
    if (ex.streaming) {
      auto header = std::make_shared<http::response<http::empty_body>>(http::status::ok, ex.version);
      allow_origin(*header, ex.cors_origin);
      header->set(http::field::server, "paged");
      header->set(http::field::content_type, "text/event-stream");
      header->set(http::field::cache_control, "no-cache");
      if (!ex.request_id.empty()) header->set("X-Request-Id", ex.request_id);
      header->keep_alive(ex.keep_alive);
      header->chunked(true);
      ex.stream_header = std::move(header);
      ctx_.counters.count(200);
    }
  } catch (...) {
    // The one exception boundary of a request: InvalidRequest 400, EngineOverloaded/Unavailable 503, the rest 500.
    const ErrorReply err = error_reply(std::current_exception());
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(err.status), ex.version);
    allow_origin(*res, ex.cors_origin);
    res->set(http::field::server, "paged");
    res->set(http::field::content_type, "application/json");
    res->keep_alive(ex.keep_alive);
    res->body() = err.body;
    res->prepare_payload();
    ex.complete = std::move(res);
    ex.streaming = false;
    ex.engine_ids.clear();
    ctx_.counters.count(err.status);
  }
}

template <class Stream>
void HttpSession<Stream>::on_event(const std::shared_ptr<Exchange>& ex, size_t prompt_index, RequestEvent event) {
  if (event.done && ctx_.options.log_requests) log_request_end(ex->id, prompt_index, event);
  if (closed_ || !ex->builder || ex->engine_ids.empty()) return;  // answered or abandoned already
  std::string frames = ex->builder->add(prompt_index, event);
  if (ex->streaming) ex->pending += frames;
  if (ex->builder->finished()) {
    ex->engine_ids.clear();
    // A stored response is there before its client hears of it (a next request may name it at once).
    if (!ex->builder->error())
      if (std::optional<openai::StoredResponse> stored = ex->builder->to_store())
        ctx_.responses.put(ex->id, ex->owner, std::move(*stored));
    if (ex->streaming) {
      if (const auto& error = ex->builder->error()) {
        ex->pending += "data: " + openai::error_body(*error, "server_error", "", "internal_error") + "\n\n";
      }
      ex->pending += ex->builder->stream_end();
      ex->stream_finished = true;
    } else {
      const auto& error = ex->builder->error();
      const unsigned status = !error ? 200 : ex->builder->unavailable() ? 503 : 500;
      auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(status), ex->version);
      allow_origin(*res, ex->cors_origin);
      res->set(http::field::server, "paged");
      res->set(http::field::content_type, "application/json");
      if (!ex->request_id.empty()) res->set("X-Request-Id", ex->request_id);
      res->keep_alive(ex->keep_alive);
      res->body() = !error ? ex->builder->body()
                    : openai::error_body(*error, "server_error", "", status == 503 ? "unavailable" : "internal_error");
      res->prepare_payload();
      ex->complete = std::move(res);
      ctx_.counters.count(status);
    }
  }
  do_write();
}

// ---- writing ----------------------------------------------------------------------------------------------------

template <class Stream>
void HttpSession<Stream>::do_write() {
  if (writing_ || closed_ || queue_.empty()) return;
  const std::shared_ptr<Exchange> ex = queue_.front();
  auto self = this->shared_from_this();
  // A client that stops reading is dropped after the write timeout (the pending read is not affected).
  beast::get_lowest_layer(stream_).expires_after(std::chrono::seconds(ctx_.options.write_timeout_s));
  if (ex->complete) {
    writing_ = true;
    http::async_write(stream_, *ex->complete, [self, ex](beast::error_code ec, size_t) {
      self->on_write(ec, true, !ex->keep_alive);
    });
  } else if (ex->streaming && !ex->header_sent) {
    writing_ = true;
    ex->serializer = std::make_shared<http::response_serializer<http::empty_body>>(*ex->stream_header);
    http::async_write_header(stream_, *ex->serializer, [self, ex](beast::error_code ec, size_t) {
      ex->header_sent = true;
      self->on_write(ec, false, false);
    });
  } else if (ex->streaming && !ex->pending.empty()) {
    writing_ = true;
    auto data = std::make_shared<std::string>(std::move(ex->pending));
    ex->pending.clear();
    net::async_write(stream_, http::make_chunk(net::buffer(*data)),
                     [self, data](beast::error_code ec, size_t) { self->on_write(ec, false, false); });
  } else if (ex->streaming && ex->stream_finished) {
    writing_ = true;
    net::async_write(stream_, http::make_chunk_last(),
                     [self, ex](beast::error_code ec, size_t) { self->on_write(ec, true, !ex->keep_alive); });
  }
  // Otherwise the front exchange waits for the engine; on_event() calls back here.
}

template <class Stream>
void HttpSession<Stream>::on_write(beast::error_code ec, bool exchange_done, bool close) {
  writing_ = false;
  if (ec) {  // the client went away mid-response
    abort_all();
    closed_ = true;
    beast::error_code ignored;
    beast::get_lowest_layer(stream_).socket().close(ignored);
    return;
  }
  if (exchange_done) {
    queue_.pop_front();
    if (close) {
      do_close();
      return;
    }
    update_read_deadline();
    do_read();
  }
  do_write();
}

template <class Stream>
void HttpSession<Stream>::do_close() {
  abort_all();
  closed_ = true;
  update_read_deadline();
  if constexpr (kIsTls<Stream>) {
    // TLS: close_notify, then the socket (bounded by kDrainTime: a client that does not answer it is not waited for).
    // With a read in flight (a keep-alive connection closed by the shutdown) the TLS stream takes no second
    // operation beside it: the socket just closes.
    if (reading_) {
      beast::error_code ignored;
      beast::get_lowest_layer(stream_).socket().close(ignored);
      return;
    }
    beast::get_lowest_layer(stream_).expires_after(kDrainTime);
    stream_.async_shutdown([self = this->shared_from_this()](beast::error_code) {
      beast::error_code ignored;
      beast::get_lowest_layer(self->stream_).socket().close(ignored);
    });
    return;
  }
  // Graceful close: send FIN, then read (and drop) what the client still sends for a moment, so that a client
  // still uploading a refused body sees the response instead of a reset.
  beast::error_code ec;
  beast::get_lowest_layer(stream_).socket().shutdown(tcp::socket::shutdown_send, ec);
  if (ec) {
    beast::get_lowest_layer(stream_).socket().close(ec);
    return;
  }
  beast::get_lowest_layer(stream_).expires_after(kDrainTime);
  do_drain();
}

template <class Stream>
void HttpSession<Stream>::do_drain() {
  if (reading_) return;  // the read in flight drains; on_read sees closed_ and stops
  auto scratch = std::make_shared<std::array<char, 4096>>();
  stream_.async_read_some(net::buffer(*scratch), [self = this->shared_from_this(), scratch](beast::error_code ec, size_t) {
    if (ec) {
      beast::error_code ignored;
      beast::get_lowest_layer(self->stream_).socket().close(ignored);
      return;
    }
    self->do_drain();
  });
}

template class HttpSession<PlainStream>;
template class HttpSession<TlsStream>;

}  // namespace paged::server
