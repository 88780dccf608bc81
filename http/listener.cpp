#include "http/listener.h"

#include <iostream>

#include <boost/asio/strand.hpp>

#include "http/http_session.h"

namespace paged::server {
namespace net = boost::asio;
using tcp = net::ip::tcp;

namespace {
constexpr std::chrono::milliseconds kFirstBackoff{10};
constexpr std::chrono::milliseconds kLongestBackoff{1000};
}  // namespace

Listener::Listener(net::io_context& ioc, std::pair<tcp, tcp::acceptor::native_handle_type> socket, ServerContext& ctx)
    : ioc_(ioc), acceptor_(net::make_strand(ioc)), ctx_(ctx), backoff_(acceptor_.get_executor()) {
  acceptor_.assign(socket.first, socket.second);
}

void Listener::run() { do_accept(); }

void Listener::stop() {
  net::post(acceptor_.get_executor(), [self = shared_from_this()] {
    boost::system::error_code ignored;
    self->acceptor_.close(ignored);
    self->backoff_.cancel();
  });
}

void Listener::do_accept() {
  // Each connection gets its own strand: its handlers never run concurrently.
  acceptor_.async_accept(net::make_strand(ioc_),
                         [self = shared_from_this()](boost::beast::error_code ec, tcp::socket socket) {
                           self->on_accept(ec, std::move(socket));
                         });
}

void Listener::on_accept(boost::beast::error_code ec, tcp::socket socket) {
  if (ec == net::error::operation_aborted || !acceptor_.is_open()) return;  // shutting down
  if (!ec) {
    if (delay_.count()) std::cerr << "paged: accepting connections again" << std::endl;
    delay_ = std::chrono::milliseconds(0);
    if (ctx_.tls)
      std::make_shared<HttpSession<TlsStream>>(TlsStream(std::move(socket), *ctx_.tls), ctx_)->run();
    else
      std::make_shared<HttpSession<PlainStream>>(PlainStream(std::move(socket)), ctx_)->run();
    do_accept();
    return;
  }
  // Retrying at once would spin while the condition lasts (out of file descriptors): wait, longer each time.
  if (!delay_.count()) std::cerr << "paged: accept: " << ec.message() << "; retrying with backoff" << std::endl;
  delay_ = delay_.count() ? std::min(delay_ * 2, kLongestBackoff) : kFirstBackoff;
  backoff_.expires_after(delay_);
  backoff_.async_wait([self = shared_from_this()](boost::beast::error_code wait) {
    if (!wait) self->do_accept();
  });
}

}  // namespace paged::server
