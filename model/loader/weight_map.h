// The checkpoint's tensors as the runners hold them: Hugging Face names of the Llama family, the shapes the config
// implies, and the part of each tensor one tensor-parallel rank keeps. q/k/v and gate/up are column-parallel (rank r
// keeps whole KV heads with their query heads, and a slice of the intermediate size: rows of those tensors), o_proj
// and down_proj row-parallel (the matching columns); embedding, norms and LM head are replicated, and the LM head is
// the embedding when tie_word_embeddings is set. Qwen3's q_norm / k_norm ([head_dim], shared by all heads) are
// replicated (Gemma 3's four norms per layer too); o_proj's bias (attention_bias) is added once, after the
// all-reduce's sum: rank 0 alone keeps it. The CPU runner (float32) and the CUDA runner (bf16) both load from this
// one map, in its order, into the same layout: the fused QKV [q rows, k rows, v rows][hidden] (Qwen2's biases
// likewise) and the fused gate/up [gate rows, up rows][hidden]. Phi-3 checkpoints hold those fused already
// (qkv_proj, gate_up_proj): a rank's shards are then row ranges of the one tensor. Mixtures of experts (Mixtral,
// Qwen3-MoE): the router is replicated, and every expert is sharded as a dense MLP is (rank r keeps the same slice of
// each expert's intermediate size), the experts back to back in one parameter: gate/up [experts][gate rows, up
// rows][hidden], down [experts][hidden][rank's intermediate], from per-expert tensors or from transformers 5's fused
// [experts, ...] ones (a 3-D tensor taken as a matrix of experts x rows).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/loader/config.h"
#include "model/loader/safetensors.h"

namespace paged {

/// The part of one checkpoint tensor that a rank keeps: rows [row_begin, row_begin + rows) and columns
/// [col_begin, col_begin + cols) of the tensor taken as a matrix (a vector is one row; a 3-D tensor [a, b, c] is a
/// matrix of a * b rows).
struct TensorShard {
  std::string name;            // e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // what the config implies: {rows, cols} for a matrix, {cols} for a vector, {experts,
                               //   rows, cols} for fused experts
  int64_t row_begin = 0, rows = 1;
  int64_t col_begin = 0, cols = 0;
  /// Elements the rank keeps: rows * cols.
  int64_t numel() const { return rows * cols; }
};

/// One parameter of a runner: the shards that fill it back to back, each dense [rows][cols] (q, k and v for the
/// fused QKV projection and its bias, gate and up for the fused gate/up projection, one shard for the others; none
/// for a bias the model has not, or the LM head of tied embeddings).
struct RankParam {
  std::vector<TensorShard> shards;
  /// Elements of the parameter on the rank: the sum over its shards.
  int64_t numel() const;
};

/// The parameters of one decoder layer on a rank, declared in load order.
struct RankLayer {
  RankParam attn_norm, ffn_norm;  // input_layernorm, post_attention_layernorm (Gemma: pre_feedforward_layernorm):
                                  //   [hidden]
  RankParam post_attn_norm, post_ffn_norm;  // Gemma (sandwich_norms): post_attention_layernorm on the attention's
                                            //   output, post_feedforward_layernorm on the MLP's: [hidden]; else empty
  RankParam wqkv, bqkv;           // [(heads + 2 * kv_heads) * head_dim][hidden] and its bias (empty without)
  RankParam q_norm, k_norm;       // Qwen3: [head_dim] each (empty without qk_norm)
  RankParam wo;                   // [hidden][heads * head_dim]
  RankParam bo;                   // [hidden], rank 0 only (empty without o_bias)
  RankParam w_gate_up;            // [2 * intermediate][hidden]; MoE: [experts][2 * intermediate][hidden]
  RankParam w_down;               // [hidden][intermediate]; MoE: [experts][hidden][intermediate]
  RankParam router;               // MoE: [experts][hidden], replicated (empty for a dense MLP)
};

/// Every parameter one rank loads, and the rank's share of the model's dimensions. Load order: embed, final_norm,
/// lm_head, then each layer's parameters in RankLayer's order (the first missing or mismatched tensor is reported).
struct WeightMap {
  int heads = 0, kv_heads = 0, intermediate = 0;  // the model's, divided by tp_size
  RankParam embed;       // [vocab][hidden]
  RankParam final_norm;  // [hidden]
  RankParam lm_head;     // [vocab][hidden]; no shards when tie_word_embeddings (the embedding serves)
  std::vector<RankLayer> layers;
};

/// The weight map of rank tp_rank of tp_size. Throws ModelError for a rank outside [0, tp_size) or tp_size < 1, and
/// when tp_size does not divide the attention heads and KV heads, or intermediate_size (the message names
/// "tensor_parallel_size N" and what it does not divide).
WeightMap rank_weight_map(const ModelConfig& config, int tp_rank, int tp_size);

/// `config` with moe.fused_experts set from the checkpoint's tensor names: true when it holds transformers 5's fused
/// experts (model.layers.0.mlp.experts.gate_up_proj), false for one set of tensors per expert and for dense models.
ModelConfig with_expert_layout(ModelConfig config, const SafeTensors& weights);

/// The checkpoint tensor of `shard`, checked against shard.shape. Throws ModelError when it is absent (for
/// lm_head.weight the message adds that tie_word_embeddings is false) or has another shape.
const TensorView& shard_tensor(const SafeTensors& weights, const TensorShard& shard);

/// The shard's elements converted to float32, dense [rows][cols]; an F8_E4M3 weight of an FP8 checkpoint
/// dequantised exactly (each code times its scale, model/loader/fp8_checkpoint.h). Throws as shard_tensor, and as
/// Fp8WeightScales for an F8_E4M3 tensor.
std::vector<float> read_shard_f32(const SafeTensors& weights, const TensorShard& shard,
                                  const Fp8Checkpoint& fp8 = {});

/// Whether some shard of `param` is an F8_E4M3 tensor of the checkpoint (a linear layer an FP8 checkpoint quantised;
/// the layers it left out keep their dtype).
bool holds_fp8(const SafeTensors& weights, const RankParam& param);

/// Whether every shard of `param` is F8_E4M3 with one scale per row (per-tensor or per-channel scales), so that its
/// codes and row scales serve an FP8 linear as they are; block scales are not.
bool fp8_rows_as_stored(const SafeTensors& weights, const RankParam& param, const Fp8Checkpoint& fp8);

}  // namespace paged
