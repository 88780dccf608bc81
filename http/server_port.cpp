#include "http/server_port.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "http/openai.h"

namespace paged::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

namespace {

// One connection while the model loads (over TLS: after the handshake): its first request is answered 503 and the
// connection closes.
template <class Socket>
void answer_loading(std::shared_ptr<Socket> socket) {
  auto buffer = std::make_shared<beast::flat_buffer>();
  auto parser = std::make_shared<http::request_parser<http::string_body>>();
  parser->body_limit(1 << 20);
  http::async_read(*socket, *buffer, *parser, [socket, buffer, parser](beast::error_code ec, size_t) {
    if (ec) return;
    const auto& req = parser->get();
    auto res = std::make_shared<http::response<http::string_body>>(http::status::service_unavailable, req.version());
    res->set(http::field::server, "paged");
    res->set(http::field::content_type, "application/json");
    res->keep_alive(false);
    res->body() = req.target() == "/health"
                      ? std::string(R"({"status":"loading"})")
                      : openai::error_body("the model is still loading", "server_error", "", "model_loading");
    res->prepare_payload();
    http::async_write(*socket, *res, [socket, res](beast::error_code, size_t) {
      beast::error_code ignored;
      beast::get_lowest_layer(*socket).shutdown(tcp::socket::shutdown_both, ignored);
    });
  });
}

}  // namespace

struct ServerPort::Impl {
  std::shared_ptr<net::ssl::context> tls;  // HTTPS (server_tls_context); null: plain HTTP
  net::io_context ioc{1};
  tcp::acceptor acceptor{ioc};
  std::thread thread;
  std::vector<std::weak_ptr<tcp::socket>> answering;  // connections taken while loading (the ioc's thread only)

  void accept() {
    auto socket = std::make_shared<tcp::socket>(ioc);
    acceptor.async_accept(*socket, [this, socket](beast::error_code ec) {
      if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
      if (!ec) {
        std::erase_if(answering, [](const std::weak_ptr<tcp::socket>& s) { return s.expired(); });
        if (tls) {
          auto stream = std::make_shared<net::ssl::stream<tcp::socket>>(std::move(*socket), *tls);
          answering.push_back(std::shared_ptr<tcp::socket>(stream, &stream->next_layer()));  // lives as long
          stream->async_handshake(net::ssl::stream_base::server, [stream](beast::error_code handshake) {
            if (!handshake) answer_loading(stream);
          });
        } else {
          answering.push_back(socket);
          answer_loading(socket);
        }
      }
      accept();
    });
  }

  // Stops the responder's thread (idempotent). A connection it took and has not answered is closed (its client
  // sees the connection end and asks again, of the server proper): left open under the stopped io_context, it
  // would wait for an answer forever.
  void stop() {
    if (!thread.joinable()) return;
    net::post(ioc, [this] {
      beast::error_code ignored;
      acceptor.cancel(ignored);
      for (const std::weak_ptr<tcp::socket>& s : answering)
        if (auto socket = s.lock()) socket->close(ignored);
      ioc.stop();
    });
    thread.join();
  }
};

ServerPort::ServerPort(const ServerOptions& options, std::shared_ptr<net::ssl::context> tls)
    : impl_(std::make_unique<Impl>()) {
  impl_->tls = std::move(tls);
  try {
    tcp::resolver resolver(impl_->ioc);
    const auto found = resolver.resolve(options.host, std::to_string(options.port),
                                        tcp::resolver::passive | tcp::resolver::numeric_service);
    if (found.empty()) throw std::runtime_error("the host name has no address");
    const tcp::endpoint endpoint = found.begin()->endpoint();
    impl_->acceptor.open(endpoint.protocol());
    impl_->acceptor.set_option(net::socket_base::reuse_address(true));
    impl_->acceptor.bind(endpoint);
    impl_->acceptor.listen(net::socket_base::max_listen_connections);
  } catch (const boost::system::system_error& e) {
    throw std::runtime_error("cannot listen on " + options.host + ":" + std::to_string(options.port) + ": " +
                             e.code().message());
  } catch (const std::exception& e) {
    throw std::runtime_error("cannot listen on " + options.host + ":" + std::to_string(options.port) + ": " +
                             e.what());
  }
  impl_->accept();
  impl_->thread = std::thread([this] { impl_->ioc.run(); });
}

ServerPort::~ServerPort() { impl_->stop(); }

uint16_t ServerPort::port() const { return impl_->acceptor.local_endpoint().port(); }

const std::shared_ptr<net::ssl::context>& ServerPort::tls() const { return impl_->tls; }

std::pair<tcp, tcp::acceptor::native_handle_type> ServerPort::release() {
  impl_->stop();
  const tcp protocol = impl_->acceptor.local_endpoint().protocol();
  return {protocol, impl_->acceptor.release()};
}

}  // namespace paged::server
