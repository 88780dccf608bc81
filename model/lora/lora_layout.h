// How a runner that keeps adapters in fixed slots (the CUDA runner) lays adapters out: every decoder layer's four
// fused linear layers (QKV, O, gate/up, down) get room for their largest set of pairs, `rank` columns (a multiple of
// 8), so that every adapter fits every slot. One adapter packs into arrays of its own (pack_lora): a layer's pairs
// concatenated, A's rows one after another ([rank][k]), B ([n][rank], zero outside each pair's output rows), and a
// scale per rank column (the pair's lora_alpha / r); columns no pair uses are zero, so they add nothing. The runner's
// arrays hold every slot's block side by side (lora_slot_copies), so that one matrix product covers all slots: A
// [slots * rank][k], B [n][slots * rank], scales [slots * rank]. Pure: no CUDA; the runner makes the copies.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "model/lora/lora_adapter.h"

namespace paged {

/// The fused linear layers of a decoder layer, in LoraLayer's order.
enum LoraProjection { kLoraQkv, kLoraO, kLoraGateUp, kLoraDown, kLoraProjections };

/// Pairs a fused linear layer takes at most: q, k and v; o; gate and up; down.
inline constexpr std::array<int, kLoraProjections> kLoraMaxPairs{3, 1, 2, 1};

/// One fused linear layer's room: in one adapter's packed arrays, A [rank][k] and B [n][rank] at element offsets of
/// its bf16 weights, the scales [rank] at an offset of its floats; in the runner's arrays of S slots, the block of
/// every slot starts at S times these offsets (A [S * rank][k], B [n][S * rank], scales [S * rank], slot s's part
/// from row, column and scale s * rank). rank 0: the layer takes no pairs (the MLP of a mixture of experts).
struct LoraBlock {
  int64_t a = 0, b = 0, scale = 0;
  int rank = 0, n = 0, k = 0;
};

struct LoraLayout {
  std::vector<std::array<LoraBlock, kLoraProjections>> layers;
  int64_t weights = 0;  // bf16 elements of one adapter (a slot)
  int64_t scales = 0;   // floats of one adapter
  int max_rank = 0;     // the largest block rank (the kernels' scratch per row)
};

/// A fused linear layer's shape on this rank: output rows n and input columns k; `lora` false when it takes no pairs.
struct LoraShape {
  int n = 0, k = 0;
  bool lora = true;
};

/// The layout of `num_layers` layers with these shapes (in LoraProjection order) for adapters of r up to
/// max_lora_rank: a block's rank is its pairs' room, rounded up to a multiple of 8 (the products' inner dimension).
/// Offsets are multiples of 8 elements (16 bytes).
LoraLayout lora_layout(int num_layers, const std::array<LoraShape, kLoraProjections>& shapes, int max_lora_rank);

/// Writes `adapter` into one adapter's arrays (resized to the layout's and zeroed first): A and B rounded to bf16
/// (their bits), the scales as floats. Throws ModelError naming the layer when a layer's pairs need more rank than its
/// room, a pair lies outside the layer's rows or columns, or the adapter has another number of layers.
void pack_lora(const LoraAdapter& adapter, const LoraLayout& layout, std::vector<uint16_t>& weights,
               std::vector<float>& scales);

/// One copy of an adapter's packed arrays into a slot of the runner's: `rows` rows of `width` elements, from `src`
/// (rows `width` apart) to `dst` (rows `dst_pitch` apart); of the bf16 weights, or of the scales.
struct LoraCopy {
  bool scales = false;
  int64_t src = 0, dst = 0, rows = 1, width = 0, dst_pitch = 0;
};

/// The copies that place one adapter's packed arrays into slot `slot` of `slots` (blocks without rank: none).
std::vector<LoraCopy> lora_slot_copies(const LoraLayout& layout, int slots, int slot);

}  // namespace paged
