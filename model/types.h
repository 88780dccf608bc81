// The ids every layer shares: tokens, sequences, KV blocks.
#pragma once

#include <cstdint>
#include <utility>

namespace paged {

using TokenId = int32_t;
using SeqId = uint64_t;
using BlockPair = std::pair<int32_t, int32_t>;  // (src block, dst block)

}  // namespace paged
