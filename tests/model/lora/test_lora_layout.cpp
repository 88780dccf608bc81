// The slot layout of LoRA adapters (model/lora/lora_layout.h), alone: adapters packed and placed into the slots of a
// runner's arrays (lora_slot_copies), read the way the CUDA products read them (v = A_all x over every slot's rows,
// kept for the row's slot and scaled, then y += B_all v), add what add_lora_pairs (the CPU runner's) adds for the
// same pairs; every block has room of its own; what does not fit is refused naming the layer.
#include <catch2/catch.hpp>

#include <random>

#include "kernels/cpu/ops.h"
#include "model/loader/config.h"
#include "model/loader/safetensors.h"
#include "model/lora/lora_layout.h"
#include "tests/model/lora/lora_slots.h"

using namespace paged;

namespace {

// Layers of 2: QKV 24 x 16 (q 16 rows, k 4, v 4), O 16 x 16, gate/up 48 x 16, down 16 x 24.
constexpr std::array<LoraShape, kLoraProjections> kShapes{
    LoraShape{24, 16}, LoraShape{16, 16}, LoraShape{48, 16}, LoraShape{16, 24}};

// A pair of rank r on rows [offset, offset + rows) of a layer with k inputs: values already bf16 (as the slot keeps
// them), so that the two ways of computing differ only in float summation order.
LoraPair pair(int offset, int rows, int r, int k, float scale, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  LoraPair p{.out_offset = offset, .out_rows = rows, .rank = r, .scale = scale};
  p.a.resize(static_cast<size_t>(r) * k);
  p.b.resize(static_cast<size_t>(rows) * r);
  for (float& x : p.a) x = bf16_to_float(float_to_bf16(u(rng)));
  for (float& x : p.b) x = bf16_to_float(float_to_bf16(u(rng)));
  return p;
}

// Row x of slot `slot` through block b of the runner's arrays, as the products compute it: v = A_all x for every
// slot's rank columns, only the row's slot's kept and scaled, then y += B_all v.
void apply_block(const LoraBlock& b, const test::LoraSlots& all, int slots, int slot, const std::vector<float>& x,
                 std::vector<float>& y) {
  const int64_t cols = int64_t{slots} * b.rank;
  std::vector<float> v(static_cast<size_t>(cols));
  for (int64_t r = 0; r < cols; ++r) {
    float sum = 0.0f;
    for (int i = 0; i < b.k; ++i) sum += bf16_to_float(all.w[static_cast<size_t>(slots * b.a + r * b.k + i)]) * x[i];
    v[static_cast<size_t>(r)] = r / b.rank == slot ? sum * all.s[static_cast<size_t>(slots * b.scale + r)] : 0.0f;
  }
  for (int i = 0; i < b.n; ++i)
    for (int64_t r = 0; r < cols; ++r)
      y[i] += bf16_to_float(all.w[static_cast<size_t>(slots * b.b + i * cols + r)]) * v[static_cast<size_t>(r)];
}

}  // namespace

TEST_CASE("a packed LoRA slot adds what the CPU runner's pairs add, every layer and linear layer in its own room",
          "[lora]") {
  std::mt19937 rng(3);
  const LoraLayout layout = lora_layout(2, kShapes, 4);
  REQUIRE(layout.layers.size() == 2);
  CHECK(layout.max_rank == 16);  // QKV: three pairs of 4, rounded up to 8
  // Blocks in order, 8-element aligned, none overlapping: each ends where the next begins (rounded up to 8).
  int64_t weights = 0, scales = 0;
  for (const auto& layer : layout.layers)
    for (int p = 0; p < kLoraProjections; ++p) {
      const LoraBlock& b = layer[p];
      INFO("projection " << p);
      CHECK(b.rank == (kLoraMaxPairs[p] * 4 + 7) / 8 * 8);
      CHECK(b.n == kShapes[p].n);
      CHECK(b.k == kShapes[p].k);
      CHECK(b.a == weights);
      CHECK(b.a % 8 == 0);
      CHECK(b.b >= b.a + int64_t{b.rank} * b.k);
      CHECK(b.b % 8 == 0);
      weights = b.b + (int64_t{b.rank} * b.n + 7) / 8 * 8;
      CHECK(b.scale == scales);
      scales += b.rank;
    }
  CHECK(layout.weights == weights);
  CHECK(layout.scales == scales);

  LoraAdapter adapter;
  adapter.path = "test-adapter";
  adapter.layers.resize(2);
  adapter.layers[0].qkv = {pair(0, 16, 2, 16, 2.0f, rng), pair(20, 4, 4, 16, 0.5f, rng), pair(16, 4, 1, 16, 4.0f, rng)};
  adapter.layers[0].down = {pair(0, 16, 3, 24, 1.5f, rng)};
  adapter.layers[1].o = {pair(0, 16, 4, 16, 1.0f, rng)};
  adapter.layers[1].gate_up = {pair(24, 24, 2, 16, 8.0f, rng), pair(0, 24, 4, 16, 0.25f, rng)};
  std::vector<uint16_t> w;
  std::vector<float> s;
  pack_lora(adapter, layout, w, s);
  REQUIRE(w.size() == static_cast<size_t>(layout.weights));
  REQUIRE(s.size() == static_cast<size_t>(layout.scales));
  // A second adapter in slot 0, this one in slot 1, slot 2 empty (zeros: adds nothing).
  LoraAdapter other;
  other.path = "other-adapter";
  other.layers.resize(2);
  other.layers[0].qkv = {pair(16, 4, 3, 16, 1.0f, rng)};
  other.layers[0].o = {pair(0, 16, 4, 16, 2.0f, rng)};
  other.layers[1].down = {pair(0, 16, 1, 24, 0.5f, rng)};
  std::vector<uint16_t> w_other;
  std::vector<float> s_other;
  pack_lora(other, layout, w_other, s_other);
  const test::PackedLora empty{std::vector<uint16_t>(w.size(), 0), std::vector<float>(s.size(), 0.0f)};
  const test::LoraSlots all = test::place_lora_slots(layout, {{w_other, s_other}, {w, s}, empty});
  const LoraAdapter* in_slot[] = {&other, &adapter, nullptr};

  const std::vector<LoraPair> LoraLayer::*which[] = {&LoraLayer::qkv, &LoraLayer::o, &LoraLayer::gate_up,
                                                     &LoraLayer::down};
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  int changed = 0;
  for (int l = 0; l < 2; ++l)
    for (int p = 0; p < kLoraProjections; ++p)
      for (int slot = 0; slot < 3; ++slot) {
        INFO("layer " << l << " projection " << p << " slot " << slot);
        const LoraBlock& b = layout.layers[l][p];
        std::vector<float> x(static_cast<size_t>(b.k)), want(static_cast<size_t>(b.n)), got(want.size());
        for (float& v : x) v = u(rng);
        for (size_t i = 0; i < want.size(); ++i) want[i] = got[i] = u(rng);
        std::vector<float> scratch;
        if (in_slot[slot]) cpu::add_lora_pairs(want.data(), x.data(), b.k, in_slot[slot]->layers[l].*which[p], scratch);
        apply_block(b, all, 3, slot, x, got);
        for (size_t i = 0; i < want.size(); ++i) CHECK(got[i] == Approx(want[i]).margin(1e-4));
        changed += in_slot[slot] && !(in_slot[slot]->layers[l].*which[p]).empty();
      }
  CHECK(changed == 7);  // the pairs above: the comparison is not of two untouched rows
}

TEST_CASE("what does not fit a LoRA slot is refused naming the layer; a mixture's MLP has no room", "[lora]") {
  std::mt19937 rng(4);
  std::array<LoraShape, kLoraProjections> moe = kShapes;
  moe[kLoraGateUp].lora = moe[kLoraDown].lora = false;
  const LoraLayout moe_layout = lora_layout(2, moe, 4);
  CHECK(moe_layout.layers[0][kLoraGateUp].rank == 0);
  CHECK(moe_layout.layers[1][kLoraDown].rank == 0);
  CHECK(moe_layout.layers[0][kLoraO].rank == 8);  // one pair of 4, rounded up to 8
  std::vector<uint16_t> w;
  std::vector<float> s;
  const auto refused = [&](const LoraAdapter& a, const LoraLayout& layout, const std::string& words) {
    CHECK_THROWS_WITH(pack_lora(a, layout, w, s), Catch::Contains(words));
  };
  LoraAdapter a;
  a.path = "bad";
  a.layers.resize(2);
  a.layers[1].down = {pair(0, 16, 2, 24, 1.0f, rng)};
  refused(a, moe_layout, "layer 1 down: this model's runner takes no LoRA pairs here");

  const LoraLayout layout = lora_layout(2, kShapes, 4);
  LoraAdapter big = a;
  big.layers[1].down = {pair(0, 16, 9, 24, 1.0f, rng)};  // r 9 in room for one pair of 4 (8 after rounding)
  refused(big, layout, "layer 1 down: its pairs need rank 9, the slots hold 8");
  LoraAdapter outside = a;
  outside.layers[1].down = {pair(8, 16, 2, 24, 1.0f, rng)};  // rows 8..24 of 16
  refused(outside, layout, "does not fit the layer's 16 x 24 weight");
  LoraAdapter wide = a;
  wide.layers[1].down = {pair(0, 16, 2, 16, 1.0f, rng)};  // A of 16 columns for 24 inputs
  refused(wide, layout, "does not fit");
  LoraAdapter three = a;
  three.layers.resize(3);
  refused(three, layout, "has 3 layers, the model 2");
}
