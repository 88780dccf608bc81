// SafeTensors' load observer: what the startup log's load progress is drawn from.
#include <catch2/catch.hpp>

#include <utility>
#include <vector>

#include "kernels/cpu/cpu_runner.h"
#include "model/loader/config.h"
#include "model/loader/safetensors.h"
#include "tests/test_data.h"

using namespace paged;
using namespace paged::test;

TEST_CASE("the load observer sees each tensor once, in growing totals, up to the checkpoint's bytes", "[loader]") {
  std::vector<std::pair<int64_t, int64_t>> reports;
  const SafeTensors weights(kModel, [&](int64_t loaded, int64_t total) { reports.emplace_back(loaded, total); });
  int64_t expected_total = 0;
  for (const auto& [name, t] : weights.tensors()) expected_total += static_cast<int64_t>(t.nbytes);
  CHECK(weights.total_bytes() == expected_total);
  CHECK(expected_total > 1000000);  // stories260K: 1 MB of float32
  CHECK(reports.empty());           // nothing is loaded until a runner asks
  CpuModelRunner runner(load_model_config(kModel), weights, {.block_size = 16, .num_blocks = 4});
  REQUIRE(reports.size() == weights.tensors().size());  // every tensor once (the tied LM head is the embedding)
  for (size_t i = 0; i < reports.size(); ++i) {
    CHECK(reports[i].second == expected_total);
    if (i) CHECK(reports[i].first > reports[i - 1].first);
  }
  CHECK(reports.back().first == expected_total);
  const size_t before = reports.size();
  CpuModelRunner second(load_model_config(kModel), weights, {.block_size = 16, .num_blocks = 4});
  CHECK(reports.size() == before);  // a tensor counts once however many ranks load it
}
