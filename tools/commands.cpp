#include "tools/commands.h"

#include <boost/json.hpp>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>

#include <signal.h>

#include "actors/messages.h"
#include "actors/tls.h"
#include "actors/tls_certs.h"
#include "actors/worker.h"
#include "http/server.h"

namespace paged::cli {

int run_serve_command(Args& args) {
  namespace fs = std::filesystem;
  std::string config_file = args.get("config").value_or("");
  if (config_file.empty()) {
    // conf/serve.json next to the source tree the binary was built from, if present.
    for (fs::path p : {fs::path("conf/serve.json"), fs::path(PAGED_SOURCE_DIR) / "conf/serve.json"})
      if (fs::exists(p)) {
        config_file = p.string();
        break;
      }
  }
  ServerOptions options = config_file.empty() ? ServerOptions{} : load_server_options(config_file);
  if (auto v = args.get("host")) options.host = *v;
  if (args.has("port")) {
    const int port = args.get_int("port", 0);
    if (port < 0 || port > 65535) throw UsageError("--port must be in [0, 65535]");
    options.port = static_cast<uint16_t>(port);
  }
  // The API key: --api-key, else PAGED_API_KEY (vLLM reads VLLM_API_KEY), else the configuration file's.
  if (auto v = args.get("api-key"))
    options.api_key = *v;
  else if (const char* env = std::getenv("PAGED_API_KEY"); env && *env)
    options.api_key = env;
  if (auto v = args.get("chat-template")) options.chat_template_file = *v;
  if (auto v = args.get("served-model-name")) options.served_model_name = *v;
  if (args.has("stats-interval")) {
    const int seconds = args.get_int("stats-interval", 0);
    if (seconds < 0) throw UsageError("--stats-interval must be 0 (off) or more seconds");
    options.stats_interval_s = seconds;
  }
  options.log_requests = args.get_bool("enable-log-requests", options.log_requests);
  // --allowed-origins: a JSON list as vLLM takes it ('["*"]'), or origins separated by commas.
  if (auto v = args.get("allowed-origins")) {
    options.allowed_origins.clear();
    boost::system::error_code ec;
    const boost::json::value list = boost::json::parse(*v, ec);
    if (!ec && list.is_array()) {
      for (const auto& origin : list.get_array()) {
        if (!origin.is_string()) throw UsageError("--allowed-origins: a list of strings, got " + *v);
        options.allowed_origins.emplace_back(origin.get_string());
      }
    } else {
      for (size_t begin = 0; begin < v->size();) {
        const size_t comma = std::min(v->find(',', begin), v->size());
        if (comma > begin) options.allowed_origins.push_back(v->substr(begin, comma - begin));
        begin = comma + 1;
      }
    }
  }
  if (args.has("shutdown-timeout")) {
    const int seconds = args.get_int("shutdown-timeout", 0);
    if (seconds < 0) throw UsageError("--shutdown-timeout must be 0 or more seconds");
    options.shutdown_timeout_s = seconds;
  }
  EngineConfig config = engine_config(args, options.model);
  args.reject_unknown();
  // The port first: a busy one fails before the model loads, and while it loads requests get 503.
  server::ServerPort port(options);
  std::cout << "paged: listening on " << options.host << ":" << port.port() << ", loading " << config.model_dir
            << std::endl;
  Engine engine(config);
  return run_server(engine, options, port);
}

int run_bench_command(Args& args) {
  namespace json = boost::json;
  EngineConfig config = engine_config(args);
  const int num_prompts = args.get_int("num-prompts", 1000);
  const std::string dataset = args.get("dataset").value_or("fixed");
  const int input_len = args.get_int("input-len", 512);
  const int output_len = args.get_int("output-len", 128);
  const int seed = args.get_int("seed", 0);
  const std::string requests_out = args.get("requests-out").value_or("");
  args.reject_unknown();
  if (num_prompts < 1) throw UsageError("--num-prompts must be positive");
  if (dataset != "fixed" && dataset != "sharegpt") throw UsageError("--dataset must be fixed or sharegpt");

  Engine engine(config);
  const int vocab = engine.model_config().vocab_size;
  const int max_len = engine.max_model_len();
  std::mt19937_64 rng(seed);
  // ShareGPT-like: lognormal lengths (sigma 1) with means 161 / 338, pruned as vLLM's benchmark prunes ShareGPT:
  // prompts of 4 to 1024 tokens, prompt + output at most 2048 (and the model's context).
  std::lognormal_distribution<double> in_dist(std::log(161.0) - 0.5, 1.0), out_dist(std::log(338.0) - 0.5, 1.0);
  std::uniform_int_distribution<int> token(std::min(100, vocab - 1), vocab - 1);
  std::vector<std::vector<TokenId>> prompts;
  std::vector<int> outputs;
  int64_t prompt_tokens = 0, output_tokens = 0;
  for (int i = 0; i < num_prompts; ++i) {
    int in = input_len, out = output_len;
    if (dataset == "sharegpt") {
      const int total = std::min(2048, max_len);
      in = std::clamp(static_cast<int>(std::lround(in_dist(rng))), 4, std::min(1024, total / 2));
      out = std::clamp(static_cast<int>(std::lround(out_dist(rng))), 1, total - in);
    }
    std::vector<TokenId> p(in);
    for (auto& t : p) t = token(rng);
    prompt_tokens += in;
    output_tokens += out;
    prompts.push_back(std::move(p));
    outputs.push_back(out);
  }
  if (!requests_out.empty()) {
    // The lengths of this run, for a baseline on the same workload (tools/gpu/hf_generate_bench.py --requests).
    json::array lengths;
    for (int i = 0; i < num_prompts; ++i) lengths.push_back(json::array{prompts[i].size(), outputs[i]});
    std::ofstream out(requests_out);
    out << json::serialize(json::object{{"dataset", dataset}, {"seed", seed}, {"requests", lengths}}) << "\n";
    if (!out) throw UsageError("cannot write --requests-out " + requests_out);
  }
  // Every request has its own output length, so each goes through submit() with its own parameters.
  std::mutex mu;
  std::condition_variable cv;
  int remaining = num_prompts;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < num_prompts; ++i) {
    SamplingParams p;
    p.max_tokens = outputs[i];
    p.temperature = 0;
    p.ignore_eos = true;
    engine.submit(prompts[i], p, [&](const RequestEvent& ev) {
      if (!ev.done) return;
      std::lock_guard lock(mu);
      if (--remaining == 0) cv.notify_all();
    });
  }
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return remaining == 0; });
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  engine.wait_idle();
  Metrics& m = engine.metrics();
  json::object o;
  o["device"] = engine.config().device;
  o["dataset"] = dataset;
  o["num_prompts"] = num_prompts;
  o["prompt_tokens"] = prompt_tokens;
  o["output_tokens"] = output_tokens;
  o["seconds"] = seconds;
  o["requests_per_s"] = num_prompts / seconds;
  o["output_tok_per_s"] = output_tokens / seconds;
  o["total_tok_per_s"] = (prompt_tokens + output_tokens) / seconds;
  o["peak_running_seqs"] = m.peak_running_seqs.load();
  o["kv_blocks_total"] = m.kv_blocks_total.load();
  o["kv_blocks_peak_used"] = m.kv_blocks_peak_used.load();
  const double reserved = static_cast<double>(m.kv_reserved_slots_sum.load());
  o["kv_waste"] = reserved > 0 ? 1.0 - static_cast<double>(m.kv_used_slots_sum.load()) / reserved : 0.0;
  o["preemptions"] = m.preemptions.load();
  o["steps"] = m.steps.load();
  o["executor_time_s"] = static_cast<double>(m.step_time_us.load()) * 1e-6;  // the rest is scheduling overhead
  o["ttft_p50_s"] = m.ttft.snapshot().quantile(0.5);
  o["tpot_p50_s"] = m.tpot.snapshot().quantile(0.5);
  std::cout << json::serialize(o) << std::endl;
  return 0;
}

int run_worker_command(Args& args) {
  EngineConfig config = engine_config(args);
  const std::string host = args.get("host").value_or("127.0.0.1");
  const int port = args.get_int("port", 7000);
  args.reject_unknown();
  if (port < 0 || port > 65535) throw UsageError("--port must be in [0, 65535]");
  if (const std::string why = plain_listen_refusal(host, config.tls_dir); !why.empty()) throw UsageError(why);
  // SIGINT / SIGTERM are taken by sigwait below: blocked before any thread starts, so every thread inherits it.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  Worker worker(config, host, static_cast<uint16_t>(port));
  const WorkerInfo& info = worker.info();
  std::cout << "paged worker: listening on " << host << ":" << worker.port() << " (" << info.device << ", "
            << info.num_blocks << " KV blocks of " << info.block_size << " tokens)"
            << (config.tls_dir.empty() ? "" : " with mutual TLS (" + config.tls_dir + ")") << std::endl;
  int received = 0;
  sigwait(&signals, &received);
  return 0;
}

int run_gen_certs_command(const std::string& dir, Args& args) {
  CertOptions options;
  options.hosts = args.get_all("host");
  options.days = args.get_int("days", options.days);
  options.force = args.get_bool("force", false);
  args.reject_unknown();
  if (options.days < 1 || options.days > 3650) throw UsageError("--days must be in [1, 3650]");
  for (const std::string& host : options.hosts)
    if (!subject_alt_name(host)) throw UsageError("--host '" + host + "' is neither an IP address nor a DNS name");
  const DeploymentFiles files = write_deployment(dir, options);
  std::string names = "localhost, 127.0.0.1, ::1";
  for (const std::string& host : options.hosts) names += ", " + host;
  std::cout << "paged gen-certs: wrote " << files.ca << ", " << files.cert << " and " << files.key << " (valid "
            << options.days << " days; names " << names << ").\nCopy " << dir << " to every host of this "
            << "deployment (node-key.pem is secret) and start the worker and the engine with --tls-dir " << dir
            << "." << std::endl;
  return 0;
}

}  // namespace paged::cli
