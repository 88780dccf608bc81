// The CUDA executor's model: the Llama-family forward pass (Llama 2/3, Mistral, Qwen2, Qwen3, Phi-3, Gemma 3 text
// with head_dim 64 or 128) in bf16 on one GPU, over a
// paged KV pool sized from the device's free memory, with a pinned host pool for swapped blocks, CUDA graphs for
// decode steps and sampling on the GPU. One runner is also one rank of a tensor-parallel group (one GPU each, an
// NCCL all-reduce between them), sharded as CpuModelRunner is. Host C++ includes this header; the CUDA types stay
// in the .cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/cuda/gpu_error.h"
#include "model/loader/config.h"
#include "model/loader/safetensors.h"
#include "model/step.h"

namespace paged {

class NcclComm;

struct CudaRunnerOptions {
  int block_size = 16;                 // tokens per KV block: 8, 16 or 32
  int num_blocks = 0;                  // device KV blocks; 0: as many as gpu_memory_utilization leaves room for
  double gpu_memory_utilization = 0.9; // fraction of the device's memory this process may use in total (vLLM's)
  double swap_space_gib = 4.0;         // pinned host memory for swapped-out blocks
  int max_num_seqs = 256;              // sequences per step: sampling rows and the largest decode graph
  int max_num_batched_tokens = 2048;   // tokens per step: the activation buffers
  /// Positions a step samples at most, each a row of vocabulary logits (speculative decoding samples each draft's
  /// position too: max_sampled_positions); at least max_num_seqs.
  int max_logits_rows = 0;
  int max_model_len = 0;               // longest context; 0: the model's max_position_embeddings
  bool cuda_graphs = true;             // replay decode-only steps from CUDA graphs (with their all-reduces)
  /// --nano-batch-rows N: decode steps of at least N rows run as two nano-batches (NanoFlow) on two streams, the
  /// attention of one beside the linear layers of the other, which take a stream of the highest priority and
  /// cuBLASLt kernels planned for nano_sm_percent of the SMs (100: all); 0: never. One GPU, no MoE; steps with LoRA
  /// rows run whole.
  int nano_batch_rows = 0;
  int nano_sm_percent = 75;
  /// --quantization fp8: the linear layers' weights as FP8 e4m3 with a scale per output channel, quantised at load
  /// (embedding, norms and LM head stay bf16); their inputs quantised per token each step. Needs compute
  /// capability 8.9 or newer. An FP8 checkpoint's weights (ModelConfig::fp8_checkpoint) load as they are with
  /// per-tensor (broadcast to its rows) or per-channel scales, block-scaled ones dequantised to bf16 and quantised
  /// again per output channel; the layers it left unquantised stay bf16. Without fp8_weights an FP8 checkpoint is
  /// dequantised to bf16.
  bool fp8_weights = false;
  /// --kv-cache-dtype fp8: K and V stored as e4m3 with a scale per token and KV head (kernels/cuda/kv_fp8.h), about
  /// half the bytes of a bf16 block, so about twice the blocks in the same memory. Compute capability 8.9 or newer.
  bool fp8_kv = false;
  /// LoRA (--enable-lora): adapters the device holds at once (vLLM's --max-loras), each in a slot with room for r up
  /// to max_lora_rank on every linear layer (model/lora/lora_layout.h); 0: no LoRA. add_lora keeps any number of
  /// adapters on the host; a step's adapters take slots (a free one, else the one least recently used that the step
  /// does not need), at most max_loras in a step.
  int max_loras = 0;
  int max_lora_rank = 16;
  int device = 0;
  // Tensor parallelism: q/k/v and gate/up column-parallel (whole KV heads with their query heads per rank),
  // o_proj and down_proj row-parallel with an all-reduce of their output, embedding, norms and LM head replicated;
  // the KV pool holds this rank's KV heads only; rank 0 alone computes logits and samples.
  int tp_rank = 0;
  int tp_size = 1;
  std::shared_ptr<NcclComm> comm = nullptr;  // required when tp_size > 1: this rank's communicator, on `device`
};

/// CUDA devices this process can use; 0 when there is no driver or no device.
int cuda_device_count();

class CudaModelRunner final : public ModelRunner {
 public:
  /// Loads the weights (kept bf16; float32 and f16 checkpoints are converted once; with tp_size > 1 only this
  /// rank's shard), allocates activations, then the KV pool and the pinned swap pool, and times cuBLASLt's
  /// candidates for the products of every decode batch bucket. Throws ModelError for a model
  /// the kernels do not support (head_dim other than 64 or 128, a GQA group above 16, a block size other than
  /// 8/16/32), for head counts or an intermediate size that tp_size does not divide, and for a missing or
  /// mismatched communicator; GpuError for CUDA failures, including too little memory for one block per sequence.
  CudaModelRunner(const ModelConfig& config, const SafeTensors& weights, CudaRunnerOptions options);
  /// The same model with random weights (uniform, deterministic in `seed` and the rank): benchmarks without a
  /// checkpoint.
  CudaModelRunner(const ModelConfig& config, uint64_t seed, CudaRunnerOptions options);
  ~CudaModelRunner() override;

  /// Runs the step on the compute stream and waits for its sampled tokens (and prompt logprobs, computed max_num_seqs
  /// positions at a time). Orders after any swap enqueued before.
  /// Every rank of a group runs every step, in the same order; ranks other than 0 wait for their part of the step
  /// and return an empty result.
  StepResult execute(const StepBatch& batch) override;
  /// Enqueue the copies on the copy stream and return; the next execute() waits for them on the device.
  void swap_out(const std::vector<BlockPair>& device_to_cpu) override;
  void swap_in(const std::vector<BlockPair>& cpu_to_device) override;
  /// The pinned host pool's block, every cache; reading and writing wait for the copy stream first (a swap that
  /// fills or reads the block may still run).
  int64_t host_block_bytes() const override;
  void read_host_block(int32_t block, std::span<std::byte> out) override;
  void write_host_block(int32_t block, std::span<const std::byte> in) override;

  /// Takes adapter `id` (packed into the slot layout on the host; ModelError when the runner has no LoRA slots or
  /// the adapter does not fit them); its chunks run with its pairs added after each linear layer.
  void add_lora(int32_t id, const LoraAdapter& adapter) override;
  void remove_lora(int32_t id) override;

  /// The step's logits [chunks with samples][vocab], float32, without sampling (parity checks); empty on ranks
  /// other than 0.
  std::vector<std::vector<float>> forward(const StepBatch& batch);

  int num_blocks() const;
  int num_swap_blocks() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace paged
