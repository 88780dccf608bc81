// How a runner that keeps adapters in fixed slots (the CUDA runner) lays one adapter out: every decoder layer's four
// fused linear layers (QKV, O, gate/up, down) get room for their largest set of pairs, `rank` columns each, so that
// every adapter fits every slot and the kernels find a layer's pairs at the same offsets in any slot. A layer's pairs
// are concatenated: A's rows one after another ([rank][k]), B transposed the same way ([rank][n], zero outside each
// pair's output rows), and a scale per rank column (the pair's lora_alpha / r). Columns no pair uses are zero, so
// they add nothing. Pure: no CUDA; the runner uploads what pack_lora writes.
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

/// One fused linear layer's room in a slot: A [rank][k] and B^T [rank][n] at element offsets of the slot's bf16
/// weights, the scales [rank] at an offset of its floats. rank 0: the layer takes no pairs (the MLP of a mixture of
/// experts).
struct LoraBlock {
  int64_t a = 0, bt = 0, scale = 0;
  int rank = 0, n = 0, k = 0;
};

struct LoraLayout {
  std::vector<std::array<LoraBlock, kLoraProjections>> layers;
  int64_t weights = 0;  // bf16 elements of a slot
  int64_t scales = 0;   // floats of a slot
  int max_rank = 0;     // the largest block rank (the kernels' scratch per row)
};

/// A fused linear layer's shape on this rank: output rows n and input columns k; `lora` false when it takes no pairs.
struct LoraShape {
  int n = 0, k = 0;
  bool lora = true;
};

/// The layout of `num_layers` layers with these shapes (in LoraProjection order) for adapters of r up to
/// max_lora_rank. Offsets are multiples of 8 elements (16 bytes).
LoraLayout lora_layout(int num_layers, const std::array<LoraShape, kLoraProjections>& shapes, int max_lora_rank);

/// Writes `adapter` into one slot's arrays (resized to the layout's and zeroed first): A and B^T rounded to bf16 (their
/// bits), the scales as floats. Throws ModelError naming the layer when a layer's pairs need more rank than its room,
/// a pair lies outside the layer's rows or columns, or the adapter has another number of layers.
void pack_lora(const LoraAdapter& adapter, const LoraLayout& layout, std::vector<uint16_t>& weights,
               std::vector<float>& scales);

}  // namespace paged
