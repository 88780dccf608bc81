// The model's shape, read from a Hugging Face config.json (+ generation_config.json) of the Llama family: Llama,
// Mistral, Qwen2, Qwen3 (q/k RMSNorm per head), Phi-3 (fused projections, partial rotary, LongRoPE) and Gemma 3 text
// ((1 + weight) norms, four per layer, GeGLU, scaled embeddings, the final logits' soft-cap, a RoPE of its own on
// sliding layers), with the sliding-window layers of Mistral / Qwen2 / Qwen3 / Phi-3 / Gemma 3 configs, and the
// mixtures of experts Mixtral and Qwen3-MoE (every layer's MLP a set of SwiGLU experts behind a top-k router).
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
  bool longrope = false;               // "longrope" (Phi-3; "su" is its old name)
  bool linear = false;                 // "linear": every frequency divided by factor (Gemma 3's full layers)
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position_embeddings = 8192;
  std::vector<double> short_factor, long_factor;  // longrope: [rotary_dim / 2] each
  double attention_factor = 1.0;       // longrope: cos and sin are multiplied by it (HF's attention_scaling)
};

/// The mixture of experts of Mixtral / Qwen3-MoE: every layer's MLP is num_experts SwiGLU experts of
/// ModelConfig::intermediate_size each, a token goes through the top_k experts of its router's softmax, weighted by
/// their probabilities (renormalised over the chosen when renormalize).
struct MoeConfig {
  int num_experts = 0;       // 0: a dense MLP (num_local_experts, num_experts)
  int top_k = 0;             // num_experts_per_tok
  bool renormalize = true;   // Mixtral always; Qwen3-MoE's norm_topk_prob
  bool fused_experts = false;  // the checkpoint's layout, not config.json's: experts fused into
                               //   mlp.experts.gate_up_proj [E, 2I, H] / down_proj [E, H, I] (transformers 5's own
                               //   layout) rather than one set of tensors per expert; set by with_expert_layout
                               //   (model/loader/weight_map.h)
};

/// How a pre-quantised FP8 checkpoint's scales cover each F8_E4M3 weight [out][in] (model/loader/fp8_checkpoint.h):
/// one per tensor ([] or [1]), one per output channel ([out] or [out, 1]), or one per block of block_rows x
/// block_cols ([ceil(out / block_rows)][ceil(in / block_cols)]).
enum class Fp8ScaleLayout { tensor, channel, block };

/// A checkpoint published in FP8 (config.json's quantization_config: quant_method "fp8" as vLLM / AutoFP8 and
/// transformers' FineGrainedFP8 write it, or "compressed-tensors" with format "float-quantized"): which of its
/// weights are FP8 is what the checkpoint holds (F8_E4M3 tensors; ignored modules keep their dtype), each weight's
/// value being its e4m3 code times its scale.
struct Fp8Checkpoint {
  bool enabled = false;                    // false: no quantization_config (an unquantised checkpoint)
  std::string method;                      // quant_method: "fp8" or "compressed-tensors"
  Fp8ScaleLayout layout = Fp8ScaleLayout::tensor;
  int block_rows = 0, block_cols = 0;      // block: weight_block_size / block_structure
  std::string scale_suffix = "weight_scale";  // the scale tensor beside each "weight": weight_scale, or
                                              //   FineGrainedFP8's weight_scale_inv (a multiplier as well)
  bool static_activations = false;         // the checkpoint's activations have a static input_scale per layer
  int activation_group = 0;                // its activations are scaled per token in groups of this many columns
                                           //   (FineGrainedFP8, compressed-tensors' group strategy); 0: per token
  /// One line for the startup log: the format, its scales, how the weights load (`fp8_linears`: into the CUDA
  /// runner's FP8 linear layers, else dequantised into `dequantised_dtype`) and how activations are quantised
  /// (always dynamically per token); empty when not enabled.
  std::string describe(bool fp8_linears, const std::string& dequantised_dtype) const;
};

/// The feed-forward activation of gate_proj's output, multiplied by up_proj's.
enum class Activation { silu, gelu_tanh };  // gelu_tanh: HF's gelu_pytorch_tanh (Gemma's GeGLU)

struct ModelConfig {
  std::string model_type;              // llama | mistral | qwen2 | qwen3 | phi3 | gemma3_text | mixtral
                                       //   | qwen3_moe
  int hidden_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int rotary_dim = 0;                  // the leading dimensions of a head that RoPE rotates (partial_rotary_factor);
                                       //   0 in a config built by hand: head_dim (read it through rotary_dims())
  int intermediate_size = 0;           // the MLP's, or each expert's with moe (Qwen3-MoE: moe_intermediate_size)
  int vocab_size = 0;
  int max_position_embeddings = 0;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;               // Qwen2, or attention_bias = true
  bool o_bias = false;                 // attention_bias = true (Llama, Qwen3): o_proj has a bias too
  bool qk_norm = false;                // Qwen3: RMSNorm over head_dim on every q and k head, before RoPE
  bool fused_projections = false;      // Phi-3: the checkpoint holds qkv_proj and gate_up_proj, not their parts
  Activation activation = Activation::silu;
  bool norm_plus_one = false;          // Gemma: every RMSNorm scales by (1 + weight), not weight
  bool sandwich_norms = false;         // Gemma: four norms per layer: input, post_attention (on the attention's
                                       //   output), pre_feedforward (the MLP's input), post_feedforward (its output)
  double embedding_scale = 1.0;        // Gemma: sqrt(hidden_size); the runner rounds it to its dtype, as HF does
  double query_pre_attn_scalar = 0.0;  // Gemma: attention scale query_pre_attn_scalar^-0.5; 0: head_dim^-0.5
  double final_logit_softcap = 0.0;    // logits -> cap * tanh(logits / cap); 0: none
  double local_rope_theta = 0.0;       // Gemma 3: the RoPE base of its sliding_attention layers (no scaling); 0: none
  std::vector<bool> local_rope_layers; // [num_layers]: the layers that take local_rope_theta; empty: none
  std::vector<int> sliding_windows;    // [num_layers]: the positions a query of that layer sees, its own included
                                       //   (keys pos - window + 1 .. pos); 0 = every earlier position; empty in a
                                       //   config built by hand: no window (read it through sliding_window(l))
  MoeConfig moe;                       // num_experts 0: dense
  std::string torch_dtype = "float32"; // the checkpoint's dtype
  Fp8Checkpoint fp8_checkpoint;        // quantization_config; not enabled for an unquantised checkpoint
  TokenId bos_token_id = -1;
  std::vector<TokenId> eos_token_ids;  // config.json and generation_config.json, merged

  /// RoPE inverse frequencies [rotary_dim / 2], llama3 or LongRoPE scaling applied. LongRoPE takes its long factors
  /// when max_model_len (0: max_position_embeddings) exceeds original_max_position_embeddings, else the short ones,
  /// for every position (vLLM's rule: the KV of a sequence never depends on how long it grows; Hugging Face switches
  /// per forward call by the sequence's length, which agrees whenever a sequence stays on one side).
  std::vector<float> rope_inv_freq(int max_model_len = 0) const;
  /// The inverse frequencies of the layers local_rope_layers marks: base local_rope_theta, unscaled.
  std::vector<float> local_rope_inv_freq() const;
  /// Whether `layer` takes local_rope_inv_freq() rather than rope_inv_freq().
  bool uses_local_rope(int layer) const {
    return static_cast<size_t>(layer) < local_rope_layers.size() && local_rope_layers[layer];
  }
  /// The factor of q.k in attention: query_pre_attn_scalar^-0.5 when set, else head_dim^-0.5.
  float attention_scale() const;
  /// The dimensions of a head that RoPE rotates: rotary_dim, or head_dim when it was left 0.
  int rotary_dims() const { return rotary_dim > 0 ? rotary_dim : head_dim; }
  /// The sliding window of `layer`, 0 for none (also when sliding_windows was left empty).
  int sliding_window(int layer) const {
    return static_cast<size_t>(layer) < sliding_windows.size() ? sliding_windows[layer] : 0;
  }
  /// Whether some layer attends through a sliding window.
  bool has_sliding_window() const;
  /// Whether the MLPs are mixtures of experts.
  bool is_moe() const { return moe.num_experts > 0; }
};

/// Reads DIR/config.json and DIR/generation_config.json (optional). Throws ModelError naming the offending field.
ModelConfig load_model_config(const std::string& model_dir);

}  // namespace paged
