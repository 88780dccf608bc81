// The fuzz tests' random stream (tests/actors/test_step_fuzz.cpp, tests/http/test_request_fuzz.cpp): seeded, so a
// failure repeats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace paged::test {

/// Draws from a seeded random stream.
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

}  // namespace paged::test
