// Where the time of the engine's steps goes, by kind of step (decode, mixed, prefill): the device's busy time, its
// idle gap before each step, and the host's share of each step's round trip. Pure bookkeeping for
// `paged bench --profile` (the scheduler adds every step; thread-safe).
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>

#include "model/step.h"

namespace paged {

enum class StepKind { decode, mixed, prefill };

/// decode: every chunk is one token (a decode, or the last token of a prompt); prefill: none is; mixed: both.
StepKind step_kind(const StepBatch& batch);
const char* step_kind_name(StepKind kind);

class StepProfile {
 public:
  struct Row {
    int64_t steps = 0, tokens = 0;
    int64_t wall_us = 0;         // from sending the step to the executors to its results, summed
    int64_t busy_us = 0;         // the device working on it (StepCost::busy_us), summed
    int64_t idle_before_us = 0;  // the device idle before it (StepCost::idle_before_us), summed
  };
  /// Adds one step of `kind` with `tokens` tokens that took `wall_us` end to end and cost the device `cost`.
  void add(StepKind kind, int64_t tokens, int64_t wall_us, const StepCost& cost);
  /// The totals of one kind so far.
  Row row(StepKind kind) const;
  /// A table, one line per kind that ran plus the total: steps, tokens per step, and per step the wall, busy, host
  /// (wall - busy) and idle-before times in ms, with the busy share of the wall time.
  std::string table() const;

 private:
  mutable std::mutex mu_;
  std::array<Row, 3> rows_{};
};

}  // namespace paged
