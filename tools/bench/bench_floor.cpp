#include "tools/bench/bench_floor.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace paged::bench {

WorkloadFloor workload_floor(const ModelConfig& cfg, const std::vector<std::pair<int, int>>& lengths,
                             FloorPrecision precision, Ceilings ceilings) {
  const double H = cfg.hidden_size, D = cfg.head_dim, I = cfg.intermediate_size, V = cfg.vocab_size;
  const double L = cfg.num_layers, heads = cfg.num_heads, kv_heads = cfg.num_kv_heads;
  const double weight_byte = precision.fp8_weights ? 1.0 : 2.0;
  const double attention_params = H * D * (2 * heads + 2 * kv_heads);  // q, k, v, o
  const double expert_params = 3 * H * I;                                // gate, up, down
  const double experts = cfg.moe.num_experts, top_k = cfg.moe.top_k;
  const double mlp_params_per_token = cfg.is_moe() ? top_k * expert_params + experts * H : expert_params;
  const double linear_flop = 2 * L * (attention_params + mlp_params_per_token);  // a token
  const double head_flop = 2 * V * H, head_bytes = 2 * V * H;                    // a sampled token; bf16
  // Bytes of the layers' weights a step of `tokens` tokens reads.
  const auto layer_bytes = [&](double tokens) {
    if (!cfg.is_moe()) return L * (attention_params + expert_params) * weight_byte;
    const double touched = experts * (1 - std::pow(1 - top_k / experts, tokens));
    return L * ((attention_params + touched * expert_params) * weight_byte + 2 * experts * H);
  };
  const double kv_bytes = precision.fp8_kv ? 2 * kv_heads * (D + 4) : 2 * kv_heads * D * 2;  // a token and layer
  const double pair_flop = 4 * D * heads;  // S = Q K^T and P V for one (query, key) pair of a layer
  std::map<int, int> windows;              // sliding window (0: none) -> layers
  for (int l = 0; l < cfg.num_layers; ++l) ++windows[cfg.sliding_window(l)];
  const double linear_rate = ceilings.bf16_flop_per_s * (precision.fp8_weights ? 2 : 1);
  const double rate = ceilings.bf16_flop_per_s, bandwidth = ceilings.bytes_per_s;

  WorkloadFloor f;
  double prompt_tokens = 0, prompt_pairs = 0;
  int longest = 0;
  for (const auto& [prompt, output] : lengths) {
    prompt_tokens += prompt;
    longest = std::max(longest, output);
    for (const auto& [window, layers] : windows) {
      const double p = prompt, w = window > 0 ? std::min<double>(window, p) : p;  // keys of the last query
      prompt_pairs += layers * (w * (w + 1) / 2 + (p - w) * w);
    }
  }
  const double prefill_flop_s = prompt_tokens * linear_flop / linear_rate +
                                (double(lengths.size()) * head_flop + prompt_pairs * pair_flop) / rate;
  f.prefill_s = std::max(prefill_flop_s, (layer_bytes(prompt_tokens) + head_bytes) / bandwidth);
  for (int t = 2; t <= longest; ++t) {  // the step that computes output t
    double tokens = 0, kv = 0, pairs = 0;
    for (const auto& [prompt, output] : lengths) {
      if (output < t) continue;
      ++tokens;
      const double keys = prompt + t - 1;
      for (const auto& [window, layers] : windows) {
        const double seen = window > 0 ? std::min<double>(window, keys) : keys;
        kv += layers * seen * kv_bytes;
        pairs += layers * seen;
      }
    }
    const double bytes = layer_bytes(tokens) + head_bytes + kv;
    const double flop_s = tokens * linear_flop / linear_rate + (tokens * head_flop + pairs * pair_flop) / rate;
    f.decode_s += std::max(bytes / bandwidth, flop_s);
    ++f.decode_steps;
  }
  return f;
}

}  // namespace paged::bench
