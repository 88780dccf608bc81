// The arithmetic of the benchmarks (`paged bench`, `paged bench serve`), free of I/O: summary statistics as numpy
// computes them, vLLM's serving metrics and goodput, the arrival schedule, and the result tables.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace paged::bench {

/// The p-th percentile (p in [0, 100]) of `values` with linear interpolation between the closest ranks, as numpy's
/// default; 0 for no values (vLLM summarises an empty list as [0]).
double percentile(std::vector<double> values, double p);

/// Mean, median, population standard deviation (numpy's std, ddof 0) and the asked percentiles of a list; all 0
/// for an empty one.
struct Summary {
  double mean = 0, median = 0, std = 0;
  std::vector<std::pair<double, double>> percentiles;  // (p, value)
};
/// `values` summarised with `percentiles` (each in [0, 100]).
Summary summarize(const std::vector<double>& values, const std::vector<double>& percentiles);

/// What one benchmark request measured, times in seconds from the moment it was sent.
struct RequestResult {
  bool success = false;
  int prompt_len = 0;         // the dataset's prompt length in tokens
  int output_tokens = 0;      // completion tokens, from the usage chunk
  double ttft = 0;            // the first chunk with a choice
  double latency = 0;         // the last chunk with a choice (vLLM's E2EL)
  std::vector<double> itl;    // gaps between consecutive chunks with a choice
  std::string generated_text;
  std::string error;          // why it failed; empty on success
};

/// Service-level objectives of --goodput, in milliseconds; a request is good when it meets every one given.
struct Slo {
  std::optional<double> ttft_ms, tpot_ms, e2el_ms;
  bool any() const { return ttft_ms || tpot_ms || e2el_ms; }
};
/// Parses vLLM's --goodput items "KEY:MS" (KEY ttft, tpot or e2el; MS >= 0); throws std::invalid_argument naming
/// the bad item.
Slo parse_slo(const std::vector<std::string>& items);

/// vLLM's serving metrics over the finished requests (calculate_metrics of benchmark_serving.py): TTFT, TPOT
/// ((latency - ttft) / (output_tokens - 1), only for requests of more than one token), ITL (every gap of every
/// request) and E2EL summarised in milliseconds; throughputs over the benchmark's duration.
struct ServingMetrics {
  int completed = 0, failed = 0;
  int64_t total_input = 0, total_output = 0;
  double duration_s = 0;
  double request_throughput = 0, request_goodput = 0, output_throughput = 0, total_token_throughput = 0;
  Summary ttft_ms, tpot_ms, itl_ms, e2el_ms;
};
/// `results` of a run that took `duration_s` (> 0); goodput counts the successful requests that meet `slo` (a
/// request of one token has TPOT 0 there, as in vLLM).
ServingMetrics serving_metrics(const std::vector<RequestResult>& results, double duration_s, const Slo& slo,
                               const std::vector<double>& percentiles);

/// When each of `n` requests is sent, in seconds from the start: the first at 0, then gaps drawn from a gamma
/// distribution of shape `burstiness` and mean 1 / `rate` (burstiness 1: a Poisson process), seeded; all 0 for an
/// infinite rate (a burst). rate > 0, burstiness > 0.
std::vector<double> arrival_times(int n, double rate, double burstiness, uint64_t seed);

/// One row of a result table as vLLM prints it: the label left-aligned in 40 columns, a space, the value
/// left-aligned in 10.
std::string table_row(const std::string& label, const std::string& value);
/// `value` with two decimals.
std::string fixed2(double value);
/// `title` centred in 50 columns of `fill`, as Python's "{:=^50}" ("==== Title ====" for " Title ").
std::string table_title(const std::string& title, char fill);

/// How vLLM names a percentile in its keys and rows: "99" for 99, "99.9" for 99.9.
std::string percentile_name(double p);

/// What the serving table shows besides the metrics.
struct ServingTableOptions {
  std::optional<int> max_concurrency;
  std::optional<double> request_rate;  // absent: a burst
  bool goodput = false;                // a goodput line (--goodput given)
  std::vector<std::string> metrics;    // the sections shown, of ttft, tpot, itl, e2el (printed in that order)
};
/// vLLM's "Serving Benchmark Result" table, lines ending in '\n'.
std::string serving_table(const ServingMetrics& m, const ServingTableOptions& options);

}  // namespace paged::bench
