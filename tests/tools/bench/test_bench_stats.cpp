// The benchmarks' arithmetic against hand-computed values: numpy's percentiles, vLLM's serving metrics and goodput,
// the arrival schedule's distribution, and the result table's layout.
#include <catch2/catch.hpp>

#include <cmath>

#include "tools/bench/bench_stats.h"

using namespace paged::bench;

TEST_CASE("percentile interpolates linearly between ranks as numpy does", "[bench]") {
  const std::vector<double> v{4, 1, 3, 2};  // sorted 1 2 3 4; rank = p / 100 * 3
  CHECK(percentile(v, 0) == 1);
  CHECK(percentile(v, 100) == 4);
  CHECK(percentile(v, 50) == Approx(2.5));   // rank 1.5
  CHECK(percentile(v, 99) == Approx(3.97));  // rank 2.97: 3 + 0.97 * (4 - 3)
  CHECK(percentile(v, 25) == Approx(1.75));  // rank 0.75
  CHECK(percentile({7}, 99) == 7);
  CHECK(percentile({}, 99) == 0);  // vLLM summarises an empty list as [0]
}

TEST_CASE("summarize gives mean, median, population std and the percentiles", "[bench]") {
  const Summary s = summarize({2, 4, 4, 4, 5, 5, 7, 9}, {50, 90});
  CHECK(s.mean == Approx(5));
  CHECK(s.std == Approx(2));        // sum of squared deviations 32, / 8 = 4
  CHECK(s.median == Approx(4.5));   // rank 3.5 between 4 and 5
  REQUIRE(s.percentiles.size() == 2);
  CHECK(s.percentiles[0].first == 50);
  CHECK(s.percentiles[0].second == Approx(4.5));
  CHECK(s.percentiles[1].second == Approx(7.6));  // rank 6.3: 7 + 0.3 * (9 - 7)
  const Summary empty = summarize({}, {99});
  CHECK((empty.mean == 0 && empty.median == 0 && empty.std == 0 && empty.percentiles[0].second == 0));
}

namespace {

/// Two successful requests and a failed one: five tokens over 0.1..0.5 s, one token at 0.2 s, and a failure.
std::vector<RequestResult> three_requests() {
  RequestResult a, b, c;
  a.success = true;
  a.prompt_len = 10;
  a.output_tokens = 5;
  a.ttft = 0.1;
  a.latency = 0.5;
  a.itl = {0.1, 0.1, 0.1, 0.1};
  b.success = true;
  b.prompt_len = 20;
  b.output_tokens = 1;
  b.ttft = 0.2;
  b.latency = 0.2;
  c.prompt_len = 30;
  c.error = "HTTP 500";
  return {a, b, c};
}

}  // namespace

TEST_CASE("serving metrics follow vLLM's definitions", "[bench]") {
  const ServingMetrics m = serving_metrics(three_requests(), 2.0, Slo{}, {99});
  CHECK(m.completed == 2);
  CHECK(m.failed == 1);
  CHECK(m.total_input == 30);  // the failed request's prompt is not counted
  CHECK(m.total_output == 6);
  CHECK(m.request_throughput == Approx(1.0));
  CHECK(m.output_throughput == Approx(3.0));
  CHECK(m.total_token_throughput == Approx(18.0));
  CHECK(m.request_goodput == 0);
  CHECK(m.ttft_ms.mean == Approx(150));
  CHECK(m.ttft_ms.median == Approx(150));
  CHECK(m.ttft_ms.percentiles[0].second == Approx(199));  // 100 + 0.99 * 100
  // TPOT only for the request of more than one token: (0.5 - 0.1) / (5 - 1) = 100 ms.
  CHECK(m.tpot_ms.mean == Approx(100));
  CHECK(m.tpot_ms.std == Approx(0).margin(1e-9));
  CHECK(m.itl_ms.mean == Approx(100));
  CHECK(m.e2el_ms.mean == Approx(350));
  CHECK(m.e2el_ms.std == Approx(150));
}

TEST_CASE("goodput counts the successful requests that meet every SLO given", "[bench]") {
  const auto goodput = [](const std::vector<std::string>& slo) {
    return serving_metrics(three_requests(), 2.0, parse_slo(slo), {99}).request_goodput;
  };
  CHECK(goodput({"ttft:150"}) == Approx(0.5));              // a (100 ms); b's 200 ms misses
  CHECK(goodput({"ttft:150", "tpot:50"}) == Approx(0.0));   // a's TPOT is 100 ms
  CHECK(goodput({"tpot:50"}) == Approx(0.5));               // b: one token, TPOT 0
  CHECK(goodput({"e2el:500"}) == Approx(1.0));              // 500 ms meets 500
  CHECK(goodput({"ttft:0.001"}) == Approx(0.0));
}

TEST_CASE("parse_slo takes KEY:MS for ttft, tpot and e2el and refuses the rest", "[bench]") {
  const Slo slo = parse_slo({"ttft:500", "tpot:0.5", "e2el:0"});
  CHECK(*slo.ttft_ms == 500);
  CHECK(*slo.tpot_ms == 0.5);
  CHECK(*slo.e2el_ms == 0);
  CHECK_FALSE(parse_slo({}).any());
  for (const char* bad : {"itl:5", "ttft", "ttft:", "ttft:-1", "ttft:abc", "ttft:1x", "ttft:inf"})
    CHECK_THROWS_AS(parse_slo({bad}), std::invalid_argument);
}

TEST_CASE("arrival times: a burst at 0, else gamma gaps of mean 1/rate and variance 1/(rate^2 burstiness)",
          "[bench]") {
  const std::vector<double> burst = arrival_times(5, std::numeric_limits<double>::infinity(), 1.0, 0);
  CHECK(burst == std::vector<double>(5, 0.0));
  const auto gap_moments = [](double rate, double burstiness) {
    const std::vector<double> t = arrival_times(20001, rate, burstiness, 7);
    REQUIRE(t[0] == 0);
    double sum = 0, squares = 0;
    for (size_t i = 1; i < t.size(); ++i) {
      REQUIRE(t[i] >= t[i - 1]);
      sum += t[i] - t[i - 1];
    }
    const double mean = sum / 20000;
    for (size_t i = 1; i < t.size(); ++i) squares += (t[i] - t[i - 1] - mean) * (t[i] - t[i - 1] - mean);
    return std::pair{mean, squares / 20000};
  };
  const auto [poisson_mean, poisson_var] = gap_moments(10, 1);  // exponential: variance = mean^2 = 0.01
  CHECK(poisson_mean == Approx(0.1).epsilon(0.02));
  CHECK(poisson_var == Approx(0.01).epsilon(0.1));
  const auto [bursty_mean, bursty_var] = gap_moments(10, 4);  // gamma(4, 1/40): variance 4 / 1600
  CHECK(bursty_mean == Approx(0.1).epsilon(0.02));
  CHECK(bursty_var == Approx(0.0025).epsilon(0.1));
  CHECK(arrival_times(10, 5, 1, 3) == arrival_times(10, 5, 1, 3));
  CHECK(arrival_times(10, 5, 1, 3) != arrival_times(10, 5, 1, 4));
}

TEST_CASE("the serving table has vLLM's layout", "[bench]") {
  ServingMetrics m = serving_metrics(three_requests(), 2.0, parse_slo({"ttft:150"}), {99});
  ServingTableOptions options;
  options.metrics = {"ttft", "itl"};
  const std::string plain = serving_table(m, options);
  CHECK(plain.rfind("============ Serving Benchmark Result ============\n", 0) == 0);
  CHECK(plain.find("Successful requests:                     2         \n") != std::string::npos);
  CHECK(plain.find("Failed requests:                         1         \n") != std::string::npos);
  CHECK(plain.find("Benchmark duration (s):                  2.00      \n") != std::string::npos);
  CHECK(plain.find("Request throughput (req/s):              1.00      \n") != std::string::npos);
  CHECK(plain.find("---------------Time to First Token----------------\n") != std::string::npos);
  CHECK(plain.find("Mean TTFT (ms):                          150.00    \n") != std::string::npos);
  CHECK(plain.find("P99 TTFT (ms):                           199.00    \n") != std::string::npos);
  CHECK(plain.find("Mean ITL (ms):") != std::string::npos);
  CHECK(plain.find("TPOT") == std::string::npos);  // not asked
  CHECK(plain.find("goodput") == std::string::npos);
  CHECK(plain.find("Request rate") == std::string::npos);  // a burst
  CHECK(plain.substr(plain.size() - 51) == std::string(50, '=') + "\n");
  options.goodput = true;
  options.request_rate = 2.5;
  options.max_concurrency = 4;
  const std::string full = serving_table(m, options);
  CHECK(full.find("Request goodput (req/s):                 0.50      \n") != std::string::npos);
  CHECK(full.find("Request rate configured (RPS):           2.50      \n") != std::string::npos);
  CHECK(full.find("Maximum request concurrency:             4         \n") != std::string::npos);
  CHECK(percentile_name(99.9) == "99.9");
  CHECK(percentile_name(50) == "50");
}
