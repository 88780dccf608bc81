// The CPU executor's model: Llama-family forward pass in float32 over a paged KV cache, plus sampling. Covers the
// families of model/loader/config.h: q/k head norms (Qwen3), partial rotary and LongRoPE (Phi-3), sliding-window
// layers (every block of a sequence stays in its table; a sliding layer reads only the window's positions), Gemma 3
// (four (1 + weight) norms per layer, GeGLU, scaled embeddings, the final logits' soft-cap, the sliding layers' own
// RoPE), and the mixtures of experts of Mixtral / Qwen3-MoE (kernels/cpu/moe.h; each expert sharded as a dense MLP).
#pragma once

#include <chrono>
#include <memory>
#include <unordered_map>
#include <vector>

#include "model/kv/kv_groups.h"
#include "model/loader/config.h"
#include "model/loader/safetensors.h"
#include "model/step.h"

namespace paged {

/// Sums a float buffer across the ranks of a tensor-parallel group; every rank calls it with the same n, in the
/// same order. Blocks until all ranks arrived.
class AllReduce {
 public:
  virtual ~AllReduce() = default;
  virtual void sum(float* data, size_t n, int rank) = 0;
};

struct CpuRunnerOptions {
  int block_size = 16;
  int num_blocks = 0;       // device-tier KV blocks (here: host memory)
  int num_swap_blocks = 0;  // CPU swap-tier blocks
  int tp_rank = 0;
  int tp_size = 1;
  AllReduce* all_reduce = nullptr;  // required when tp_size > 1
  int max_model_len = 0;            // the engine's context limit (0: max_position_embeddings); picks LongRoPE's factors
  /// Emulates the CUDA runner's --quantization fp8 in float32 (tests; the engine does not offer FP8 on the CPU): the
  /// linear layers' weights and each row of their inputs rounded through e4m3 with a scale per row. With an FP8
  /// checkpoint, as the CUDA runner loads it: per-tensor / per-channel codes as they are, block-scaled weights
  /// rounded to bf16 and then per row, the layers the checkpoint left unquantised as they are. Without it, an FP8
  /// checkpoint is dequantised exactly (code x scale) into float32.
  bool fp8_weights = false;
  /// Emulates the CUDA runner's --kv-cache-dtype fp8 likewise (tests): each token's K and V heads rounded through
  /// e4m3 with a scale per head as they enter the cache.
  bool fp8_kv = false;
};

/// Weights of one tensor-parallel rank, float32, sharded and laid out as model/loader/weight_map.h says: q/k/v and
/// gate/up column-parallel (whole KV heads with their query heads per rank), o_proj and down_proj row-parallel;
/// embedding, norms and LM head replicated.
struct CpuLayerWeights {
  std::vector<float> attn_norm, ffn_norm;  // [hidden]; Gemma's (1 + weight) from here on, as every norm below
  std::vector<float> post_attn_norm, post_ffn_norm;  // [hidden] each (sandwich_norms), or empty
  std::vector<float> wqkv;                 // [(local_heads + 2 * local_kv_heads) * head_dim][hidden]
  std::vector<float> bqkv;                 // same rows, or empty
  std::vector<float> q_norm, k_norm;       // [head_dim] each, or empty (no qk_norm)
  std::vector<float> wo;                   // [hidden][local_heads * head_dim]
  std::vector<float> bo;                   // [hidden] on rank 0, or empty
  std::vector<float> w_gate_up;            // [2 * local_inter][hidden]: gate rows, then up rows (MoE: per expert)
  std::vector<float> w_down;               // [hidden][local_inter] (MoE: per expert)
  std::vector<float> router;               // MoE: [experts][hidden]; empty for a dense MLP
  struct {
    bool wqkv = false, wo = false, w_gate_up = false, w_down = false;
  } fp8;  // fp8_weights: the linear layers held as FP8 (all, but those an FP8 checkpoint left in their dtype)
};

class CpuModelRunner final : public ModelRunner {
 public:
  /// Loads (and converts to float32) this rank's weights, per-expert or fused experts alike (with_expert_layout);
  /// throws ModelError on any shape mismatch, when the head counts / intermediate size do not divide by tp_size,
  /// and for fp8_weights with a mixture of experts.
  CpuModelRunner(const ModelConfig& config, const SafeTensors& weights, CpuRunnerOptions options);

  /// Bounds-checked before the KV is touched: throws ModelError for a chunk without tokens, a negative start_pos,
  /// a token or block id outside the vocabulary or pool, copy pairs outside the pool (check_block_pairs), and
  /// std::out_of_range (kv_slot) for a block table that does not reach a position written. Prompt logprobs are
  /// scored one position at a time (one vocabulary of logits held, however long the chunk).
  StepResult execute(const StepBatch& batch) override;
  /// Both throw ModelError, copying nothing, for a pair outside the pools (check_block_pairs).
  void swap_out(const std::vector<BlockPair>& device_to_cpu) override;
  void swap_in(const std::vector<BlockPair>& cpu_to_device) override;
  int64_t host_block_bytes() const override;
  void read_host_block(int32_t block, std::span<std::byte> out) override;
  void write_host_block(int32_t block, std::span<const std::byte> in) override;
  /// Throws ModelError for an id <= 0 or taken, or an adapter of another layer count.
  void add_lora(int32_t id, const LoraAdapter& adapter) override;
  void remove_lora(int32_t id) override { loras_.erase(id); }

  /// Runs the step without sampling (bounds-checked as execute is); returns the logits [num sampled seqs][vocab]
  /// (rank 0; others: empty).
  std::vector<std::vector<float>> forward(const StepBatch& batch);

  /// Raw KV storage [num_blocks][block_elems()] of a layer (its slot of the blocks), for tests that check copy and
  /// swap orders move real data.
  float* k_cache(int layer) { return k_cache_[kv_groups_.slot_of.at(layer)].get(); }
  float* v_cache(int layer) { return v_cache_[kv_groups_.slot_of.at(layer)].get(); }
  int64_t block_elems() const;

 private:
  /// The layers of the step (bounds-checked as execute is): the residual stream after the last layer, one row of
  /// hidden_size per token of the batch, in batch order.
  std::vector<float> run_layers(const StepBatch& batch);
  /// The logits [vocab] of one row of run_layers' output: final norm, then the LM head.
  void logits_of(const float* hidden, std::vector<float>& out) const;

  ModelConfig cfg_;
  CpuRunnerOptions opt_;
  int local_heads_, local_kv_heads_, local_inter_;
  KvGroups kv_groups_;  // kv_groups_of(cfg_): a chunk's table per group, a cache per slot of a block
  std::vector<float> embed_, final_norm_, lm_head_;  // lm_head_ empty when tied
  std::vector<CpuLayerWeights> layers_;
  std::unordered_map<int32_t, std::shared_ptr<const LoraAdapter>> loras_;  // add_lora's, by id
  std::vector<float> inv_freq_, local_inv_freq_;  // RoPE of every layer, and of uses_local_rope layers (or empty)
  // Per layer [num_blocks][kv][block][head_dim]. Left uninitialised so that untouched pages (most of a large swap
  // pool) are never committed; a slot is read only after it was written.
  using Buffer = std::unique_ptr<float[]>;
  std::vector<Buffer> k_cache_, v_cache_;  // the device tier
  std::vector<Buffer> k_swap_, v_swap_;    // the CPU swap tier
  std::chrono::steady_clock::time_point last_end_{};  // when the previous execute() returned (StepCost)
};

}  // namespace paged
