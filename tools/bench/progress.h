// A progress line for long runs (the benchmarks): a bar redrawn in place on a terminal, plain "done/total" lines
// otherwise, at a bounded rate.
#pragma once

#include <chrono>
#include <ostream>
#include <string>

namespace paged::bench {

class ProgressBar {
 public:
  /// Reports on `out` under `label` the progress towards `total` (> 0) items: on a terminal (`is_terminal`) a bar
  /// redrawn with '\r', else one "label: done/total" line per report; at most one report per `min_interval`
  /// besides the first and the last (done == total), which are always shown. Not thread-safe: callers serialise.
  ProgressBar(std::ostream& out, bool is_terminal, std::string label, int total,
              std::chrono::milliseconds min_interval);
  /// `done` items are finished (0..total, non-decreasing); draws when due.
  void update(int done);

 private:
  void draw(int done, std::chrono::steady_clock::time_point now);

  std::ostream& out_;
  const bool is_terminal_;
  const std::string label_;
  const int total_;
  const std::chrono::milliseconds min_interval_;
  const std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  int drawn_ = -1;  // the `done` last shown; -1: nothing shown yet
};

/// A ProgressBar on stderr for `total` items: a bar when stderr is a terminal (10 redraws a second), else plain
/// lines (one a second).
ProgressBar stderr_progress(std::string label, int total);

}  // namespace paged::bench
