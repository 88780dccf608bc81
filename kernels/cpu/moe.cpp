#include "kernels/cpu/moe.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/ops.h"
#include "model/moe/expert_routing.h"

namespace paged::cpu {

void grouped_linear(float* out, const float* x, const int32_t* x_rows, const int32_t* offsets, const float* w,
                    int num_experts, int n, int k) {
  std::vector<float> rows;
  for (int e = 0; e < num_experts; ++e) {
    const int first = offsets[e], count = offsets[e + 1] - first;
    if (count == 0) continue;
    const float* in = x + static_cast<int64_t>(first) * k;
    if (x_rows) {  // gather the expert's rows first
      rows.resize(static_cast<size_t>(count) * k);
      for (int i = 0; i < count; ++i)
        std::copy_n(x + static_cast<int64_t>(x_rows[first + i]) * k, k, rows.begin() + static_cast<int64_t>(i) * k);
      in = rows.data();
    }
    linear(out + static_cast<int64_t>(first) * n, in, w + static_cast<int64_t>(e) * n * k, nullptr, count, n, k);
  }
}

void combine_experts(float* out, const float* y, const int32_t* slot_position, const float* weights, int tokens,
                     int top_k, int hidden, bool accumulate) {
  for (int t = 0; t < tokens; ++t) {
    float* o = out + static_cast<int64_t>(t) * hidden;
    if (!accumulate) std::fill(o, o + hidden, 0.0f);
    for (int j = 0; j < top_k; ++j) {
      const int64_t slot = static_cast<int64_t>(t) * top_k + j;
      const float* row = y + static_cast<int64_t>(slot_position[slot]) * hidden;
      for (int c = 0; c < hidden; ++c) o[c] += weights[slot] * row[c];
    }
  }
}

void moe_mlp(float* out, const float* x, int tokens, int hidden, const MoeWeights& w) {
  const int slots = tokens * w.top_k;
  std::vector<float> router_logits(static_cast<size_t>(tokens) * w.num_experts);
  linear(router_logits.data(), x, w.router, nullptr, tokens, w.num_experts, hidden);
  const ExpertChoice choice = route_tokens(router_logits.data(), tokens, w.num_experts, w.top_k, w.renormalize);
  const ExpertGroups groups = group_by_expert(choice.experts, w.num_experts, 1);
  std::vector<int32_t> token_of(slots);  // the token of each sorted position
  for (int p = 0; p < slots; ++p) token_of[p] = groups.sorted_slot[p] / w.top_k;
  std::vector<float> gate_up(static_cast<size_t>(slots) * 2 * w.inter), act(static_cast<size_t>(slots) * w.inter);
  std::vector<float> y(static_cast<size_t>(slots) * hidden);
  grouped_linear(gate_up.data(), x, token_of.data(), groups.offsets.data(), w.gate_up, w.num_experts, 2 * w.inter,
                 hidden);
  silu_and_mul(act.data(), gate_up.data(), slots, w.inter);
  grouped_linear(y.data(), act.data(), nullptr, groups.offsets.data(), w.down, w.num_experts, hidden, w.inter);
  combine_experts(out, y.data(), groups.slot_position.data(), choice.weights.data(), tokens, w.top_k, hidden, false);
}

}  // namespace paged::cpu
