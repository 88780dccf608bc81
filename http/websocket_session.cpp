#include "http/websocket_session.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>

#include <boost/asio/dispatch.hpp>
#include <boost/beast/core/buffers_to_string.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/json.hpp>

#include "http/strict_json.h"

namespace paged::server {
namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace net = boost::asio;
namespace json = boost::json;

HandshakeFault websocket_handshake_fault(const http::request<http::string_body>& req) {
  const std::string_view version = req[http::field::sec_websocket_version];
  if (version != "13")
    return {426, version.empty() ? std::string("Sec-WebSocket-Version is missing: this server speaks version 13")
                                 : "Sec-WebSocket-Version " + std::string(version.substr(0, 32)) +
                                       " is not supported: this server speaks version 13"};
  // 16 bytes in base64: 22 characters of the alphabet, then "==".
  const std::string_view key = req[http::field::sec_websocket_key];
  const bool base64_16 = key.size() == 24 && key.ends_with("==") &&
                         std::all_of(key.begin(), key.end() - 2, [](char ch) {
                           return std::isalnum(static_cast<unsigned char>(ch)) || ch == '+' || ch == '/';
                         });
  if (!base64_16)
    return {400, key.empty() ? std::string("Sec-WebSocket-Key is missing")
                             : "Sec-WebSocket-Key must be the base64 of 16 bytes (24 characters)"};
  return {};
}
using tcp = net::ip::tcp;

template <class Stream>
WebSocketSession<Stream>::WebSocketSession(Stream&& stream, ServerContext& ctx) : ws_(std::move(stream)), ctx_(ctx) {}

template <class Stream>
WebSocketSession<Stream>::~WebSocketSession() { abort_all(); }

template <class Stream>
void WebSocketSession<Stream>::abort_all() {
  for (const auto& [key, gen] : generations_) ctx_.engine.abort(gen.engine_id);
  generations_.clear();
  update_owed();
}

template <class Stream>
void WebSocketSession<Stream>::run(http::request<http::string_body> upgrade) {
  // The WebSocket layer keeps its own timeouts (handshake, idle with pings); the TCP stream's are off.
  beast::get_lowest_layer(ws_).expires_never();
  ws_.set_option(websocket::stream_base::timeout::suggested(beast::role_type::server));
  ws_.set_option(websocket::stream_base::decorator(
      [](websocket::response_type& res) { res.set(http::field::server, "paged"); }));
  ws_.read_message_max(ctx_.options.body_limit);
  auto req = std::make_shared<http::request<http::string_body>>(std::move(upgrade));
  net::dispatch(ws_.get_executor(), [self = this->shared_from_this(), req] {
    self->ws_.async_accept(*req, [self, req](beast::error_code ec) { self->on_accept(ec); });
  });
}

template <class Stream>
void WebSocketSession<Stream>::on_accept(beast::error_code ec) {
  if (ec) return;
  do_read();
}

template <class Stream>
void WebSocketSession<Stream>::do_read() {
  ws_.async_read(buffer_, beast::bind_front_handler(&WebSocketSession::on_read, this->shared_from_this()));
}

template <class Stream>
void WebSocketSession<Stream>::on_read(beast::error_code ec, size_t) {
  if (ec) {  // closed by the client, or broken: stop everything it started
    closed_ = true;
    abort_all();
    return;
  }
  const std::string text = beast::buffers_to_string(buffer_.data());
  buffer_.consume(buffer_.size());
  handle_frame(text);
  do_read();
}

template <class Stream>
void WebSocketSession<Stream>::send_error(const json::value& id, unsigned code, const std::string& body_json) {
  // body_json is an OpenAI error body; the frame carries its "error" object with the status as code.
  json::object err = json::parse(body_json).at("error").as_object();
  err["code"] = code;
  send(json::serialize(json::object{{"type", "error"}, {"id", id}, {"error", std::move(err)}}));
}

template <class Stream>
void WebSocketSession<Stream>::handle_frame(const std::string& text) {
  openai::StrictJsonError error;
  std::optional<json::value> frame = openai::parse_strict(text, error);
  if (error.duplicate) {
    send_error(nullptr, 400, openai::error_body("a frame must be valid: " + error.message(), "invalid_request_error",
                                                *error.duplicate));
    return;
  }
  if (!frame || !frame->is_object()) {
    send_error(nullptr, 400, openai::error_body(std::string("a frame must be a JSON object") +
                                                    (frame ? "" : " (" + error.message() + ")"),
                                                "invalid_request_error"));
    return;
  }
  json::object& obj = frame->get_object();
  const json::value id = obj.contains("id") ? obj.at("id") : json::value(nullptr);
  // Every answer echoes the id: 1e999 parses as infinity, which would go out as `Infinity`, not JSON.
  if (!id.is_string() && !(id.is_number() && std::isfinite(id.to_number<double>()))) {
    send_error(nullptr, 400, openai::error_body("'id' must be a string or a finite number", "invalid_request_error", "id"));
    return;
  }
  const json::value* type = obj.if_contains("type");
  if (type && type->is_string() && type->get_string() == "generate") {
    start_generation(std::move(obj), id);
  } else if (type && type->is_string() && type->get_string() == "cancel") {
    auto it = generations_.find(json::serialize(id));
    if (it == generations_.end()) {
      send_error(id, 404, openai::error_body("no running generation with this id", "invalid_request_error", "id"));
      return;
    }
    ctx_.engine.abort(it->second.engine_id);  // its last event arrives as a "cancelled" done frame
  } else {
    send_error(id, 400, openai::error_body("'type' must be \"generate\" or \"cancel\"", "invalid_request_error", "type"));
  }
}

template <class Stream>
void WebSocketSession<Stream>::start_generation(json::object frame, const json::value& id) {
  if (closed_) return;  // frames read after the session closed (the outbox bound) start nothing
  const std::string key = json::serialize(id);
  if (generations_.count(key)) {
    send_error(id, 400, openai::error_body("a generation with this id is running", "invalid_request_error", "id"));
    return;
  }
  if (static_cast<int>(generations_.size()) >= ctx_.options.ws_max_generations) {
    send_error(id, 429, openai::error_body("too many generations on this socket (limit " +
                                               std::to_string(ctx_.options.ws_max_generations) + ")",
                                           "invalid_request_error", "", "too_many_generations"));
    return;
  }
  const auto endpoint = frame.contains("messages") ? openai::Endpoint::chat : openai::Endpoint::completions;
  if (ctx_.draining) {
    send_error(id, 503, openai::error_body("the server is shutting down", "server_error", "", "shutting_down"));
    return;
  }
  try {
    // Every generation here streams: 'stream' may say so, and 'stream_options' ask the usage its done frame always
    // carries; anything else they say is refused, not ignored.
    if (const json::value* stream = frame.if_contains("stream"); stream && *stream != json::value(true))
      throw InvalidRequest("'stream' must be true or left out: a WebSocket generation always streams", "stream");
    if (const json::value* options = frame.if_contains("stream_options")) {
      if (!options->is_object()) throw InvalidRequest("'stream_options' must be an object", "stream_options");
      for (const auto& kv : options->get_object())
        if (kv.key() != "include_usage" || !kv.value().is_bool())
          throw InvalidRequest("'stream_options." + std::string(kv.key()) +
                                   "' is not available on the WebSocket stream (its done frame carries the usage)",
                               "stream_options");
    }
    for (const char* transport_field : {"type", "id", "stream", "stream_options"}) frame.erase(transport_field);
    // Token frames carry text and ids only: what would shape another response is refused, not ignored.
    for (const char* field : {"logprobs", "top_logprobs", "prompt_logprobs", "echo", "return_token_ids"})
      if (const json::value* v = frame.if_contains(field); v && !v->is_null() && *v != json::value(false))
        throw InvalidRequest(std::string("'") + field + "' is not available on the WebSocket stream (use the HTTP API)",
                             field);
    const openai::Request request = openai::parse_request(endpoint, frame, ctx_.model_info());
    if (request.prompts.size() != 1) throw InvalidRequest("a WebSocket generation takes one prompt", "prompt");
    std::weak_ptr<WebSocketSession> weak = this->weak_from_this();
    const auto ids = submit_prompts(ctx_, request, ws_.get_executor(), [weak, key](size_t, RequestEvent event) {
      if (auto self = weak.lock()) self->on_event(key, std::move(event));
    });
    Generation gen;
    gen.id = id;
    gen.engine_id = ids.at(0);
    gen.finish_reasons.assign(request.params.n, "");
    generations_.emplace(key, std::move(gen));
    update_owed();
  } catch (...) {
    // The one exception boundary of a frame: InvalidRequest 400, EngineOverloaded/Unavailable 503, the rest 500.
    const ErrorReply err = error_reply(std::current_exception());
    send_error(id, err.status, err.body);
  }
}

template <class Stream>
void WebSocketSession<Stream>::on_event(const std::string& key, RequestEvent event) {
  auto it = generations_.find(key);
  if (closed_ || it == generations_.end()) return;
  Generation& gen = it->second;
  for (const CompletionDelta& d : event.deltas) {
    if (d.finish_reason && d.index >= 0 && static_cast<size_t>(d.index) < gen.finish_reasons.size()) {
      gen.finish_reasons[d.index] = *d.finish_reason;
    }
    if (d.text.empty() && d.token_ids.empty()) continue;
    json::array ids;
    for (TokenId t : d.token_ids) ids.push_back(t);
    send(json::serialize(json::object{{"type", "token"},
                                      {"id", gen.id},
                                      {"index", d.index},
                                      {"text", d.text},
                                      {"token_ids", std::move(ids)}}));
    // A frame past the outbox bound closed the session, and abort_all() ended every generation: `gen` and `it`
    // are gone (using them was a use-after-free, a crash of the server when a client that does not read filled
    // its outbox in the middle of an event of several deltas).
    if (closed_) return;
  }
  if (!event.done) return;
  if (event.error) {
    send_error(gen.id, event.unavailable ? 503 : 500,
               openai::error_body(*event.error, "server_error", "", event.unavailable ? "unavailable" : "internal_error"));
  } else {
    json::array reasons;
    for (const auto& r : gen.finish_reasons) reasons.push_back(json::string(r.empty() ? "cancelled" : r));
    const json::value first = reasons.empty() ? json::value("cancelled") : reasons[0];
    send(json::serialize(json::object{
        {"type", "done"},
        {"id", gen.id},
        {"finish_reason", first},
        {"finish_reasons", std::move(reasons)},
        {"usage", json::object{{"prompt_tokens", event.prompt_tokens},
                               {"completion_tokens", event.completion_tokens},
                               {"total_tokens", event.prompt_tokens + event.completion_tokens}}}}));
  }
  if (closed_) return;  // as above: the last frame closed the session and took the generation with it
  generations_.erase(it);
  update_owed();
}

template <class Stream>
void WebSocketSession<Stream>::update_owed() {
  if (!closed_ && (!generations_.empty() || !outbox_.empty())) {
    if (!owed_) owed_ = ctx_.owe_client();
  } else {
    owed_.reset();
  }
}

template <class Stream>
void WebSocketSession<Stream>::send(std::string frame) {
  if (closed_) return;
  outbox_bytes_ += frame.size();
  outbox_.push_back(std::move(frame));
  if (outbox_bytes_ > ctx_.options.ws_max_outbox_bytes) {
    // A client that does not read: its generations end and the connection closes, with 1008 (policy) when the
    // close frame can go out now, else by closing the socket under the write that does not drain.
    closed_ = true;
    abort_all();
    // The frame under an async_write stays alive until its handler runs: the write reads it until then.
    outbox_.erase(writing_ ? outbox_.begin() + 1 : outbox_.begin(), outbox_.end());
    outbox_bytes_ = 0;
    update_owed();
    if (writing_) {
      beast::error_code ignored;
      beast::get_lowest_layer(ws_).socket().close(ignored);
    } else {
      ws_.async_close(websocket::close_reason(websocket::close_code::policy_error, "the client does not read"),
                      [self = this->shared_from_this()](beast::error_code) {});
    }
    return;
  }
  do_write();
}

template <class Stream>
void WebSocketSession<Stream>::do_write() {
  if (writing_ || outbox_.empty() || closed_) return;
  writing_ = true;
  ws_.text(true);
  ws_.async_write(net::buffer(outbox_.front()), [self = this->shared_from_this()](beast::error_code ec, size_t) {
    self->writing_ = false;
    if (ec || self->closed_) {  // broken, or closed meanwhile (the outbox bound): nothing is left to write
      self->closed_ = true;
      self->abort_all();
      self->outbox_.clear();
      self->update_owed();
      return;
    }
    self->outbox_bytes_ -= self->outbox_.front().size();
    self->outbox_.pop_front();
    self->update_owed();
    self->do_write();
  });
}

template class WebSocketSession<PlainStream>;
template class WebSocketSession<TlsStream>;

}  // namespace paged::server
