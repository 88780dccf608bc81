#include "actors/metrics.h"

#include <algorithm>
#include <sstream>

namespace paged {

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  std::lock_guard lock(mu_);
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  ++counts_[i];
  ++count_;
  sum_ += value;
}

Histogram::Snapshot Histogram::snapshot() const {
  std::lock_guard lock(mu_);
  Snapshot s;
  s.bounds = bounds_;
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) s.cumulative.push_back(cum += counts_[i]);
  s.count = count_;
  s.sum = sum_;
  return s;
}

double Histogram::Snapshot::quantile(double q) const {
  if (count == 0) return 0.0;
  const double rank = q * static_cast<double>(count);
  double lower = 0.0;
  uint64_t below = 0;
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (static_cast<double>(cumulative[i]) >= rank) {
      const uint64_t in_bucket = cumulative[i] - below;
      const double frac = in_bucket ? (rank - static_cast<double>(below)) / static_cast<double>(in_bucket) : 1.0;
      return lower + (bounds[i] - lower) * frac;
    }
    below = cumulative[i];
    lower = bounds[i];
  }
  return bounds.empty() ? 0.0 : bounds.back();  // in the +Inf bucket
}

namespace {
std::vector<double> latency_buckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
          1.0,   2.5,    5.0,   7.5,  10.0, 20.0, 40.0, 80.0};
}
}  // namespace

Metrics::Metrics() : ttft(latency_buckets()), tpot(latency_buckets()), e2e(latency_buckets()) {}

std::string Metrics::prometheus() const {
  std::ostringstream out;
  auto gauge = [&](const char* name, const char* help, int64_t v, const char* type = "gauge") {
    out << "# HELP paged_" << name << ' ' << help << "\n# TYPE paged_" << name << ' ' << type << "\npaged_" << name
        << ' ' << v << '\n';
  };
  gauge("num_requests_running", "Requests in the running batch.", running_requests);
  gauge("num_requests_waiting", "Requests waiting to be scheduled.", waiting_requests);
  gauge("num_requests_swapped", "Requests swapped out to CPU memory.", swapped_requests);
  gauge("num_seqs_running", "Sequences in the running batch.", running_seqs);
  gauge("kv_blocks_total", "KV-cache blocks of the device pool.", kv_blocks_total);
  gauge("kv_blocks_free", "Free KV-cache blocks of the device pool (cached-but-free count as free).", kv_blocks_free);
  gauge("kv_blocks_cached", "Free blocks still holding a prefix-cache entry.", kv_blocks_cached);
  gauge("cpu_blocks_total", "Blocks of the CPU swap pool.", cpu_blocks_total);
  gauge("cpu_blocks_free", "Free blocks of the CPU swap pool.", cpu_blocks_free);
  const int64_t total = kv_blocks_total;
  out << "# HELP paged_kv_cache_usage_perc KV-cache usage (0-1).\n# TYPE paged_kv_cache_usage_perc gauge\n"
      << "paged_kv_cache_usage_perc " << (total ? 1.0 - double(kv_blocks_free) / double(total) : 0.0) << '\n';
  gauge("peak_running_seqs", "Largest running batch seen.", peak_running_seqs);
  gauge("engine_ready", "1 while the engine takes requests, 0 once its executor is gone.", engine_ready);
  gauge("num_preemptions_total", "Preemptions (swap or recompute).", preemptions, "counter");
  gauge("swapped_out_blocks_total", "Blocks swapped out to CPU.", swapped_out_blocks, "counter");
  gauge("swapped_in_blocks_total", "Blocks swapped back in.", swapped_in_blocks, "counter");
  gauge("prefix_cache_hit_tokens_total", "Prompt tokens served from the prefix cache.", prefix_cache_hit_tokens,
        "counter");
  gauge("kv_evicted_blocks_total", "Cached KV blocks evicted from the prefix cache to make room.", evicted_blocks,
        "counter");
  gauge("prompt_tokens_computed_total", "Prompt tokens whose KV was computed.", prompt_tokens_computed, "counter");
  gauge("prompt_tokens_total", "Prompt tokens of finished and running requests.", prompt_tokens, "counter");
  gauge("generation_tokens_total", "Generated tokens.", generation_tokens, "counter");
  gauge("request_success_total", "Requests finished.", requests_finished, "counter");
  gauge("request_aborted_total", "Requests aborted.", requests_aborted, "counter");
  gauge("request_moved_total", "Requests moved to another replica when theirs was lost.", requests_moved, "counter");
  gauge("engine_steps_total", "Engine steps executed.", steps, "counter");
  auto hist = [&](const char* name, const char* help, const Histogram& h) {
    Histogram::Snapshot s = h.snapshot();
    out << "# HELP paged_" << name << ' ' << help << "\n# TYPE paged_" << name << " histogram\n";
    for (size_t i = 0; i < s.bounds.size(); ++i)
      out << "paged_" << name << "_bucket{le=\"" << s.bounds[i] << "\"} " << s.cumulative[i] << '\n';
    out << "paged_" << name << "_bucket{le=\"+Inf\"} " << s.count << '\n'
        << "paged_" << name << "_sum " << s.sum << '\n'
        << "paged_" << name << "_count " << s.count << '\n';
  };
  hist("time_to_first_token_seconds", "Time to first token.", ttft);
  hist("time_per_output_token_seconds", "Time per output token after the first.", tpot);
  hist("e2e_request_latency_seconds", "End-to-end request latency.", e2e);
  return out.str();
}

void ReplicaMetricsWriter::raise_peak(Field peak, int64_t (*of)(const Metrics&)) {
  for (Metrics* m : {replica_, total_})
    if (const int64_t now = of(*m); now > m->*peak) m->*peak = now;
}

void ReplicaMetricsWriter::clear(std::initializer_list<Field> gauges) {
  for (Field gauge : gauges) set(gauge, 0);
}

std::string replicas_prometheus(const std::vector<ReplicaView>& replicas) {
  std::ostringstream out;
  const auto series = [&](const char* name, const char* help, const char* type, int64_t (*of)(const Metrics&)) {
    out << "# HELP paged_replica_" << name << ' ' << help << "\n# TYPE paged_replica_" << name << ' ' << type << '\n';
    for (const ReplicaView& r : replicas)
      out << "paged_replica_" << name << "{replica=\"" << r.index << "\",address=\"" << r.address << "\"} "
          << of(*r.metrics) << '\n';
  };
  series("up", "1 while the replica serves, 0 while it is lost.", "gauge",
         [](const Metrics& m) -> int64_t { return m.engine_ready; });
  series("num_requests_running", "Requests in the replica's running batch.", "gauge",
         [](const Metrics& m) -> int64_t { return m.running_requests; });
  series("num_requests_waiting", "Requests waiting on the replica.", "gauge",
         [](const Metrics& m) -> int64_t { return m.waiting_requests; });
  series("kv_blocks_free", "Free KV-cache blocks of the replica's device pool.", "gauge",
         [](const Metrics& m) -> int64_t { return m.kv_blocks_free; });
  series("kv_blocks_total", "KV-cache blocks of the replica's device pool.", "gauge",
         [](const Metrics& m) -> int64_t { return m.kv_blocks_total; });
  series("steps_total", "Steps the replica executed (rate() gives steps/s).", "counter",
         [](const Metrics& m) -> int64_t { return m.steps; });
  return out.str();
}

}  // namespace paged
