// Checks shared by the sampling tests: two specs' logits processing (paged::PenaltyOps) is the same.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <utility>
#include <vector>

#include "model/sampling/sampler.h"

namespace paged::test {

/// Checks that `a` and `b` mask, penalise and subtract the same tokens (subtractions in any order).
inline void check_same_penalties(const PenaltyOps& a, const PenaltyOps& b) {
  CHECK(a.masked == b.masked);
  CHECK(a.repeated == b.repeated);
  CHECK(a.repetition == b.repetition);
  auto sorted = [](std::vector<std::pair<TokenId, float>> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  CHECK(sorted(a.subtract) == sorted(b.subtract));
  CHECK(a.bias == b.bias);
}

}  // namespace paged::test
