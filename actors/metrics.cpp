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

Metrics::Metrics()
    : ttft(latency_buckets()),
      tpot(latency_buckets()),
      e2e(latency_buckets()),
      itl(latency_buckets()),
      queue_time(latency_buckets()),
      prefill_time(latency_buckets()),
      decode_time(latency_buckets()),
      iteration_tokens({1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}) {}

namespace {

// One Prometheus histogram: `name`, its help, the label set of every sample ("" or `key="value"`), its snapshot.
void write_histogram(std::ostringstream& out, const std::string& name, const char* help, const std::string& labels,
                     const Histogram& h) {
  const Histogram::Snapshot s = h.snapshot();
  const std::string sep = labels.empty() ? "" : ",";
  const std::string plain = labels.empty() ? "" : "{" + labels + "}";
  out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << " histogram\n";
  for (size_t i = 0; i < s.bounds.size(); ++i)
    out << name << "_bucket{" << labels << sep << "le=\"" << s.bounds[i] << "\"} " << s.cumulative[i] << '\n';
  out << name << "_bucket{" << labels << sep << "le=\"+Inf\"} " << s.count << '\n'
      << name << "_sum" << plain << ' ' << s.sum << '\n'
      << name << "_count" << plain << ' ' << s.count << '\n';
}

// Prometheus label values escape backslash, quote and newline.
std::string label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

std::string Metrics::vllm_prometheus(const std::string& model_name) const {
  std::ostringstream out;
  const std::string label = "model_name=\"" + label_value(model_name) + "\"";
  const auto series = [&](const char* name, const char* type, const char* help, double value,
                          const std::string& extra = "") {
    // A counter's sample carries the _total suffix (Prometheus' convention, as vLLM's client library writes it).
    out << "# HELP vllm:" << name << ' ' << help << "\n# TYPE vllm:" << name << ' ' << type << "\nvllm:" << name
        << (std::string_view(type) == "counter" ? "_total" : "") << '{' << label << extra << "} " << value << '\n';
  };
  const int64_t total = kv_blocks_total;
  series("num_requests_running", "gauge", "Requests in the running batch.", double(running_requests));
  series("num_requests_waiting", "gauge", "Requests waiting to be scheduled.", double(waiting_requests));
  series("num_requests_swapped", "gauge", "Requests swapped out to CPU memory.", double(swapped_requests));
  series("kv_cache_usage_perc", "gauge", "KV-cache usage (1 = all blocks used).",
         total ? 1.0 - double(kv_blocks_free) / double(total) : 0.0);
  series("prefix_cache_queries", "counter", "Prompt tokens looked up in the prefix cache.", double(prompt_tokens));
  series("prefix_cache_hits", "counter", "Prompt tokens found in the prefix cache.", double(prefix_cache_hit_tokens));
  series("num_preemptions", "counter", "Preemptions.", double(preemptions));
  series("prompt_tokens", "counter", "Prompt tokens.", double(prompt_tokens));
  series("generation_tokens", "counter", "Generated tokens.", double(generation_tokens));
  series("spec_decode_num_drafts", "counter", "Sequences' steps that verified drafts (speculative decoding).",
         double(spec_decode_drafts));
  series("spec_decode_num_draft_tokens", "counter", "Draft tokens verified.", double(spec_decode_draft_tokens));
  series("spec_decode_num_accepted_tokens", "counter", "Draft tokens accepted.", double(spec_decode_accepted_tokens));
  out << "# HELP vllm:request_success Requests finished, by the finish reason of their first output.\n"
      << "# TYPE vllm:request_success counter\n";
  for (const auto& [reason, count] : {std::pair{"stop", &finished_stop}, std::pair{"length", &finished_length},
                                      std::pair{"abort", &finished_abort}})
    out << "vllm:request_success_total{" << label << ",finished_reason=\"" << reason << "\"} " << count->load() << '\n';
  write_histogram(out, "vllm:time_to_first_token_seconds", "Time to first token.", label, ttft);
  write_histogram(out, "vllm:inter_token_latency_seconds", "Time between a request's steps with output.", label, itl);
  write_histogram(out, "vllm:time_per_output_token_seconds", "Time per output token after the first.", label, tpot);
  write_histogram(out, "vllm:e2e_request_latency_seconds", "End-to-end request latency.", label, e2e);
  write_histogram(out, "vllm:request_queue_time_seconds", "Time from arrival to first scheduled.", label, queue_time);
  write_histogram(out, "vllm:request_prefill_time_seconds", "Time from first scheduled to first token.", label,
                  prefill_time);
  write_histogram(out, "vllm:request_decode_time_seconds", "Time from first token to the end.", label, decode_time);
  write_histogram(out, "vllm:iteration_tokens_total", "Tokens computed per engine step.", label, iteration_tokens);
  return out.str();
}

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
  gauge("kv_offload_blocks_total", "Blocks of the prefix cache's CPU tier.", offload_blocks_total);
  gauge("kv_offload_blocks_cached", "Blocks of the CPU tier holding a prefix-cache entry.", offload_blocks_cached);
  gauge("kv_offloaded_blocks_total", "Evicted device blocks kept in the CPU tier.", offloaded_blocks, "counter");
  gauge("kv_disk_blocks_total", "Blocks the disk tier may hold.", disk_blocks_total);
  gauge("kv_disk_blocks_stored", "Blocks the disk tier holds.", disk_blocks_stored);
  gauge("kv_disk_saved_blocks_total", "CPU-tier blocks written to the disk tier.", disk_saved_blocks, "counter");
  const auto per_tier = [&](const char* name, const char* help, int64_t device, int64_t cpu, int64_t disk) {
    out << "# HELP paged_" << name << ' ' << help << "\n# TYPE paged_" << name << " counter\n";
    for (const auto& [tier, v] : {std::pair{"device", device}, std::pair{"cpu", cpu}, std::pair{"disk", disk}})
      out << "paged_" << name << "{tier=\"" << tier << "\"} " << v << '\n';
  };
  per_tier("kv_tier_queries_total",
           "Prompt tokens looked up in each tier of the prefix cache (cpu: device misses; disk: cpu misses).",
           prompt_tokens, offload_query_tokens, disk_query_tokens);
  // A disk hit is loaded into the CPU tier and counted there again when it is promoted.
  per_tier("kv_tier_hits_total", "Prompt tokens found in each tier of the prefix cache.",
           prefix_cache_hit_tokens - offload_hit_tokens, offload_hit_tokens, disk_hit_tokens);
  gauge("kv_evicted_blocks_total", "Cached KV blocks evicted from the prefix cache to make room.", evicted_blocks,
        "counter");
  gauge("prompt_tokens_computed_total", "Prompt tokens whose KV was computed.", prompt_tokens_computed, "counter");
  gauge("prompt_tokens_total", "Prompt tokens of finished and running requests.", prompt_tokens, "counter");
  gauge("generation_tokens_total", "Generated tokens.", generation_tokens, "counter");
  gauge("request_success_total", "Requests finished.", requests_finished, "counter");
  gauge("request_aborted_total", "Requests aborted.", requests_aborted, "counter");
  gauge("request_moved_total", "Requests moved to another replica when theirs was lost.", requests_moved, "counter");
  gauge("engine_steps_total", "Engine steps executed.", steps, "counter");
  gauge("engine_steps_deferred_total", "Steps sent before the step ahead of them returned (async scheduling).",
        steps_deferred, "counter");
  gauge("spec_decode_draft_tokens_total", "Draft tokens verified (speculative decoding).", spec_decode_draft_tokens,
        "counter");
  gauge("spec_decode_accepted_tokens_total", "Draft tokens accepted.", spec_decode_accepted_tokens, "counter");
  gauge("cuda_graphs_captured_total", "CUDA graphs captured (each decode shape on its first step).", graphs_captured,
        "counter");
  out << "# HELP paged_cuda_graph_capture_seconds_total Time spent capturing CUDA graphs.\n"
      << "# TYPE paged_cuda_graph_capture_seconds_total counter\npaged_cuda_graph_capture_seconds_total "
      << double(graph_capture_us) * 1e-6 << '\n';
  auto hist = [&](const char* name, const char* help, const Histogram& h) {
    write_histogram(out, std::string("paged_") + name, help, "", h);
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

void LoraUse::add(const Counts& running, const Counts& waiting) {
  std::lock_guard lock(mu_);
  for (auto [into, from] : {std::pair{&running_, &running}, std::pair{&waiting_, &waiting}})
    for (const auto& [id, n] : *from)
      if (((*into)[id] += n) == 0) into->erase(id);
}

std::pair<std::vector<int32_t>, std::vector<int32_t>> LoraUse::adapters() const {
  std::lock_guard lock(mu_);
  std::pair<std::vector<int32_t>, std::vector<int32_t>> out;
  for (const auto& [id, n] : running_)
    if (n > 0) out.first.push_back(id);
  for (const auto& [id, n] : waiting_)
    if (n > 0) out.second.push_back(id);
  return out;
}

void ReplicaMetricsWriter::set_lora_use(LoraUse::Counts running, LoraUse::Counts waiting) {
  LoraPublished& last = *lora_published_;
  if (running == last.running && waiting == last.waiting) return;
  // The change: the new counts, less the old.
  LoraUse::Counts d_running = running, d_waiting = waiting;
  for (const auto& [id, n] : last.running) d_running[id] -= n;
  for (const auto& [id, n] : last.waiting) d_waiting[id] -= n;
  replica_->lora_use.add(d_running, d_waiting);
  total_->lora_use.add(d_running, d_waiting);
  last = {std::move(running), std::move(waiting)};
}

std::string lora_requests_info(const std::vector<std::string>& running, const std::vector<std::string>& waiting,
                               int max_lora, double now) {
  const auto joined = [](const std::vector<std::string>& names) {
    std::string s;
    for (const std::string& n : names) s += (s.empty() ? "" : ",") + n;
    return label_value(s);
  };
  std::ostringstream out;
  out << "# HELP vllm:lora_requests_info Running stats on lora requests.\n# TYPE vllm:lora_requests_info gauge\n"
      << "vllm:lora_requests_info{max_lora=\"" << max_lora << "\",running_lora_adapters=\"" << joined(running)
      << "\",waiting_lora_adapters=\"" << joined(waiting) << "\"} " << std::fixed << now << '\n';
  return out.str();
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
