// Mixture-of-experts bookkeeping: the router's choice per token (route_tokens: softmax, top-k, renormalisation) and
// the grouping of the (token, choice) slots by expert that the grouped expert GEMMs run over (group_by_expert).
// Pure C++: the CPU runner computes with these; the CUDA routing kernels (kernels/cuda/moe.h) are their twins and
// are tested against them.
#pragma once

#include <cstdint>
#include <vector>

namespace paged {

/// The experts a batch of tokens goes through: slot token * top_k + j holds the token's j-th choice.
struct ExpertChoice {
  std::vector<int32_t> experts;  // [tokens][top_k]: expert ids, by decreasing probability
  std::vector<float> weights;    // [tokens][top_k]: their routing weights
};

/// Each token's top_k experts from its router logits, as Hugging Face's Mixtral / Qwen3-MoE routers choose them: the
/// softmax over all experts (float32), the top_k largest probabilities (ties: the lower expert id first), and with
/// renormalize those divided by their sum (Mixtral, Qwen3-MoE's norm_topk_prob; the same as a softmax over the
/// chosen logits). top_k in [1, num_experts].
ExpertChoice route_tokens(const float* logits,  // [tokens][num_experts]
                          int tokens, int num_experts, int top_k, bool renormalize);

/// The tiles of tile_rows sorted positions that the grouped GEMMs of `slots` slots over num_experts experts launch at
/// most: ceil(slots / tile_rows) + num_experts (each expert's last tile may be partial).
inline int max_expert_tiles(int slots, int num_experts, int tile_rows) {
  return (slots + tile_rows - 1) / tile_rows + num_experts;
}

/// The slots sorted by expert (stable: by slot within an expert), and the row tiles of the grouped GEMMs over them.
struct ExpertGroups {
  std::vector<int32_t> offsets;        // [num_experts + 1]: expert e owns sorted positions [offsets[e], offsets[e+1])
  std::vector<int32_t> sorted_slot;    // [slots]: the slot at each sorted position
  std::vector<int32_t> slot_position;  // [slots]: the sorted position of each slot (the inverse)
  std::vector<int32_t> tile_expert;    // [max_expert_tiles]: the expert of each tile, -1 past the last tile
  std::vector<int32_t> tile_row;       // [max_expert_tiles]: the tile's first sorted position (0 past the last)
};

/// Groups the slots of `experts` ([slots], ids in [0, num_experts)) by expert; each expert's positions split into
/// tiles of tile_rows, in expert order (an expert without slots has none). Throws std::out_of_range for an id
/// outside [0, num_experts).
ExpertGroups group_by_expert(const std::vector<int32_t>& experts, int num_experts, int tile_rows);

}  // namespace paged
