#include "model/moe/expert_routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

namespace paged {

ExpertChoice route_tokens(const float* logits, int tokens, int num_experts, int top_k, bool renormalize) {
  ExpertChoice choice;
  choice.experts.resize(static_cast<size_t>(tokens) * top_k);
  choice.weights.resize(choice.experts.size());
  std::vector<float> prob(num_experts);
  std::vector<int32_t> order(num_experts);
  for (int t = 0; t < tokens; ++t) {
    const float* row = logits + static_cast<int64_t>(t) * num_experts;
    const float max = *std::max_element(row, row + num_experts);
    float sum = 0.0f;
    for (int e = 0; e < num_experts; ++e) sum += prob[e] = std::exp(row[e] - max);
    for (int e = 0; e < num_experts; ++e) prob[e] /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                      [&](int32_t a, int32_t b) { return prob[a] > prob[b] || (prob[a] == prob[b] && a < b); });
    float chosen = 0.0f;
    for (int j = 0; j < top_k; ++j) chosen += prob[order[j]];
    for (int j = 0; j < top_k; ++j) {
      const size_t slot = static_cast<size_t>(t) * top_k + j;
      choice.experts[slot] = order[j];
      choice.weights[slot] = renormalize ? prob[order[j]] / chosen : prob[order[j]];
    }
  }
  return choice;
}

ExpertGroups group_by_expert(const std::vector<int32_t>& experts, int num_experts, int tile_rows) {
  const int slots = static_cast<int>(experts.size());
  ExpertGroups g;
  g.offsets.assign(num_experts + 1, 0);
  for (int32_t e : experts) {
    if (e < 0 || e >= num_experts)
      throw std::out_of_range("expert id " + std::to_string(e) + " outside [0, " + std::to_string(num_experts) + ")");
    ++g.offsets[e + 1];
  }
  std::partial_sum(g.offsets.begin(), g.offsets.end(), g.offsets.begin());
  g.sorted_slot.resize(slots);
  g.slot_position.resize(slots);
  std::vector<int32_t> next(g.offsets.begin(), g.offsets.end() - 1);
  for (int s = 0; s < slots; ++s) {
    const int32_t p = next[experts[s]]++;
    g.sorted_slot[p] = s;
    g.slot_position[s] = p;
  }
  const int max_tiles = max_expert_tiles(slots, num_experts, tile_rows);
  g.tile_expert.assign(max_tiles, -1);
  g.tile_row.assign(max_tiles, 0);
  int tile = 0;
  for (int e = 0; e < num_experts; ++e)
    for (int32_t row = g.offsets[e]; row < g.offsets[e + 1]; row += tile_rows, ++tile) {
      g.tile_expert[tile] = e;
      g.tile_row[tile] = row;
    }
  return g;
}

}  // namespace paged
