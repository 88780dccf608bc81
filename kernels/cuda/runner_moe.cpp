// CudaModelRunner's mixture-of-experts MLP (Mixtral, Qwen3-MoE): see runner_impl.h. The twin of cpu::moe_mlp
// (kernels/cpu/moe.cpp), kernel for kernel. Every size the kernels read on the device (the experts' row counts)
// stays there: the launches depend on the step's row count alone, so decode steps capture into CUDA graphs.
#include "kernels/cuda/runner_impl.h"

#include "model/moe/expert_routing.h"

namespace paged {

void CudaModelRunner::Impl::allocate_moe() {
  const int64_t E = cfg.moe.num_experts, slots = int64_t{max_tokens} * cfg.moe.top_k;
  int64_t tiles = 0;  // the most any tile size needs
  for (const int rows : cuda::kSupportedExpertTileRows)
    tiles = std::max<int64_t>(tiles, max_expert_tiles(static_cast<int>(slots), static_cast<int>(E), rows));
  router_gemm = std::make_unique<cuda::Gemm>(size_t{4} << 20, cuda::GemmTuning{.candidates = 1});
  moe_logits = device_alloc<float>(int64_t{max_tokens} * E);
  moe_weights = device_alloc<float>(slots);
  moe_experts = device_alloc<int32_t>(slots);
  moe_groups = device_alloc<int32_t>((E + 1) + 3 * slots + 2 * tiles);
  int32_t* at = moe_groups.get();
  const auto take = [&at](int64_t n) { return std::exchange(at, at + n); };
  moe_view.offsets = take(E + 1);
  moe_view.sorted_slot = take(slots);
  moe_view.sorted_token = take(slots);
  moe_view.slot_position = take(slots);
  moe_view.tile_expert = take(tiles);
  moe_view.tile_row = take(tiles);
  moe_gate_up = device_alloc<bf16>(slots * 2 * inter);
  moe_act = device_alloc<bf16>(slots * inter);
  moe_out = device_alloc<bf16>(slots * hidden);
}

void CudaModelRunner::Impl::moe_mlp(bf16* out, const bf16* x, const LayerWeights& L, int rows, bool accumulate) {
  const int E = cfg.moe.num_experts, k = cfg.moe.top_k, slots = rows * k;
  const int layout = cuda::expert_product_layout(slots, E), tile = layout == 0 ? 16 : layout;  // 0: GEMVs
  cudaStream_t s = compute;
  PAGED_CUDA_CHECK(router_gemm->linear(moe_logits.get(), x, L.router, nullptr, rows, E, hidden, true, s));
  PAGED_CUDA_CHECK(cuda::route_topk(moe_experts.get(), moe_weights.get(), moe_logits.get(), rows, E, k,
                                    cfg.moe.renormalize, s));
  PAGED_CUDA_CHECK(cuda::group_experts(moe_view, moe_experts.get(), slots, k, E, tile, s));
  const int tiles = max_expert_tiles(slots, E, tile);
  cuda::GroupedGemmArgs g{.y = moe_gate_up.get(), .x = x, .x_rows = moe_view.sorted_token, .w = L.w_gate_up,
                          .offsets = moe_view.offsets, .tile_expert = moe_view.tile_expert,
                          .tile_row = moe_view.tile_row, .max_tiles = tiles, .n = 2 * inter, .k = hidden,
                          .tile_rows = tile, .gemv_slots = layout == 0 ? slots : 0,
                          .num_experts = E};
  PAGED_CUDA_CHECK(cuda::grouped_linear(g, s));
  PAGED_CUDA_CHECK(cuda::silu_and_mul(moe_act.get(), moe_gate_up.get(), slots, inter, s));
  g.y = moe_out.get();
  g.x = moe_act.get();
  g.x_rows = nullptr;
  g.w = L.w_down;
  g.n = hidden;
  g.k = inter;
  PAGED_CUDA_CHECK(cuda::grouped_linear(g, s));
  PAGED_CUDA_CHECK(cuda::combine_experts(out, moe_out.get(), moe_view.slot_position, moe_weights.get(), rows, k,
                                         hidden, accumulate, s));
}

}  // namespace paged
