#include "kernels/cpu/cpu_runner.h"

#include <cmath>
#include <cstring>
#include <string>

#include "kernels/cpu/ops.h"
#include "model/sampling/sampler.h"

namespace paged {

namespace {

// Rows [row0, row0 + rows) of a [R][cols] matrix.
std::vector<float> slice_rows(const std::vector<float>& m, int64_t cols, int64_t row0, int64_t rows) {
  return {m.begin() + row0 * cols, m.begin() + (row0 + rows) * cols};
}

// Columns [col0, col0 + n) of a [rows][cols] matrix.
std::vector<float> slice_cols(const std::vector<float>& m, int64_t rows, int64_t cols, int64_t col0, int64_t n) {
  std::vector<float> out(rows * n);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(&out[r * n], &m[r * cols + col0], sizeof(float) * n);
  return out;
}

void append(std::vector<float>& dst, const std::vector<float>& src) { dst.insert(dst.end(), src.begin(), src.end()); }

}  // namespace

CpuModelRunner::CpuModelRunner(const ModelConfig& config, const SafeTensors& w, CpuRunnerOptions options)
    : cfg_(config), opt_(options) {
  const int tp = opt_.tp_size, rank = opt_.tp_rank;
  if (tp < 1 || rank < 0 || rank >= tp) throw ModelError("invalid tensor-parallel rank/size");
  if (cfg_.num_kv_heads % tp != 0 || cfg_.num_heads % tp != 0)
    throw ModelError("tensor_parallel_size " + std::to_string(tp) + " does not divide the attention heads (" +
                     std::to_string(cfg_.num_heads) + ") and KV heads (" + std::to_string(cfg_.num_kv_heads) + ")");
  if (cfg_.intermediate_size % tp != 0)
    throw ModelError("tensor_parallel_size " + std::to_string(tp) + " does not divide intermediate_size " +
                     std::to_string(cfg_.intermediate_size));
  if (tp > 1 && !opt_.all_reduce) throw ModelError("tensor parallelism needs an all-reduce");
  local_heads_ = cfg_.num_heads / tp;
  local_kv_heads_ = cfg_.num_kv_heads / tp;
  local_inter_ = cfg_.intermediate_size / tp;
  const int64_t H = cfg_.hidden_size, D = cfg_.head_dim, V = cfg_.vocab_size, I = cfg_.intermediate_size;
  const int64_t q_rows = int64_t{cfg_.num_heads} * D, kv_rows = int64_t{cfg_.num_kv_heads} * D;

  embed_ = w.get_f32("model.embed_tokens.weight", {V, H});
  final_norm_ = w.get_f32("model.norm.weight", {H});
  if (!cfg_.tie_word_embeddings) {
    if (!w.contains("lm_head.weight"))
      throw ModelError("checkpoint lacks tensor 'lm_head.weight' and tie_word_embeddings is false");
    lm_head_ = w.get_f32("lm_head.weight", {V, H});
  }
  inv_freq_ = cfg_.rope_inv_freq();

  layers_.resize(cfg_.num_layers);
  for (int l = 0; l < cfg_.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    CpuLayerWeights& L = layers_[l];
    L.attn_norm = w.get_f32(p + "input_layernorm.weight", {H});
    L.ffn_norm = w.get_f32(p + "post_attention_layernorm.weight", {H});
    const int64_t qr = local_heads_ * D, kvr = local_kv_heads_ * D;
    append(L.wqkv, slice_rows(w.get_f32(p + "self_attn.q_proj.weight", {q_rows, H}), H, rank * qr, qr));
    append(L.wqkv, slice_rows(w.get_f32(p + "self_attn.k_proj.weight", {kv_rows, H}), H, rank * kvr, kvr));
    append(L.wqkv, slice_rows(w.get_f32(p + "self_attn.v_proj.weight", {kv_rows, H}), H, rank * kvr, kvr));
    if (cfg_.qkv_bias) {
      append(L.bqkv, slice_rows(w.get_f32(p + "self_attn.q_proj.bias", {q_rows}), 1, rank * qr, qr));
      append(L.bqkv, slice_rows(w.get_f32(p + "self_attn.k_proj.bias", {kv_rows}), 1, rank * kvr, kvr));
      append(L.bqkv, slice_rows(w.get_f32(p + "self_attn.v_proj.bias", {kv_rows}), 1, rank * kvr, kvr));
    }
    L.wo = slice_cols(w.get_f32(p + "self_attn.o_proj.weight", {H, q_rows}), H, q_rows, rank * qr, qr);
    const int64_t ir = local_inter_;
    append(L.w_gate_up, slice_rows(w.get_f32(p + "mlp.gate_proj.weight", {I, H}), H, rank * ir, ir));
    append(L.w_gate_up, slice_rows(w.get_f32(p + "mlp.up_proj.weight", {I, H}), H, rank * ir, ir));
    L.w_down = slice_cols(w.get_f32(p + "mlp.down_proj.weight", {H, I}), H, I, rank * ir, ir);
  }

  const int64_t per_layer = block_elems() * opt_.num_blocks, per_layer_swap = block_elems() * opt_.num_swap_blocks;
  for (int l = 0; l < cfg_.num_layers; ++l) {
    k_cache_.push_back(std::make_unique_for_overwrite<float[]>(per_layer));
    v_cache_.push_back(std::make_unique_for_overwrite<float[]>(per_layer));
    k_swap_.push_back(std::make_unique_for_overwrite<float[]>(per_layer_swap));
    v_swap_.push_back(std::make_unique_for_overwrite<float[]>(per_layer_swap));
  }
}

int64_t CpuModelRunner::block_elems() const { return int64_t{local_kv_heads_} * opt_.block_size * cfg_.head_dim; }

std::vector<std::vector<float>> CpuModelRunner::forward(const StepBatch& batch) {
  const int H = cfg_.hidden_size, D = cfg_.head_dim, B = opt_.block_size;
  const int nh = local_heads_, nkv = local_kv_heads_;
  const int qkv_dim = (nh + 2 * nkv) * D;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);

  for (int l = 0; l < cfg_.num_layers; ++l) {
    cpu::copy_blocks(k_cache_[l].get(), batch.copies, block_elems());
    cpu::copy_blocks(v_cache_[l].get(), batch.copies, block_elems());
  }

  // Flatten the ragged batch: tokens, positions, slots, per-sequence query ranges and block tables.
  std::vector<TokenId> tokens;
  std::vector<int32_t> positions, query_start{0}, context_lens;
  std::vector<int64_t> slots;
  size_t max_blocks = 1;
  for (const SeqChunk& c : batch.seqs) max_blocks = std::max(max_blocks, c.block_table.size());
  std::vector<int32_t> tables(batch.seqs.size() * max_blocks, 0);
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const SeqChunk& c = batch.seqs[s];
    for (size_t i = 0; i < c.tokens.size(); ++i) {
      const int32_t pos = c.start_pos + static_cast<int32_t>(i);
      tokens.push_back(c.tokens[i]);
      positions.push_back(pos);
      slots.push_back(int64_t{c.block_table.at(pos / B)} * B + pos % B);
    }
    query_start.push_back(static_cast<int32_t>(tokens.size()));
    context_lens.push_back(c.start_pos + static_cast<int32_t>(c.tokens.size()));
    std::copy(c.block_table.begin(), c.block_table.end(), tables.begin() + s * max_blocks);
  }
  const int T = static_cast<int>(tokens.size());

  std::vector<float> residual(int64_t{T} * H), h(int64_t{T} * H), qkv(int64_t{T} * qkv_dim);
  std::vector<float> q(int64_t{T} * nh * D), k(int64_t{T} * nkv * D), v(int64_t{T} * nkv * D);
  std::vector<float> attn(int64_t{T} * nh * D), proj(int64_t{T} * H);
  std::vector<float> gate_up(int64_t{T} * 2 * local_inter_), act(int64_t{T} * local_inter_);
  for (int t = 0; t < T; ++t) {
    if (tokens[t] < 0 || tokens[t] >= cfg_.vocab_size) throw ModelError("token id out of range");
    std::memcpy(&residual[int64_t{t} * H], &embed_[int64_t{tokens[t]} * H], sizeof(float) * H);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  for (int l = 0; l < cfg_.num_layers; ++l) {
    const CpuLayerWeights& L = layers_[l];
    cpu::rms_norm(h.data(), residual.data(), L.attn_norm.data(), T, H, eps);
    cpu::linear(qkv.data(), h.data(), L.wqkv.data(), L.bqkv.empty() ? nullptr : L.bqkv.data(), T, qkv_dim, H);
    for (int t = 0; t < T; ++t) {
      const float* row = &qkv[int64_t{t} * qkv_dim];
      std::memcpy(&q[int64_t{t} * nh * D], row, sizeof(float) * nh * D);
      std::memcpy(&k[int64_t{t} * nkv * D], row + nh * D, sizeof(float) * nkv * D);
      std::memcpy(&v[int64_t{t} * nkv * D], row + (nh + nkv) * D, sizeof(float) * nkv * D);
    }
    cpu::rope(q.data(), k.data(), positions.data(), inv_freq_.data(), T, nh, nkv, D);
    cpu::reshape_and_cache(k.data(), v.data(), k_cache_[l].get(), v_cache_[l].get(), slots.data(), T, nkv, D, B);
    cpu::paged_attention(attn.data(), q.data(), k_cache_[l].get(), v_cache_[l].get(), tables.data(),
                         query_start.data(), context_lens.data(), static_cast<int>(batch.seqs.size()),
                         static_cast<int>(max_blocks), nh, nkv, D, B, scale);
    cpu::linear(proj.data(), attn.data(), L.wo.data(), nullptr, T, H, nh * D);
    if (opt_.tp_size > 1) opt_.all_reduce->sum(proj.data(), proj.size(), opt_.tp_rank);
    cpu::add_rms_norm(h.data(), residual.data(), proj.data(), L.ffn_norm.data(), T, H, eps);
    cpu::linear(gate_up.data(), h.data(), L.w_gate_up.data(), nullptr, T, 2 * local_inter_, H);
    cpu::silu_and_mul(act.data(), gate_up.data(), T, local_inter_);
    cpu::linear(proj.data(), act.data(), L.w_down.data(), nullptr, T, H, local_inter_);
    if (opt_.tp_size > 1) opt_.all_reduce->sum(proj.data(), proj.size(), opt_.tp_rank);
    for (size_t i = 0; i < residual.size(); ++i) residual[i] += proj[i];
  }

  std::vector<std::vector<float>> logits;
  if (opt_.tp_rank != 0) return logits;
  const float* head = lm_head_.empty() ? embed_.data() : lm_head_.data();
  std::vector<float> last(H);
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    if (batch.seqs[s].samples.empty()) continue;
    cpu::rms_norm(last.data(), &residual[int64_t{query_start[s + 1] - 1} * H], final_norm_.data(), 1, H, eps);
    logits.emplace_back(cfg_.vocab_size);
    cpu::linear(logits.back().data(), last.data(), head, nullptr, 1, cfg_.vocab_size, H);
  }
  return logits;
}

StepResult CpuModelRunner::execute(const StepBatch& batch) {
  std::vector<std::vector<float>> logits = forward(batch);
  StepResult r;
  if (opt_.tp_rank != 0) return r;
  size_t i = 0;
  for (const SeqChunk& c : batch.seqs) {
    if (c.samples.empty()) continue;
    r.seqs.push_back(c.seq);
    auto& per_spec = r.samples.emplace_back();
    for (const SampleSpec& spec : c.samples) {
      std::vector<float> l = c.samples.size() == 1 ? std::move(logits[i]) : logits[i];
      per_spec.push_back(sample_logits(l, spec));
    }
    ++i;
  }
  return r;
}

void CpuModelRunner::swap_out(const std::vector<BlockPair>& device_to_cpu) {
  const int64_t n = block_elems();
  for (int l = 0; l < cfg_.num_layers; ++l)
    for (const auto& [dev, cpu] : device_to_cpu) {
      std::memcpy(&k_swap_[l][cpu * n], &k_cache_[l][dev * n], sizeof(float) * n);
      std::memcpy(&v_swap_[l][cpu * n], &v_cache_[l][dev * n], sizeof(float) * n);
    }
}

void CpuModelRunner::swap_in(const std::vector<BlockPair>& cpu_to_device) {
  const int64_t n = block_elems();
  for (int l = 0; l < cfg_.num_layers; ++l)
    for (const auto& [cpu, dev] : cpu_to_device) {
      std::memcpy(&k_cache_[l][dev * n], &k_swap_[l][cpu * n], sizeof(float) * n);
      std::memcpy(&v_cache_[l][dev * n], &v_swap_[l][cpu * n], sizeof(float) * n);
    }
}

}  // namespace paged
