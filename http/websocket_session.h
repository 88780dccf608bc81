// Token streaming over a WebSocket (/v1/stream). Several generations run at once on one socket.
//   client: {"type":"generate","id":ID, ...completion params (prompt) or chat params (messages)...}
//           {"type":"cancel","id":ID}
//   server: {"type":"token","id":ID,"index":I,"text":DELTA,"token_ids":[...]}          per engine step
//           {"type":"done","id":ID,"finish_reason":R,"finish_reasons":[...],"usage":{...}}  R: stop|length|cancelled
//           {"type":"error","id":ID,"error":{"message":...,"type":...,"param":...,"code":STATUS}}
// ID is any JSON string or number chosen by the client, unique among its running generations. Engine events are
// posted onto the session's strand; a socket that closes aborts its generations.
#pragma once

#include <deque>
#include <map>
#include <memory>
#include <string>

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket/stream.hpp>
#include <boost/json/value.hpp>

#include "http/server_context.h"
#include "http/tls_stream.h"

namespace paged::server {

/// Why an upgrade request's WebSocket handshake fields fail RFC 6455 section 4.2.1 (status 426 for a
/// Sec-WebSocket-Version other than 13, which the answer must name; 400 for a Sec-WebSocket-Key that is not the
/// base64 of 16 bytes), or status 0 when they hold. The upgrade headers themselves (GET, Connection: upgrade,
/// Upgrade: websocket) are websocket::is_upgrade's.
struct HandshakeFault {
  unsigned status = 0;
  std::string message;
};
HandshakeFault websocket_handshake_fault(const boost::beast::http::request<boost::beast::http::string_body>& req);

template <class Stream>
class WebSocketSession : public std::enable_shared_from_this<WebSocketSession<Stream>> {
 public:
  /// Takes over the connection of an HttpSession (PlainStream or TlsStream); `ctx` must outlive the session.
  WebSocketSession(Stream&& stream, ServerContext& ctx);
  /// Aborts the generations still running.
  ~WebSocketSession();
  /// Completes the upgrade of `upgrade` (the HTTP request) and starts reading frames.
  void run(boost::beast::http::request<boost::beast::http::string_body> upgrade);

 private:
  struct Generation {
    boost::json::value id;
    RequestId engine_id = 0;
    std::vector<std::string> finish_reasons;  // per completion index
  };

  void on_accept(boost::beast::error_code ec);
  void do_read();
  void on_read(boost::beast::error_code ec, size_t bytes);
  void handle_frame(const std::string& text);
  void start_generation(boost::json::object frame, const boost::json::value& id);
  void on_event(const std::string& key, RequestEvent event);
  void send_error(const boost::json::value& id, unsigned code, const std::string& body_json);
  void send(std::string frame);
  void do_write();
  void abort_all();

  boost::beast::websocket::stream<Stream> ws_;
  boost::beast::flat_buffer buffer_;
  ServerContext& ctx_;
  std::map<std::string, Generation> generations_;  // by the serialised client id
  std::deque<std::string> outbox_;
  size_t outbox_bytes_ = 0;  // bytes of the frames in outbox_
  bool writing_ = false;
  bool closed_ = false;
  std::shared_ptr<void> owed_;  // while generations or frames are pending (ServerContext::owe_client)
  /// Takes or lets go of owed_ as generations_ and outbox_ say.
  void update_owed();
};

}  // namespace paged::server
