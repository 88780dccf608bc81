// Counters, gauges and histograms of the engine, kept in one place, read by /metrics and `generate --stats`.
// Thread-safe: actors update, HTTP sessions read.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "model/scheduling/step_profile.h"

namespace paged {

/// Fixed-bucket histogram (Prometheus semantics: cumulative buckets, sum, count).
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // per bound
    uint64_t count = 0;
    double sum = 0.0;
    /// Approximate quantile by linear interpolation inside the bucket.
    double quantile(double q) const;
  };
  Snapshot snapshot() const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  uint64_t count_ = 0;
  double sum_ = 0.0;
};

/// Requests per LoRA adapter id, running and waiting (vLLM's vllm:lora_requests_info). Thread-safe.
class LoraUse {
 public:
  using Counts = std::map<int32_t, int64_t>;  // adapter id -> requests (none listed: 0)
  /// Adds `running` and `waiting` (which may be negative: a replica's change) to the counts.
  void add(const Counts& running, const Counts& waiting);
  /// The adapters with running requests, and with waiting ones, each in id order.
  std::pair<std::vector<int32_t>, std::vector<int32_t>> adapters() const;

 private:
  mutable std::mutex mu_;
  Counts running_, waiting_;
};

struct Metrics {
  Metrics();
  using Gauge = std::atomic<int64_t>;
  using Counter = std::atomic<int64_t>;
  Gauge waiting_requests{0}, running_requests{0}, swapped_requests{0};  // requests by queue
  Gauge running_seqs{0};
  Gauge kv_blocks_total{0}, kv_blocks_free{0}, kv_blocks_cached{0};  // device pool; cached-but-free blocks are free
  Gauge cpu_blocks_total{0}, cpu_blocks_free{0};                      // CPU swap pool
  Counter preemptions{0};
  Counter swapped_out_blocks{0}, swapped_in_blocks{0};
  Counter prefix_cache_hit_tokens{0};      // in any tier (device or CPU)
  Gauge offload_blocks_total{0}, offload_blocks_cached{0};  // the prefix cache's CPU tier (--kv-offloading-size)
  Counter offload_query_tokens{0}, offload_hit_tokens{0};   // prompt tokens looked up / found in the CPU tier
  Counter offloaded_blocks{0};             // device blocks demoted to the CPU tier
  Gauge disk_blocks_total{0}, disk_blocks_stored{0};    // the disk tier (--kv-disk-dir, --kv-disk-size)
  Counter disk_query_tokens{0}, disk_hit_tokens{0};     // prompt tokens looked up on disk / loaded from it
  Counter disk_saved_blocks{0};            // CPU-tier blocks written to disk
  Counter evicted_blocks{0};               // cached device blocks evicted from the prefix cache to make room
  Counter prompt_tokens_computed{0}, prompt_tokens{0}, generation_tokens{0};
  Counter requests_finished{0}, requests_aborted{0};
  Counter requests_moved{0};               // moved to another replica when theirs was lost
  Counter steps{0};
  Counter steps_deferred{0};               // sent before the step ahead of them returned (two steps in flight)
  Counter step_time_us{0};                 // summed steps' times: to all replies, from when it was sent or the
                                           // results of the step ahead of it came, whichever is later
  // Speculative decoding (vLLM's spec_decode_*): sequences' steps that verified drafts, the drafts, those accepted.
  Counter spec_decode_drafts{0}, spec_decode_draft_tokens{0}, spec_decode_accepted_tokens{0};
  Counter graphs_captured{0}, graph_capture_us{0};  // CUDA graphs this process's runners captured, and the time
  Gauge peak_running_seqs{0};
  Gauge engine_ready{0};                   // 1 while the engine takes requests (a replica's: while it serves)
  Gauge unqueued_requests{0};              // submitted, not yet on a replica's queue (the waiting limit counts them)
  Gauge kv_blocks_peak_used{0};            // most device blocks in use at once (kv_blocks_total - kv_blocks_free)
  // KV waste over the run: reserved and used (computed) device slots summed over every planned step, so that
  // 1 - used / reserved is the step-averaged waste (KvMetrics::kv_waste at plan time).
  Counter kv_reserved_slots_sum{0}, kv_used_slots_sum{0};
  Counter finished_stop{0}, finished_length{0}, finished_abort{0};  // requests by the finish of their first output
  // histograms, seconds
  Histogram ttft;
  Histogram tpot;
  Histogram e2e;
  Histogram itl;           // between a request's consecutive steps with output
  Histogram queue_time;    // arrival to first scheduled
  Histogram prefill_time;  // first scheduled to first token
  Histogram decode_time;   // first token to the end
  StepProfile step_profile;  // the engine's steps by kind: device busy and idle, host time (paged bench --profile)
  Histogram iteration_tokens;  // tokens computed per engine step (a count, not seconds)
  LoraUse lora_use;            // requests per LoRA adapter, running and waiting

  /// Prometheus text exposition, every name prefixed paged_.
  std::string prometheus() const;
  /// The same figures under vLLM's series names (vllm:num_requests_running, vllm:kv_cache_usage_perc, ...), each
  /// labelled model_name="NAME", so that dashboards made for vLLM read them unchanged.
  std::string vllm_prometheus(const std::string& model_name) const;
};

/// Where the actors of one replica (its scheduler and memory manager) write: the replica's own figures and the
/// engine's totals, the sums over every replica, kept in step. Histograms are the engine's only.
class ReplicaMetricsWriter {
 public:
  using Field = Metrics::Gauge Metrics::*;
  ReplicaMetricsWriter(Metrics* total, Metrics* replica) : total_(total), replica_(replica) {}
  /// The replica's gauge becomes `value`; the total moves by the difference.
  void set(Field gauge, int64_t value) { total_->*gauge += value - (replica_->*gauge).exchange(value); }
  /// The replica's counter and the total grow by n.
  void add(Field counter, int64_t n) {
    replica_->*counter += n;
    total_->*counter += n;
  }
  /// Raises `peak` of the replica and of the total to what `of` says they hold now, where that is more.
  void raise_peak(Field peak, int64_t (*of)(const Metrics&));
  /// Sets `gauges` to 0 (an actor of the replica ends: what it published leaves the totals; counters stay).
  void clear(std::initializer_list<Field> gauges);
  /// The replica's requests per LoRA adapter are now `running` and `waiting`; the total moves by the difference.
  void set_lora_use(LoraUse::Counts running, LoraUse::Counts waiting);
  Metrics& total() const { return *total_; }

 private:
  Metrics* total_;
  Metrics* replica_;
  // What set_lora_use last gave, shared by the writer's copies (the scheduler's, and the one that clears what it
  // published when it ends).
  struct LoraPublished {
    LoraUse::Counts running, waiting;
  };
  std::shared_ptr<LoraPublished> lora_published_ = std::make_shared<LoraPublished>();
};

/// vLLM's vllm:lora_requests_info gauge: the names of the LoRA adapters with running and with waiting requests, each
/// joined by commas, and max_lora as labels; the value `now` (seconds since the epoch, as vLLM's).
std::string lora_requests_info(const std::vector<std::string>& running, const std::vector<std::string>& waiting,
                               int max_lora, double now);

/// One replica as /metrics lists it: its index, where it runs ("local" or HOST:PORT) and its own figures.
struct ReplicaView {
  size_t index = 0;
  std::string address;
  const Metrics* metrics = nullptr;
};

/// Prometheus text of the replicas' own figures, labelled replica="INDEX",address="...": paged_replica_up (1 serving,
/// 0 lost), running / waiting requests, free and total KV blocks, steps.
std::string replicas_prometheus(const std::vector<ReplicaView>& replicas);

}  // namespace paged
