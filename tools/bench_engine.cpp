// Offline throughput of the actor runtime: N synthetic requests (seeded lengths) through the default engine and
// through the same engine with max_num_seqs 1, in one run, side by side (the continuous-batching speed-up).
//
//   bench_engine [--model DIR] [--num-requests 256] [--seed 0] [--device cpu] [--input-mean 100]
//                [--output-mean 150] [--max-num-seqs 256] [--skip-sequential]
//
// Lengths: log-normal (sigma 0.8, ShareGPT's shape, scaled to the model's context), each request's prompt + output
// capped at the model length; prompts are BOS + uniform random ids; greedy, ignore_eos (every request generates
// exactly its drawn output length, as vLLM's benchmark_throughput does). Prints one line per engine and a final
// JSON line.
#include <boost/json.hpp>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <random>
#include <string>

#include "actors/engine.h"

using namespace paged;
namespace json = boost::json;

namespace {

struct Workload {
  std::vector<std::vector<TokenId>> prompts;
  std::vector<SamplingParams> params;
  int64_t input_tokens = 0, output_tokens = 0;
};

Workload make_workload(int n, uint64_t seed, double input_mean, double output_mean, int max_len, int vocab) {
  std::mt19937_64 rng(seed);
  const double sigma = 0.8;  // lognormal: mean = exp(mu + sigma^2 / 2)
  std::lognormal_distribution<double> in_len(std::log(input_mean) - sigma * sigma / 2, sigma);
  std::lognormal_distribution<double> out_len(std::log(output_mean) - sigma * sigma / 2, sigma);
  std::uniform_int_distribution<TokenId> token(3, vocab - 1);
  Workload w;
  for (int i = 0; i < n; ++i) {
    int in = std::clamp(static_cast<int>(std::lround(in_len(rng))), 4, max_len / 2);
    int out = std::clamp(static_cast<int>(std::lround(out_len(rng))), 4, max_len - in);
    std::vector<TokenId> prompt{1};
    while (static_cast<int>(prompt.size()) < in) prompt.push_back(token(rng));
    SamplingParams p;
    p.temperature = 0.0f;
    p.max_tokens = out;
    p.ignore_eos = true;
    w.prompts.push_back(std::move(prompt));
    w.params.push_back(p);
    w.input_tokens += in;
    w.output_tokens += out;
  }
  return w;
}

struct Result {
  double seconds = 0;
  int64_t output_tokens = 0;
  int64_t peak_running_seqs = 0, peak_blocks = 0, blocks_total = 0, preemptions = 0, steps = 0;
  double kv_waste = 0;
  double ttft_p50 = 0, tpot_p50 = 0;
};

Result run(const EngineConfig& config, const Workload& w) {
  Engine engine(config);
  std::mutex mu;
  std::condition_variable cv;
  size_t remaining = w.prompts.size();
  int64_t tokens = 0;
  std::string error;
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < w.prompts.size(); ++i)
    engine.submit(w.prompts[i], w.params[i], [&](RequestEvent ev) {
      std::lock_guard lock(mu);
      for (const auto& d : ev.deltas) tokens += static_cast<int64_t>(d.token_ids.size());
      if (ev.error && error.empty()) error = *ev.error;
      if (ev.done && --remaining == 0) cv.notify_all();
    });
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return remaining == 0; });
  }
  Result r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!error.empty()) throw std::runtime_error("a request failed: " + error);
  engine.wait_idle();
  Metrics& m = engine.metrics();
  r.output_tokens = tokens;
  r.peak_running_seqs = m.peak_running_seqs;
  r.peak_blocks = m.kv_blocks_peak_used;
  r.blocks_total = m.kv_blocks_total;
  r.preemptions = m.preemptions;
  r.steps = m.steps;
  const int64_t reserved = m.kv_reserved_slots_sum, used = m.kv_used_slots_sum;
  r.kv_waste = reserved > 0 ? double(reserved - used) / double(reserved) : 0.0;
  r.ttft_p50 = m.ttft.snapshot().quantile(0.5);
  r.tpot_p50 = m.tpot.snapshot().quantile(0.5);
  if (m.kv_blocks_free != m.kv_blocks_total) throw std::runtime_error("the KV pool did not drain");
  return r;
}

json::object report(const char* name, const Result& r, const Workload& w) {
  const double reqs = static_cast<double>(w.prompts.size());
  std::cout << name << ": " << r.seconds << " s, " << reqs / r.seconds << " requests/s, "
            << double(r.output_tokens) / r.seconds << " output tok/s, "
            << double(r.output_tokens + w.input_tokens) / r.seconds << " total tok/s; steps " << r.steps
            << ", peak running seqs " << r.peak_running_seqs << ", peak KV blocks " << r.peak_blocks << "/"
            << r.blocks_total << ", KV waste " << 100.0 * r.kv_waste << "%, preemptions " << r.preemptions
            << ", TTFT p50 " << r.ttft_p50 << " s, TPOT p50 " << r.tpot_p50 << " s\n";
  return json::object{{"seconds", r.seconds},
                      {"requests_per_s", reqs / r.seconds},
                      {"output_tok_per_s", double(r.output_tokens) / r.seconds},
                      {"total_tok_per_s", double(r.output_tokens + w.input_tokens) / r.seconds},
                      {"steps", r.steps},
                      {"peak_running_seqs", r.peak_running_seqs},
                      {"peak_kv_blocks", r.peak_blocks},
                      {"kv_blocks_total", r.blocks_total},
                      {"kv_waste", r.kv_waste},
                      {"preemptions", r.preemptions}};
}

/// The project's default model (models/stories260K in the source tree).
std::string default_model() { return std::string(PAGED_SOURCE_DIR) + "/models/stories260K"; }

}  // namespace

int main(int argc, char** argv) {
  std::string model = default_model(), device = "cpu";
  int n = 256, max_num_seqs = 256;
  uint64_t seed = 0;
  double input_mean = 100, output_mean = 150;
  bool sequential = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "bench_engine: " << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--model") model = next();
    else if (a == "--num-requests") n = std::stoi(next());
    else if (a == "--seed") seed = std::stoull(next());
    else if (a == "--device") device = next();
    else if (a == "--input-mean") input_mean = std::stod(next());
    else if (a == "--output-mean") output_mean = std::stod(next());
    else if (a == "--max-num-seqs") max_num_seqs = std::stoi(next());
    else if (a == "--skip-sequential") sequential = false;
    else {
      std::cerr << "usage: bench_engine [--model DIR] [--num-requests N] [--seed S] [--device cpu|cuda]"
                   " [--input-mean N] [--output-mean N] [--max-num-seqs N] [--skip-sequential]\n";
      return 2;
    }
  }
  try {
    EngineConfig config;
    config.model_dir = model;
    config.device = device;
    config.max_num_seqs = max_num_seqs;
    config.swap_space_gib = 1.0;
    int max_len = 0, vocab = 0;
    {
      Engine probe(config);
      max_len = probe.max_model_len();
      vocab = probe.model_config().vocab_size;
    }
    const Workload w = make_workload(n, seed, input_mean, output_mean, max_len, vocab);
    std::cout << "bench_engine: " << model << " on " << device << ", " << n << " requests (seed " << seed
              << "), mean input " << double(w.input_tokens) / n << ", mean output " << double(w.output_tokens) / n
              << " tokens, greedy, ignore_eos\n";
    json::object out;
    const Result batched = run(config, w);
    out["batched"] = report("default engine", batched, w);
    if (sequential) {
      EngineConfig one = config;
      one.max_num_seqs = 1;
      const Result single = run(one, w);
      out["max_num_seqs_1"] = report("max_num_seqs 1", single, w);
      const double ratio = (double(batched.output_tokens) / batched.seconds) /
                           (double(single.output_tokens) / single.seconds);
      std::cout << "continuous batching speed-up (output tok/s, default / max_num_seqs 1): " << ratio << "x\n";
      out["speedup"] = ratio;
    }
    out["num_requests"] = n;
    out["mean_input_tokens"] = double(w.input_tokens) / n;
    out["mean_output_tokens"] = double(w.output_tokens) / n;
    std::cout << json::serialize(out) << '\n';
  } catch (const std::exception& e) {
    std::cerr << "bench_engine: error: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
