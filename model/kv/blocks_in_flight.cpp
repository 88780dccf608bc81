#include "model/kv/blocks_in_flight.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace paged {

BlocksInFlight::BlocksInFlight(int32_t num_blocks) : in_flight_(static_cast<size_t>(std::max(num_blocks, 0)), 0) {}

void BlocksInFlight::add(int32_t block) {
  if (block < 0 || block >= static_cast<int32_t>(in_flight_.size()))
    throw std::out_of_range("BlocksInFlight: block " + std::to_string(block) + " outside the pool");
  if (!in_flight_[block]) marked_.push_back(block);
  in_flight_[block] = 1;
}

bool BlocksInFlight::touched_by(const StepBatch& batch) const {
  if (marked_.empty()) return false;
  for (const auto& [src, dst] : batch.copies)
    if (marked(src) || marked(dst)) return true;
  const auto any = [&](const std::vector<int32_t>& table) {
    for (const int32_t block : table)
      if (marked(block)) return true;
    return false;
  };
  for (const SeqChunk& c : batch.seqs) {
    if (any(c.block_table)) return true;
    for (const auto& table : c.group_tables)
      if (any(table)) return true;
  }
  return false;
}

void BlocksInFlight::clear() {
  for (const int32_t block : marked_) in_flight_[block] = 0;
  marked_.clear();
}

}  // namespace paged
