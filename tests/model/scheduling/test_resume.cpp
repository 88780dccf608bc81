#include <catch2/catch.hpp>

#include "model/scheduling/resume.h"

using namespace paged;

TEST_CASE("a moved request goes on from what its client was sent", "[resume]") {
  SamplingParams p;
  p.n = 3;
  const std::vector<DeliveredCompletion> delivered = {
      {.index = 2, .tokens = {7, 8, 9}, .cumulative_logprob = -1.5, .finished = false},
      {.index = 0, .tokens = {4, 5}, .cumulative_logprob = -0.5, .finished = false},
      {.index = 1, .tokens = {4, 2}, .cumulative_logprob = -2.0, .finished = true},  // ended: nothing more
  };
  const ResumePoint point = resume_point(p, delivered);
  CHECK_FALSE(point.restart);
  REQUIRE(point.seqs.size() == 2);
  CHECK(point.seqs[0].index == 0);
  CHECK(point.seqs[0].output == std::vector<TokenId>{4, 5});
  CHECK(point.seqs[0].cumulative_logprob == -0.5);
  CHECK(point.seqs[1].index == 2);
  CHECK(point.seqs[1].output == std::vector<TokenId>{7, 8, 9});
}

TEST_CASE("a moved request whose client saw nothing, or that delivers at its end, starts over", "[resume]") {
  SamplingParams p;
  p.n = 2;
  CHECK(resume_point(p, {{.index = 0}, {.index = 1}}).restart);
  SamplingParams beam;
  beam.use_beam_search = true;
  beam.n = 2;
  CHECK(resume_point(beam, {{.index = 0, .tokens = {3}}, {.index = 1, .tokens = {4}}}).restart);
  SamplingParams best_of;
  best_of.n = 1;
  best_of.best_of = 3;
  CHECK(resume_point(best_of, {{.index = 0, .tokens = {3}}, {.index = 1}, {.index = 2}}).restart);
}

TEST_CASE("a moved request with every completion finished has nothing left", "[resume]") {
  const ResumePoint point = resume_point(SamplingParams{}, {{.index = 0, .tokens = {1, 2}, .finished = true}});
  CHECK_FALSE(point.restart);
  CHECK(point.seqs.empty());
}
