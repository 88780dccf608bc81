// One step of beam search (beam_search_step), pure: the ranking of offers over beams, which child forks, stop ids
// before and from min_tokens, the length end, the early stop against finished hypotheses, and a vocabulary smaller
// than 2w. The engine's beam search against a reference on a real model is in tests/actors/test_engine.cpp.
#include <catch2/catch.hpp>

#include <vector>

#include "model/scheduling/beam_search.h"

using namespace paged;

namespace {

SampledToken offer(TokenId token, float logprob) { return SampledToken{token, logprob, {}}; }

/// Tokens as offered, each with its own logprob (-0.01 times its id), to tell them apart after a step.
std::vector<SampledToken> offered(const std::vector<TokenId>& ids) {
  std::vector<SampledToken> out;
  for (TokenId id : ids) out.push_back(offer(id, -0.01f * static_cast<float>(id)));
  return out;
}

std::vector<TokenId> ids(const std::vector<SampledToken>& tokens) {
  std::vector<TokenId> out;
  for (const SampledToken& t : tokens) out.push_back(t.token);
  return out;
}

BeamHypothesis hypothesis(const std::vector<TokenId>& tokens, double cumulative_logprob, bool stopped) {
  return {offered(tokens), cumulative_logprob, stopped};
}

/// A beam's output and offers, owned: Beam views them.
struct BeamData {
  BeamData(double cumulative_logprob, const std::vector<TokenId>& output, std::vector<SampledToken> candidates)
      : cumulative_logprob(cumulative_logprob), output(offered(output)), candidates(std::move(candidates)) {}
  double cumulative_logprob = 0.0;
  std::vector<SampledToken> output;
  std::vector<SampledToken> candidates;  // (token, logprob), best first
};

std::vector<Beam> views(const std::vector<BeamData>& data) {
  std::vector<Beam> beams;
  for (const BeamData& b : data) beams.push_back({b.cumulative_logprob, b.output, b.candidates});
  return beams;
}

const std::vector<TokenId> kStopIds = {2};

/// Prompt of 4 tokens, width 2, n 2, no min_tokens, max_tokens 10, model length 100, stop id 2.
BeamSearchLimits limits() {
  return BeamSearchLimits{.width = 2, .n = 2, .min_tokens = 0, .max_tokens = 10, .max_model_len = 100,
                          .prompt_len = 4, .stop_ids = kStopIds};
}

std::vector<TokenId> tokens_of(const BeamChild& c, const std::vector<BeamData>& data) {
  std::vector<TokenId> t = ids(data[c.parent].output);
  t.push_back(c.token.token);
  return t;
}

}  // namespace

TEST_CASE("beam score: cumulative logprob over prompt and output length, a final stop id not counted", "[beam]") {
  CHECK(beam_score(-6.0, 4, 2, false) == Approx(-1.0));
  CHECK(beam_score(-5.0, 4, 2, true) == Approx(-1.0));
  CHECK(beam_score(-6.0, 4, 2, false, 2.0) == Approx(-6.0 / 36.0));  // vLLM's length_penalty: length^penalty
  CHECK(beam_score(-6.0, 4, 2, false, 0.0) == Approx(-6.0));
}

TEST_CASE("the 2w best offers over all beams become the children; ties go to the earlier beam, then its order",
          "[beam]") {
  SECTION("ties between beams and within a beam") {
    // Scores: beam 0 token 10: -1.5, token 11: -1.5; beam 1 token 20: -1.5, token 21: -2.0.
    const std::vector<BeamData> data = {{-1.0, {5, 6}, {offer(10, -0.5f), offer(11, -0.5f)}},
                                        {-1.5, {5, 7}, {offer(20, 0.0f), offer(21, -0.5f)}}};
    const BeamDecision d = beam_search_step(views(data), {}, limits());
    REQUIRE_FALSE(d.done);
    REQUIRE(d.children.size() == 2);
    CHECK(d.children[0].parent == 0);
    CHECK(d.children[0].token.token == 10);
    CHECK_FALSE(d.children[0].fork);
    CHECK(d.children[1].parent == 0);  // beam 0's second offer ties beam 1's first: the earlier beam wins
    CHECK(d.children[1].token.token == 11);
    CHECK(d.children[1].fork);         // beam 0's second child forks it; beam 1 has no child and ends
    CHECK(d.children[1].cumulative_logprob == Approx(-1.5));
    CHECK(d.finished.empty());
  }
  SECTION("each parent keeps its sequence for its first child and forks for the others") {
    const std::vector<BeamData> data = {{-3.0, {5, 6}, {offer(10, -1.0f), offer(11, -2.0f)}},
                                        {-1.0, {5, 7}, {offer(20, -0.5f), offer(21, -0.6f)}}};
    const BeamDecision d = beam_search_step(views(data), {}, limits());
    REQUIRE(d.children.size() == 2);
    CHECK(tokens_of(d.children[0], data) == std::vector<TokenId>{5, 7, 20});
    CHECK(tokens_of(d.children[1], data) == std::vector<TokenId>{5, 7, 21});
    CHECK_FALSE(d.children[0].fork);
    CHECK(d.children[1].fork);
    CHECK(d.children[1].cumulative_logprob == Approx(-1.6));
  }
}

TEST_CASE("a stop id ends a hypothesis only from min_tokens on", "[beam]") {
  // The outputs hold 2 tokens: the children have 3.
  const std::vector<BeamData> data = {{-1.0, {5, 6}, {offer(2, -0.1f), offer(11, -0.2f), offer(12, -3.0f)}}};
  SECTION("before min_tokens the stop id runs on like any token") {
    BeamSearchLimits l = limits();
    l.min_tokens = 4;
    const BeamDecision d = beam_search_step(views(data), {}, l);
    REQUIRE_FALSE(d.done);
    REQUIRE(d.children.size() == 2);
    CHECK(d.children[0].token.token == 2);
    CHECK(d.finished.empty());
  }
  SECTION("at min_tokens it finishes the hypothesis, scored without the stop id") {
    BeamSearchLimits l = limits();
    l.min_tokens = 3;
    const BeamDecision d = beam_search_step(views(data), {}, l);
    REQUIRE_FALSE(d.done);  // one finished of w = 2: the search goes on with the running children
    REQUIRE(d.finished.size() == 1);
    CHECK(ids(d.finished[0].tokens) == std::vector<TokenId>{5, 6, 2});
    CHECK(d.finished[0].stopped);
    CHECK(d.finished[0].cumulative_logprob == Approx(-1.1));
    REQUIRE(d.children.size() == 2);
    CHECK(d.children[0].token.token == 11);
    CHECK(d.children[1].token.token == 12);
  }
}

TEST_CASE("the length limit finishes every child and ends the search with the best n by beam score", "[beam]") {
  // An earlier hypothesis (stopped, 2 tokens: -1.0 / 5 = -0.2) competes with the 4-token children (-2.0 / 8).
  const std::vector<BeamHypothesis> earlier = {hypothesis({5, 2}, -1.0, true)};
  const std::vector<BeamData> data = {{-1.0, {5, 6, 7}, {offer(10, -1.0f), offer(11, -1.5f)}},
                                      {-0.9, {5, 6, 8}, {offer(20, -1.2f), offer(21, -2.0f)}}};
  for (const bool by_model_len : {false, true}) {
    INFO((by_model_len ? "max_model_len" : "max_tokens"));
    BeamSearchLimits l = limits();
    if (by_model_len)
      l.max_model_len = 8;  // prompt 4 + output 4
    else
      l.max_tokens = 4;
    const BeamDecision d = beam_search_step(views(data), earlier, l);
    CHECK(d.done);
    CHECK(d.children.empty());
    REQUIRE(d.finished.size() == 2);  // n
    CHECK(ids(d.finished[0].tokens) == std::vector<TokenId>{5, 2});
    CHECK(ids(d.finished[1].tokens) == std::vector<TokenId>{5, 6, 7, 10});
    CHECK_FALSE(d.finished[1].stopped);
  }
}

TEST_CASE("w finished hypotheses that all score at least the best running child end the search early", "[beam]") {
  // Two stopped 2-token hypotheses: -0.5 / 5 = -0.1 and -1.0 / 5 = -0.2. The best running child scores
  // -3.5 / 7 = -0.5 and ends the search; one at -0.7 / 7 = -0.1 keeps it going.
  const std::vector<BeamHypothesis> earlier = {hypothesis({5, 2}, -0.5, true), hypothesis({6, 2}, -1.0, true)};
  SECTION("worse running children: done, the best n = 1 returned") {
    const std::vector<BeamData> data = {{-3.0, {5, 6}, {offer(10, -0.5f), offer(11, -1.0f)}}};
    BeamSearchLimits l = limits();
    l.n = 1;
    const BeamDecision d = beam_search_step(views(data), earlier, l);
    CHECK(d.done);
    REQUIRE(d.finished.size() == 1);
    CHECK(ids(d.finished[0].tokens) == std::vector<TokenId>{5, 2});
  }
  SECTION("a better running child: the search goes on and keeps the w finished") {
    const std::vector<BeamData> data = {{-0.5, {5, 6}, {offer(10, -0.2f), offer(11, -1.0f)}}};
    const BeamDecision d = beam_search_step(views(data), earlier, limits());
    CHECK_FALSE(d.done);
    CHECK(d.finished.size() == 2);
    REQUIRE(d.children.size() == 2);
    CHECK(d.children[0].token.token == 10);
  }
}

TEST_CASE("a vocabulary smaller than 2w: every offer is a child, and fewer than n hypotheses may return", "[beam]") {
  BeamSearchLimits l = limits();
  l.width = 3;  // 2w = 6 offers wanted, the vocabulary has 2
  l.n = 3;
  const std::vector<BeamData> first = {{0.0, {}, {offer(10, -0.1f), offer(11, -0.2f)}}};
  const BeamDecision d = beam_search_step(views(first), {}, l);
  REQUIRE_FALSE(d.done);
  REQUIRE(d.children.size() == 2);
  CHECK_FALSE(d.children[0].fork);
  CHECK(d.children[1].fork);

  l.max_tokens = 2;  // the next step ends by length: 4 offers, best 3 = n returned; with max_tokens 1 only 2 exist
  const std::vector<BeamData> second = {{-0.1, {10}, {offer(10, -0.3f), offer(11, -0.4f)}},
                                        {-0.2, {11}, {offer(10, -0.5f), offer(11, -0.6f)}}};
  const BeamDecision end = beam_search_step(views(second), {}, l);
  CHECK(end.done);
  REQUIRE(end.finished.size() == 3);
  CHECK(ids(end.finished[0].tokens) == std::vector<TokenId>{10, 10});
  l.max_tokens = 1;
  const BeamDecision short_end = beam_search_step(views(first), {}, l);
  CHECK(short_end.done);
  CHECK(short_end.finished.size() == 2);
}

TEST_CASE("children and finished hypotheses carry each token as offered: its logprob and alternatives", "[beam]") {
  SampledToken stop = offer(2, -0.1f), go_on = offer(11, -0.2f);
  stop.top_logprobs = {{2, -0.1f}, {11, -0.2f}};
  go_on.top_logprobs = stop.top_logprobs;
  const std::vector<BeamData> data = {{-1.0, {5, 6}, {stop, go_on, offer(12, -3.0f)}}};
  const BeamDecision d = beam_search_step(views(data), {}, limits());
  REQUIRE(d.finished.size() == 1);
  const std::vector<SampledToken>& h = d.finished[0].tokens;
  REQUIRE(h.size() == 3);
  CHECK(h[0].logprob == data[0].output[0].logprob);  // the parent's output as it was offered
  CHECK(h[1].logprob == data[0].output[1].logprob);
  CHECK(h[2].logprob == -0.1f);
  CHECK(h[2].top_logprobs == stop.top_logprobs);
  REQUIRE_FALSE(d.children.empty());
  CHECK(d.children[0].token.logprob == -0.2f);
  CHECK(d.children[0].token.top_logprobs == go_on.top_logprobs);
}
