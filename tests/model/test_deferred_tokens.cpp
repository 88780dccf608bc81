// DeferredTokens (model/deferred_tokens.h): a step sent before the one ahead of it returned takes its deferred
// tokens from what that step sampled, or is refused whole.
#include <catch2/catch.hpp>

#include <algorithm>

#include "model/deferred_tokens.h"
#include "model/sampling/sampler.h"
#include "tests/model/sampling/same_penalties.h"

using namespace paged;
using paged::test::check_same_penalties;

namespace {

StepResult sampled(std::vector<std::pair<SeqId, TokenId>> tokens) {
  StepResult r;
  for (auto [seq, token] : tokens) {
    r.seqs.push_back(seq);
    r.samples.push_back({{SampledToken{token, -0.5f, {}}}});
  }
  return r;
}

SeqChunk chunk(SeqId seq, std::vector<TokenId> tokens, bool deferred, const SamplingParams* params = nullptr) {
  SeqChunk c;
  c.seq = seq;
  c.tokens = std::move(tokens);
  c.last_token_deferred = deferred;
  if (params) c.samples.push_back({.params = params});
  return c;
}

}  // namespace

TEST_CASE("deferred tokens come from the step before, into the chunk and each of its samples", "[deferred]") {
  SamplingParams params;
  DeferredTokens d;
  d.remember(sampled({{4, 17}, {9, 3}}));
  StepBatch b;
  b.seqs = {chunk(9, {-1}, true, &params), chunk(5, {1, 2, 3}, false, &params), chunk(4, {-1}, true, &params)};
  REQUIRE_FALSE(d.resolve(b));
  CHECK(b.seqs[0].tokens == std::vector<TokenId>{3});
  CHECK(b.seqs[0].samples[0].pending_output == 3);
  CHECK(b.seqs[1].tokens == std::vector<TokenId>{1, 2, 3});
  CHECK(b.seqs[1].samples[0].pending_output == -1);
  CHECK(b.seqs[2].tokens == std::vector<TokenId>{17});
  CHECK(b.seqs[2].samples[0].pending_output == 17);
}

TEST_CASE("a deferred token of a sequence the step before did not sample refuses the whole step", "[deferred]") {
  DeferredTokens d;
  d.remember(sampled({{4, 17}}));
  StepBatch b;
  b.seqs = {chunk(4, {-1}, true), chunk(6, {-1}, true)};
  const auto e = d.resolve(b);
  REQUIRE(e);
  CHECK(e->field == "seqs[1].tokens");
  CHECK(b.seqs[0].tokens == std::vector<TokenId>{-1});  // unchanged
  d.remember({});  // a failed step: nothing to take from
  b.seqs = {chunk(4, {-1}, true)};
  CHECK(d.resolve(b));
  StepBatch plain;
  plain.seqs = {chunk(4, {8}, false)};
  CHECK_FALSE(d.resolve(plain));  // nothing deferred, nothing needed
}

TEST_CASE("only the step just before counts", "[deferred]") {
  DeferredTokens d;
  d.remember(sampled({{4, 17}}));
  d.remember(sampled({{5, 2}}));
  StepBatch b;
  b.seqs = {chunk(4, {-1}, true)};
  CHECK(d.resolve(b));
}

TEST_CASE("a pending output id counts as generated: min_tokens, penalties and the random stream see it", "[deferred]") {
  SamplingParams p;
  p.temperature = 1.0f;
  p.min_tokens = 2;
  p.repetition_penalty = 2.0f;
  p.frequency_penalty = 0.5f;
  const std::vector<TokenId> prompt{1}, stop{0};
  const std::vector<TokenId> whole{3, 2}, head{3};
  SampleSpec known{.params = &p, .seed = 11, .prompt = &prompt, .output = &whole, .stop_ids = &stop};
  SampleSpec pending = known;
  pending.output = &head;
  pending.pending_output = 2;
  CHECK(generated_count(known) == 2);
  CHECK(generated_count(pending) == 2);
  const PenaltyOps a = penalty_ops(known, 6);
  check_same_penalties(a, penalty_ops(pending, 6));
  CHECK(a.masked.empty());  // two generated: min_tokens reached, EOS no longer masked
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> x(6), y;
    for (int i = 0; i < 6; ++i) x[i] = 0.3f * ((i * 7 + trial) % 5);
    y = x;
    CHECK(sample_logits(x, known)[0].token == sample_logits(y, pending)[0].token);
    known.seed = pending.seed = 100 + trial;
  }
}
