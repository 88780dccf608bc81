#include "http/server.h"

#include <chrono>
#include <csignal>
#include <functional>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>

#include "http/listener.h"
#include "http/server_port.h"
#include "http/server_context.h"
#include "model/loader/generation_config.h"

namespace paged {
namespace net = boost::asio;

namespace {
// After the grace period: how long the error events of the requests ended then may take to be written.
constexpr auto kFlushTime = std::chrono::seconds(5);

std::string mib(int64_t bytes) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << double(bytes) / double(1 << 20) << " MiB";
  return s.str();
}

// What vLLM prints as it starts: the model, where it runs, its weights, the KV cache and what fits in it.
void log_startup(const EngineSummary& s, const NgramSpeculation& speculation, const std::string& served_name) {
  std::cout << "paged: model " << served_name << " (" << s.model_type << ", " << s.model_dir << "): checkpoint "
            << s.checkpoint_dtype << ", computing in " << s.compute_dtype << " on " << s.device
            << (s.tensor_parallel_size > 1 ? " x" + std::to_string(s.tensor_parallel_size) : std::string())
            << ", "
            << (s.weight_bytes                                   ? mib(s.weight_bytes) + " of weights"
                : !s.replicas.empty() && s.replicas[0].address.empty() ? std::string("random weights (--load-format dummy)")
                                                                   : std::string("weights on the workers"))
            << ", ready in " << std::fixed << std::setprecision(2) << s.load_seconds << " s" << std::endl;
  if (!s.checkpoint_format.empty()) std::cout << "paged: " << s.checkpoint_format << std::endl;
  for (const EngineSummary::Pool& p : s.replicas)
    std::cout << "paged: KV cache" << (p.address.empty() ? std::string() : " of worker " + p.address) << ": "
              << p.kv_blocks << " blocks of " << s.block_size << " tokens in " << s.kv_cache_dtype << " ("
              << mib(p.kv_bytes) << "), CPU swap pool "
              << p.swap_blocks << " blocks (" << mib(p.swap_bytes) << "), CPU tier " << p.offload_blocks << " blocks ("
              << mib(p.offload_bytes) << "), disk tier " << p.disk_blocks << " blocks (" << mib(p.disk_bytes) << ")"
              << (s.kv_disk_dir.empty() ? std::string() : " in " + s.kv_disk_dir) << std::endl;
  std::cout << "paged: maximum concurrency at max_model_len " << s.max_model_len << ": " << std::setprecision(1)
            << s.max_concurrency() << " sequences"
            << (s.kv_groups.num_sliding() > 0
                    ? " (" + std::to_string(s.kv_groups.num_sliding()) + " of " +
                          std::to_string(s.kv_groups.num_groups()) + " KV groups slide: a sequence keeps " +
                          std::to_string(s.blocks_per_sequence()) + " blocks)"
                    : std::string())
            << std::endl;
  if (speculation.enabled())
    std::cout << "paged: speculative decoding: n-gram lookup of " << speculation.prompt_lookup_min << " to "
              << speculation.prompt_lookup_max << " tokens, up to " << speculation.num_speculative_tokens
              << " drafts a step (steps planned one after another)" << std::endl;
  if (s.device == "cuda")
    std::cout << "paged: CUDA graphs: one per decode (batch, context) bucket, captured on its first step (no capture "
                 "at startup; the stats lines and /metrics paged_cuda_graph_capture_seconds_total give the time)"
              << std::endl;
}

// The figures a stats line compares with the previous one.
struct StatsMark {
  int64_t prompt_tokens = 0, generation_tokens = 0, prefix_hits = 0;
  std::chrono::steady_clock::time_point at = std::chrono::steady_clock::now();
};

// One stats line when the engine worked since `last` (vLLM's periodic log); `last` moves to now.
void log_stats(const Metrics& m, StatsMark& last) {
  StatsMark now{m.prompt_tokens_computed, m.generation_tokens, m.prefix_cache_hit_tokens,
                std::chrono::steady_clock::now()};
  const bool busy = m.running_requests + m.waiting_requests + m.swapped_requests > 0;
  if (busy || now.prompt_tokens != last.prompt_tokens || now.generation_tokens != last.generation_tokens) {
    const double seconds = std::max(1e-9, std::chrono::duration<double>(now.at - last.at).count());
    const int64_t queried = now.prompt_tokens - last.prompt_tokens + now.prefix_hits - last.prefix_hits;
    const int64_t total = m.kv_blocks_total;
    std::cout << std::fixed << std::setprecision(1) << "paged: prompt "
              << double(now.prompt_tokens - last.prompt_tokens) / seconds << " tok/s, generation "
              << double(now.generation_tokens - last.generation_tokens) / seconds << " tok/s, running "
              << m.running_requests << ", waiting " << m.waiting_requests << ", swapped " << m.swapped_requests
              << ", KV cache " << (total ? 100.0 * (1.0 - double(m.kv_blocks_free) / double(total)) : 0.0)
              << "% used, prefix-cache hit rate "
              << (queried ? 100.0 * double(now.prefix_hits - last.prefix_hits) / double(queried) : 0.0) << "%"
              << (m.graphs_captured ? ", CUDA graphs " + std::to_string(m.graphs_captured.load()) + " captured in " +
                                          std::to_string(m.graph_capture_us.load() / 1000) + " ms"
                                    : std::string())
              << std::endl;
  }
  last = now;
}

}  // namespace

int run_server(Engine& engine, const ServerOptions& options, server::ServerPort& port) {
  std::unique_ptr<server::ServerContext> ctx;
  try {
    ctx = std::make_unique<server::ServerContext>(engine, options, port.tls());
  } catch (const std::exception& e) {
    std::cerr << "paged: cannot load the chat template: " << e.what() << "\n";
    return 1;
  }
  const int threads = std::max(1, options.io_threads);
  net::io_context ioc(threads);
  auto listener = std::make_shared<server::Listener>(ioc, port.release(), *ctx);
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
  // Every stats_interval_s, a line while the engine works.
  net::steady_timer stats_timer(ioc);
  StatsMark stats_mark;
  std::function<void()> stats = [&] {
    stats_timer.expires_after(std::chrono::seconds(options.stats_interval_s));
    stats_timer.async_wait([&](const boost::system::error_code& ec) {
      if (ec) return;
      log_stats(engine.metrics(), stats_mark);
      stats();
    });
  };
  if (options.stats_interval_s > 0) stats();

  log_startup(engine.summary(), engine.config().speculative_config, ctx->model_name);
  if (const std::vector<LoraInfo> loras = engine.lora_adapters(); !loras.empty()) {
    std::cout << "paged: LoRA adapters, each served as a model:";
    for (size_t i = 0; i < loras.size(); ++i) std::cout << (i ? ", " : " ") << loras[i].name << " (" << loras[i].path << ")";
    std::cout << "; " << engine.config().max_loras << " at once (--max-loras)" << std::endl;
  }
  if (ctx->runtime_lora_updating)
    std::cout << "paged: VLLM_ALLOW_RUNTIME_LORA_UPDATING: POST /v1/load_lora_adapter and /v1/unload_lora_adapter "
                 "load and drop LoRA adapters" << std::endl;
  if (const std::string set = describe(ctx->model_info().sampling_defaults); !set.empty())
    std::cout << "paged: default sampling parameters of requests that leave them out: " << set
              << " (--generation-config " << options.generation_config
              << (options.override_generation_config.empty() ? "" : " and --override-generation-config")
              << "; --generation-config vllm: none)" << std::endl;
  const auto bound = listener->local_endpoint();
  std::cout << "paged: serving " << ctx->model_name << " on " << (ctx->tls ? "https://" : "http://") << options.host << ":" << bound.port()
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
