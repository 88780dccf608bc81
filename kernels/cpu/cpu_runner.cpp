#include "kernels/cpu/cpu_runner.h"

#include "kernels/cpu/fp8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/moe.h"
#include "kernels/cpu/ops.h"
#include "model/loader/weight_map.h"
#include "model/lora/lora_adapter.h"
#include "model/sampling/sampler.h"
#include "model/step_check.h"

namespace paged {

namespace {

// The rank's parameter as float32: its shards back to back (an FP8 checkpoint's weights dequantised exactly).
std::vector<float> read_param(const SafeTensors& weights, const RankParam& param, const Fp8Checkpoint& fp8) {
  std::vector<float> out;
  out.reserve(static_cast<size_t>(param.numel()));
  for (const TensorShard& shard : param.shards) {
    const std::vector<float> part = read_shard_f32(weights, shard, fp8);
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

// Throws ModelError naming the first pair outside the pools (check_block_pairs), before anything is copied.
void require_pairs_in_pools(const std::vector<BlockPair>& pairs, PairOrder order, const CpuRunnerOptions& opt) {
  if (auto bad = check_block_pairs(pairs, order, opt.num_blocks, opt.num_swap_blocks))
    throw ModelError(bad->describe());
}

// Copies block src of `from` to block dst of `to` in every layer, for each (src, dst) pair; blocks of n floats.
void copy_pool_blocks(std::vector<std::unique_ptr<float[]>>& to, const std::vector<std::unique_ptr<float[]>>& from,
                      const std::vector<BlockPair>& pairs, int64_t n) {
  for (size_t l = 0; l < to.size(); ++l)
    for (const auto& [src, dst] : pairs) std::memcpy(&to[l][dst * n], &from[l][src * n], sizeof(float) * n);
}

}  // namespace

CpuModelRunner::CpuModelRunner(const ModelConfig& config, const SafeTensors& w, CpuRunnerOptions options)
    : cfg_(with_expert_layout(config, w)), opt_(options), kv_groups_(kv_groups_of(cfg_)) {
  if (opt_.fp8_weights && cfg_.is_moe()) throw ModelError("FP8 emulation does not cover mixtures of experts");
  const WeightMap map = rank_weight_map(cfg_, opt_.tp_rank, opt_.tp_size);
  if (opt_.tp_size > 1 && !opt_.all_reduce) throw ModelError("tensor parallelism needs an all-reduce");
  local_heads_ = map.heads;
  local_kv_heads_ = map.kv_heads;
  local_inter_ = map.intermediate;

  const Fp8Checkpoint& fp8 = cfg_.fp8_checkpoint;
  // A norm's weights as it scales by them: Gemma's 1 + weight, in float32 as HF computes it.
  const auto read_norm = [&](const RankParam& param) {
    std::vector<float> weight = read_param(w, param, fp8);
    if (cfg_.norm_plus_one)
      for (float& x : weight) x += 1.0f;
    return weight;
  };
  // A linear weight [rows][cols] as the CUDA runner's FP8 twin holds it: an FP8 checkpoint's codes and row scales as
  // they are (read_param dequantised them exactly); else rounded through e4m3 per row, an FP8 checkpoint's block-
  // scaled (or mixed) weight first rounded to bf16 as the CUDA runner stages it. A layer that an FP8 checkpoint left
  // unquantised stays as it is, as on CUDA. Returns whether the layer is held as FP8.
  const auto emulate_fp8_weight = [&](const RankParam& param, std::vector<float>& x, int cols) {
    if (fp8.enabled && !holds_fp8(w, param)) return false;
    if (fp8.enabled && fp8_rows_as_stored(w, param, fp8)) return true;
    if (fp8.enabled)
      for (float& v : x) v = bf16_to_float(float_to_bf16(v));
    cpu::fake_quantize_rows_fp8(x.data(), static_cast<int64_t>(x.size()) / cols, cols);
    return true;
  };
  embed_ = read_param(w, map.embed, fp8);
  final_norm_ = read_norm(map.final_norm);
  lm_head_ = read_param(w, map.lm_head, fp8);
  inv_freq_ = cfg_.rope_inv_freq(opt_.max_model_len);
  if (!cfg_.local_rope_layers.empty()) local_inv_freq_ = cfg_.local_rope_inv_freq();

  layers_.resize(cfg_.num_layers);
  for (int l = 0; l < cfg_.num_layers; ++l) {
    const RankLayer& M = map.layers[l];
    CpuLayerWeights& L = layers_[l];
    L.attn_norm = read_norm(M.attn_norm);
    L.ffn_norm = read_norm(M.ffn_norm);
    L.post_attn_norm = read_norm(M.post_attn_norm);
    L.post_ffn_norm = read_norm(M.post_ffn_norm);
    L.wqkv = read_param(w, M.wqkv, fp8);
    L.bqkv = read_param(w, M.bqkv, fp8);
    L.q_norm = read_norm(M.q_norm);
    L.k_norm = read_norm(M.k_norm);
    L.wo = read_param(w, M.wo, fp8);
    L.bo = read_param(w, M.bo, fp8);
    L.w_gate_up = read_param(w, M.w_gate_up, fp8);
    L.w_down = read_param(w, M.w_down, fp8);
    L.router = read_param(w, M.router, fp8);
    if (opt_.fp8_weights) {
      const int H = cfg_.hidden_size, D = cfg_.head_dim;
      L.fp8 = {.wqkv = emulate_fp8_weight(M.wqkv, L.wqkv, H),
               .wo = emulate_fp8_weight(M.wo, L.wo, local_heads_ * D),
               .w_gate_up = emulate_fp8_weight(M.w_gate_up, L.w_gate_up, H),
               .w_down = emulate_fp8_weight(M.w_down, L.w_down, local_inter_)};
    }
  }

  const int64_t per_layer = block_elems() * opt_.num_blocks, per_layer_swap = block_elems() * opt_.num_swap_blocks;
  for (int slot = 0; slot < kv_groups_.layers_per_block; ++slot) {
    k_cache_.push_back(std::make_unique_for_overwrite<float[]>(per_layer));
    v_cache_.push_back(std::make_unique_for_overwrite<float[]>(per_layer));
    k_swap_.push_back(std::make_unique_for_overwrite<float[]>(per_layer_swap));
    v_swap_.push_back(std::make_unique_for_overwrite<float[]>(per_layer_swap));
  }
}

int64_t CpuModelRunner::block_elems() const { return int64_t{local_kv_heads_} * opt_.block_size * cfg_.head_dim; }

std::vector<float> CpuModelRunner::run_layers(const StepBatch& batch) {
  const int H = cfg_.hidden_size, D = cfg_.head_dim, B = opt_.block_size;
  const int nh = local_heads_, nkv = local_kv_heads_;
  const int qkv_dim = (nh + 2 * nkv) * D;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);

  // Bounds first, before anything is written: the KV a chunk writes and reads stays in the pool (each of its tables
  // reaches its last position and every block of it is in the pool, but for released ones before every window of its
  // group's layers, which no layer reads), and so do the copies.
  const int G = kv_groups_.num_groups();
  require_pairs_in_pools(batch.copies, PairOrder::copy_on_write, opt_);
  for (const SeqChunk& c : batch.seqs) {
    if (c.start_pos < 0 || c.tokens.empty() ||
        int64_t{c.start_pos} + static_cast<int64_t>(c.tokens.size()) > std::numeric_limits<int32_t>::max())
      throw ModelError("a chunk needs a token and positions in [0, 2^31)");
    for (TokenId t : c.tokens)
      if (t < 0 || t >= cfg_.vocab_size) throw ModelError("token id out of range");
    if (auto bad = check_chunk_tables(c, kv_groups_.windows, opt_.num_blocks, B))
      throw ModelError("chunk" + bad->describe());
    if (c.lora != 0 && !loras_.count(c.lora)) throw ModelError("chunk of LoRA adapter " + std::to_string(c.lora) +
                                                               ", which this runner was not given");
  }

  // Flatten the ragged batch: tokens, positions, per-sequence query ranges; per KV group the tokens' slots and the
  // block tables.
  std::vector<TokenId> tokens;
  std::vector<int32_t> positions, query_start{0}, context_lens;
  std::vector<std::vector<int64_t>> slots(G);
  size_t max_blocks = 1;
  for (const SeqChunk& c : batch.seqs)
    for (int g = 0; g < G; ++g) max_blocks = std::max(max_blocks, table_of(c, g).size());
  std::vector<std::vector<int32_t>> tables(G, std::vector<int32_t>(batch.seqs.size() * max_blocks, 0));
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const SeqChunk& c = batch.seqs[s];
    for (size_t i = 0; i < c.tokens.size(); ++i) {
      const int32_t pos = c.start_pos + static_cast<int32_t>(i);
      tokens.push_back(c.tokens[i]);
      positions.push_back(pos);
      for (int g = 0; g < G; ++g) slots[g].push_back(kv_slot(table_of(c, g), pos, B));
    }
    query_start.push_back(static_cast<int32_t>(tokens.size()));
    context_lens.push_back(c.start_pos + static_cast<int32_t>(c.tokens.size()));
    for (int g = 0; g < G; ++g) {
      const std::vector<int32_t>& t = table_of(c, g);
      std::copy(t.begin(), t.end(), tables[g].begin() + s * max_blocks);
    }
  }
  const int T = static_cast<int>(tokens.size());
  // Each token's LoRA adapter (null: the base model alone).
  std::vector<const LoraAdapter*> row_lora;
  for (const SeqChunk& c : batch.seqs)
    row_lora.insert(row_lora.end(), c.tokens.size(), c.lora != 0 ? loras_.at(c.lora).get() : nullptr);
  const bool any_lora = std::any_of(row_lora.begin(), row_lora.end(), [](const LoraAdapter* a) { return a; });
  for (size_t slot = 0; slot < k_cache_.size(); ++slot) {  // copy-on-write, before this step's attention
    cpu::copy_blocks(k_cache_[slot].get(), batch.copies, block_elems());
    cpu::copy_blocks(v_cache_[slot].get(), batch.copies, block_elems());
  }

  std::vector<float> residual(int64_t{T} * H), h(int64_t{T} * H), qkv(int64_t{T} * qkv_dim);
  std::vector<float> q(int64_t{T} * nh * D), k(int64_t{T} * nkv * D), v(int64_t{T} * nkv * D);
  std::vector<float> attn(int64_t{T} * nh * D), proj(int64_t{T} * H);
  std::vector<float> gate_up(int64_t{T} * 2 * local_inter_), act(int64_t{T} * local_inter_);
  // Gemma scales the embeddings by sqrt(hidden) rounded to the model's dtype (here float32), as HF does.
  const float embedding_scale = static_cast<float>(cfg_.embedding_scale);
  for (int t = 0; t < T; ++t) {
    float* row = &residual[int64_t{t} * H];
    std::memcpy(row, &embed_[int64_t{tokens[t]} * H], sizeof(float) * H);
    if (embedding_scale != 1.0f)
      for (int i = 0; i < H; ++i) row[i] *= embedding_scale;
  }
  const float scale = cfg_.attention_scale();
  // A linear layer; one held as FP8 (emulated) rounds its input rows through e4m3 first (the weights were at load).
  std::vector<float> quantised;
  const auto linear = [&](float* out, const float* x, const std::vector<float>& w, bool fp8,
                          const std::vector<float>& bias, int n, int k) {
    if (fp8) {
      quantised.assign(x, x + int64_t{T} * k);
      cpu::fake_quantize_rows_fp8(quantised.data(), T, k);
      x = quantised.data();
    }
    cpu::linear(out, x, w.data(), bias.empty() ? nullptr : bias.data(), T, n, k);
  };
  // A linear layer's LoRA pairs (the input rows as the base layer took them before any FP8 rounding): each token's
  // adapter's pairs of layer l, `which` of them, added to its output row; before the all-reduce of a row-parallel
  // layer, whose partial products it sums as the base layer's.
  std::vector<float> lora_scratch;
  const auto lora = [&](float* out, const float* x, int l, std::vector<LoraPair> LoraLayer::*which, int n, int k) {
    if (!any_lora) return;
    for (int t = 0; t < T; ++t)
      if (const LoraAdapter* a = row_lora[t])
        cpu::add_lora_pairs(out + int64_t{t} * n, x + int64_t{t} * k, k, a->layers[l].*which, lora_scratch);
  };

  for (int l = 0; l < cfg_.num_layers; ++l) {
    const CpuLayerWeights& L = layers_[l];
    cpu::rms_norm(h.data(), residual.data(), L.attn_norm.data(), T, H, eps);
    linear(qkv.data(), h.data(), L.wqkv, L.fp8.wqkv, L.bqkv, qkv_dim, H);
    lora(qkv.data(), h.data(), l, &LoraLayer::qkv, qkv_dim, H);
    for (int t = 0; t < T; ++t) {
      const float* row = &qkv[int64_t{t} * qkv_dim];
      std::memcpy(&q[int64_t{t} * nh * D], row, sizeof(float) * nh * D);
      std::memcpy(&k[int64_t{t} * nkv * D], row + nh * D, sizeof(float) * nkv * D);
      std::memcpy(&v[int64_t{t} * nkv * D], row + (nh + nkv) * D, sizeof(float) * nkv * D);
    }
    if (!L.q_norm.empty()) {  // Qwen3, Gemma 3: RMSNorm over each head (rows of head_dim), before RoPE
      cpu::rms_norm(q.data(), q.data(), L.q_norm.data(), T * nh, D, eps);
      cpu::rms_norm(k.data(), k.data(), L.k_norm.data(), T * nkv, D, eps);
    }
    const bool local_rope = cfg_.uses_local_rope(l);  // Gemma 3's sliding layers: their own base, no scaling
    cpu::rope(q.data(), k.data(), positions.data(), local_rope ? local_inv_freq_.data() : inv_freq_.data(), T, nh,
              nkv, D, cfg_.rotary_dims(), local_rope ? 1.0f : static_cast<float>(cfg_.rope_scaling.attention_factor));
    if (opt_.fp8_kv) {  // each token's K and V heads rounded as the CUDA runner's FP8 cache stores them
      cpu::fake_quantize_rows_fp8(k.data(), int64_t{T} * nkv, D);
      cpu::fake_quantize_rows_fp8(v.data(), int64_t{T} * nkv, D);
    }
    // The layer's KV: its slot of its group's blocks.
    const int group = kv_groups_.group_of[l];
    float* const k_cache = k_cache_[kv_groups_.slot_of[l]].get();
    float* const v_cache = v_cache_[kv_groups_.slot_of[l]].get();
    cpu::reshape_and_cache(k.data(), v.data(), k_cache, v_cache, slots[group].data(), T, nkv, D, B);
    cpu::paged_attention(attn.data(), q.data(), k_cache, v_cache, tables[group].data(),
                         query_start.data(), context_lens.data(), static_cast<int>(batch.seqs.size()),
                         static_cast<int>(max_blocks), nh, nkv, D, B, scale, cfg_.sliding_window(l));
    linear(proj.data(), attn.data(), L.wo, L.fp8.wo, L.bo, H, nh * D);
    lora(proj.data(), attn.data(), l, &LoraLayer::o, H, nh * D);
    if (opt_.tp_size > 1) opt_.all_reduce->sum(proj.data(), proj.size(), opt_.tp_rank);
    // Gemma's sandwich: each sublayer's output is normed before it joins the residual stream.
    if (!L.post_attn_norm.empty()) cpu::rms_norm(proj.data(), proj.data(), L.post_attn_norm.data(), T, H, eps);
    cpu::add_rms_norm(h.data(), residual.data(), proj.data(), L.ffn_norm.data(), T, H, eps);
    if (cfg_.is_moe()) {
      cpu::moe_mlp(proj.data(), h.data(), T, H,
                   {.router = L.router.data(), .gate_up = L.w_gate_up.data(), .down = L.w_down.data(),
                    .num_experts = cfg_.moe.num_experts, .top_k = cfg_.moe.top_k, .inter = local_inter_,
                    .renormalize = cfg_.moe.renormalize});
    } else {
      linear(gate_up.data(), h.data(), L.w_gate_up, L.fp8.w_gate_up, {}, 2 * local_inter_, H);
      lora(gate_up.data(), h.data(), l, &LoraLayer::gate_up, 2 * local_inter_, H);
      if (cfg_.activation == Activation::gelu_tanh)
        cpu::gelu_tanh_and_mul(act.data(), gate_up.data(), T, local_inter_);
      else
        cpu::silu_and_mul(act.data(), gate_up.data(), T, local_inter_);
      linear(proj.data(), act.data(), L.w_down, L.fp8.w_down, {}, H, local_inter_);
      lora(proj.data(), act.data(), l, &LoraLayer::down, H, local_inter_);
    }
    if (opt_.tp_size > 1) opt_.all_reduce->sum(proj.data(), proj.size(), opt_.tp_rank);
    if (!L.post_ffn_norm.empty()) cpu::rms_norm(proj.data(), proj.data(), L.post_ffn_norm.data(), T, H, eps);
    for (size_t i = 0; i < residual.size(); ++i) residual[i] += proj[i];
  }

  return residual;
}

void CpuModelRunner::add_lora(int32_t id, const LoraAdapter& adapter) {
  if (id <= 0 || loras_.count(id)) throw ModelError("LoRA adapter id " + std::to_string(id) + " is taken or not > 0");
  if (adapter.layers.size() != static_cast<size_t>(cfg_.num_layers))
    throw ModelError("LoRA adapter " + adapter.path + " was loaded for another model");
  loras_.emplace(id, std::make_shared<const LoraAdapter>(adapter));
}

void CpuModelRunner::logits_of(const float* hidden, std::vector<float>& out) const {
  const int H = cfg_.hidden_size;
  std::vector<float> normed(H);
  cpu::rms_norm(normed.data(), hidden, final_norm_.data(), 1, H, static_cast<float>(cfg_.rms_norm_eps));
  out.resize(cfg_.vocab_size);
  cpu::linear(out.data(), normed.data(), lm_head_.empty() ? embed_.data() : lm_head_.data(), nullptr, 1,
              cfg_.vocab_size, H);
  if (cfg_.final_logit_softcap > 0.0)
    cpu::soft_cap(out.data(), cfg_.vocab_size, static_cast<float>(cfg_.final_logit_softcap));
}

std::vector<std::vector<float>> CpuModelRunner::forward(const StepBatch& batch) {
  const std::vector<float> hidden = run_layers(batch);
  std::vector<std::vector<float>> logits;
  if (opt_.tp_rank != 0) return logits;
  int64_t end = 0;  // the row of `hidden` after the chunk's last token
  for (const SeqChunk& c : batch.seqs) {
    end += static_cast<int64_t>(c.tokens.size());
    if (!c.samples.empty()) logits_of(&hidden[(end - 1) * cfg_.hidden_size], logits.emplace_back());
  }
  return logits;
}

StepResult CpuModelRunner::execute(const StepBatch& batch) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<float> hidden = run_layers(batch);
  StepResult r;
  if (opt_.tp_rank != 0) return r;
  // The host is the device: its time on the step, and since the previous step's end (none before the first).
  const auto us = [](auto d) { return std::chrono::duration_cast<std::chrono::microseconds>(d).count(); };
  if (last_end_ != std::chrono::steady_clock::time_point{}) r.cost.idle_before_us = us(start - last_end_);
  const int64_t H = cfg_.hidden_size;
  std::vector<float> logits;
  int64_t first = 0;  // the row of `hidden` of the chunk's first token
  for (const SeqChunk& c : batch.seqs) {
    const int64_t end = first + static_cast<int64_t>(c.tokens.size());
    if (!c.samples.empty()) {
      r.seqs.push_back(c.seq);
      auto& answered = r.samples.emplace_back();
      // The logits of each token sampled, once: several specs of one token (n > 1) share them, each sampling a copy
      // but the last (the sampler processes its row in place).
      std::vector<float> shared;
      const size_t n = samples_answered(c);
      for (size_t k = 0; k < n; ++k) {
        ChunkSample s = chunk_sample(c, k);
        if (k == 0 || s.token != chunk_sample(c, k - 1).token)
          logits_of(&hidden[(first + static_cast<int64_t>(s.token)) * H], logits);
        const bool reused = k + 1 < n && chunk_sample(c, k + 1).token == s.token;
        if (reused) shared = logits;
        answered.push_back(sample_logits(reused ? shared : logits, s.spec));
      }
    }
    // Prompt logprobs position by position: one vocabulary of logits at a time, however long the chunk.
    if (const PromptLogprobsSpec& want = c.prompt_logprobs; want.count > 0) {
      ChunkPromptLogprobs& scored = r.prompt_logprobs.emplace_back();
      scored.seq = c.seq;
      scored.first_pos = c.start_pos + 1;
      for (int i = 0; i < want.count; ++i) {
        logits_of(&hidden[(first + i) * H], logits);
        const TokenId next = static_cast<size_t>(i) + 1 < c.tokens.size() ? c.tokens[i + 1] : want.next_token;
        scored.tokens.push_back(score_token(logits, next, want.num_top));
      }
    }
    first = end;
  }
  last_end_ = std::chrono::steady_clock::now();
  r.cost.busy_us = us(last_end_ - start);
  return r;
}

void CpuModelRunner::swap_out(const std::vector<BlockPair>& device_to_cpu) {
  require_pairs_in_pools(device_to_cpu, PairOrder::swap_out, opt_);
  copy_pool_blocks(k_swap_, k_cache_, device_to_cpu, block_elems());
  copy_pool_blocks(v_swap_, v_cache_, device_to_cpu, block_elems());
}

int64_t CpuModelRunner::host_block_bytes() const {
  return 2 * static_cast<int64_t>(k_swap_.size()) * block_elems() * static_cast<int64_t>(sizeof(float));
}

namespace {

// The host block's K then V of every layer, in layer order, as bytes: `visit(layer buffer, byte offset in `bytes`)`.
template <class Visit>
void for_each_host_part(std::vector<std::unique_ptr<float[]>>& k, std::vector<std::unique_ptr<float[]>>& v,
                        int32_t block, int num_blocks, int64_t elems, size_t bytes, Visit visit) {
  if (block < 0 || block >= num_blocks)
    throw std::out_of_range("host block " + std::to_string(block) + " is outside the host pool");
  const size_t part = static_cast<size_t>(elems) * sizeof(float);
  if (bytes != 2 * k.size() * part) throw std::out_of_range("host block bytes of the wrong size");
  size_t at = 0;
  for (size_t l = 0; l < k.size(); ++l)
    for (auto* pool : {&k, &v}) {
      visit((*pool)[l].get() + static_cast<int64_t>(block) * elems, at, part);
      at += part;
    }
}

}  // namespace

void CpuModelRunner::read_host_block(int32_t block, std::span<std::byte> out) {
  for_each_host_part(k_swap_, v_swap_, block, opt_.num_swap_blocks, block_elems(), out.size(),
                     [&](float* part, size_t at, size_t n) { std::memcpy(out.data() + at, part, n); });
}

void CpuModelRunner::write_host_block(int32_t block, std::span<const std::byte> in) {
  for_each_host_part(k_swap_, v_swap_, block, opt_.num_swap_blocks, block_elems(), in.size(),
                     [&](float* part, size_t at, size_t n) { std::memcpy(part, in.data() + at, n); });
}

void CpuModelRunner::swap_in(const std::vector<BlockPair>& cpu_to_device) {
  require_pairs_in_pools(cpu_to_device, PairOrder::swap_in, opt_);
  copy_pool_blocks(k_cache_, k_swap_, cpu_to_device, block_elems());
  copy_pool_blocks(v_cache_, v_swap_, cpu_to_device, block_elems());
}

}  // namespace paged
