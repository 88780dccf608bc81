// The step profile's bookkeeping: kinds of steps, sums per kind, and the table's per-step figures.
#include <catch2/catch.hpp>

#include <sstream>

#include "model/scheduling/step_profile.h"

using namespace paged;

namespace {

StepBatch batch_of(std::initializer_list<int> chunk_tokens) {
  StepBatch b;
  for (int n : chunk_tokens) {
    SeqChunk c;
    c.tokens.assign(n, 1);
    b.seqs.push_back(c);
  }
  return b;
}

}  // namespace

TEST_CASE("a step is decode, mixed or prefill by its chunks' lengths", "[profile]") {
  CHECK(step_kind(batch_of({1, 1, 1})) == StepKind::decode);
  CHECK(step_kind(batch_of({1, 17})) == StepKind::mixed);
  CHECK(step_kind(batch_of({512, 2})) == StepKind::prefill);
  CHECK(std::string(step_kind_name(StepKind::mixed)) == "mixed");
}

TEST_CASE("the profile sums each kind and prints per-step means", "[profile]") {
  StepProfile p;
  p.add(StepKind::decode, 64, 10000, {.busy_us = 8000, .idle_before_us = 1500});
  p.add(StepKind::decode, 32, 6000, {.busy_us = 4000, .idle_before_us = 500});
  p.add(StepKind::prefill, 2048, 50000, {.busy_us = 49000, .idle_before_us = 0});
  const StepProfile::Row d = p.row(StepKind::decode);
  CHECK(d.steps == 2);
  CHECK(d.tokens == 96);
  CHECK(d.wall_us == 16000);
  CHECK(d.busy_us == 12000);
  CHECK(d.idle_before_us == 2000);
  CHECK(p.row(StepKind::mixed).steps == 0);
  std::istringstream table(p.table());
  std::string header, decode, prefill, all, extra;
  std::getline(table, header);
  std::getline(table, decode);
  std::getline(table, prefill);
  std::getline(table, all);
  CHECK_FALSE(std::getline(table, extra));  // no mixed line: none ran
  // Per step: 48 tokens, wall 8 ms, busy 6, host 2, idle 1, busy 75 %.
  CHECK(decode == "decode         2         48.0     8.000     6.000     2.000     1.000     75.0");
  CHECK(prefill == "prefill        1       2048.0    50.000    49.000     1.000     0.000     98.0");
  // All: 3 steps, 2144 / 3 tokens, wall 66 / 3, busy 61 / 3, host 5 / 3, idle 2 / 3, busy 61 / 66.
  CHECK(all == "all            3        714.7    22.000    20.333     1.667     0.667     92.4");
}
