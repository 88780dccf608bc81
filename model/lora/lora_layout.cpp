#include "model/lora/lora_layout.h"

#include <algorithm>
#include <string>

#include "model/loader/config.h"
#include "model/loader/safetensors.h"

namespace paged {

namespace {

constexpr const char* kProjectionNames[kLoraProjections] = {"QKV", "O", "gate/up", "down"};

int64_t round_up8(int64_t x) { return (x + 7) / 8 * 8; }

}  // namespace

LoraLayout lora_layout(int num_layers, const std::array<LoraShape, kLoraProjections>& shapes, int max_lora_rank) {
  LoraLayout out;
  out.layers.resize(static_cast<size_t>(num_layers));
  for (auto& layer : out.layers)
    for (int p = 0; p < kLoraProjections; ++p) {
      const LoraShape& s = shapes[p];
      LoraBlock& b = layer[p];
      b.n = s.n;
      b.k = s.k;
      b.rank = s.lora ? static_cast<int>(round_up8(int64_t{kLoraMaxPairs[p]} * max_lora_rank)) : 0;
      b.a = out.weights;
      out.weights += round_up8(int64_t{b.rank} * b.k);
      b.b = out.weights;
      out.weights += round_up8(int64_t{b.rank} * b.n);
      b.scale = out.scales;
      out.scales += b.rank;
      out.max_rank = std::max(out.max_rank, b.rank);
    }
  return out;
}

void pack_lora(const LoraAdapter& adapter, const LoraLayout& layout, std::vector<uint16_t>& weights,
               std::vector<float>& scales) {
  if (adapter.layers.size() != layout.layers.size())
    throw ModelError("LoRA adapter " + adapter.path + " has " + std::to_string(adapter.layers.size()) +
                     " layers, the model " + std::to_string(layout.layers.size()));
  weights.assign(static_cast<size_t>(layout.weights), 0);
  scales.assign(static_cast<size_t>(layout.scales), 0.0f);
  const std::vector<LoraPair> LoraLayer::*kPairs[kLoraProjections] = {&LoraLayer::qkv, &LoraLayer::o,
                                                                      &LoraLayer::gate_up, &LoraLayer::down};
  for (size_t l = 0; l < layout.layers.size(); ++l)
    for (int p = 0; p < kLoraProjections; ++p) {
      const LoraBlock& b = layout.layers[l][p];
      const auto bad = [&](const std::string& why) {
        return ModelError("LoRA adapter " + adapter.path + ", layer " + std::to_string(l) + " " +
                          kProjectionNames[p] + ": " + why);
      };
      int column = 0;  // the next free rank column of the block
      for (const LoraPair& pair : adapter.layers[l].*kPairs[p]) {
        if (b.rank == 0) throw bad("this model's runner takes no LoRA pairs here (a mixture of experts' MLP)");
        if (column + pair.rank > b.rank)
          throw bad("its pairs need rank " + std::to_string(column + pair.rank) + ", the slots hold " +
                    std::to_string(b.rank) + " (--max-lora-rank)");
        if (pair.out_offset < 0 || pair.out_rows < 0 || pair.out_offset + pair.out_rows > b.n ||
            pair.a.size() != static_cast<size_t>(pair.rank) * static_cast<size_t>(b.k) ||
            pair.b.size() != static_cast<size_t>(pair.out_rows) * static_cast<size_t>(pair.rank))
          throw bad("a pair does not fit the layer's " + std::to_string(b.n) + " x " + std::to_string(b.k) +
                    " weight");
        for (int j = 0; j < pair.rank; ++j) {
          const int64_t row = column + j;
          for (int i = 0; i < b.k; ++i)
            weights[static_cast<size_t>(b.a + row * b.k + i)] =
                float_to_bf16(pair.a[static_cast<size_t>(j) * b.k + i]);
          for (int i = 0; i < pair.out_rows; ++i)
            weights[static_cast<size_t>(b.b + (pair.out_offset + i) * int64_t{b.rank} + row)] =
                float_to_bf16(pair.b[static_cast<size_t>(i) * pair.rank + j]);
          scales[static_cast<size_t>(b.scale + row)] = pair.scale;
        }
        column += pair.rank;
      }
    }
}

std::vector<LoraCopy> lora_slot_copies(const LoraLayout& layout, int slots, int slot) {
  std::vector<LoraCopy> out;
  for (const auto& layer : layout.layers)
    for (const LoraBlock& b : layer) {
      if (b.rank == 0) continue;
      const int64_t part = int64_t{slot} * b.rank;  // the slot's first row of A, column of B, scale
      const int64_t a = int64_t{b.rank} * b.k;
      out.push_back({.src = b.a, .dst = slots * b.a + part * b.k, .width = a, .dst_pitch = a});
      out.push_back({.src = b.b, .dst = slots * b.b + part, .rows = b.n, .width = b.rank,
                     .dst_pitch = int64_t{slots} * b.rank});
      out.push_back({.scales = true, .src = b.scale, .dst = slots * b.scale + part, .width = b.rank,
                     .dst_pitch = b.rank});
    }
  return out;
}

}  // namespace paged
