#include "http/server.h"

#include <chrono>
#include <csignal>
#include <functional>
#include <iostream>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>

#include "http/listener.h"
#include "http/server_context.h"

namespace paged {
namespace net = boost::asio;

namespace {
// After the grace period: how long the error events of the requests ended then may take to be written.
constexpr auto kFlushTime = std::chrono::seconds(5);
}  // namespace

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
  // Graceful shutdown on SIGTERM / SIGINT: stop accepting, answer new generations 503, let what runs finish for
  // shutdown_timeout_s, then end the rest with an error (SSE error event + [DONE], a WebSocket error frame, 503) and
  // stop once every response is written (at most kFlushTime more). A second signal ends the grace period at once.
  net::signal_set signals(ioc, SIGINT, SIGTERM);
  net::steady_timer drain_timer(ioc);
  using Clock = std::chrono::steady_clock;
  Clock::time_point deadline{}, stop_by{};
  bool aborted = false;
  std::function<void()> drain = [&] {
    const auto now = Clock::now();
    if (ctx->owed() == 0 || (aborted && now >= stop_by)) {
      ioc.stop();
      return;
    }
    if (!aborted && now >= deadline) {
      aborted = true;
      stop_by = now + kFlushTime;
      std::cout << "paged: shutdown timeout: ending " << ctx->owed() << " unfinished response(s) with an error"
                << std::endl;
      engine.abort_all("the server is shutting down");
    }
    drain_timer.expires_after(std::chrono::milliseconds(20));
    drain_timer.async_wait([&](const boost::system::error_code& ec) {
      if (!ec) drain();
    });
  };
  std::function<void(const boost::system::error_code&, int)> on_signal = [&](const boost::system::error_code& ec,
                                                                           int) {
    if (ec) return;
    if (ctx->draining) {
      deadline = Clock::now();  // a second signal: no more grace
    } else {
      ctx->draining = true;
      listener->stop();
      deadline = Clock::now() + std::chrono::seconds(options.shutdown_timeout_s);
      std::cout << "paged: shutting down: " << ctx->owed() << " response(s) in flight, up to "
                << options.shutdown_timeout_s << " s to finish" << std::endl;
      drain();
    }
    signals.async_wait(on_signal);
  };
  signals.async_wait(on_signal);
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
