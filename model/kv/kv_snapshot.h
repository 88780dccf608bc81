// A picture of the KV blocks for the dashboard (GET /dashboard): every block of every tier as one cell byte, in
// block order, run-length encoded, so that 100k free or cached blocks in a row cost one run. Pure data and the
// encoding; KvCacheManager::snapshot() fills it from its pools and block tables.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/types.h"

namespace paged {

/// What one block holds, as one byte. From kCellFirstSeq on: in use by one sequence, the value chosen by its id
/// (seq_cell), so that a sequence keeps its colour from one snapshot to the next.
inline constexpr uint8_t kCellFree = 0;      // no content
inline constexpr uint8_t kCellCached = 1;    // free but holding registered content (a prefix-cache hit revives it),
                                             // or a disk-tier file
inline constexpr uint8_t kCellShared = 2;    // in use by more than one sequence (ref count > 1)
inline constexpr uint8_t kCellBusy = 3;      // in use by the tier itself: a CPU-tier block that a promotion or a
                                             // disk load holds
inline constexpr uint8_t kCellFirstSeq = 4;

/// The cell of a block in use by sequence `seq` alone: kCellFirstSeq + seq mod (256 - kCellFirstSeq).
uint8_t seq_cell(SeqId seq);

/// `count` consecutive blocks with the same cell.
struct CellRun {
  uint8_t cell = kCellFree;
  int64_t count = 0;
};

/// One tier's blocks, block 0 first.
struct TierSnapshot {
  std::string name;              // "device" (the GPU pool, or the CPU executor's), "swap" (CPU swap space), "cpu"
                                 // (the prefix cache's CPU tier), "disk" (its disk tier: stored files, then room)
  int64_t num_blocks = 0;        // the sum of the runs' counts
  std::vector<CellRun> runs;     // never two neighbours with the same cell, no empty run

  /// Appends `count` blocks with `cell`, merged into the last run when it has the same cell.
  void push(uint8_t cell, int64_t count = 1);
  /// Blocks whose cell is `cell`.
  int64_t count(uint8_t cell) const;
  /// Blocks in use: neither free nor cached.
  int64_t in_use() const { return num_blocks - count(kCellFree) - count(kCellCached); }
};

/// A sequence that holds blocks.
struct SeqSnapshot {
  SeqId seq = 0;
  bool swapped = false;          // its blocks are in the swap tier, else on the device
  int32_t num_blocks = 0;        // blocks it holds (not those a sliding window released)
  int32_t num_computed = 0;      // tokens whose KV a returned step wrote
};

/// Every tier of one KV cache manager, and the sequences holding blocks.
struct KvSnapshot {
  int32_t block_size = 0;
  std::vector<TierSnapshot> tiers;  // "device", "swap" (when it has blocks), "cpu" and "disk" (when enabled)
  std::vector<SeqSnapshot> seqs;    // by id
};

}  // namespace paged
