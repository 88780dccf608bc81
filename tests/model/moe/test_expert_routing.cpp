// route_tokens (softmax, top-k, renormalisation as Mixtral and Qwen3-MoE route) and group_by_expert (slots sorted by
// expert, stable; the GEMM row tiles), against values worked out here.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "model/moe/expert_routing.h"

using namespace paged;

TEST_CASE("route_tokens: softmax over all experts, the top k, renormalised or not", "[moe]") {
  // Token 0: logits 1, 3, 2, 0 -> experts 1 then 2. Token 1: expert 3 first, then 0.
  const std::vector<float> logits{1, 3, 2, 0, 0.5f, -1, -2, 4};
  const double z0 = std::exp(1.0) + std::exp(3.0) + std::exp(2.0) + std::exp(0.0);
  const double z1 = std::exp(0.5) + std::exp(-1.0) + std::exp(-2.0) + std::exp(4.0);
  const ExpertChoice plain = route_tokens(logits.data(), 2, 4, 2, false);
  CHECK(plain.experts == std::vector<int32_t>{1, 2, 3, 0});
  CHECK(plain.weights[0] == Approx(std::exp(3.0) / z0));
  CHECK(plain.weights[1] == Approx(std::exp(2.0) / z0));
  CHECK(plain.weights[2] == Approx(std::exp(4.0) / z1));
  CHECK(plain.weights[3] == Approx(std::exp(0.5) / z1));
  // Renormalised over the chosen: Mixtral's softmax over the chosen logits (1 / (1 + e^-1) for logits 3 and 2).
  const ExpertChoice norm = route_tokens(logits.data(), 2, 4, 2, true);
  CHECK(norm.experts == plain.experts);
  CHECK(norm.weights[0] == Approx(1.0 / (1.0 + std::exp(-1.0))));
  CHECK(norm.weights[1] == Approx(1.0 / (1.0 + std::exp(1.0))));
  CHECK(norm.weights[2] == Approx(1.0 / (1.0 + std::exp(0.5 - 4.0))));
  // top_k = every expert, renormalised: the plain softmax, sorted.
  const ExpertChoice all = route_tokens(logits.data(), 1, 4, 4, true);
  CHECK(all.experts == std::vector<int32_t>{1, 2, 0, 3});
  CHECK(all.weights[3] == Approx(1.0 / z0));
  // top_k = 1 renormalised: weight 1.
  CHECK(route_tokens(logits.data(), 2, 4, 1, true).weights == std::vector<float>{1.0f, 1.0f});
}

TEST_CASE("route_tokens: equal probabilities choose the lower expert id first", "[moe]") {
  const std::vector<float> logits{2, 5, 5, 2, 5};
  const ExpertChoice c = route_tokens(logits.data(), 1, 5, 3, true);
  CHECK(c.experts == std::vector<int32_t>{1, 2, 4});
  for (float w : c.weights) CHECK(w == Approx(1.0 / 3));
}

TEST_CASE("group_by_expert: slots sorted by expert, stable, with empty experts and ragged tiles", "[moe]") {
  // 4 tokens x top 2 over 5 experts; expert 2 and 4 get nothing, expert 0 five slots.
  const std::vector<int32_t> experts{0, 3, 1, 0, 0, 3, 0, 0};
  const ExpertGroups g = group_by_expert(experts, 5, 2);
  CHECK(g.offsets == std::vector<int32_t>{0, 5, 6, 6, 8, 8});
  CHECK(g.sorted_slot == std::vector<int32_t>{0, 3, 4, 6, 7, 2, 1, 5});
  for (size_t p = 0; p < g.sorted_slot.size(); ++p) CHECK(g.slot_position[g.sorted_slot[p]] == int32_t(p));
  // Tiles of 2: expert 0 -> rows 0, 2, 4 (the last one partial), expert 1 -> 5, expert 3 -> 6; then none.
  REQUIRE(g.tile_expert.size() == size_t(max_expert_tiles(8, 5, 2)));
  CHECK(g.tile_expert == std::vector<int32_t>{0, 0, 0, 1, 3, -1, -1, -1, -1});
  CHECK(g.tile_row == std::vector<int32_t>{0, 2, 4, 5, 6, 0, 0, 0, 0});
  CHECK_THROWS_AS(group_by_expert({0, 5}, 5, 2), std::out_of_range);
  CHECK_THROWS_AS(group_by_expert({-1}, 5, 2), std::out_of_range);
}

TEST_CASE("max_expert_tiles bounds the tiles of any grouping", "[moe]") {
  std::mt19937 rng(3);
  for (const int experts : {8, 64, 128})
    for (const int slots : {1, 7, 300})
      for (const int tile : {1, 16, 64})
        for (int trial = 0; trial < 5; ++trial) {
          // Skewed choices: most slots on few experts, many experts empty.
          std::geometric_distribution<int> pick(0.3);
          std::vector<int32_t> ids(slots);
          for (auto& e : ids) e = std::min(pick(rng), experts - 1);
          const ExpertGroups g = group_by_expert(ids, experts, tile);
          int used = 0, covered = 0;
          for (size_t i = 0; i < g.tile_expert.size(); ++i)
            if (g.tile_expert[i] >= 0) {
              ++used;
              covered += std::min(tile, g.offsets[g.tile_expert[i] + 1] - g.tile_row[i]);
            }
          CHECK(used <= max_expert_tiles(slots, experts, tile));
          CHECK(covered == slots);
        }
}
