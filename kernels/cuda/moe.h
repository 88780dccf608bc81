// Mixture-of-experts kernels (Mixtral, Qwen3-MoE) on bf16 activations: the router's top-k per token, the grouping
// of the (token, choice) slots by expert, the grouped GEMM (one launch per projection over every expert: tokens
// sorted by expert, per-expert row offsets read on the device, so nothing syncs with the host and CUDA graphs
// capture it), and the weighted combination of the experts' outputs back into token order.
// CPU twins: route_tokens and group_by_expert (model/moe/expert_routing.h), cpu::grouped_linear and
// cpu::combine_experts (kernels/cpu/moe.h).
// Every launcher enqueues on `stream` and returns the launch status; arguments outside what the kernels support are
// refused with cudaErrorInvalidValue and a message (describe_launch_error).
#pragma once

#include <cstdint>

#include "kernels/cuda/launch.h"

namespace paged::cuda {

/// The largest expert count and top-k the routing kernels take.
inline constexpr int kMaxExperts = 256;
inline constexpr int kMaxTopK = 8;
/// The row tiles of the grouped GEMM: 16 rows for decode-sized groups (few rows per expert), 64 and 128 for prefill.
inline constexpr int kSupportedExpertTileRows[] = {16, 64, 128};
/// Up to this many (token, choice) slots the grouped products run as one GEMV per slot (GroupedGemmArgs::gemv_slots):
/// one stream and small batches, where the tiles would leave most SMs idle (8 experts x 12 column tiles of 128).
inline constexpr int kMaxGemvSlots = 32;
/// How the grouped products run for `slots` over num_experts: 0, a GEMV per slot (up to kMaxGemvSlots), else the row
/// tile of the grouped GEMM: 16 while the experts average at most 8 slots, 64 up to 32, else 128 (bench_cuda_runner
/// moe-gemm on the H200: at 16 slots an expert 64 beats 16, at 64 slots 128 beats 64).
inline int expert_product_layout(int slots, int num_experts) {
  return slots <= kMaxGemvSlots ? 0 : slots <= 8 * num_experts ? 16 : slots <= 32 * num_experts ? 64 : 128;
}

/// Each token's top_k experts from its float router logits: softmax over all experts, the top_k largest (ties: the
/// lower id), divided by their sum when renormalize. Grid ceil(tokens / 4), 4 warps a block, one warp per token.
/// num_experts in [1, kMaxExperts], top_k in [1, min(num_experts, kMaxTopK)].
cudaError_t route_topk(int32_t* experts,      // [tokens][top_k]
                       float* weights,        // [tokens][top_k]
                       const float* logits,   // [tokens][num_experts]
                       int tokens, int num_experts, int top_k, bool renormalize, cudaStream_t stream);

/// Where group_experts writes the grouping (paged::ExpertGroups' fields, and the token of each sorted position).
struct ExpertGroupsView {
  int32_t* offsets;        // [num_experts + 1]
  int32_t* sorted_slot;    // [slots]
  int32_t* sorted_token;   // [slots]: sorted_slot / top_k, the row of the token a position reads
  int32_t* slot_position;  // [slots]
  int32_t* tile_expert;    // [max_expert_tiles(slots, num_experts, tile_rows)]
  int32_t* tile_row;       // same
};

/// Sorts the slots of `experts` by expert, stable, and lays out the GEMM row tiles of tile_rows
/// (kSupportedExpertTileRows): one block counts, scans and fills the tile table; then one block per expert places
/// its slots in slot order. An id outside [0, num_experts) counts nowhere (its slot keeps no position).
cudaError_t group_experts(const ExpertGroupsView& groups,
                          const int32_t* experts,  // [slots]
                          int slots, int top_k, int num_experts, int tile_rows, cudaStream_t stream);

/// One grouped product: y[p] = x[x_rows ? x_rows[p] : p] * w[e]^T for the sorted positions p of every expert e,
/// float32 accumulation. gemv_slots 0: bf16 tensor cores (m16n8k16 MMAs, operands streamed by cp.async three stages
/// deep), grid (ceil(n / 128), max_tiles), 8 warps a block: block (i, t) computes columns 128 i .. of tile t
/// (tile_expert[t] < 0: nothing). gemv_slots > 0 (the positions, offsets[num_experts]; the tiles unused): one GEMV per
/// position, grid (ceil(n / 8), gemv_slots), each warp two output columns, the expert of a position found in offsets.
/// n and k multiples of 8, pointers 16-byte aligned.
struct GroupedGemmArgs {
  bf16* y;                    // [slots][n]
  const bf16* x;              // [rows][k]
  const int32_t* x_rows;      // [slots] or nullptr (x is in sorted order)
  const bf16* w;              // [num_experts][n][k]
  const int32_t* offsets;     // [num_experts + 1]
  const int32_t* tile_expert; // [max_tiles]
  const int32_t* tile_row;    // [max_tiles]
  int max_tiles, n, k, tile_rows;
  int gemv_slots = 0, num_experts = 0;
};
cudaError_t grouped_linear(const GroupedGemmArgs& args, cudaStream_t stream);

/// out[t] = (accumulate ? out[t] : 0) + sum over j < top_k of weights[t, j] * y[slot_position[t, j]], summed in
/// float32 and rounded once. Grid (tokens), 128 threads, 8 columns a thread. hidden a multiple of 8.
cudaError_t combine_experts(bf16* out,                    // [tokens][hidden]
                            const bf16* y,                // [tokens * top_k][hidden], sorted by expert
                            const int32_t* slot_position, // [tokens * top_k]
                            const float* weights,         // [tokens * top_k]
                            int tokens, int top_k, int hidden, bool accumulate, cudaStream_t stream);

}  // namespace paged::cuda
