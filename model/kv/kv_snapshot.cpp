#include "model/kv/kv_snapshot.h"

namespace paged {

uint8_t seq_cell(SeqId seq) { return static_cast<uint8_t>(kCellFirstSeq + seq % (256 - kCellFirstSeq)); }

void TierSnapshot::push(uint8_t cell, int64_t count) {
  if (count <= 0) return;
  num_blocks += count;
  if (!runs.empty() && runs.back().cell == cell) {
    runs.back().count += count;
  } else {
    runs.push_back({cell, count});
  }
}

int64_t TierSnapshot::count(uint8_t cell) const {
  int64_t n = 0;
  for (const CellRun& run : runs)
    if (run.cell == cell) n += run.count;
  return n;
}

}  // namespace paged
