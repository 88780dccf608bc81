// The KV memory one sequence holds, by layer kind: every layer keeps the blocks of one block table, while a
// sliding-window layer (Gemma 3's five of six, Mistral's every one) reads only the blocks that overlap its window.
// The cache manager releases the others, a KV group at a time (model/kv/kv_groups.h: window_blocks is what it holds
// then, but for a group's unused slots). Pure arithmetic over a ModelConfig; tools/bench_kv_sliding prints it beside
// what the manager holds for Gemma 3's shapes.
#pragma once

#include <cstdint>

#include "model/loader/config.h"

namespace paged {

/// Bytes of K and V one sequence holds over all layers.
struct KvFootprint {
  int64_t every_block = 0;    // every layer holds ceil(context / block_size) blocks (the cache manager, unless every
                              // layer slides)
  int64_t window_blocks = 0;  // a sliding layer holds only the blocks overlapping its window, the others all
};

/// The footprint of a sequence of `context` tokens (positions 0 .. context - 1) whose last token is the newest query:
/// a layer of window W needs positions context - W .. context - 1 only. Blocks of block_size tokens, bytes_per_value
/// bytes per K or V element (2: bf16). context >= 0, block_size >= 1.
KvFootprint sequence_kv_bytes(const ModelConfig& config, int64_t context, int block_size, int bytes_per_value);

}  // namespace paged
