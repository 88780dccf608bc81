// Fuzzing a worker's way in: valid WireSteps, mutated field by field and byte by byte (through CAF's binary
// serializer), go through CAF's deserializer and the step check (model/step_check.h); whatever passes the check is
// executed on a small CPU runner over stories260K and must neither throw nor touch memory outside its pools. Swap
// orders likewise. Part of paged_tests, and built on its own with AddressSanitizer and UBSan (paged_fuzz_step, see
// CMakeLists.txt), which turn any such touch into a failure.
#include <catch2/catch.hpp>

#include <algorithm>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "actors/messages.h"
#include "actors/step_wire.h"
#include "model/step_check.h"
#include "tests/test_data.h"

using namespace paged;
using namespace paged::test;

namespace {

constexpr int kMutatedSteps = 10000;  // half mutated field by field, half byte by byte
constexpr int kSwapOrders = 2000;

// The runner's limits: few blocks, so that random ids often fall outside, and short contexts, so that steps are cheap.
StepLimits fuzz_limits(int vocab_size) {
  return {.vocab_size = vocab_size, .block_size = 16, .num_blocks = 24, .num_swap_blocks = 8, .max_model_len = 128,
          .max_num_batched_tokens = 48};
}

// Draws from the fuzzer's random stream.
class Draw {
 public:
  explicit Draw(uint64_t seed) : rng_(seed) {}
  int in(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }  // [lo, hi]
  bool coin() { return in(0, 1) == 1; }
  template <class T>
  T pick(const std::vector<T>& xs) {
    return xs[index(xs.size())];
  }
  size_t index(size_t n) { return static_cast<size_t>(in(0, static_cast<int>(n) - 1)); }  // [0, n), n > 0
  uint64_t bits() { return rng_(); }

 private:
  std::mt19937_64 rng_;
};

// A valid step for `limits` (check_step passes it): 1 to 3 chunks of distinct sequences, each with its block table
// and up to two samples with parameters in range, and up to two copies.
WireStep valid_step(Draw& d, const StepLimits& limits) {
  WireStep w;
  const int chunks = d.in(1, 3);
  for (int c = 0; c < chunks; ++c) {
    WireChunk& wc = w.seqs.emplace_back();
    wc.chunk.seq = static_cast<SeqId>(100 + 10 * c + d.in(0, 9));
    wc.chunk.tokens.resize(static_cast<size_t>(d.in(1, 12)));
    for (TokenId& t : wc.chunk.tokens) t = d.in(0, limits.vocab_size - 1);
    wc.chunk.start_pos = d.in(0, 60);
    const int end = wc.chunk.start_pos + static_cast<int>(wc.chunk.tokens.size());
    const int blocks = (end + limits.block_size - 1) / limits.block_size + d.in(0, 1);
    for (int b = 0; b < blocks; ++b) wc.chunk.block_table.push_back(d.in(0, limits.num_blocks - 1));
    for (int s = d.in(0, 2); s > 0; --s) {
      WireSample& ws = wc.samples.emplace_back();
      SamplingParams& p = ws.params;
      p.temperature = d.pick<float>({0.0f, 0.7f, 1.3f});
      p.top_k = d.pick<int>({-1, 5});
      p.top_p = d.pick<float>({1.0f, 0.9f});
      p.min_p = d.pick<float>({0.0f, 0.05f});
      p.repetition_penalty = d.pick<float>({1.0f, 1.2f});
      p.presence_penalty = d.pick<float>({0.0f, 0.5f});
      p.frequency_penalty = d.pick<float>({0.0f, -0.3f});
      p.min_tokens = d.pick<int>({0, 3});
      if (d.coin()) p.logit_bias[d.in(0, limits.vocab_size - 1)] = 2.0f;
      if (d.coin()) p.logprobs = d.in(0, 3);
      ws.seed = d.bits();
      for (int i = d.in(1, 6); i > 0; --i) ws.prompt.push_back(d.in(0, limits.vocab_size - 1));
      for (int i = d.in(0, 4); i > 0; --i) ws.output.push_back(d.in(0, limits.vocab_size - 1));
      ws.stop_ids = {2};
      ws.num_logprobs = p.logprobs.value_or(0);
      ws.num_candidates = d.pick<int>({1, 1, 3});
    }
  }
  // Copies onto blocks 20..23, from blocks below 20: no destination twice, none read by another copy.
  for (int i = d.in(0, 2); i > 0; --i) w.copies.emplace_back(d.in(0, 19), 20 + i);
  return w;
}

// A value just inside or outside some limit, or anywhere.
int32_t edge_int(Draw& d, const StepLimits& limits) {
  return d.pick<int32_t>({-1, 0, 1, 15, 16, 17, limits.vocab_size - 1, limits.vocab_size, limits.num_blocks - 1,
                          limits.num_blocks, limits.num_swap_blocks, limits.max_model_len - 1, limits.max_model_len,
                          9000, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(),
                          static_cast<int32_t>(d.bits())});
}

float edge_float(Draw& d) {
  return d.pick<float>({std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity(), 0.0f, -0.0f,
                        std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                        std::numeric_limits<float>::max(), -1.0f, 0.5f, 1.0f, 2.0f, 10.5f, 100.0f, 101.0f});
}

// One random change to one field of `w`.
void mutate_field(Draw& d, WireStep& w, const StepLimits& limits) {
  WireChunk& wc = w.seqs[d.index(w.seqs.size())];
  SeqChunk& c = wc.chunk;
  const auto any_of = [&](std::vector<TokenId>& ids) {
    if (ids.empty())
      ids.push_back(edge_int(d, limits));
    else
      ids[d.index(ids.size())] = edge_int(d, limits);
  };
  WireSample* ws = wc.samples.empty() ? nullptr : &wc.samples[d.index(wc.samples.size())];
  switch (d.in(0, 17)) {
    case 0: any_of(c.tokens); break;
    case 1: c.start_pos = edge_int(d, limits); break;
    case 2: any_of(c.block_table); break;
    case 3: c.block_table.push_back(d.coin() ? edge_int(d, limits) : d.in(0, limits.num_blocks - 1)); break;
    case 4: if (!c.block_table.empty()) c.block_table.pop_back(); break;
    case 5: c.tokens.resize(static_cast<size_t>(d.in(0, 80)), 1); break;
    case 6: c.seq = w.seqs[0].chunk.seq; break;
    case 7: w.seqs.push_back(wc); break;
    case 8:
      if (!w.copies.empty())
        (d.coin() ? w.copies[0].first : w.copies[0].second) = edge_int(d, limits);
      else
        w.copies.emplace_back(edge_int(d, limits), edge_int(d, limits));
      break;
    case 9:
      w.copies.emplace_back(d.in(0, limits.num_blocks - 1), d.in(0, limits.num_blocks - 1));  // maybe a chain or twice
      break;
    case 10:
      if (ws) {
        SamplingParams& p = ws->params;
        float* fields[] = {&p.temperature, &p.top_p, &p.min_p, &p.repetition_penalty, &p.presence_penalty,
                           &p.frequency_penalty};
        *fields[d.in(0, 5)] = edge_float(d);
      }
      break;
    case 11:
      if (ws) {
        SamplingParams& p = ws->params;
        int* fields[] = {&p.top_k, &p.min_tokens, &p.max_tokens, &p.n, &p.best_of};
        *fields[d.in(0, 4)] = edge_int(d, limits);
      }
      break;
    case 12:
      if (ws) ws->params.logit_bias[d.coin() ? edge_int(d, limits) : 3] = d.coin() ? edge_float(d) : 1.0f;
      break;
    case 13:
      if (ws) (d.coin() ? ws->num_logprobs : ws->num_candidates) = d.coin() ? edge_int(d, limits) : d.in(-2, 300);
      break;
    case 14:
      if (ws) any_of(d.pick<int>({0, 1, 2}) == 0 ? ws->prompt : d.coin() ? ws->output : ws->stop_ids);
      break;
    case 15:
      if (ws) ws->output.resize(static_cast<size_t>(d.in(0, 2 * limits.max_model_len)), 4);
      break;
    case 16:
      if (ws) {
        ws->params.use_beam_search = d.coin();
        ws->params.stop.push_back(d.pick<std::string>({"", "\xff", "end"}));
        ws->params.logprobs = d.coin() ? std::optional<int>(edge_int(d, limits)) : std::nullopt;
      }
      break;
    case 17:
      if (ws) {
        const WireSample copy = *ws;
        wc.samples.resize(static_cast<size_t>(d.in(0, kMaxSamplesPerChunk + 2)), copy);
      }
      break;
  }
}

// One random change to the serialised bytes of a step: bits flipped, a byte set to an edge value, the tail cut,
// a run repeated or random bytes put in.
void mutate_bytes(Draw& d, std::vector<char>& bytes) {
  const auto at = [&] { return d.index(bytes.size()); };
  switch (d.in(0, 4)) {
    case 0:
      for (int i = d.in(1, 4); i > 0; --i) bytes[at()] ^= static_cast<char>(1 << d.in(0, 7));
      break;
    case 1: bytes[at()] = d.pick<char>({'\0', '\x01', '\x7f', '\x80', '\xff'}); break;
    case 2: bytes.resize(at()); break;
    case 3: {
      const size_t from = at(), n = std::min<size_t>(static_cast<size_t>(d.in(1, 16)), bytes.size() - from);
      const std::vector<char> run(bytes.begin() + from, bytes.begin() + from + n);
      bytes.insert(bytes.begin() + at(), run.begin(), run.end());
      break;
    }
    case 4:
      for (int i = d.in(1, 8); i > 0; --i) bytes.insert(bytes.begin() + at(), static_cast<char>(d.bits()));
      break;
  }
}

// Counts of what the fuzzer fed where.
struct Tally {
  int undecodable = 0, refused = 0, executed = 0;
};

// Checks `wire` and, when it passes, executes it: it must run without throwing, and return one entry per chunk that
// samples, each with the tokens asked for, all in the vocabulary.
void check_and_execute(const WireStep& wire, const StepLimits& limits, CpuModelRunner& runner, Tally& tally) {
  const StepBatch step = from_wire(wire);
  if (check_step(step, limits)) {
    ++tally.refused;
    return;
  }
  ++tally.executed;
  StepResult r;
  REQUIRE_NOTHROW(r = runner.execute(step));
  size_t i = 0;
  for (const SeqChunk& c : step.seqs) {
    if (c.samples.empty()) continue;
    REQUIRE(i < r.seqs.size());
    CHECK(r.seqs[i] == c.seq);
    REQUIRE(r.samples[i].size() == c.samples.size());
    for (size_t k = 0; k < c.samples.size(); ++k) {
      const auto& candidates = r.samples[i][k];
      CHECK(candidates.size() == static_cast<size_t>(std::min(c.samples[k].num_candidates, limits.vocab_size)));
      for (const SampledToken& t : candidates) {
        CHECK(t.token >= 0);
        CHECK(t.token < limits.vocab_size);
        CHECK(t.top_logprobs.size() == static_cast<size_t>(c.samples[k].num_logprobs));
      }
    }
    ++i;
  }
  CHECK(i == r.seqs.size());
}

}  // namespace

TEST_CASE("mutated steps and swap orders: the decoder and the check never crash, and what passes is safe to run",
          "[remote][fuzz]") {
  const ModelConfig cfg = load_model_config(kModel);
  const SafeTensors weights(kModel);
  const StepLimits limits = fuzz_limits(cfg.vocab_size);
  CpuModelRunner runner(cfg, weights,
                        {.block_size = limits.block_size, .num_blocks = limits.num_blocks,
                         .num_swap_blocks = limits.num_swap_blocks});
  {  // Every slot of both pools written once, so that whatever a step reads was written.
    StepBatch fill;
    SeqChunk& c = fill.seqs.emplace_back();
    c.tokens.assign(static_cast<size_t>(limits.num_blocks * limits.block_size), 7);
    for (int b = 0; b < limits.num_blocks; ++b) c.block_table.push_back(b);
    runner.execute(fill);
    std::vector<BlockPair> all;
    for (int b = 0; b < limits.num_swap_blocks; ++b) all.emplace_back(b, b);
    runner.swap_out(all);
  }

  Draw d(20240611);
  Tally fields, bytes;
  for (int i = 0; i < kMutatedSteps / 2; ++i) {
    WireStep w = valid_step(d, limits);
    REQUIRE_FALSE(check_step(from_wire(w), limits));
    for (int m = d.in(1, 3); m > 0; --m) mutate_field(d, w, limits);
    check_and_execute(w, limits, runner, fields);
  }
  for (int i = 0; i < kMutatedSteps / 2; ++i) {
    const WireStep valid = valid_step(d, limits);
    std::vector<char> encoded;
    caf::binary_serializer sink(nullptr, encoded);
    REQUIRE_FALSE(sink(valid));
    for (int m = d.in(1, 3); m > 0 && !encoded.empty(); --m) mutate_bytes(d, encoded);
    WireStep decoded;
    caf::binary_deserializer source(nullptr, encoded);
    if (source(decoded)) {
      ++bytes.undecodable;
      continue;
    }
    check_and_execute(decoded, limits, runner, bytes);
  }
  INFO("field mutations: " << fields.refused << " refused, " << fields.executed << " executed; byte mutations: "
                           << bytes.undecodable << " undecodable, " << bytes.refused << " refused, "
                           << bytes.executed << " executed");
  // Each way in reaches both outcomes, often.
  CHECK(fields.refused > kMutatedSteps / 10);
  CHECK(fields.executed > kMutatedSteps / 10);
  CHECK(bytes.undecodable > kMutatedSteps / 50);
  CHECK(bytes.refused > kMutatedSteps / 50);
  CHECK(bytes.executed > kMutatedSteps / 50);

  int swaps_executed = 0;
  for (int i = 0; i < kSwapOrders; ++i) {
    const PairOrder order = d.coin() ? PairOrder::swap_out : PairOrder::swap_in;
    std::vector<BlockPair> pairs;
    for (int n = d.in(0, 4); n > 0; --n)
      pairs.emplace_back(d.coin() ? edge_int(d, limits) : d.in(0, 8), d.coin() ? edge_int(d, limits) : d.in(0, 8));
    if (check_block_pairs(pairs, order, limits.num_blocks, limits.num_swap_blocks)) continue;
    ++swaps_executed;
    REQUIRE_NOTHROW(order == PairOrder::swap_out ? runner.swap_out(pairs) : runner.swap_in(pairs));
  }
  CHECK(swaps_executed > kSwapOrders / 20);
}
