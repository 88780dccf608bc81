// The model's shape, read from a Hugging Face config.json (+ generation_config.json) of the Llama family.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "model/types.h"

namespace paged {

/// Raised for any problem with a model folder: missing files, unsupported config fields, bad safetensors.
struct ModelError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct RopeScaling {
  bool llama3 = false;                 // rope_scaling.rope_type == "llama3"
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string model_type;              // llama | mistral | qwen2
  int hidden_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int intermediate_size = 0;
  int vocab_size = 0;
  int max_position_embeddings = 0;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;               // Qwen2, or attention_bias = true
  std::string torch_dtype = "float32"; // the checkpoint's dtype
  TokenId bos_token_id = -1;
  std::vector<TokenId> eos_token_ids;  // config.json and generation_config.json, merged

  /// RoPE inverse frequencies [head_dim / 2], llama3 scaling applied.
  std::vector<float> rope_inv_freq() const;
};

/// Reads DIR/config.json and DIR/generation_config.json (optional). Throws ModelError naming the offending field.
ModelConfig load_model_config(const std::string& model_dir);

}  // namespace paged
