// sequence_kv_bytes against footprints counted by hand.
#include <catch2/catch.hpp>

#include <vector>

#include "model/kv/kv_footprint.h"

using namespace paged;

TEST_CASE("KV footprint: every layer keeps every block, or a sliding layer only its window's", "[kv][footprint]") {
  // 6 layers, 2 KV heads of 64: one 16-token block of K and V in bf16 is 2 * 2 * 64 * 16 * 2 = 8 KiB per layer.
  struct Case {
    const char* what;
    std::vector<int> windows;
    int64_t context;
    int64_t every_blocks, window_blocks;  // summed over the layers, counted by hand
  };
  const std::vector<Case> cases = {
      {"no sliding layer: positions 0..99 in 7 blocks on every layer", {}, 100, 6 * 7, 6 * 7},
      // First visible position 100 - 32 = 68, in block 4: blocks 4, 5, 6 on each sliding layer.
      {"Gemma 3's pattern, window 32", {32, 32, 32, 32, 32, 0}, 100, 6 * 7, 5 * 3 + 7},
      {"a context within the window keeps everything", {32, 32, 32, 32, 32, 0}, 20, 6 * 2, 6 * 2},
      // First visible 8192 - 1024 = 7168, block 448: blocks 448 .. 511.
      {"8k, window 1024: 64 of 512 blocks", {1024, 1024, 1024, 1024, 1024, 0}, 8192, 6 * 512, 5 * 64 + 512},
      // First visible 7192 = 16 * 449 + 8: blocks 449 .. 511 on layer 0, the block the window starts in kept.
      {"a window starting inside a block", {1000, 0, 0, 0, 0, 0}, 8192, 6 * 512, 63 + 5 * 512}};
  for (const Case& c : cases) {
    INFO(c.what);
    ModelConfig m;
    m.num_layers = 6;
    m.num_kv_heads = 2;
    m.head_dim = 64;
    m.sliding_windows = c.windows;
    const KvFootprint f = sequence_kv_bytes(m, c.context, 16, 2);
    CHECK(f.every_block == c.every_blocks * 8192);
    CHECK(f.window_blocks == c.window_blocks * 8192);
  }
}
