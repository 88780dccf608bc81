#include "tools/bench/bench_stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <stdexcept>

namespace paged::bench {

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = p / 100.0 * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (rank - static_cast<double>(lo));
}

Summary summarize(const std::vector<double>& values, const std::vector<double>& percentiles) {
  Summary s;
  if (!values.empty()) {
    double sum = 0;
    for (double v : values) sum += v;
    s.mean = sum / static_cast<double>(values.size());
    double squares = 0;
    for (double v : values) squares += (v - s.mean) * (v - s.mean);
    s.std = std::sqrt(squares / static_cast<double>(values.size()));
  }
  s.median = percentile(values, 50);
  for (double p : percentiles) s.percentiles.emplace_back(p, percentile(values, p));
  return s;
}

Slo parse_slo(const std::vector<std::string>& items) {
  Slo slo;
  for (const std::string& item : items) {
    const size_t colon = item.find(':');
    const std::string key = item.substr(0, colon);
    double ms = -1;
    if (colon != std::string::npos) {
      try {
        size_t used = 0;
        ms = std::stod(item.substr(colon + 1), &used);
        if (used != item.size() - colon - 1) ms = -1;
      } catch (const std::exception&) {
        ms = -1;
      }
    }
    if (!(ms >= 0) || !std::isfinite(ms))
      throw std::invalid_argument("'" + item + "': an SLO is KEY:MILLISECONDS with a number >= 0");
    if (key == "ttft") slo.ttft_ms = ms;
    else if (key == "tpot") slo.tpot_ms = ms;
    else if (key == "e2el") slo.e2el_ms = ms;
    else throw std::invalid_argument("'" + item + "': the SLO names one of ttft, tpot, e2el");
  }
  return slo;
}

ServingMetrics serving_metrics(const std::vector<RequestResult>& results, double duration_s, const Slo& slo,
                               const std::vector<double>& percentiles) {
  ServingMetrics m;
  m.duration_s = duration_s;
  std::vector<double> ttfts, tpots, itls, e2els;
  int good = 0;
  for (const RequestResult& r : results) {
    if (!r.success) {
      ++m.failed;
      continue;
    }
    ++m.completed;
    m.total_input += r.prompt_len;
    m.total_output += r.output_tokens;
    double tpot = 0;  // a request of one token counts as TPOT 0 for goodput, and not in the TPOT summary
    if (r.output_tokens > 1) {
      tpot = (r.latency - r.ttft) / (r.output_tokens - 1);
      tpots.push_back(tpot * 1000);
    }
    ttfts.push_back(r.ttft * 1000);
    e2els.push_back(r.latency * 1000);
    itls.insert(itls.end(), r.itl.begin(), r.itl.end());
    if (slo.any() && (!slo.ttft_ms || r.ttft * 1000 <= *slo.ttft_ms) && (!slo.tpot_ms || tpot * 1000 <= *slo.tpot_ms) &&
        (!slo.e2el_ms || r.latency * 1000 <= *slo.e2el_ms))
      ++good;
  }
  for (double& gap : itls) gap *= 1000;
  m.request_throughput = m.completed / duration_s;
  m.request_goodput = good / duration_s;
  m.output_throughput = static_cast<double>(m.total_output) / duration_s;
  m.total_token_throughput = static_cast<double>(m.total_input + m.total_output) / duration_s;
  m.ttft_ms = summarize(ttfts, percentiles);
  m.tpot_ms = summarize(tpots, percentiles);
  m.itl_ms = summarize(itls, percentiles);
  m.e2el_ms = summarize(e2els, percentiles);
  return m;
}

std::vector<double> arrival_times(int n, double rate, double burstiness, uint64_t seed) {
  std::vector<double> times(std::max(n, 0), 0.0);
  if (std::isinf(rate)) return times;
  std::mt19937_64 rng(seed);
  std::gamma_distribution<double> gap(burstiness, 1.0 / (rate * burstiness));
  for (int i = 1; i < n; ++i) times[i] = times[i - 1] + gap(rng);
  return times;
}

std::string table_row(const std::string& label, const std::string& value) {
  std::string row = label, shown = value;
  if (row.size() < 40) row.resize(40, ' ');
  if (shown.size() < 10) shown.resize(10, ' ');
  return row + " " + shown + "\n";
}

std::string fixed2(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%.2f", value);
  return text;
}

std::string table_title(const std::string& title, char fill) {
  if (title.size() >= 50) return title + "\n";
  const size_t left = (50 - title.size()) / 2;
  return std::string(left, fill) + title + std::string(50 - title.size() - left, fill) + "\n";
}

std::string percentile_name(double p) {
  if (p == std::floor(p)) return std::to_string(static_cast<int64_t>(p));
  char text[32];
  std::snprintf(text, sizeof text, "%g", p);
  return text;
}

std::string serving_table(const ServingMetrics& m, const ServingTableOptions& options) {
  std::string t = table_title(" Serving Benchmark Result ", '=');
  t += table_row("Successful requests:", std::to_string(m.completed));
  t += table_row("Failed requests:", std::to_string(m.failed));
  if (options.max_concurrency) t += table_row("Maximum request concurrency:", std::to_string(*options.max_concurrency));
  if (options.request_rate) t += table_row("Request rate configured (RPS):", fixed2(*options.request_rate));
  t += table_row("Benchmark duration (s):", fixed2(m.duration_s));
  t += table_row("Total input tokens:", std::to_string(m.total_input));
  t += table_row("Total generated tokens:", std::to_string(m.total_output));
  t += table_row("Request throughput (req/s):", fixed2(m.request_throughput));
  if (options.goodput) t += table_row("Request goodput (req/s):", fixed2(m.request_goodput));
  t += table_row("Output token throughput (tok/s):", fixed2(m.output_throughput));
  t += table_row("Total Token throughput (tok/s):", fixed2(m.total_token_throughput));
  struct Section {
    const char *key, *name, *header;
    const Summary* summary;
  };
  const Section sections[] = {{"ttft", "TTFT", "Time to First Token", &m.ttft_ms},
                              {"tpot", "TPOT", "Time per Output Token (excl. 1st token)", &m.tpot_ms},
                              {"itl", "ITL", "Inter-token Latency", &m.itl_ms},
                              {"e2el", "E2EL", "End-to-end Latency", &m.e2el_ms}};
  for (const Section& s : sections) {
    if (std::find(options.metrics.begin(), options.metrics.end(), s.key) == options.metrics.end()) continue;
    const std::string unit = std::string(" ") + s.name + " (ms):";
    t += table_title(s.header, '-');
    t += table_row("Mean" + unit, fixed2(s.summary->mean));
    t += table_row("Median" + unit, fixed2(s.summary->median));
    for (const auto& [p, value] : s.summary->percentiles)
      t += table_row(std::string("P").append(percentile_name(p)) + unit, fixed2(value));
  }
  return t + std::string(50, '=') + "\n";
}

}  // namespace paged::bench
