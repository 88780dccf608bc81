#include "http/server.h"

#include <csignal>
#include <iostream>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/json.hpp>

#include "http/listener.h"
#include "http/server_context.h"
#include "model/json_file.h"

namespace paged {
namespace json = boost::json;
namespace net = boost::asio;

ServerOptions load_server_options(const std::string& json_file) {
  const json::object root = read_json_object<std::runtime_error>(json_file);
  ServerOptions o;
  const json::value* server = root.if_contains("server");
  if (!server) return o;
  if (!server->is_object()) throw std::runtime_error(json_file + ": \"server\" must be an object");
  for (const auto& kv : server->get_object()) {
    const std::string key(kv.key());
    const json::value& v = kv.value();
    auto bad = [&](const char* what) { return std::runtime_error(json_file + ": server." + key + " must be " + what); };
    auto text = [&] {
      if (!v.is_string()) throw bad("a string");
      return std::string(v.get_string());
    };
    auto positive = [&](int64_t max) {
      if (!v.is_int64() || v.get_int64() < 1 || v.get_int64() > max) throw bad("a positive integer");
      return v.get_int64();
    };
    if (key == "host") {
      o.host = text();
    } else if (key == "port") {
      if (!v.is_int64() || v.get_int64() < 0 || v.get_int64() > 65535) throw bad("a port number");
      o.port = static_cast<uint16_t>(v.get_int64());
    } else if (key == "api_key") {
      o.api_key = text();
    } else if (key == "served_model_name") {
      o.served_model_name = text();
    } else if (key == "chat_template") {
      o.chat_template_file = text();
    } else if (key == "body_limit_bytes") {
      o.body_limit = static_cast<size_t>(positive(int64_t{1} << 32));
    } else if (key == "read_timeout_s") {
      o.read_timeout_s = static_cast<int>(positive(86400));
    } else if (key == "write_timeout_s") {
      o.write_timeout_s = static_cast<int>(positive(86400));
    } else if (key == "pipeline_limit") {
      o.pipeline_limit = static_cast<size_t>(positive(1024));
    } else if (key == "io_threads") {
      o.io_threads = static_cast<int>(positive(256));
    } else if (key == "ws_max_generations") {
      o.ws_max_generations = static_cast<int>(positive(4096));
    } else {
      throw std::runtime_error(json_file + ": unknown key server." + key);
    }
  }
  return o;
}

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
    const net::ip::tcp::endpoint endpoint(net::ip::make_address(options.host), options.port);
    listener = std::make_shared<server::Listener>(ioc, endpoint, *ctx);
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
