// LoRA adapters (PEFT's format: adapter_config.json beside adapter_model.safetensors) as one tensor-parallel rank
// applies them: for a linear layer W of the base model, y = W x + scale * B (A x), A [r][in] and B [out][r], scale
// lora_alpha / r (lora_alpha / sqrt(r) with use_rslora). The pairs are found by the base model's own tensor names
// (model/loader/weight_map.h): "base_model.model.<base name minus .weight>.lora_A.weight" and ".lora_B.weight", so
// every family and the fused layouts (Phi-3's qkv_proj, gate_up_proj) need nothing of their own. A pair is sharded
// as its base weight is: a column-parallel shard (rows of W: q/k/v, gate/up) keeps those rows of B and all of A, a
// row-parallel one (columns of W: o_proj, down_proj) those columns of A and all of B, whose partial products the
// all-reduce then sums with the base layer's. Pure: no CAF, no CUDA; the runners hold the result in their own form.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/loader/config.h"

namespace paged {

/// One LoRA pair as it adds to a runner's (fused) linear layer on this rank: output rows [out_offset, out_offset +
/// out_rows) of the fused layer get scale * B (A x).
struct LoraPair {
  int out_offset = 0, out_rows = 0;  // rows of the rank's fused output (q rows, then k, then v; gate, then up)
  int rank = 0;                      // r
  float scale = 0.0f;                // lora_alpha / r, or lora_alpha / sqrt(r) (use_rslora)
  std::vector<float> a;              // [rank][in]: the rank's input columns of the layer
  std::vector<float> b;              // [out_rows][rank]
};

/// The pairs of one decoder layer, per fused linear layer of the runners (none: the adapter leaves it alone).
struct LoraLayer {
  std::vector<LoraPair> qkv, o, gate_up, down;
};

/// One adapter, loaded for one rank.
struct LoraAdapter {
  std::string path;
  int max_rank = 0;           // the largest r of its pairs
  uint64_t content_hash = 0;  // of its pairs' weights and scales (never 0): the prefix cache's salt for its requests
  std::vector<LoraLayer> layers;  // [num_layers]
};

/// Reads the PEFT adapter in folder `path` for rank tp_rank of tp_size of a model of `config`. Throws ModelError
/// naming the problem: no adapter_config.json or adapter_model.safetensors (a PyTorch .bin is refused), a peft_type
/// other than LORA, DoRA, LoRA biases, modules_to_save, fan_in_fan_out, an r above max_lora_rank, a pair with one
/// half or shapes that do not fit its base weight, and any LoRA tensor that no base linear layer takes (embeddings,
/// the LM head, the experts of a mixture).
LoraAdapter load_lora_adapter(const std::string& path, const ModelConfig& config, int tp_rank, int tp_size,
                              int max_lora_rank);

}  // namespace paged
