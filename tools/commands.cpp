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
#include <functional>
#include <memory>
#include <sstream>
#include <optional>
#include <random>
#include <iomanip>

#include <signal.h>

#include "actors/actors.h"
#include "actors/messages.h"
#include "actors/tls.h"
#include "actors/tls_certs.h"
#include "actors/worker.h"
#include "http/server.h"
#include "http/tls_stream.h"
#include "model/json_file.h"
#include "model/loader/config.h"
#include "model/tokenizer/load_tokenizer.h"
#include "tools/bench/bench_floor.h"
#include "tools/bench/bench_stats.h"
#include "tools/bench/datasets.h"
#include "tools/bench/multiturn_bench.h"
#include "tools/bench/progress.h"

namespace paged::cli {

namespace {

/// The weights' load progress on stderr, in percent of the checkpoint's bytes (a bar on a terminal, else lines).
std::function<void(int64_t, int64_t)> load_progress() {
  auto bar = std::make_shared<std::optional<bench::ProgressBar>>();
  return [bar](int64_t loaded, int64_t total) {  // SafeTensors serialises the calls
    if (!*bar) {
      std::ostringstream label;
      label << "paged: loading " << std::fixed << std::setprecision(1) << double(total) / (1 << 20)
            << " MiB of weights (%)";
      bar->emplace(bench::stderr_progress(label.str(), 100));
    }
    (*bar)->update(static_cast<int>(total > 0 ? loaded * 100 / total : 100));
  };
}

// The H200 floor (tools/bench/bench_floor.h) of `requests` under an engine configuration: FP8 weights with
// --quantization fp8 (or a pre-quantised FP8 checkpoint left on auto), FP8 KV with --kv-cache-dtype fp8, one H200's
// ceilings per tensor-parallel device.
bench::WorkloadFloor h200_floor(const ModelConfig& model, const EngineConfig& c,
                                const std::vector<bench::BenchRequest>& requests) {
  std::vector<std::pair<int, int>> lengths;
  for (const bench::BenchRequest& r : requests) lengths.emplace_back(r.prompt_len, r.output_len);
  const bench::FloorPrecision precision{
      .fp8_weights = c.quantization == "fp8" || (c.quantization == "auto" && model.fp8_checkpoint.enabled),
      .fp8_kv = c.kv_cache_dtype == "fp8"};  // resolve_config names fp8_e4m3 fp8
  const bench::Ceilings one;
  const double devices = c.tensor_parallel_size;
  return bench::workload_floor(model, lengths, precision,
                               {.bytes_per_s = devices * one.bytes_per_s,
                                .bf16_flop_per_s = devices * one.bf16_flop_per_s});
}

// "16.27 (prompts 2.79, decode 13.48)": the floor and its two parts, in seconds.
std::string floor_text(const bench::WorkloadFloor& f) {
  return bench::fixed2(f.seconds()) + " (prompts " + bench::fixed2(f.prefill_s) + ", decode " +
         bench::fixed2(f.decode_s) + ")";
}

// The floor's fields of a --json line.
void add_floor(boost::json::object& o, const bench::WorkloadFloor& f) {
  o["h200_floor_s"] = f.seconds();
  o["h200_floor_prefill_s"] = f.prefill_s;
  o["h200_floor_decode_s"] = f.decode_s;
}

// `paged bench --floor-only`: the H200 floor of the requests alone, from config.json (and the tokenizer for a
// ShareGPT file): no weights, no device, no run.
int print_floor_only(EngineConfig config, const bench::DatasetOptions& data, bool as_json) {
  namespace json = boost::json;
  const ModelConfig model = load_model_config(config.model_dir);
  const int max_model_len = resolve_config(config, model, false);
  std::unique_ptr<Tokenizer> tokenizer;
  const std::vector<bench::BenchRequest> requests =
      bench::dataset_requests(data, model.vocab_size, max_model_len, [&](const std::string& text) {
        if (!tokenizer) tokenizer = load_tokenizer(config.model_dir);
        return tokenizer->encode(text, true);
      });
  int64_t prompt_tokens = 0, output_tokens = 0;
  for (const bench::BenchRequest& r : requests) {
    prompt_tokens += r.prompt_len;
    output_tokens += r.output_len;
  }
  const bench::WorkloadFloor floor = h200_floor(model, config, requests);
  if (!as_json) {
    using bench::fixed2, bench::table_row;
    std::cout << bench::table_title(" H200 Floor ", '=') << table_row("Dataset:", data.name)
              << table_row("Requests:", std::to_string(requests.size()))
              << table_row("Total input tokens:", std::to_string(prompt_tokens))
              << table_row("Total output tokens:", std::to_string(output_tokens))
              << table_row("H200 floor (s):", floor_text(floor))
              << table_row("Output tok/s at the floor:", fixed2(output_tokens / floor.seconds()))
              << std::string(50, '=') << std::endl;
    return 0;
  }
  json::object o{{"dataset", data.name},
                 {"num_prompts", requests.size()},
                 {"prompt_tokens", prompt_tokens},
                 {"output_tokens", output_tokens},
                 {"floor_output_tok_per_s", output_tokens / floor.seconds()}};
  add_floor(o, floor);
  std::cout << json::serialize(o) << std::endl;
  return 0;
}

}  // namespace

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
  // The file's "engine" object: the engine flags' values where the command line gives none.
  if (!config_file.empty()) {
    const boost::json::object root = read_json_object<UsageError>(config_file);
    if (const boost::json::value* engine = root.if_contains("engine")) {
      if (!engine->is_object()) throw UsageError(config_file + ": \"engine\" must be an object");
      args.fall_back_to(engine->get_object(), config_file + ": engine");
    }
  }
  if (auto v = args.get("host")) options.host = *v;
  if (args.has("port")) {
    const int port = args.get_int("port", 0);
    if (port < 0 || port > 65535) throw UsageError("--port must be in [0, 65535]");
    options.port = static_cast<uint16_t>(port);
  }
  // The API keys: --api-key (repeatable: any of them is let in), else PAGED_API_KEY (vLLM reads VLLM_API_KEY), else
  // the configuration file's.
  if (const std::vector<std::string> keys = args.get_all("api-key"); !keys.empty()) {
    for (const std::string& k : keys)
      if (k.empty()) throw UsageError("--api-key must not be empty");
    options.api_keys = keys;
  } else if (const char* env = std::getenv("PAGED_API_KEY"); env && *env) {
    options.api_keys = {env};
  }
  if (auto v = args.get("chat-template")) options.chat_template_file = *v;
  if (const std::vector<std::string> names = args.get_all("served-model-name"); !names.empty()) {
    for (const std::string& n : names)
      if (n.empty()) throw UsageError("--served-model-name must not be empty");
    options.served_model_names = names;
  }
  if (args.has("stats-interval")) {
    const int seconds = args.get_int("stats-interval", 0);
    if (seconds < 0) throw UsageError("--stats-interval must be 0 (off) or more seconds");
    options.stats_interval_s = seconds;
  }
  if (args.get_bool("disable-log-stats", false)) options.stats_interval_s = 0;  // vLLM's
  options.log_requests = args.get_bool("enable-log-requests", options.log_requests);
  if (args.get_bool("disable-log-requests", false)) options.log_requests = false;  // vLLM's older switch
  args.get_bool("enable-server-load-tracking", true);  // vLLM's switch for GET /load, which always counts here
  options.trust_request_chat_template =
      args.get_bool("trust-request-chat-template", options.trust_request_chat_template);
  options.enable_auto_tool_choice = args.get_bool("enable-auto-tool-choice", options.enable_auto_tool_choice);
  if (auto v = args.get("tool-call-parser")) options.tool_call_parser = *v;
  if (auto v = args.get("reasoning-parser")) options.reasoning_parser = *v;
  options.structured_outputs_in_reasoning =
      args.get_bool("structured-outputs-in-reasoning", options.structured_outputs_in_reasoning);
  try {
    auto_tool_call_format(options);
    reasoning_format(options);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
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
  if (args.has("max-stored-responses")) {
    const int count = args.get_int("max-stored-responses", 0);
    if (count < 0) throw UsageError("--max-stored-responses must be 0 (none) or more");
    options.max_stored_responses = static_cast<size_t>(count);
  }
  if (auto v = args.get("ssl-keyfile")) options.ssl_keyfile = *v;
  if (auto v = args.get("ssl-certfile")) options.ssl_certfile = *v;
  if (auto v = args.get("ssl-ca-certs")) options.ssl_ca_certs = *v;
  if (args.has("ssl-cert-reqs")) options.ssl_cert_reqs = args.get_int("ssl-cert-reqs", 0);
  if (auto v = args.get("generation-config")) options.generation_config = *v;
  options.return_tokens_as_token_ids = args.get_bool("return-tokens-as-token-ids", options.return_tokens_as_token_ids);
  if (auto v = args.get("override-generation-config")) options.override_generation_config = *v;
  EngineConfig config = engine_config(args, options.model);
  config.seed = seed_flag(args);  // vLLM's: the seeds of requests that give none
  args.reject_unknown();
  try {  // a bad generation config fails before the model loads
    sampling_defaults(options, config.model_dir);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  // HTTPS: bad certificate files fail before anything loads.
  std::shared_ptr<boost::asio::ssl::context> tls;
  try {
    tls = server::server_tls_context(options);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  // The port first: a busy one fails before the model loads, and while it loads requests get 503.
  server::ServerPort port(options, tls);
  std::cout << "paged: listening on " << options.host << ":" << port.port() << ", loading " << config.model_dir
            << std::endl;
  config.on_load_progress = load_progress();
  Engine engine(config);
  return run_server(engine, options, port);
}

int run_bench_command(Args& args) {
  namespace json = boost::json;
  EngineConfig config = engine_config(args);
  if (args.get("dataset-name") == "multiturn") return bench::run_multiturn_bench(args, config);
  bench::DatasetOptions defaults;
  defaults.random_input_len = 512;
  const bench::DatasetOptions data = bench::dataset_options(args, defaults);
  const std::string requests_out = args.get("requests-out").value_or("");
  const bool as_json = args.get_bool("json", false);
  const bool profile = args.get_bool("profile", false);
  const bool floor_only = args.get_bool("floor-only", false);
  // vLLM's benchmark_throughput --lora-path: the adapter is loaded --max-loras times (names 1 .. N) and each request
  // takes one of them at random (seeded), so that a step mixes up to --max-loras adapters.
  const std::string lora_path = args.get("lora-path").value_or("");
  args.reject_unknown();
  if (!lora_path.empty() && !config.enable_lora) throw UsageError("--lora-path needs --enable-lora");
  if (!lora_path.empty() && floor_only) throw UsageError("--floor-only counts no LoRA pairs: leave out --lora-path");

  if (floor_only) return print_floor_only(config, data, as_json);
  Engine engine(config);
  std::vector<int32_t> lora_ids;
  if (!lora_path.empty())
    for (int i = 1; i <= config.max_loras; ++i) lora_ids.push_back(engine.load_lora(std::to_string(i), lora_path));
  std::mt19937 lora_pick(static_cast<uint32_t>(data.seed));
  const std::vector<bench::BenchRequest> requests =
      bench::dataset_requests(data, engine.model_config().vocab_size, engine.max_model_len(),
                              [&](const std::string& text) { return engine.tokenizer().encode(text, true); });
  const int num_prompts = static_cast<int>(requests.size());
  if (!requests_out.empty()) {
    // The lengths of this run, for a baseline on the same workload (tools/gpu/hf_generate_bench.py --requests).
    json::array lengths;
    for (const bench::BenchRequest& r : requests) lengths.push_back(json::array{r.prompt_len, r.output_len});
    std::ofstream out(requests_out);
    out << json::serialize(json::object{{"dataset", data.name}, {"seed", data.seed}, {"requests", lengths}}) << "\n";
    if (!out) throw UsageError("cannot write --requests-out " + requests_out);
  }
  // Every request has its own output length, so each goes through submit() with its own parameters.
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0, failed = 0;
  int64_t prompt_tokens = 0, output_tokens = 0;  // of the requests that succeeded
  std::string first_error;
  bench::ProgressBar progress = bench::stderr_progress("bench", num_prompts);
  progress.update(0);
  const auto t0 = std::chrono::steady_clock::now();
  for (const bench::BenchRequest& r : requests) {
    SamplingParams p;
    p.max_tokens = r.output_len;
    p.temperature = 0;
    p.ignore_eos = true;
    if (!lora_ids.empty()) p.lora = lora_ids[lora_pick() % lora_ids.size()];
    engine.submit(r.prompt_ids, p, [&, prompt_len = r.prompt_len](const RequestEvent& ev) {
      if (!ev.done) return;
      std::lock_guard lock(mu);
      if (ev.error) {
        if (failed++ == 0) first_error = *ev.error;
      } else {
        prompt_tokens += prompt_len;
        output_tokens += ev.completion_tokens;
      }
      progress.update(++finished);
      if (finished == num_prompts) cv.notify_all();
    });
  }
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return finished == num_prompts; });
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  engine.wait_idle();
  if (failed > 0) std::cerr << "paged bench: " << failed << " requests failed; the first: " << first_error << "\n";
  Metrics& m = engine.metrics();
  const int completed = num_prompts - failed;
  const double reserved = static_cast<double>(m.kv_reserved_slots_sum.load());
  const double kv_waste = reserved > 0 ? 1.0 - static_cast<double>(m.kv_used_slots_sum.load()) / reserved : 0.0;
  const double executor_s = static_cast<double>(m.step_time_us.load()) * 1e-6;  // the rest is scheduling overhead
  const double ttft_p50 = m.ttft.snapshot().quantile(0.5), tpot_p50 = m.tpot.snapshot().quantile(0.5);
  // On CUDA in this process, what these requests cost at the H200's ceilings, beside what they took.
  std::optional<bench::WorkloadFloor> floor;
  if (engine.config().device == "cuda" && engine.config().workers.empty() && failed == 0)
    floor = h200_floor(engine.model_config(), engine.config(), requests);
  if (!as_json) {
    using bench::fixed2, bench::table_row;
    std::cout << bench::table_title(" Offline Throughput Benchmark Result ", '=')
              << table_row("Device:", engine.config().device) << table_row("Dataset:", data.name)
              << (lora_ids.empty() ? std::string()
                                   : table_row("LoRA adapters:", std::to_string(lora_ids.size()) + " of " + lora_path))
              << table_row("Successful requests:", std::to_string(completed))
              << table_row("Failed requests:", std::to_string(failed))
              << table_row("Benchmark duration (s):", fixed2(seconds))
              << table_row("Total input tokens:", std::to_string(prompt_tokens))
              << table_row("Total generated tokens:", std::to_string(output_tokens))
              << table_row("Request throughput (req/s):", fixed2(completed / seconds))
              << table_row("Output token throughput (tok/s):", fixed2(output_tokens / seconds))
              << table_row("Total Token throughput (tok/s):", fixed2((prompt_tokens + output_tokens) / seconds));
    if (floor)
      std::cout << table_row("H200 floor (s):", floor_text(*floor))
                << table_row("Floor / duration (%):", fixed2(100 * floor->seconds() / seconds));
    std::cout << bench::table_title("Engine", '-')
              << table_row("Peak running sequences:", std::to_string(m.peak_running_seqs.load()))
              << table_row("KV blocks used at peak / total:", std::to_string(m.kv_blocks_peak_used.load()) + " / " +
                                                                   std::to_string(m.kv_blocks_total.load()))
              << table_row("KV waste (%):", fixed2(100 * kv_waste))
              << table_row("Preemptions:", std::to_string(m.preemptions.load()))
              << table_row("Engine steps:", std::to_string(m.steps.load()));
    if (engine.config().speculative_config.enabled())
      std::cout << table_row("Drafts accepted / proposed:", std::to_string(m.spec_decode_accepted_tokens.load()) +
                                                                " / " +
                                                                std::to_string(m.spec_decode_draft_tokens.load()));
    std::cout << table_row("Executor time (s):", fixed2(executor_s))
              << table_row("Median TTFT (ms):", fixed2(1000 * ttft_p50))
              << table_row("Median TPOT (ms):", fixed2(1000 * tpot_p50)) << std::string(50, '=') << std::endl;
  }
  // --profile: where each kind of step spends its time (device busy, host, device idle before it), on stderr.
  if (profile) std::cerr << "Step profile (per step):\n" << m.step_profile.table() << std::flush;
  if (!as_json) return 0;
  json::object o;
  o["device"] = engine.config().device;
  o["dataset"] = data.name;
  o["lora_adapters"] = lora_ids.size();
  o["num_prompts"] = num_prompts;
  o["completed"] = completed;
  o["failed"] = failed;
  o["prompt_tokens"] = prompt_tokens;
  o["output_tokens"] = output_tokens;
  o["seconds"] = seconds;
  o["requests_per_s"] = completed / seconds;
  o["output_tok_per_s"] = output_tokens / seconds;
  o["total_tok_per_s"] = (prompt_tokens + output_tokens) / seconds;
  if (floor) {
    add_floor(o, *floor);
    o["fraction_of_floor"] = floor->seconds() / seconds;
  }
  o["peak_running_seqs"] = m.peak_running_seqs.load();
  o["kv_blocks_total"] = m.kv_blocks_total.load();
  o["kv_blocks_peak_used"] = m.kv_blocks_peak_used.load();
  o["kv_waste"] = kv_waste;
  o["preemptions"] = m.preemptions.load();
  o["steps"] = m.steps.load();
  o["spec_decode_draft_tokens"] = m.spec_decode_draft_tokens.load();
  o["spec_decode_accepted_tokens"] = m.spec_decode_accepted_tokens.load();
  o["executor_time_s"] = executor_s;
  o["ttft_p50_s"] = ttft_p50;
  o["tpot_p50_s"] = tpot_p50;
  if (profile) {
    json::object kinds;
    for (StepKind kind : {StepKind::decode, StepKind::mixed, StepKind::prefill}) {
      const StepProfile::Row r = m.step_profile.row(kind);
      kinds[step_kind_name(kind)] = {{"steps", r.steps}, {"tokens", r.tokens}, {"wall_us", r.wall_us},
                                     {"busy_us", r.busy_us}, {"idle_before_us", r.idle_before_us}};
    }
    o["profile"] = std::move(kinds);
  }
  std::cout << json::serialize(o) << std::endl;
  return 0;
}

int run_worker_command(Args& args) {
  EngineConfig config = engine_config(args);
  const std::string host = args.get("host").value_or("127.0.0.1");
  const int port = args.get_int("port", 7000);
  args.reject_unknown();
  if (port < 0 || port > 65535) throw UsageError("--port must be in [0, 65535]");
  if (!config.kv_disk_dir.empty() || config.kv_disk_gib > 0)
    throw UsageError("--kv-disk-dir and --kv-disk-size: the disk tier is not available with workers");
  if (const std::string why = plain_listen_refusal(host, config.tls_dir); !why.empty()) throw UsageError(why);
  // SIGINT / SIGTERM are taken by sigwait below: blocked before any thread starts, so every thread inherits it.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  config.on_load_progress = load_progress();
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
