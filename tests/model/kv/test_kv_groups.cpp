// KV groups (model/kv/kv_groups.h): how layers share the blocks, for the layer patterns of the families served, and
// what a sequence holds over its groups.
#include <catch2/catch.hpp>

#include <limits>
#include <stdexcept>
#include <vector>

#include "model/kv/kv_groups.h"

namespace paged {
namespace {

// Gemma 3's pattern: every sixth layer full, the others sliding by `window`.
std::vector<int> gemma3_layers(int layers, int window) {
  std::vector<int> w;
  for (int l = 0; l < layers; ++l) w.push_back((l + 1) % 6 == 0 ? 0 : window);
  return w;
}

}  // namespace

TEST_CASE("KV groups: one group when every layer has the same window, in layer order", "[kv][groups]") {
  const KvGroups none = make_kv_groups(std::vector<int>(32, 0));  // Llama
  CHECK(none.windows == std::vector<int>{0});
  CHECK(none.layers_per_block == 32);
  CHECK(none.slot_of[31] == 31);
  CHECK(none.group_of == std::vector<int>(32, 0));
  CHECK(none.num_sliding() == 0);
  const KvGroups all = make_kv_groups(std::vector<int>(32, 4096));  // Mistral 7B v0.1
  CHECK(all.windows == std::vector<int>{4096});
  CHECK(all.layers_per_block == 32);
  CHECK(all.num_sliding() == 1);
  CHECK_THROWS_AS(make_kv_groups(std::vector<int>{}), std::invalid_argument);
  CHECK_THROWS_AS(make_kv_groups(std::vector<int>{0, -1}), std::invalid_argument);
}

TEST_CASE("KV groups: Gemma 3's layers split into groups of as many layers as it has full ones", "[kv][groups]") {
  // gemma-3-27b: 62 layers, 10 full (5, 11, ..., 59): a group of them, the 52 sliding ones in groups of 10 (the last
  // of 2, its other 8 slots unused).
  const KvGroups g = make_kv_groups(gemma3_layers(62, 1024));
  REQUIRE(g.windows == std::vector<int>{0, 1024, 1024, 1024, 1024, 1024, 1024});
  CHECK(g.layers_per_block == 10);
  CHECK(g.group_of[5] == 0);
  CHECK(g.slot_of[5] == 0);
  CHECK(g.group_of[59] == 0);
  CHECK(g.slot_of[59] == 9);
  CHECK(g.group_of[0] == 1);
  CHECK(g.slot_of[0] == 0);
  CHECK(g.group_of[10] == 1);  // the sliding layers 0-4, 6-10 fill group 1; layer 12 opens group 2
  CHECK(g.slot_of[10] == 9);
  CHECK(g.group_of[12] == 2);
  CHECK(g.slot_of[12] == 0);
  CHECK(g.group_of[61] == 6);
  CHECK(g.slot_of[61] == 1);
  // Every (group, slot) holds one layer.
  std::vector<std::vector<int>> seen(g.num_groups(), std::vector<int>(g.layers_per_block, 0));
  for (size_t l = 0; l < g.group_of.size(); ++l) ++seen[g.group_of[l]][g.slot_of[l]];
  for (const auto& group : seen)
    for (int n : group) CHECK(n <= 1);
  CHECK(g.num_sliding() == 6);
  // gemma-3-12b: 48 layers, 8 full: six groups of 8, none padded.
  const KvGroups twelve = make_kv_groups(gemma3_layers(48, 1024));
  CHECK(twelve.windows.size() == 6);
  CHECK(twelve.layers_per_block == 8);
  // Two window sizes and full layers: a group list per size, ascending (full first).
  const KvGroups mixed = make_kv_groups(std::vector<int>{0, 64, 128, 64, 0, 128});
  CHECK(mixed.windows == std::vector<int>{0, 64, 128});
  CHECK(mixed.layers_per_block == 2);
}

TEST_CASE("KV groups: a pattern that would need more than kMaxKvGroups groups keeps every block in one",
          "[kv][groups]") {
  std::vector<int> layers(40, 512);
  layers[7] = 0;  // one full layer: groups of one layer, 41 of them
  const KvGroups g = make_kv_groups(layers);
  CHECK(g.windows == std::vector<int>{0});  // the full layer reads every position: nothing released
  CHECK(g.layers_per_block == 40);
  std::vector<int> two(40, 512);
  two[7] = 256;  // every layer slides: one group, released behind the largest window
  CHECK(make_kv_groups(two).windows == std::vector<int>{512});
}

TEST_CASE("KV groups: what a sequence holds at most and keeps, over its groups", "[kv][groups]") {
  const std::vector<int> windows{0, 64, 64};
  // 1,000 tokens in blocks of 16: the full group 63 blocks; a sliding group, in chunks of 16, at most
  // ceil((64 + 48) / 16) + 2 = 9, and once done ceil(64 / 16) + 1 = 5.
  CHECK(most_blocks_held(1000, 16, 0, 16) == 63);
  CHECK(most_blocks_held(1000, 16, 64, 16) == 9);
  CHECK(most_blocks_held(windows, 1000, 16, 16) == 63 + 9 + 9);
  CHECK(most_blocks_held(windows, 20, 16, 16) == 6);  // a short sequence: all of its blocks in each group
  // The longest sequence a number of blocks holds: 100 blocks take the sliding groups' 9 each and the full group's
  // ceil(n / 16) <= 82; a sliding group alone holds any length once its window and chunks fit.
  CHECK(longest_sequence(windows, 100, 16, 16) == 82 * 16);
  CHECK(longest_sequence(std::vector<int>{0}, 10, 16, 16) == 160);
  CHECK(longest_sequence(std::vector<int>{64}, 9, 16, 16) == std::numeric_limits<int64_t>::max());
  CHECK(longest_sequence(std::vector<int>{64}, 8, 16, 16) == 128);
  CHECK(longest_sequence(windows, 0, 16, 16) == 0);
  // Three beams from a 100-token prompt (6 full blocks) grown to 1,000 tokens. Full group: the 6 shared, 57 each.
  const std::vector<int> full{0};
  CHECK(most_blocks_held_by_forks(full, 100, 1000, 3, 16, 16, true) == 6 + 3 * 57);
  CHECK(most_blocks_held_by_forks(full, 100, 1000, 3, 16, 16, false) == 3 * 63);
  CHECK(most_blocks_held_by_forks(full, 100, 1000, 1, 16, 16, true) == most_blocks_held(1000, 16, 0, 16));
  // A sliding group holds 9 blocks at most. At 9 blocks none is released and the 6 are shared: 6 + 3 x 3 = 15; at
  // 12, 3 are released: 3 + 3 x 6 = 21; from 15 on the prompt's blocks are all released: 3 x 9 = 27, the most.
  const std::vector<int> sliding{64};
  CHECK(most_blocks_held_by_forks(sliding, 100, 1000, 3, 16, 16, true) == 27);
  CHECK(most_blocks_held_by_forks(sliding, 100, 12 * 16, 3, 16, 16, true) == 21);
  CHECK(most_blocks_held_by_forks(sliding, 100, 130, 3, 16, 16, true) == 6 + 3 * 3);  // 9 blocks, none released
  CHECK(most_blocks_held_by_forks(windows, 100, 130, 3, 16, 16, true) == 3 * (6 + 3 * 3));
  KvGroups g;
  g.windows = windows;
  CHECK(blocks_kept(g, 1000, 16) == 63 + 5 + 5);
  CHECK(blocks_kept(g, 20, 16) == 6);
}

}  // namespace paged
