#include "http/server.h"

#include <csignal>
#include <iostream>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>

#include "http/listener.h"
#include "http/server_context.h"

namespace paged {
namespace net = boost::asio;

int run_server(Engine& engine, const ServerOptions& options) {
  std::unique_ptr<server::ServerContext> ctx;
  try {
    ctx = std::make_unique<server::ServerContext>(engine, options);
  } catch (const std::exception& e) {
    std::cerr << "paged: cannot load the chat template: " << e.what() << "\n";
    return 1;
  }
  const int threads = std::max(1, options.io_threads);
  net::io_context ioc(threads);
  std::shared_ptr<server::Listener> listener;
  try {
    // A name (localhost, a host name) is resolved; the first address it has is listened on.
    net::ip::tcp::resolver resolver(ioc);
    const auto found = resolver.resolve(options.host, std::to_string(options.port),
                                        net::ip::resolver_base::passive | net::ip::resolver_base::numeric_service);
    if (found.empty()) throw std::runtime_error("the host name has no address");
    listener = std::make_shared<server::Listener>(ioc, found.begin()->endpoint(), *ctx);
  } catch (const std::exception& e) {
    std::cerr << "paged: cannot listen on " << options.host << ":" << options.port << ": " << e.what() << "\n";
    return 1;
  }
  listener->run();
  net::signal_set signals(ioc, SIGINT, SIGTERM);
  signals.async_wait([&ioc](const boost::system::error_code&, int) { ioc.stop(); });
  const auto bound = listener->local_endpoint();
  std::cout << "paged: serving " << ctx->model_name << " on http://" << options.host << ":" << bound.port()
            << (ctx->model_info().chat_template ? "" : " (no chat template: /v1/chat/completions answers 400)")
            << std::endl;

  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back([&ioc] { ioc.run(); });
  ioc.run();
  for (auto& t : pool) t.join();
  // No engine event may be posted onto the io_context once it is gone; the sessions' destructors (run when the
  // io_context drops its handlers) abort whatever still runs.
  ctx->gate->close();
  std::cout << "paged: server stopped" << std::endl;
  return 0;
}

}  // namespace paged
