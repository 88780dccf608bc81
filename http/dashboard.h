// The live dashboard (GET /dashboard): its static page, the frames its WebSocket (/dashboard/ws) pushes, and how a
// browser gives the API key, which it cannot put in a WebSocket's headers.
//   frame: {"type":"snapshot","seq":N,"time_ms":T,
//           "replicas":[{"index":I,"address":"local"|HOST:PORT,"block_size":B,
//                        "tiers":[{"name":"device"|"swap"|"cpu"|"disk","blocks":N,"runs":[CELL,COUNT,...]}],
//                        "seqs":[[SEQ_ID,SWAPPED(0|1),BLOCKS,COMPUTED_TOKENS],...]}],
//           "queues":{"running":R,"waiting":W,"swapped":S},
//           "totals":{"generation_tokens","prompt_tokens","prefix_hit_tokens","preemptions",
//                     "ttft_sum","ttft_count","tpot_sum","tpot_count"}}   (cumulative: the page plots differences)
// CELL is a block's cell byte (model/kv/kv_snapshot.h: 0 free, 1 cached, 2 shared, 3 busy, 4.. one sequence).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "actors/engine.h"

namespace paged::server {

/// The figures of a frame that come from the engine's metrics rather than the KV bookkeeping.
struct DashboardFigures {
  int64_t running = 0, waiting = 0, swapped = 0;  // requests by queue
  int64_t generation_tokens = 0, prompt_tokens = 0, prefix_hit_tokens = 0, preemptions = 0;  // cumulative
  double ttft_sum = 0.0, tpot_sum = 0.0;          // seconds, cumulative
  uint64_t ttft_count = 0, tpot_count = 0;
};

/// The figures as `metrics` holds them now.
DashboardFigures dashboard_figures(const Metrics& metrics);

/// The JSON text of one pushed frame (the shape above).
std::string dashboard_frame(const std::vector<ReplicaKv>& replicas, const DashboardFigures& figures, int64_t time_ms,
                            uint64_t seq);

/// `text` (a path segment, a query value) with every %XX replaced by its byte; a malformed escape is kept as it is.
std::string percent_decoded(std::string_view text);

/// The value of query parameter `name` in a request target ("/dashboard?key=K"), percent-decoded; empty when absent.
std::string query_param(std::string_view target, std::string_view name);
/// Every query parameter of a request target as (name, value), percent-decoded, in order.
std::vector<std::pair<std::string, std::string>> query_params(std::string_view target);
/// The value of cookie `name` in a Cookie header ("a=1; paged_key=K"), percent-decoded; empty when absent.
std::string cookie_value(std::string_view cookie_header, std::string_view name);

/// The cookie the dashboard's pages and WebSocket accept the API key from (besides "Authorization: Bearer KEY" and
/// the query parameter "key").
inline constexpr std::string_view kDashboardKeyCookie = "paged_key";
/// The Set-Cookie value of /dashboard?key=KEY: the key (percent-encoded) for /dashboard's files and its WebSocket,
/// HttpOnly, SameSite=Strict, for this browser session.
std::string dashboard_key_cookie(std::string_view key);

/// One of the dashboard's static files, built into the binary (http/dashboard/: index.html at /dashboard, the others
/// at /dashboard/NAME).
struct DashboardAsset {
  std::string_view path;
  const char* content_type;
  std::string_view body;
};
/// The asset served at `path`; nullptr for none. Defined in the file the build generates from http/dashboard/.
const DashboardAsset* find_dashboard_asset(std::string_view path);

}  // namespace paged::server
