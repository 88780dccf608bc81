// The mixture-of-experts kernels against their CPU twins: route_topk vs route_tokens, group_experts vs
// group_by_expert (model/moe/expert_routing.h), grouped_linear and combine_experts vs cpu::grouped_linear and
// cpu::combine_experts (kernels/cpu/moe.h). Expert counts 8-128, top-k 1-8, ragged token counts, empty experts.
#include <numeric>

#include "kernels/cpu/moe.h"
#include "kernels/cuda/moe.h"
#include "model/moe/expert_routing.h"
#include "tests/kernels/cuda/gpu_test_util.h"

using namespace paged;
using namespace paged::gpu_test;

namespace {

// Router logits whose values differ by at least 0.03 within a row (a random permutation of evenly spaced levels):
// no near-tie that float rounding of the softmax could order either way.
std::vector<float> spaced_logits(std::mt19937& rng, int tokens, int experts) {
  std::vector<float> out(static_cast<size_t>(tokens) * experts);
  std::vector<int> level(experts);
  std::iota(level.begin(), level.end(), 0);
  std::uniform_real_distribution<float> shift(-2.f, 2.f);
  for (int t = 0; t < tokens; ++t) {
    std::shuffle(level.begin(), level.end(), rng);
    const float s = shift(rng);
    for (int e = 0; e < experts; ++e)
      out[static_cast<size_t>(t) * experts + e] = s + 0.03f * (128.f / experts) * level[e];
  }
  return out;
}

// top_k distinct experts per token, skewed (low ids far more often), so that some experts stay empty.
std::vector<int32_t> skewed_choices(std::mt19937& rng, int tokens, int experts, int top_k) {
  std::vector<int32_t> out;
  std::geometric_distribution<int> pick(4.0 / experts);
  for (int t = 0; t < tokens; ++t) {
    std::vector<int32_t> mine;
    while (static_cast<int>(mine.size()) < top_k) {
      const int e = std::min(pick(rng), experts - 1);
      if (std::find(mine.begin(), mine.end(), e) == mine.end()) mine.push_back(e);
    }
    out.insert(out.end(), mine.begin(), mine.end());
  }
  return out;
}

// The GPU's grouping of `experts`: offsets, sorted_slot, sorted_token, slot_position, tile_expert, tile_row.
struct DeviceGroups {
  DeviceArray<int32_t> offsets, sorted_slot, sorted_token, slot_position, tile_expert, tile_row;
  DeviceGroups(int slots, int num_experts, int tiles)
      : offsets(num_experts + 1), sorted_slot(slots), sorted_token(slots), slot_position(slots), tile_expert(tiles),
        tile_row(tiles) {}
  cuda::ExpertGroupsView view() const {
    return {offsets.get(), sorted_slot.get(), sorted_token.get(), slot_position.get(), tile_expert.get(),
            tile_row.get()};
  }
};

}  // namespace

TEST_CASE("route_topk matches route_tokens", "[gpu][moe]") {
  require_device();
  std::mt19937 rng(21);
  for (const int experts : {8, 16, 64, 128})
    for (const int top_k : {1, 2, 4, 8})
      for (const int tokens : {1, 37, 300})
        for (const bool renormalize : {true, false}) {
          if (top_k > experts) continue;
          INFO(experts << " experts, top " << top_k << ", " << tokens << " tokens, renormalize " << renormalize);
          const std::vector<float> logits = spaced_logits(rng, tokens, experts);
          const ExpertChoice want = route_tokens(logits.data(), tokens, experts, top_k, renormalize);
          DeviceArray<float> d_logits(logits), d_weights(want.weights.size());
          DeviceArray<int32_t> d_experts(want.experts.size());
          CUDA_REQUIRE(cuda::route_topk(d_experts.get(), d_weights.get(), d_logits.get(), tokens, experts, top_k,
                                        renormalize, nullptr));
          CHECK(d_experts.download() == want.experts);
          const std::vector<float> got = d_weights.download();
          for (size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == Approx(want.weights[i]).margin(1e-6));
        }
  CHECK(cuda::route_topk(nullptr, nullptr, nullptr, 1, 300, 2, true, nullptr) == cudaErrorInvalidValue);
  CHECK(cuda::route_topk(nullptr, nullptr, nullptr, 1, 8, 9, true, nullptr) == cudaErrorInvalidValue);
}

TEST_CASE("group_experts matches group_by_expert: stable order, empty experts, ragged tiles", "[gpu][moe]") {
  require_device();
  std::mt19937 rng(22);
  for (const int experts : {8, 32, 128})
    for (const int top_k : {1, 2, 8})
      for (const int tokens : {1, 5, 129, 2000})
        for (const int tile : {16, 64, 128}) {
          if (top_k > experts) continue;
          INFO(experts << " experts, top " << top_k << ", " << tokens << " tokens, tiles of " << tile);
          const std::vector<int32_t> ids = skewed_choices(rng, tokens, experts, top_k);
          const int slots = tokens * top_k, tiles = max_expert_tiles(slots, experts, tile);
          const ExpertGroups want = group_by_expert(ids, experts, tile);
          DeviceArray<int32_t> d_ids(ids);
          DeviceGroups g(slots, experts, tiles);
          CUDA_REQUIRE(cuda::group_experts(g.view(), d_ids.get(), slots, top_k, experts, tile, nullptr));
          CHECK(g.offsets.download() == want.offsets);
          CHECK(g.sorted_slot.download() == want.sorted_slot);
          CHECK(g.slot_position.download() == want.slot_position);
          CHECK(g.tile_expert.download() == want.tile_expert);
          CHECK(g.tile_row.download() == want.tile_row);
          std::vector<int32_t> tokens_of(slots);
          for (int p = 0; p < slots; ++p) tokens_of[p] = want.sorted_slot[p] / top_k;
          CHECK(g.sorted_token.download() == tokens_of);
        }
  CHECK(cuda::group_experts({}, nullptr, 4, 2, 8, 32, nullptr) == cudaErrorInvalidValue);
}

TEST_CASE("grouped_linear (tiles and GEMVs) matches cpu::grouped_linear over ragged experts, gathered or sorted rows",
          "[gpu][moe]") {
  require_device();
  std::mt19937 rng(23);
  struct Shape {
    int experts, top_k, tokens, n, k;
  };
  // Ragged n and k (not multiples of the 128 x 32 tiles), decode-sized and prefill-sized groups, 8 to 128 experts.
  for (const Shape& sh : {Shape{8, 2, 1, 128, 64}, Shape{8, 2, 37, 72, 40}, Shape{16, 4, 200, 96, 64},
                          Shape{128, 8, 3, 64, 128}, Shape{128, 8, 300, 136, 256}, Shape{64, 1, 90, 64, 48},
                          Shape{8, 2, 700, 264, 520}})
    for (const int layout : {0, 16, 64, 128})  // 0: a GEMV per position, else the row tile
      for (const bool gather : {true, false}) {
        const int tile = layout == 0 ? 16 : layout;
        INFO(sh.experts << " experts, top " << sh.top_k << ", " << sh.tokens << " tokens, n " << sh.n << ", k " << sh.k
                        << (layout == 0 ? ", GEMVs" : ", tiles of ") << layout << (gather ? ", gathered" : ""));
        const std::vector<int32_t> ids = skewed_choices(rng, sh.tokens, sh.experts, sh.top_k);
        const int slots = sh.tokens * sh.top_k, tiles = max_expert_tiles(slots, sh.experts, tile);
        const ExpertGroups groups = group_by_expert(ids, sh.experts, tile);
        std::vector<int32_t> rows(slots);
        for (int p = 0; p < slots; ++p) rows[p] = groups.sorted_slot[p] / sh.top_k;
        const int x_rows = gather ? sh.tokens : slots;
        const auto x = random_bf16_values(rng, static_cast<size_t>(x_rows) * sh.k);
        const auto w = random_bf16_values(rng, static_cast<size_t>(sh.experts) * sh.n * sh.k, 0.1f);
        std::vector<float> want(static_cast<size_t>(slots) * sh.n);
        cpu::grouped_linear(want.data(), x.data(), gather ? rows.data() : nullptr, groups.offsets.data(), w.data(),
                            sh.experts, sh.n, sh.k);
        DeviceArray<bf16> d_x(to_bf16(x)), d_w(to_bf16(w)), d_y(want.size());
        DeviceArray<int32_t> d_rows(rows), d_offsets(groups.offsets), d_tile_expert(groups.tile_expert),
            d_tile_row(groups.tile_row);
        const cuda::GroupedGemmArgs args{.y = d_y.get(), .x = d_x.get(), .x_rows = gather ? d_rows.get() : nullptr,
                                         .w = d_w.get(), .offsets = d_offsets.get(),
                                         .tile_expert = d_tile_expert.get(), .tile_row = d_tile_row.get(),
                                         .max_tiles = tiles, .n = sh.n, .k = sh.k, .tile_rows = tile,
                                         .gemv_slots = layout == 0 ? slots : 0, .num_experts = sh.experts};
        CUDA_REQUIRE(cuda::grouped_linear(args, nullptr));
        check_close(to_float(d_y.download()), want, "grouped_linear");
      }
  cuda::GroupedGemmArgs bad{};
  bad.k = 12;
  CHECK(cuda::grouped_linear(bad, nullptr) == cudaErrorInvalidValue);
  bad = {.max_tiles = 70000, .n = 64, .k = 64, .tile_rows = 64};  // beyond the grid's y limit
  CHECK(cuda::grouped_linear(bad, nullptr) == cudaErrorInvalidValue);
  bad = {.n = 64, .k = 64, .tile_rows = 16, .gemv_slots = 70000, .num_experts = 8};
  CHECK(cuda::grouped_linear(bad, nullptr) == cudaErrorInvalidValue);
}

TEST_CASE("combine_experts matches cpu::combine_experts, stored and accumulated", "[gpu][moe]") {
  require_device();
  std::mt19937 rng(24);
  for (const int top_k : {1, 2, 8})
    for (const int tokens : {1, 61})
      for (const bool accumulate : {false, true}) {
        const int hidden = 264, experts = 16, slots = tokens * top_k;
        INFO("top " << top_k << ", " << tokens << " tokens, accumulate " << accumulate);
        const ExpertGroups groups = group_by_expert(skewed_choices(rng, tokens, experts, top_k), experts, 16);
        const auto y = random_bf16_values(rng, static_cast<size_t>(slots) * hidden);
        const auto base = random_bf16_values(rng, static_cast<size_t>(tokens) * hidden);
        std::vector<float> weights(slots);
        std::uniform_real_distribution<float> u(0.f, 1.f);
        for (auto& x : weights) x = u(rng);
        std::vector<float> want = base;
        cpu::combine_experts(want.data(), y.data(), groups.slot_position.data(), weights.data(), tokens, top_k, hidden,
                             accumulate);
        DeviceArray<bf16> d_out(to_bf16(base)), d_y(to_bf16(y));
        DeviceArray<int32_t> d_pos(groups.slot_position);
        DeviceArray<float> d_w(weights);
        CUDA_REQUIRE(cuda::combine_experts(d_out.get(), d_y.get(), d_pos.get(), d_w.get(), tokens, top_k, hidden,
                                           accumulate, nullptr));
        check_close(to_float(d_out.download()), want, "combine_experts");
      }
}
