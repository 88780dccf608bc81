// One HTTP/1.1 connection: reads requests (body limit, read timeout), routes them, and writes responses in request
// order (pipelining up to a limit). Generations are submitted to the engine and their events posted back onto
// this session's strand; nothing here blocks. A WebSocket upgrade of /v1/stream hands the socket over to a
// WebSocketSession. When the client goes away, every engine request of this connection is aborted.
#pragma once

#include <deque>
#include <initializer_list>
#include <utility>
#include <memory>
#include <optional>

#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>

#include "http/server_context.h"
#include "http/tls_stream.h"

namespace paged::server {

struct HttpExchange;  // one request's response (http_session.cpp)

/// Over PlainStream or TlsStream (http/tls_stream.h): a TLS session shakes hands first.
template <class Stream>
class HttpSession : public std::enable_shared_from_this<HttpSession<Stream>> {
 public:
  /// Takes the connection; `ctx` must outlive the session.
  HttpSession(Stream&& stream, ServerContext& ctx);
  /// Aborts the engine requests of this connection that still run.
  ~HttpSession();
  /// Starts reading requests (on the session's strand).
  void run();

 private:
  using Request = boost::beast::http::request<boost::beast::http::string_body>;
  using Exchange = HttpExchange;

  /// TLS: the handshake (within the read timeout), then do_read.
  void handshake();
  void do_read();
  void on_read(boost::beast::error_code ec, size_t bytes);
  void do_write();
  void on_write(boost::beast::error_code ec, bool exchange_done, bool close);
  void do_close();
  void do_drain();
  void do_watch();

  /// Routes a request; queues its exchange (answered at once, or when the engine is done).
  void handle(Request&& req);
  void start_generation(openai::Endpoint endpoint, const Request& req, Exchange& ex,
                        const std::shared_ptr<Exchange>& handle);
  /// An engine event of prompt `prompt_index` of `ex`, on the strand.
  void on_event(const std::shared_ptr<Exchange>& ex, size_t prompt_index, RequestEvent event);
  /// Queues a whole response; `close` ends the connection after it; `headers` are set on it (Allow of a 405,
  /// Set-Cookie, ...; an empty value is left out).
  void respond(unsigned status, std::string body, const char* content_type, bool close = false,
               std::initializer_list<std::pair<boost::beast::http::field, std::string_view>> headers = {});
  /// 405 for `req`'s method, naming the path and the methods it takes (`allow`, also the Allow header).
  void respond_not_allowed(const Request& req, std::string_view allow);
  /// 401 for a missing or wrong API key on the OpenAI routes.
  void respond_unauthorized();
  /// GET and DELETE /v1/responses/{id}, GET /v1/responses/{id}/input_items: the responses ctx_.responses keeps.
  void respond_stored_response(const Request& req);
  /// GET /v1/models/{id}: the card of one served name (openai::model_body).
  void respond_model(const Request& req);
  /// GET /dashboard and its files (http/dashboard.h), behind the API key when one is set.
  void respond_dashboard(const Request& req);
  /// Answers a CORS preflight (OPTIONS with Origin) when the server allows CORS: its methods and headers, or 400 for
  /// an origin it does not allow.
  void respond_preflight(const Request& req);
  /// Arms the idle/read timeout while a read waits with nothing queued, disarms it otherwise.
  void update_read_deadline();
  /// Aborts the engine requests of every queued exchange and lets go of held_while_answering_ (the session closes).
  void abort_all();

  Stream stream_;
  boost::beast::flat_buffer buffer_;
  ServerContext& ctx_;
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  std::deque<std::shared_ptr<Exchange>> queue_;  // in request order; the front one is being written
  boost::asio::steady_timer read_deadline_;
  uint64_t deadline_generation_ = 0;
  bool deadline_armed_ = false;
  bool reading_ = false;
  bool writing_ = false;
  bool stop_reading_ = false;  // after "Connection: close", an upgrade or a request we could not read
  bool closed_ = false;
  unsigned request_version_ = 11;
  bool request_keep_alive_ = true;
  std::string request_cors_origin_;  // Access-Control-Allow-Origin for the request being handled; empty: none
  /// The session itself while responses are pending and no read is (after "Connection: close", HTTP/1.0 or with
  /// the pipeline full): the engine's sinks hold it weakly, so nothing else would keep it until they answer.
  std::shared_ptr<HttpSession> held_while_answering_;
};

}  // namespace paged::server
