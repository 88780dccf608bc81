// The ids every layer shares: tokens, sequences, KV blocks.
#pragma once

#include <cstdint>
#include <utility>

namespace paged {

using TokenId = int32_t;
using SeqId = uint64_t;
using BlockPair = std::pair<int32_t, int32_t>;  // (src block, dst block)

/// A block table entry of a block its sequence released: in a KV group of sliding layers (model/kv/kv_groups.h), the
/// blocks wholly before the window of the sequence's next queries are read by no layer of the group again.
inline constexpr int32_t kReleasedBlock = -1;

/// The first block of a sequence's table that a step computing from position `start_pos` on may read, when no
/// layer's window exceeds `window` (0: no window, block 0): its queries see positions start_pos - window + 1 on, so
/// the blocks before this one may be kReleasedBlock.
inline int first_window_block(int start_pos, int window, int block_size) {
  if (window <= 0 || start_pos - window + 1 <= 0) return 0;
  return (start_pos - window + 1) / block_size;
}

}  // namespace paged
