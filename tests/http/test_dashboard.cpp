// The dashboard's pieces that need no server: the frame's JSON, the key's query parameter and cookie, and the files
// built into the binary (http/dashboard.h).
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>

#include <boost/json.hpp>

#include "http/dashboard.h"

using namespace paged;
using namespace paged::server;
namespace json = boost::json;

TEST_CASE("dashboard frame: every tier's runs, the sequences, the queues and the totals", "[http][dashboard]") {
  ReplicaKv r;
  r.index = 1;
  r.address = "10.0.0.2:7000";
  r.kv.block_size = 16;
  TierSnapshot device;
  device.name = "device";
  device.push(seq_cell(9), 3);
  device.push(kCellShared);
  device.push(kCellFree, 100);
  r.kv.tiers.push_back(device);
  r.kv.seqs.push_back({9, false, 4, 50});
  r.kv.seqs.push_back({12, true, 2, 20});
  DashboardFigures f;
  f.running = 2;
  f.waiting = 5;
  f.swapped = 1;
  f.generation_tokens = 1234;
  f.ttft_sum = 0.5;
  f.ttft_count = 4;
  const json::value frame = json::parse(dashboard_frame({r}, f, 1700000000123, 7));
  CHECK(frame.at("type") == "snapshot");
  CHECK(frame.at("seq") == 7);
  CHECK(frame.at("time_ms") == 1700000000123);
  const json::object& rep = frame.at("replicas").at(0).as_object();
  CHECK(rep.at("index") == 1);
  CHECK(rep.at("address") == "10.0.0.2:7000");
  CHECK(rep.at("block_size") == 16);
  const json::object& tier = rep.at("tiers").at(0).as_object();
  CHECK(tier.at("name") == "device");
  CHECK(tier.at("blocks") == 104);
  CHECK(tier.at("runs") == json::array{seq_cell(9), 3, kCellShared, 1, kCellFree, 100});
  CHECK(rep.at("seqs") == json::array{json::array{9, 0, 4, 50}, json::array{12, 1, 2, 20}});
  CHECK(frame.at("queues") == json::object{{"running", 2}, {"waiting", 5}, {"swapped", 1}});
  CHECK(frame.at("totals").at("generation_tokens") == 1234);
  CHECK(frame.at("totals").at("ttft_sum").to_number<double>() == 0.5);
  CHECK(frame.at("totals").at("ttft_count") == 4);
  // The replica in this process is "local".
  r.address.clear();
  CHECK(json::parse(dashboard_frame({r}, f, 0, 1)).at("replicas").at(0).at("address") == "local");
}

TEST_CASE("dashboard frame: the figures are the metrics'", "[http][dashboard]") {
  Metrics m;
  m.running_requests = 3;
  m.waiting_requests = 4;
  m.swapped_requests = 1;
  m.generation_tokens = 99;
  m.prompt_tokens = 40;
  m.prefix_cache_hit_tokens = 16;
  m.preemptions = 2;
  m.ttft.observe(0.25);
  m.ttft.observe(0.75);
  m.tpot.observe(0.01);
  const DashboardFigures f = dashboard_figures(m);
  CHECK(f.running == 3);
  CHECK(f.waiting == 4);
  CHECK(f.swapped == 1);
  CHECK(f.generation_tokens == 99);
  CHECK(f.prompt_tokens == 40);
  CHECK(f.prefix_hit_tokens == 16);
  CHECK(f.preemptions == 2);
  CHECK(f.ttft_sum == Approx(1.0));
  CHECK(f.ttft_count == 2);
  CHECK(f.tpot_count == 1);
}

TEST_CASE("dashboard key: query parameter and cookie, percent-decoded; the cookie set round-trips",
          "[http][dashboard]") {
  CHECK(query_param("/dashboard?key=abc", "key") == "abc");
  CHECK(query_param("/dashboard/ws?x=1&key=a%20b%3Bc&y=2", "key") == "a b;c");
  CHECK(query_param("/dashboard?monkey=1", "key").empty());
  CHECK(query_param("/dashboard", "key").empty());
  CHECK(query_param("/dashboard?key=%zz", "key") == "%zz");  // a malformed escape stays as it is
  CHECK(cookie_value("a=1; paged_key=s3cret; b=2", "paged_key") == "s3cret");
  CHECK(cookie_value("xpaged_key=1", "paged_key").empty());
  CHECK(cookie_value("", "paged_key").empty());
  const std::string key = "k=1; x y/\xc3\xa9";
  const std::string set_cookie = dashboard_key_cookie(key);
  CHECK(set_cookie.find("HttpOnly") != std::string::npos);
  CHECK(set_cookie.find("Path=/dashboard") != std::string::npos);
  // What a browser sends back is the NAME=VALUE before the first ';'.
  CHECK(cookie_value(set_cookie.substr(0, set_cookie.find(';')), kDashboardKeyCookie) == key);
}

TEST_CASE("dashboard files: the page, its script and style, byte for byte", "[http][dashboard]") {
  auto source = [](const std::string& name) {
    std::ifstream in(std::string(PAGED_SOURCE_DIR) + "/http/dashboard/" + name, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  const DashboardAsset* page = find_dashboard_asset("/dashboard");
  REQUIRE(page != nullptr);
  CHECK(std::string(page->content_type) == "text/html; charset=utf-8");
  CHECK(page->body == source("index.html"));
  const DashboardAsset* script = find_dashboard_asset("/dashboard/dashboard.js");
  REQUIRE(script != nullptr);
  CHECK(std::string(script->content_type) == "text/javascript; charset=utf-8");
  CHECK(script->body == source("dashboard.js"));
  REQUIRE(find_dashboard_asset("/dashboard/dashboard.css") != nullptr);
  CHECK(find_dashboard_asset("/dashboard/index.html") == nullptr);
  CHECK(find_dashboard_asset("/dashboard/nothing.js") == nullptr);
  // The page names only files that are built in (no CDN).
  for (const char* ref : {"/dashboard/dashboard.js", "/dashboard/dashboard.css"})
    CHECK(page->body.find(ref) != std::string::npos);
  CHECK(page->body.find("http") == std::string::npos);
}
