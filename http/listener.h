// Accepts TCP connections and hands each to an HttpSession on its own strand.
#pragma once

#include <chrono>
#include <memory>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/error.hpp>

#include "http/server_context.h"

namespace paged::server {

class Listener : public std::enable_shared_from_this<Listener> {
 public:
  /// Accepts on `socket`, a listening socket (ServerPort::release) it takes over.
  Listener(boost::asio::io_context& ioc,
           std::pair<boost::asio::ip::tcp, boost::asio::ip::tcp::acceptor::native_handle_type> socket,
           ServerContext& ctx);
  /// Starts accepting; returns at once.
  void run();
  /// Stops accepting and closes the listening socket (the server shuts down).
  void stop();
  /// The bound address (the chosen port when asked for port 0).
  boost::asio::ip::tcp::endpoint local_endpoint() const { return acceptor_.local_endpoint(); }

 private:
  void do_accept();
  void on_accept(boost::beast::error_code ec, boost::asio::ip::tcp::socket socket);

  boost::asio::io_context& ioc_;
  boost::asio::ip::tcp::acceptor acceptor_;
  ServerContext& ctx_;
  // After a failed accept (no file descriptors left: EMFILE, ENFILE, ENOBUFS) the next waits, doubling from
  // kFirstBackoff to kLongestBackoff while accepts keep failing; one log line per failing stretch.
  boost::asio::steady_timer backoff_;
  std::chrono::milliseconds delay_{0};
};

}  // namespace paged::server
