// The server's listening port, bound before the model loads: a busy port or a bad host fails at once, with one line,
// and while the model loads every request on the port is answered 503 (GET /health: {"status":"loading"}), as vLLM's
// server does, so that a load balancer sees the replica coming up. run_server takes the port over once the engine is
// ready.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>

#include <memory>

#include "http/server_options.h"

namespace paged::server {

class ServerPort {
 public:
  /// Resolves options.host (a name or an address), binds options.port (0: any free port), listens, and answers 503
  /// on its own thread (over TLS with `tls`, server_tls_context's). Throws std::runtime_error "cannot listen on
  /// HOST:PORT: why".
  explicit ServerPort(const ServerOptions& options, std::shared_ptr<boost::asio::ssl::context> tls = nullptr);
  ~ServerPort();
  ServerPort(const ServerPort&) = delete;
  ServerPort& operator=(const ServerPort&) = delete;

  /// The bound port.
  uint16_t port() const;
  /// The TLS context connections are served with (null: plain HTTP).
  const std::shared_ptr<boost::asio::ssl::context>& tls() const;
  /// Stops answering 503 and hands over the listening socket: its protocol and native handle (the caller owns it).
  std::pair<boost::asio::ip::tcp, boost::asio::ip::tcp::acceptor::native_handle_type> release();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace paged::server
