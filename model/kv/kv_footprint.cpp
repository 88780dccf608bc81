#include "model/kv/kv_footprint.h"

#include <algorithm>

namespace paged {

KvFootprint sequence_kv_bytes(const ModelConfig& config, int64_t context, int block_size, int bytes_per_value) {
  const int64_t B = block_size;
  const int64_t block_bytes = 2 * int64_t{config.num_kv_heads} * config.head_dim * B * bytes_per_value;  // K and V
  const int64_t all = (context + B - 1) / B;  // blocks of positions 0 .. context - 1
  KvFootprint f;
  for (int l = 0; l < config.num_layers; ++l) {
    f.every_block += all * block_bytes;
    const int64_t window = config.sliding_window(l);
    // The newest query sees positions from context - window on; the blocks wholly before that can go.
    const int64_t first_block = window > 0 ? std::max<int64_t>(0, context - window) / B : 0;
    f.window_blocks += (all - first_block) * block_bytes;
  }
  return f;
}

}  // namespace paged
