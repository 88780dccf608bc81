// A runner's LoRA slot arrays built on the host, for the tests: each packed adapter copied into its slot by
// lora_slot_copies (model/lora/lora_layout.h), executed here as the CUDA runner executes them with cudaMemcpy2DAsync.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <utility>
#include <vector>

#include "model/lora/lora_layout.h"

namespace paged::test {

/// The arrays of packed.size() slots, slot s holding packed[s] (weights, scales); each destination element is
/// written at most once (REQUIRE).
struct LoraSlots {
  std::vector<uint16_t> w;
  std::vector<float> s;
};
using PackedLora = std::pair<std::vector<uint16_t>, std::vector<float>>;  // pack_lora's weights and scales
inline LoraSlots place_lora_slots(const LoraLayout& layout, const std::vector<PackedLora>& packed) {
  const int slots = static_cast<int>(packed.size());
  LoraSlots out{std::vector<uint16_t>(static_cast<size_t>(layout.weights * slots), 0),
                std::vector<float>(static_cast<size_t>(layout.scales * slots), 0.0f)};
  std::vector<int> w_written(out.w.size(), 0), s_written(out.s.size(), 0);
  for (int slot = 0; slot < slots; ++slot)
    for (const LoraCopy& c : lora_slot_copies(layout, slots, slot))
      for (int64_t r = 0; r < c.rows; ++r)
        for (int64_t i = 0; i < c.width; ++i) {
          const auto src = static_cast<size_t>(c.src + r * c.width + i);
          const auto dst = static_cast<size_t>(c.dst + r * c.dst_pitch + i);
          if (c.scales) {
            REQUIRE(dst < out.s.size());
            out.s[dst] = packed[static_cast<size_t>(slot)].second.at(src);
            REQUIRE(++s_written[dst] == 1);
          } else {
            REQUIRE(dst < out.w.size());
            out.w[dst] = packed[static_cast<size_t>(slot)].first.at(src);
            REQUIRE(++w_written[dst] == 1);
          }
        }
  return out;
}

}  // namespace paged::test
