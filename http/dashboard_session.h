// The dashboard's WebSocket (/dashboard/ws): pushes a frame (http/dashboard.h) every kPushInterval, built from the
// engine's KV snapshots (Engine::kv_snapshot, answered by the memory managers) and its metrics. At most one snapshot
// is asked and one frame written at a time: a slow reader gets fewer frames, never a backlog. Frames the client sends
// are read and ignored (the read notices when it goes away).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket/stream.hpp>

#include "http/server_context.h"
#include "http/tls_stream.h"

namespace paged::server {

template <class Stream>
class DashboardSession : public std::enable_shared_from_this<DashboardSession<Stream>> {
 public:
  /// Time between two pushes.
  static constexpr std::chrono::milliseconds kPushInterval{500};

  /// Takes over the connection of an HttpSession (PlainStream or TlsStream); `ctx` must outlive the session.
  DashboardSession(Stream&& stream, ServerContext& ctx);
  /// Completes the upgrade of `upgrade` (the HTTP request), then pushes a frame at once and every kPushInterval.
  void run(boost::beast::http::request<boost::beast::http::string_body> upgrade);

 private:
  void on_accept(boost::beast::error_code ec);
  void do_read();
  /// Asks for a snapshot unless one is asked or a frame is being written; re-arms the timer.
  void on_tick();
  /// The engine's answer, on the strand: the frame is written.
  void on_snapshot(std::vector<ReplicaKv> replicas);
  void close();

  boost::beast::websocket::stream<Stream> ws_;
  boost::beast::flat_buffer buffer_;
  boost::asio::steady_timer timer_;
  ServerContext& ctx_;
  std::string frame_;      // the frame being written
  uint64_t seq_ = 0;       // frames pushed
  bool asking_ = false;    // a snapshot was asked and has not come
  bool writing_ = false;
  bool closed_ = false;
};

}  // namespace paged::server
