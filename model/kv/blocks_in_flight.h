// The device KV blocks that copies on another stream (swaps, CPU-tier moves) may still be reading or writing, and
// whether a step touches any of them. A step that does must wait for those copies; one that does not runs beside
// them (the CUDA runner: a swap-in overlaps the steps until its sequence is scheduled, a swap-out the steps until a
// freed block is given out again). Pure bookkeeping: the runner adds a copy's device blocks as it enqueues it and
// clears them once the copies are done or waited for.
#pragma once

#include <cstdint>
#include <vector>

#include "model/step.h"

namespace paged {

class BlocksInFlight {
 public:
  /// Device blocks 0 .. num_blocks - 1.
  explicit BlocksInFlight(int32_t num_blocks = 0);

  /// Marks `block` (outside [0, num_blocks): std::out_of_range).
  void add(int32_t block);
  bool empty() const { return marked_.empty(); }
  /// Whether the step reads or writes a marked block: one of a chunk's block tables (every KV group's), or a
  /// copy-on-write pair's source or destination. Entries outside the pool (a released sliding entry, -1) are none.
  bool touched_by(const StepBatch& batch) const;
  /// Unmarks every block (the copies are done, or the step waits for them).
  void clear();

 private:
  bool marked(int32_t block) const {
    return block >= 0 && block < static_cast<int32_t>(in_flight_.size()) && in_flight_[block];
  }
  std::vector<uint8_t> in_flight_;  // per block: marked
  std::vector<int32_t> marked_;     // the marked blocks, once each
};

}  // namespace paged
