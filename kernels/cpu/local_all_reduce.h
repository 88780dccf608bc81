// In-process all-reduce for tensor parallelism on CPU executors (one thread per rank).
#pragma once

#include <barrier>
#include <vector>

#include "kernels/cpu/cpu_runner.h"

namespace paged {

/// Sums over ranks in rank order, so every rank gets bit-identical results. Two barriers per call: one after every
/// rank published its buffer, one after every rank read all of them.
class LocalAllReduce final : public AllReduce {
 public:
  explicit LocalAllReduce(int ranks) : buffers_(ranks), barrier_(ranks) {}
  void sum(float* data, size_t n, int rank) override {
    buffers_[rank] = data;
    barrier_.arrive_and_wait();
    thread_local std::vector<float> total;
    total.assign(buffers_[0], buffers_[0] + n);
    for (size_t r = 1; r < buffers_.size(); ++r)
      for (size_t i = 0; i < n; ++i) total[i] += buffers_[r][i];
    barrier_.arrive_and_wait();
    std::copy(total.begin(), total.end(), data);
  }

 private:
  std::vector<float*> buffers_;
  std::barrier<> barrier_;
};

}  // namespace paged
