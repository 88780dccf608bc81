#include "model/loader/weight_map.h"

#include <algorithm>
#include <optional>

#include "model/loader/fp8_checkpoint.h"

namespace paged {

namespace {

// The whole tensor `name` of `shape` (a vector is one row, a 3-D tensor a matrix of its first two dimensions' rows).
TensorShard whole(std::string name, std::vector<int64_t> shape) {
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < shape.size(); ++d) rows *= shape[d];
  const int64_t cols = shape.back();
  return {std::move(name), std::move(shape), 0, rows, 0, cols};
}

// Rows [begin, begin + rows) of a [R][C] matrix: a column-parallel weight.
TensorShard row_shard(std::string name, std::vector<int64_t> shape, int64_t begin, int64_t rows) {
  TensorShard s = whole(std::move(name), std::move(shape));
  s.row_begin = begin;
  s.rows = rows;
  return s;
}

// Columns [begin, begin + cols) of a [R][C] matrix (a row-parallel weight), or elements of a vector (the bias of a
// column-parallel weight).
TensorShard column_shard(std::string name, std::vector<int64_t> shape, int64_t begin, int64_t cols) {
  TensorShard s = whole(std::move(name), std::move(shape));
  s.col_begin = begin;
  s.cols = cols;
  return s;
}

const std::string kLmHead = "lm_head.weight";

// The router and experts of layer prefix `p` on a rank that keeps intermediate columns [begin, begin + ir) of each
// expert (of I): per expert Mixtral's block_sparse_moe.experts.E.w1 (gate) / w3 (up) / w2 (down) or Qwen3-MoE's
// mlp.experts.E.gate_proj / up_proj / down_proj, or fused mlp.experts.gate_up_proj [E, 2I, H] (gate rows first) and
// down_proj [E, H, I].
void expert_shards(const ModelConfig& config, const std::string& p, int64_t begin, int64_t ir, RankLayer& L) {
  const int64_t E = config.moe.num_experts, H = config.hidden_size, I = config.intermediate_size;
  const bool mixtral = config.model_type == "mixtral";
  if (config.moe.fused_experts) {
    L.router.shards = {whole(p + "mlp.gate.weight", {E, H})};
    const std::string gate_up = p + "mlp.experts.gate_up_proj", down = p + "mlp.experts.down_proj";
    for (int64_t e = 0; e < E; ++e) {
      L.w_gate_up.shards.push_back(row_shard(gate_up, {E, 2 * I, H}, e * 2 * I + begin, ir));
      L.w_gate_up.shards.push_back(row_shard(gate_up, {E, 2 * I, H}, e * 2 * I + I + begin, ir));
      TensorShard d = column_shard(down, {E, H, I}, begin, ir);
      d.row_begin = e * H;
      d.rows = H;
      L.w_down.shards.push_back(std::move(d));
    }
    return;
  }
  const std::string moe = p + (mixtral ? "block_sparse_moe." : "mlp.");
  L.router.shards = {whole(moe + "gate.weight", {E, H})};
  for (int64_t e = 0; e < E; ++e) {
    const std::string x = moe + "experts." + std::to_string(e) + ".";
    L.w_gate_up.shards.push_back(row_shard(x + (mixtral ? "w1" : "gate_proj") + ".weight", {I, H}, begin, ir));
    L.w_gate_up.shards.push_back(row_shard(x + (mixtral ? "w3" : "up_proj") + ".weight", {I, H}, begin, ir));
    L.w_down.shards.push_back(column_shard(x + (mixtral ? "w2" : "down_proj") + ".weight", {H, I}, begin, ir));
  }
}

}  // namespace

int64_t RankParam::numel() const {
  int64_t n = 0;
  for (const TensorShard& s : shards) n += s.numel();
  return n;
}

WeightMap rank_weight_map(const ModelConfig& config, int tp_rank, int tp_size) {
  const int tp = tp_size;
  if (tp < 1 || tp_rank < 0 || tp_rank >= tp) throw ModelError("invalid tensor-parallel rank/size");
  if (config.num_kv_heads % tp != 0 || config.num_heads % tp != 0)
    throw ModelError("tensor_parallel_size " + std::to_string(tp) + " does not divide the attention heads (" +
                     std::to_string(config.num_heads) + ") and KV heads (" + std::to_string(config.num_kv_heads) +
                     ")");
  if (config.intermediate_size % tp != 0)
    throw ModelError("tensor_parallel_size " + std::to_string(tp) + " does not divide intermediate_size " +
                     std::to_string(config.intermediate_size));
  WeightMap m;
  m.heads = config.num_heads / tp;
  m.kv_heads = config.num_kv_heads / tp;
  m.intermediate = config.intermediate_size / tp;

  const int64_t H = config.hidden_size, D = config.head_dim, V = config.vocab_size, I = config.intermediate_size;
  const int64_t q_rows = int64_t{config.num_heads} * D, kv_rows = int64_t{config.num_kv_heads} * D;  // whole
  const int64_t qr = m.heads * D, kvr = m.kv_heads * D, ir = m.intermediate;                          // the rank's
  const int64_t rank = tp_rank;
  m.embed.shards = {whole("model.embed_tokens.weight", {V, H})};
  m.final_norm.shards = {whole("model.norm.weight", {H})};
  if (!config.tie_word_embeddings) m.lm_head.shards = {whole(kLmHead, {V, H})};
  m.layers.resize(config.num_layers);
  for (int l = 0; l < config.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    RankLayer& L = m.layers[l];
    L.attn_norm.shards = {whole(p + "input_layernorm.weight", {H})};
    if (config.sandwich_norms) {
      L.ffn_norm.shards = {whole(p + "pre_feedforward_layernorm.weight", {H})};
      L.post_attn_norm.shards = {whole(p + "post_attention_layernorm.weight", {H})};
      L.post_ffn_norm.shards = {whole(p + "post_feedforward_layernorm.weight", {H})};
    } else {
      L.ffn_norm.shards = {whole(p + "post_attention_layernorm.weight", {H})};
    }
    // Column-parallel: the rank's rows of q, k, v (its heads), gate and up (its intermediate slice).
    if (config.fused_projections) {
      const std::string qkv = p + "self_attn.qkv_proj.weight";
      const std::vector<int64_t> shape{q_rows + 2 * kv_rows, H};
      L.wqkv.shards = {row_shard(qkv, shape, rank * qr, qr), row_shard(qkv, shape, q_rows + rank * kvr, kvr),
                       row_shard(qkv, shape, q_rows + kv_rows + rank * kvr, kvr)};
    } else {
      L.wqkv.shards = {row_shard(p + "self_attn.q_proj.weight", {q_rows, H}, rank * qr, qr),
                       row_shard(p + "self_attn.k_proj.weight", {kv_rows, H}, rank * kvr, kvr),
                       row_shard(p + "self_attn.v_proj.weight", {kv_rows, H}, rank * kvr, kvr)};
    }
    if (config.qk_norm) {
      L.q_norm.shards = {whole(p + "self_attn.q_norm.weight", {D})};
      L.k_norm.shards = {whole(p + "self_attn.k_norm.weight", {D})};
    }
    if (config.qkv_bias)
      L.bqkv.shards = {column_shard(p + "self_attn.q_proj.bias", {q_rows}, rank * qr, qr),
                       column_shard(p + "self_attn.k_proj.bias", {kv_rows}, rank * kvr, kvr),
                       column_shard(p + "self_attn.v_proj.bias", {kv_rows}, rank * kvr, kvr)};
    // Row-parallel: the rank's columns of o and down.
    L.wo.shards = {column_shard(p + "self_attn.o_proj.weight", {H, q_rows}, rank * qr, qr)};
    if (config.o_bias && rank == 0) L.bo.shards = {whole(p + "self_attn.o_proj.bias", {H})};
    if (config.is_moe())
      expert_shards(config, p, rank * ir, ir, L);
    else if (config.fused_projections)
      L.w_gate_up.shards = {row_shard(p + "mlp.gate_up_proj.weight", {2 * I, H}, rank * ir, ir),
                            row_shard(p + "mlp.gate_up_proj.weight", {2 * I, H}, I + rank * ir, ir)};
    else
      L.w_gate_up.shards = {row_shard(p + "mlp.gate_proj.weight", {I, H}, rank * ir, ir),
                            row_shard(p + "mlp.up_proj.weight", {I, H}, rank * ir, ir)};
    if (!config.is_moe()) L.w_down.shards = {column_shard(p + "mlp.down_proj.weight", {H, I}, rank * ir, ir)};
  }
  return m;
}

ModelConfig with_expert_layout(ModelConfig config, const SafeTensors& weights) {
  config.moe.fused_experts = config.is_moe() && weights.contains("model.layers.0.mlp.experts.gate_up_proj");
  return config;
}

const TensorView& shard_tensor(const SafeTensors& weights, const TensorShard& shard) {
  if (shard.name == kLmHead && !weights.contains(kLmHead))
    throw ModelError("checkpoint lacks tensor '" + kLmHead + "' and tie_word_embeddings is false");
  return weights.get(shard.name, shard.shape);
}

std::vector<float> read_shard_f32(const SafeTensors& weights, const TensorShard& shard, const Fp8Checkpoint& fp8) {
  const TensorView& t = shard_tensor(weights, shard);
  const int64_t C = shard.shape.back();
  std::optional<Fp8WeightScales> scales;
  if (t.dtype == DType::f8_e4m3) scales.emplace(weights, shard.name, t, fp8);
  std::vector<float> out(static_cast<size_t>(shard.numel()));
  float* dst = out.data();
  for (int64_t r = 0; r < shard.rows; ++r, dst += shard.cols) {
    const int64_t row = shard.row_begin + r, first = row * C + shard.col_begin;  // the run's first element
    t.to_floats(first, shard.cols, dst);
    if (scales) scales->dequantise(row, shard.col_begin, shard.cols, dst);
  }
  return out;
}

bool holds_fp8(const SafeTensors& weights, const RankParam& param) {
  return std::any_of(param.shards.begin(), param.shards.end(), [&](const TensorShard& s) {
    return weights.contains(s.name) && weights.tensors().at(s.name).dtype == DType::f8_e4m3;
  });
}

bool fp8_rows_as_stored(const SafeTensors& weights, const RankParam& param, const Fp8Checkpoint& fp8) {
  return !param.shards.empty() && std::all_of(param.shards.begin(), param.shards.end(), [&](const TensorShard& s) {
    const TensorView& t = shard_tensor(weights, s);
    return t.dtype == DType::f8_e4m3 && Fp8WeightScales(weights, s.name, t, fp8).per_row();
  });
}

}  // namespace paged
