#include "http/dashboard.h"

#include <cctype>

#include <boost/json.hpp>

namespace paged::server {
namespace json = boost::json;

std::string percent_decoded(std::string_view text) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && hex(text[i + 1]) >= 0 && hex(text[i + 2]) >= 0) {
      out += static_cast<char>(hex(text[i + 1]) * 16 + hex(text[i + 2]));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

namespace {

// The value of `name` among `separator`-separated NAME=VALUE pairs (spaces before a name skipped).
std::string pair_value(std::string_view pairs, char separator, std::string_view name) {
  while (!pairs.empty()) {
    const size_t end = pairs.find(separator);
    std::string_view pair = pairs.substr(0, end);
    while (!pair.empty() && pair.front() == ' ') pair.remove_prefix(1);
    const size_t eq = pair.find('=');
    if (eq != std::string_view::npos && pair.substr(0, eq) == name) return percent_decoded(pair.substr(eq + 1));
    if (end == std::string_view::npos) break;
    pairs.remove_prefix(end + 1);
  }
  return {};
}

}  // namespace

DashboardFigures dashboard_figures(const Metrics& m) {
  DashboardFigures f;
  f.running = m.running_requests;
  f.waiting = m.waiting_requests;
  f.swapped = m.swapped_requests;
  f.generation_tokens = m.generation_tokens;
  f.prompt_tokens = m.prompt_tokens;
  f.prefix_hit_tokens = m.prefix_cache_hit_tokens;
  f.preemptions = m.preemptions;
  const Histogram::Snapshot ttft = m.ttft.snapshot(), tpot = m.tpot.snapshot();
  f.ttft_sum = ttft.sum;
  f.ttft_count = ttft.count;
  f.tpot_sum = tpot.sum;
  f.tpot_count = tpot.count;
  return f;
}

std::string dashboard_frame(const std::vector<ReplicaKv>& replicas, const DashboardFigures& f, int64_t time_ms,
                            uint64_t seq) {
  json::array reps;
  for (const ReplicaKv& r : replicas) {
    json::array tiers;
    for (const TierSnapshot& t : r.kv.tiers) {
      json::array runs;
      runs.reserve(2 * t.runs.size());
      for (const CellRun& run : t.runs) {
        runs.emplace_back(run.cell);
        runs.emplace_back(run.count);
      }
      tiers.push_back(json::object{{"name", t.name}, {"blocks", t.num_blocks}, {"runs", std::move(runs)}});
    }
    json::array seqs;
    for (const SeqSnapshot& s : r.kv.seqs)
      seqs.push_back(json::array{s.seq, s.swapped ? 1 : 0, s.num_blocks, s.num_computed});
    reps.push_back(json::object{{"index", r.index},
                                {"address", r.address.empty() ? "local" : r.address},
                                {"block_size", r.kv.block_size},
                                {"tiers", std::move(tiers)},
                                {"seqs", std::move(seqs)}});
  }
  return json::serialize(json::object{
      {"type", "snapshot"},
      {"seq", seq},
      {"time_ms", time_ms},
      {"replicas", std::move(reps)},
      {"queues", json::object{{"running", f.running}, {"waiting", f.waiting}, {"swapped", f.swapped}}},
      {"totals", json::object{{"generation_tokens", f.generation_tokens},
                              {"prompt_tokens", f.prompt_tokens},
                              {"prefix_hit_tokens", f.prefix_hit_tokens},
                              {"preemptions", f.preemptions},
                              {"ttft_sum", f.ttft_sum},
                              {"ttft_count", f.ttft_count},
                              {"tpot_sum", f.tpot_sum},
                              {"tpot_count", f.tpot_count}}}});
}

std::string query_param(std::string_view target, std::string_view name) {
  const size_t q = target.find('?');
  if (q == std::string_view::npos) return {};
  return pair_value(target.substr(q + 1), '&', name);
}

std::vector<std::pair<std::string, std::string>> query_params(std::string_view target) {
  std::vector<std::pair<std::string, std::string>> params;
  const size_t q = target.find('?');
  if (q == std::string_view::npos) return params;
  std::string_view pairs = target.substr(q + 1);
  while (!pairs.empty()) {
    const size_t end = pairs.find('&');
    const std::string_view pair = pairs.substr(0, end);
    const size_t eq = pair.find('=');
    if (!pair.empty())
      params.emplace_back(percent_decoded(pair.substr(0, eq)),
                          eq == std::string_view::npos ? std::string() : percent_decoded(pair.substr(eq + 1)));
    if (end == std::string_view::npos) break;
    pairs.remove_prefix(end + 1);
  }
  return params;
}

std::string dashboard_key_cookie(std::string_view key) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string value;
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      value += static_cast<char>(c);
    } else {
      value += '%';
      value += kHex[c >> 4];
      value += kHex[c & 15];
    }
  }
  return std::string(kDashboardKeyCookie) + "=" + value + "; Path=/dashboard; HttpOnly; SameSite=Strict";
}

std::string cookie_value(std::string_view cookie_header, std::string_view name) {
  return pair_value(cookie_header, ';', name);
}

}  // namespace paged::server
