// KV waste of paged allocation (KvCacheManager at block sizes 8, 16, 32) beside contiguous per-request reservation
// (FasterTransformer / Orca style), on one seeded ShareGPT-like request trace.
//
// Lengths: lognormal with sigma 1.0, clamped to [1, 2048] with the output cut so that input + output <= 2048 (the
// model's max length), and scaled so that the clamped means over the trace are 161 (input) and 338 (output) tokens.
// The means of the requests actually simulated are printed.
// Simulation: a closed loop of 256 running sequences (vLLM's default max_num_seqs); a finished sequence is freed and
// the next request of the trace is admitted at once: its prompt is allocated and prefilled, then it decodes one token
// per step (reserve one slot, mark it computed). After every 10th step past a warm-up, the reserved and used KV slots
// over all live sequences are sampled; KV waste = (reserved - used) / reserved, averaged over samples. Samples are
// taken at step boundaries, when every reserved slot but those of partly filled last blocks is used.
// Baselines, measured on the same live sequences at the same samples: reserve the model max (2048 tokens) per
// request, and reserve exactly input + output per request (an oracle that knows each output length).
//
// Usage: bench_kv_waste [seed]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "model/kv/kv_cache_manager.h"

namespace {

using paged::KvCacheManager;
using paged::TokenId;

constexpr int kMaxLen = 2048;
constexpr int kConcurrency = 256;
constexpr int kSteps = 12000;
constexpr int kWarmupSteps = 2000;
constexpr int kSampleEvery = 10;

struct Request {
  int input;
  int output;
};

std::vector<Request> sample_trace(uint64_t seed, int count, double input_mean, double output_mean) {
  std::mt19937_64 rng(seed);
  const double sigma = 1.0;
  std::lognormal_distribution<double> input(std::log(input_mean) - sigma * sigma / 2, sigma);
  std::lognormal_distribution<double> output(std::log(output_mean) - sigma * sigma / 2, sigma);
  std::vector<Request> trace(count);
  for (Request& r : trace) {
    r.input = std::clamp(static_cast<int>(std::lround(input(rng))), 1, kMaxLen - 1);
    r.output = std::clamp(static_cast<int>(std::lround(output(rng))), 1, kMaxLen - r.input);
  }
  return trace;
}

// Lognormal lengths whose means after clamping are 161 and 338: the unclamped means are rescaled a few times
// against the sample (clamping the long tail lowers the mean).
std::vector<Request> make_trace(uint64_t seed, int count) {
  double input_mean = 161.0, output_mean = 338.0;
  std::vector<Request> trace;
  for (int round = 0; round < 4; ++round) {
    trace = sample_trace(seed, count, input_mean, output_mean);
    double in = 0, out = 0;
    for (const Request& r : trace) {
      in += r.input;
      out += r.output;
    }
    input_mean *= 161.0 * count / in;
    output_mean *= 338.0 * count / out;
  }
  return trace;
}

struct Waste {
  double sum = 0.0;
  double max = 0.0;
  double reserved_per_seq = 0.0;
  int samples = 0;
  void add(double reserved, double used, int live) {
    double w = reserved > 0 ? (reserved - used) / reserved : 0.0;
    sum += w;
    max = std::max(max, w);
    reserved_per_seq += reserved / live;
    ++samples;
  }
  void print(const char* name) const {
    std::printf("%-34s %9.2f%% %9.2f%% %14.0f\n", name, 100.0 * sum / samples, 100.0 * max, reserved_per_seq / samples);
  }
};

struct Live {
  paged::SeqId id;
  const Request* request;
  std::vector<TokenId> tokens;
};

struct Result {
  Waste paged, max_len, oracle;
  int64_t requests = 0;
  int64_t prefix_hit_tokens = 0;
};

Result simulate(const std::vector<Request>& trace, int block_size, uint64_t seed) {
  paged::KvCacheOptions options;
  options.block_size = block_size;
  options.num_device_blocks = kConcurrency * ((kMaxLen + block_size - 1) / block_size) + 64;  // never preempts
  options.num_cpu_blocks = 0;
  KvCacheManager kv(options);
  std::mt19937_64 token_rng(seed ^ 0x5eedULL);  // random ids: no prefix is shared by chance
  Result result;
  size_t next = 0;
  std::vector<Live> live;
  std::vector<paged::BlockPair> copies;

  auto admit = [&](Live& seq) {
    if (next == trace.size()) {
      std::fprintf(stderr, "trace too short\n");
      std::exit(1);
    }
    seq.id = next;
    seq.request = &trace[next++];
    seq.tokens.resize(seq.request->input);
    for (TokenId& t : seq.tokens) t = static_cast<TokenId>(token_rng() % 32000);
    if (!kv.allocate(seq.id, seq.tokens, seq.request->input)) {
      std::fprintf(stderr, "out of blocks\n");
      std::exit(1);
    }
    kv.mark_computed(seq.id, seq.tokens, seq.request->input);  // prefill
    ++result.requests;
  };

  live.resize(kConcurrency);
  for (Live& seq : live) admit(seq);
  for (int step = 0; step < kSteps; ++step) {
    for (Live& seq : live) {
      const int n = static_cast<int>(seq.tokens.size());
      if (n == seq.request->input + seq.request->output) {  // finished
        kv.free(seq.id);
        admit(seq);
        continue;
      }
      copies.clear();
      if (!kv.reserve(seq.id, n, n + 1, copies)) {
        std::fprintf(stderr, "out of blocks\n");
        std::exit(1);
      }
      seq.tokens.push_back(static_cast<TokenId>(token_rng() % 32000));
      kv.mark_computed(seq.id, seq.tokens, n + 1);  // decode
    }
    if (step < kWarmupSteps || step % kSampleEvery != 0) continue;
    paged::KvMetrics m = kv.metrics();
    double used = 0, oracle = 0;
    for (const Live& seq : live) {
      used += static_cast<double>(seq.tokens.size());
      oracle += seq.request->input + seq.request->output;
    }
    if (static_cast<int64_t>(used) != m.used_slots) {
      std::fprintf(stderr, "used slots disagree: %.0f vs %lld\n", used, static_cast<long long>(m.used_slots));
      std::exit(1);
    }
    result.paged.add(static_cast<double>(m.reserved_slots), used, kConcurrency);
    result.max_len.add(static_cast<double>(kConcurrency) * kMaxLen, used, kConcurrency);
    result.oracle.add(oracle, used, kConcurrency);
  }
  result.prefix_hit_tokens = kv.metrics().prefix_hit_tokens;
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1;
  const std::vector<Request> trace = make_trace(seed, 20000);

  std::vector<std::pair<int, Result>> runs;
  for (int block_size : {8, 16, 32}) runs.emplace_back(block_size, simulate(trace, block_size, seed));

  const int64_t used_requests = runs.front().second.requests;
  double in = 0, out = 0;
  for (int64_t i = 0; i < used_requests; ++i) {
    in += trace[i].input;
    out += trace[i].output;
  }
  std::printf("KV waste, seed %llu: %lld requests (mean input %.1f, mean output %.1f tokens, lognormal sigma 1, "
              "max length %d), %d concurrent sequences, %d steps, %d samples\n\n",
              static_cast<unsigned long long>(seed), static_cast<long long>(used_requests), in / used_requests,
              out / used_requests, kMaxLen, kConcurrency, kSteps, runs.front().second.paged.samples);
  std::printf("%-34s %10s %10s %14s\n", "config", "mean waste", "max waste", "slots per seq");
  for (const auto& [block_size, r] : runs) {
    char name[64];
    std::snprintf(name, sizeof name, "paged, block %d", block_size);
    r.paged.print(name);
  }
  runs.front().second.oracle.print("contiguous, exact in+out (oracle)");
  runs.front().second.max_len.print("contiguous, max length 2048");
  return 0;
}
