// The CUDA runner's state (CudaModelRunner::Impl) and its allocation helpers, shared by the runner's source files:
// cuda_runner.cpp (shapes, weights, step plan and forward pass) and runner_sampling.cpp (sampling, prompt scoring).
// Internal to kernels/cuda: host C++ outside includes cuda_runner.h only.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <memory>
#include <tuple>
#include <vector>

#include "kernels/cuda/cuda_runner.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/cache_ops.h"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/kv_fp8.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/layer_ops.h"
#include "kernels/cuda/lora.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/nccl_comm.h"
#include "kernels/cuda/random_fill.h"
#include "kernels/cuda/rope_cache.h"
#include "kernels/cuda/sampling.h"
#include "model/kv/blocks_in_flight.h"
#include "model/kv/kv_groups.h"
#include "model/loader/weight_map.h"
#include "model/lora/lora_layout.h"
#include "model/sampling/params_check.h"
#include "model/sampling/sampler.h"

namespace paged {

using cuda::bf16;

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw GpuError(std::string(what) + ": " + cuda::describe_launch_error(e));
}
#define PAGED_CUDA_CHECK(expr) check((expr), #expr)

struct DeviceFree {
  void operator()(void* p) const { cudaFree(p); }
};
struct HostFree {
  void operator()(void* p) const { cudaFreeHost(p); }
};
template <typename T>
using DevicePtr = std::unique_ptr<T[], DeviceFree>;
template <typename T>
using PinnedPtr = std::unique_ptr<T[], HostFree>;

// n elements (room for one at least) from `allocate`, cudaMalloc or cudaMallocHost, named `what` in the GpuError
// thrown when it fails.
template <typename T, typename Free>
std::unique_ptr<T[], Free> cuda_alloc(cudaError_t (*allocate)(void**, size_t), const char* what, size_t n) {
  void* p = nullptr;
  const cudaError_t e = allocate(&p, std::max<size_t>(n, 1) * sizeof(T));
  if (e != cudaSuccess)
    throw GpuError(std::string(what) + " of " + std::to_string(n * sizeof(T) >> 20) + " MiB: " + cudaGetErrorString(e));
  return std::unique_ptr<T[], Free>(static_cast<T*>(p));
}

template <typename T>
DevicePtr<T> device_alloc(size_t n) {
  return cuda_alloc<T, DeviceFree>(cudaMalloc, "cudaMalloc", n);
}

template <typename T>
PinnedPtr<T> pinned_alloc(size_t n) {
  return cuda_alloc<T, HostFree>(cudaMallocHost, "cudaMallocHost", n);
}

// A device array at a fixed address (CUDA graphs read it) and its pinned host staging, of the same length.
template <typename T>
struct Staged {
  DevicePtr<T> device;
  PinnedPtr<T> host;
  /// (Re)allocates both arrays for n elements; the old ones must no longer be in use.
  void allocate(size_t n) {
    device = device_alloc<T>(n);
    host = pinned_alloc<T>(n);
  }
  /// Enqueues the copy of the first `count` elements host -> device on `stream`.
  cudaError_t upload(size_t count, cudaStream_t stream) const {
    return cudaMemcpyAsync(device.get(), host.get(), count * sizeof(T), cudaMemcpyHostToDevice, stream);
  }
  /// Enqueues the copy of the first `count` elements device -> host on `stream`.
  cudaError_t download(size_t count, cudaStream_t stream) const {
    return cudaMemcpyAsync(host.get(), device.get(), count * sizeof(T), cudaMemcpyDeviceToHost, stream);
  }
};

inline int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// A linear layer's weights as FP8 (--quantization fp8): e4m3 codes [n][k] and one scale per output row [n].
struct Fp8Weight {
  uint8_t* q = nullptr;
  float* scale = nullptr;
};

// One layer's weights on this rank (heads, kv_heads and inter: the rank's share, see Impl). With FP8 weights the
// four linear layers are their *8 twins and their bf16 pointers are null.
struct LayerWeights {
  bf16 *attn_norm = nullptr, *ffn_norm = nullptr;
  bf16 *post_attn_norm = nullptr, *post_ffn_norm = nullptr;  // Gemma (sandwich_norms): [hidden] each, or null
  bf16 *wqkv = nullptr, *bqkv = nullptr;  // [(heads + 2 kv_heads) * head_dim][hidden], bias or null
  bf16 *q_norm = nullptr, *k_norm = nullptr;  // Qwen3: [head_dim] each, or null
  bf16 *wo = nullptr;                     // [hidden][heads * head_dim]
  bf16 *bo = nullptr;                     // [hidden] on rank 0 (attention_bias), or null
  bf16 *w_gate_up = nullptr;              // [2 * inter][hidden]: gate rows, then up rows (MoE: [experts][...])
  bf16 *w_down = nullptr;                 // [hidden][inter] (MoE: [experts][hidden][inter])
  bf16 *router = nullptr;                 // MoE: [experts][hidden], or null
  Fp8Weight qkv8, o8, gate_up8, down8;
};

// One parameter of the weight map and where it goes: a bf16 tensor, or (fp8 set, with --quantization fp8) the FP8
// twin of a linear layer, which passes through the bf16 staging buffer once.
struct WeightSlot {
  bf16** where;
  const RankParam* param;
  Fp8Weight* fp8 = nullptr;
};

struct CudaModelRunner::Impl {
  ModelConfig cfg;
  CudaRunnerOptions opt;
  WeightMap map;  // this rank's tensors
  const SafeTensors* checkpoint = nullptr;  // while the constructor loads it: which linear layers it holds in FP8
  // This rank's shapes: heads, kv_heads and inter are the model's divided by tp_size.
  int heads = 0, kv_heads = 0, head_dim = 0, hidden = 0, inter = 0, vocab = 0, qkv_dim = 0;
  int max_tokens = 0, max_seqs = 0, table_stride = 0, sm_count = 0;
  int max_rows = 0;  // logits rows a step samples at most: max_num_seqs, more with drafts (max_logits_rows)
  int64_t l2_bytes = 0;  // the device's L2 cache
  KvGroups kv_groups;          // kv_groups_of(cfg): a chunk's table per group, a layer's KV in its slot of a block
  float eps = 0.f, scale = 0.f;
  float norm_offset = 0.f;     // added to every norm weight: Gemma's 1 (the norms scale by 1 + weight)
  float embedding_scale = 1.f; // Gemma's sqrt(hidden), rounded to bf16 as HF rounds it to the model's dtype

  cudaStream_t compute = nullptr, copy = nullptr;
  // Nano-batched decode steps (opt.nano_batch_rows): the stream of the linear layers (highest priority), their
  // Gemm (cuBLASLt kernels for opt.nano_sm_percent of the SMs), and the hand-over events between the two streams (the
  // products and the attention of each nano-batch). Null when the runner never splits a step.
  cudaStream_t nano_stream = nullptr;
  std::unique_ptr<cuda::Gemm> nano_gemm;
  std::array<cudaEvent_t, 2> products_done{}, attention_done{};
  cudaEvent_t compute_done = nullptr, swap_done = nullptr;
  // The step's device time (StepCost): its start, the end of its forward pass and sampling, and the previous end.
  cudaEvent_t step_start = nullptr, step_end = nullptr, prev_end = nullptr;
  bool prev_end_recorded = false;
  // The device blocks of the swaps enqueued on `copy` since a step last waited for them (swap_done): a step that
  // uses one waits, others run beside the copies.
  BlocksInFlight swapping;

  // Weights: one arena, every tensor 256-byte aligned inside it. FP8 weights: their codes, their scales, and the
  // bf16 staging of one tensor while it loads (freed once all are quantised).
  DevicePtr<bf16> arena;
  DevicePtr<uint8_t> fp8_arena;
  DevicePtr<float> fp8_scales;
  DevicePtr<bf16> fp8_staging;
  bf16 *embed = nullptr, *final_norm = nullptr, *lm_head = nullptr;
  std::vector<LayerWeights> layers;
  DevicePtr<float> inv_freq, local_inv_freq;  // RoPE of every layer, and of uses_local_rope layers (or null)
  std::unique_ptr<cuda::Gemm> gemm;
  // The one-stream GEMVs (kernels/cuda/gemv.h) of a decoder layer, and the kGemvTiles index each takes (-1: gemv's
  // default), the fastest on this model's own weights (tune_gemv_tiles).
  enum GemvProjection { kGemvQkv, kGemvO, kGemvGateUp, kGemvDown, kGemvProjections };
  std::array<int, kGemvProjections> gemv_tile{-1, -1, -1, -1};

  // Activations, sized for max_tokens rows; with FP8 weights also the rows quantised for their products, codes
  // [max_tokens][max(hidden, inter, heads * head_dim)] and scales [max_tokens].
  DevicePtr<bf16> residual, normed, qkv, attn, proj, gate_up, act, last_hidden;
  DevicePtr<bf16> post_normed;  // sandwich_norms: a sublayer's output after its post norm [max_tokens][hidden]
  DevicePtr<uint8_t> act_fp8;
  DevicePtr<float> act_scale;
  int fp8_row_width = 0;  // act_fp8's row stride for a nano-batch's first row: max(hidden, inter, heads * head_dim)
  DevicePtr<float> logits;  // [max_rows][vocab]
  // Mixture of experts (cfg.is_moe()), for max_tokens rows of top_k slots each: router logits [max_tokens][experts],
  // the choices [max_tokens][top_k], their grouping by expert (cuda::group_experts; tiles for the larger count of
  // the two tile sizes) and the experts' rows in sorted order: gate/up [slots][2 * inter], act [slots][inter], their
  // outputs [slots][hidden].
  // The router's GEMM takes cuBLASLt's heuristic algorithm, never the fastest timed one: every tensor-parallel rank
  // then sums the router logits in the same order and routes every token alike.
  std::unique_ptr<cuda::Gemm> router_gemm;
  DevicePtr<float> moe_logits, moe_weights;
  DevicePtr<int32_t> moe_experts, moe_groups;
  cuda::ExpertGroupsView moe_view{};
  DevicePtr<bf16> moe_gate_up, moe_act, moe_out;
  DevicePtr<char> sample_ws, decode_ws;
  size_t decode_ws_bytes = 0;

  // Step metadata, staged: token ids and positions [max_tokens]; per KV group slots [groups][max_tokens] and block
  // tables [groups][max_seqs][table_stride] (a layer reads its group's, at fixed addresses for the decode graphs);
  // query starts [max_seqs + 1]; context lengths [max_seqs]; the rows that sample [max_rows]; copy-on-write pairs.
  Staged<int32_t> token_ids, positions, query_start, context_lens, block_tables, last_rows, copy_pairs;
  Staged<int64_t> slots;
  size_t pairs_capacity = 0;
  // Sampling, [max_seqs] each: the rows' parameters, their rows of `logits`, the tokens and their logprobs.
  Staged<cuda::SamplingRow> sample_rows;
  Staged<int32_t> logits_row_ids, sampled;
  Staged<float> logprobs;
  PinnedPtr<float> h_logits;  // [max_rows][vocab]: logits downloaded for sampling on the CPU, allocated when needed
  // Prompt logprobs, [max_seqs] rows a pass (kMaxLogprobs alternatives each): the rows of `normed` scored, the
  // tokens they score, and the scores (cuda::score_tokens); the sampled rows' alternatives, [max_rows] a pass.
  // Allocated on first use.
  Staged<int32_t> score_rows, score_targets, score_ranks, score_top_ids;
  Staged<float> score_logprobs, score_top_logprobs;
  // Logits processing of GPU-sampled rows (cuda::apply_penalties): [max_rows] rows, their ids and values (grown on
  // demand to penalty_capacity).
  Staged<cuda::PenaltyRow> penalty_rows;
  Staged<int32_t> penalty_ids;
  Staged<float> penalty_values;
  size_t penalty_capacity = 0;
  // The token masks (structured outputs, allowed_token_ids) of GPU-sampled rows (cuda::apply_token_bitmask):
  // [max_rows] rows and [max_rows][ceil(vocab / 32)] words, allocated on first use.
  Staged<int32_t> mask_rows;
  Staged<uint32_t> mask_bits;

  // LoRA (opt.max_loras > 0): the slots' layout, their weights and scales on the device (every slot's block side by
  // side, lora_slot_copies), each row's slot (-1: none; at a fixed address, so decode graphs with LoRA rows replay),
  // the shrink's scratch [max_tokens][max_loras * max_rank] in float and bf16; every adapter add_lora took, packed on
  // the host; the adapter each slot holds (0: none) and its last use.
  LoraLayout lora_map;
  DevicePtr<bf16> lora_weights, lora_v16;
  DevicePtr<float> lora_scales, lora_v;
  Staged<int32_t> lora_rows;
  struct HostLora {
    std::vector<uint16_t> weights;
    std::vector<float> scales;
  };
  std::map<int32_t, HostLora> loras;
  std::vector<int32_t> slot_lora;
  std::vector<uint64_t> slot_used;
  uint64_t lora_uses = 0;

  // KV cache: device pool [2 * layers_per_block][num_blocks][block], pinned host pool likewise.
  DevicePtr<char> kv_memory;
  PinnedPtr<char> swap_memory;
  cuda::BlockPool kv, host;

  std::vector<int> buckets, ctx_buckets;
  std::map<std::tuple<int, int, bool>, cudaGraphExec_t> graphs;  // decode graphs by (rows, grid context, LoRA)
  int captured = 0;         // graphs captured since the last execute() returned, and their capture time
  int64_t capture_us = 0;

  ~Impl() {
    for (auto& [key, exec] : graphs) cudaGraphExecDestroy(exec);
    for (cudaEvent_t e : {step_start, step_end, prev_end, products_done[0], products_done[1], attention_done[0],
                          attention_done[1]})
      if (e) cudaEventDestroy(e);
    if (nano_stream) cudaStreamDestroy(nano_stream);
    if (compute_done) cudaEventDestroy(compute_done);
    if (swap_done) cudaEventDestroy(swap_done);
    if (compute) cudaStreamDestroy(compute);
    if (copy) cudaStreamDestroy(copy);
  }

  void init_shapes(const ModelConfig& config, const CudaRunnerOptions& options);
  // Each weight with the parameter of `map` that fills it, in the arena's order (the load order).
  std::vector<WeightSlot> weight_params();
  // Quantises the bf16 tensor of `slot` in fp8_staging into its FP8 twin (--quantization fp8).
  void quantize_weight(const WeightSlot& slot);
  struct Slice;
  // y = x w^T (+ bias) for the slice's rows of x and y, on its stream with its Gemm: the bf16 GEMM, or with FP8
  // weights x quantised per row (into the slice's rows of act_fp8 / act_scale) and the FP8 GEMM.
  // x_quantized: with FP8 weights, x's codes and scales are already there (a norm wrote them).
  void linear(const Slice& sl, bf16* y, const bf16* x, const bf16* w, const Fp8Weight& w8, const bf16* bias, int n,
              int k, bool x_quantized = false);
  void allocate_weights();
  void load_weights(const SafeTensors& w);
  void random_weights(uint64_t seed);
  void allocate_runtime();
  // Whether single-token steps take the GEMVs: one GPU, and a layer whose row operations the GEMVs fuse (no O bias,
  // no post norms, SiLU, a hidden size the GEMV normalises itself).
  bool one_stream_gemvs() const;
  // Projection p of layer L as a GEMV from x into y (its output operation, norm and weights).
  cuda::GemvArgs gemv_args(GemvProjection p, const LayerWeights& L, bf16* y, const bf16* x) const;
  // Times every tile of kGemvTiles on each projection over the first layers' weights (the activation buffers as
  // scratch) and keeps the fastest in gemv_tile; before any step, when one_stream_gemvs().
  void tune_gemv_tiles();
  // Plans every decode bucket's products (QKV, O, gate/up, down and the LM head; bf16 or FP8 as the layers hold
  // them) with cuBLASLt's fastest candidate, timed over several layers' weights (Gemm::tune_linear): the heuristic's
  // first choice ran up to 1.8x slower at some bucket sizes (H100: QKV at 256 rows 44 against 24 us). Before any step.
  void tune_decode_gemms();
  // The MoE buffers above (runner_moe.cpp).
  void allocate_moe();
  // out (+)= the mixture-of-experts MLP of x [rows][hidden] (runner_moe.cpp): router GEMM, route_topk,
  // group_experts, grouped gate/up, SiLU-and-mul, grouped down, combine_experts (added to out when accumulate).
  void moe_mlp(bf16* out, const bf16* x, const LayerWeights& L, int rows, bool accumulate);
  void allocate_kv();
  // The LoRA slots and buffers above (opt.max_loras > 0).
  void allocate_lora();
  // The slot of adapter `id` for this step: the one holding it, else a free one, else the least recently used one
  // whose adapter is not in `step` (the adapters this step has placed), filled from the host copy on the compute
  // stream. ModelError for an adapter the runner does not hold or a step of more adapters than slots.
  int lora_slot(int32_t id, std::vector<int32_t>& step);

  // Layer `layer`'s K and V caches (its slot of the blocks), and its group's slots and block tables.
  char* k_cache(int layer) const { return kv.block(2 * kv_groups.slot_of[layer], 0); }
  char* v_cache(int layer) const { return kv.block(2 * kv_groups.slot_of[layer] + 1, 0); }
  int64_t* layer_slots(int layer) const { return slots.device.get() + int64_t{kv_groups.group_of[layer]} * max_tokens; }
  int32_t* layer_tables(int layer) const {
    return block_tables.device.get() + int64_t{kv_groups.group_of[layer]} * max_seqs * table_stride;
  }

  struct Plan {
    int tokens = 0, seqs = 0;  // rows run (decode graphs: the bucket, padding included)
    int max_q = 0;
    bool decode = false;
    // The leading sequences whose attention runs through the decode kernel: every row of a decode step; in other
    // steps the leading one-token chunks when they alone give every SM a block (else the prefill kernel takes them
    // with the rest, at no extra launch). grid_ctx and partition: the decode kernel's grid context and partition.
    int decode_seqs = 0;
    int grid_ctx = 0, partition = 0;
    // A decode step of at least opt.nano_batch_rows rows: the rows of its first nano-batch (the rest the second's)
    // and each one's decode partition; 0: the step runs whole.
    int nano_first = 0;
    std::array<int, 2> nano_partition{};
    std::vector<int> logits_row;      // per chunk: its (first) row of `logits`, -1 when it samples nothing
    int logits_rows = 0;
    bool lora = false;  // some row runs an adapter (lora_rows uploaded)
  };
  Plan prepare(const StepBatch& batch);
  // Rows [first, first + tokens) of a step (the whole step, or a nano-batch of a decode step: then its sequences are
  // its rows), the stream and Gemm their linear layers take, the decode kernel's share of them and its workspace, and
  // the FP8 products whose scale passes are left to the next kernel that reads them.
  struct Slice {
    int first = 0, tokens = 0, seqs = 0;
    int decode_seqs = 0, partition = 0;
    cudaStream_t stream = nullptr;
    cuda::Gemm* gemm = nullptr;
    char* decode_ws = nullptr;
    size_t decode_ws_bytes = 0;
    cuda::Fp8Product pending{};     // `proj` holds an FP8 product still to scale: its scales, for add_rms_norm
    cuda::Fp8Product qkv_scales{};  // `qkv` likewise, for rope_and_cache
    // p + the slice's first row of a [rows][width] array (null stays null: a buffer the runner does not have).
    template <typename T>
    T* row(T* p, int64_t width) const {
      return p ? p + first * width : p;
    }
  };
  // Whether decode steps of at least opt.nano_batch_rows rows run as two nano-batches: one GPU, no MoE.
  bool nano_batched() const { return opt.nano_batch_rows > 0 && opt.tp_size == 1 && !cfg.is_moe(); }
  // Whether the slice takes the GEMVs (kernels/cuda/gemv.h): single-token steps on one GPU (one_stream_gemvs) without
  // LoRA rows. Then the O and down projections add into the residual stream themselves, gate/up applies
  // SiLU-and-mul, and the QKV and gate/up GEMVs normalise the residual they read themselves (no norm kernel between
  // the sublayers, but before the LM head and a MoE block). Otherwise `proj` holds the sublayer's output until the
  // next add_rms_norm folds it into the residual.
  bool takes_gemvs(const Plan& plan, const Slice& sl) const {
    return sl.tokens == 1 && one_stream_gemvs() && !plan.lora;
  }
  // The nano-batches of a decode step of `rows` rows: (first row, rows) of each, in order.
  static std::array<std::pair<int, int>, 2> nano_batches(int rows);
  // The forward pass of the plan's rows: embedding, layers (whole, or two nano-batches beside each other), final
  // norm, LM head on the sampled rows.
  void enqueue_forward(const Plan& plan);
  // Layer l of a slice in three parts: its norm, QKV product and RoPE + cache write; its attention (on `stream`); the
  // rest (O product, MLP) on the slice's stream.
  void enqueue_before_attention(const Plan& plan, Slice& sl, int l);
  void enqueue_attention(const Plan& plan, const Slice& sl, int l, cudaStream_t stream);
  void enqueue_after_attention(const Plan& plan, Slice& sl, int l);
  // The final norm of a slice's rows into `normed`, on its stream.
  void enqueue_final_norm(const Plan& plan, Slice& sl);
  // Layer l's LoRA pairs of linear layer p over the slice's rows x, added to its output rows y (before any
  // all-reduce: a row-parallel layer's pairs hold this rank's columns of A); nothing in steps without LoRA rows.
  void lora(const Plan& plan, const Slice& sl, bf16* y, const bf16* x, int l, LoraProjection p);
  // The LM head over n rows of `rows` [n][hidden] into `logits` [n][vocab] on the compute stream, soft-capped when
  // the model says (final_logit_softcapping).
  void lm_head_logits(const bf16* rows, int n);
  void run(const StepBatch& batch, Plan& plan);
  // The finished step's device time into `cost` (rank 0): busy from step_start to step_end, idle since prev_end;
  // the graphs captured for it and their capture time. step_end becomes prev_end.
  void step_cost(StepCost& cost);
  StepResult sample(const StepBatch& batch, const Plan& plan);
  // Adds the prompt logprobs the chunks ask for to `result`: the LM head over at most max_seqs scored rows of
  // `normed` at a time (into `logits`, so a long prompt never holds more than max_seqs rows of logits), scored on
  // the GPU (cuda::score_tokens, the twin of paged::score_token).
  void score_prompts(const StepBatch& batch, StepResult& result);
  // One sample of a step: its chunk, its index among the chunk's samples_answered, its row of `logits`, its spec
  // (chunk_sample: with drafts, those before its position).
  struct SampleJob {
    int chunk, sample, logits_row;
    SampleSpec spec;
  };
  // The logits processing of the GPU-sampled `jobs` (each alone on its row), on their rows of `logits` in place.
  void apply_penalties(const std::vector<SampleJob>& jobs);
  // The token masks (fill_token_mask, filled here while the forward runs) of the GPU-sampled `jobs` (each alone on
  // its row), in place.
  void apply_token_masks(const std::vector<SampleJob>& jobs);
  // The score_* staging, [max_seqs] rows of kMaxLogprobs alternatives (prompt logprobs, sampled rows' alternatives),
  // on first use.
  void allocate_score_staging();
  // Enqueues the copies of (block of `from`, block of `to`) pairs on the copy stream; the next step waits for them.
  void swap(const cuda::BlockPool& from, const cuda::BlockPool& to, const std::vector<BlockPair>& pairs);
};

}  // namespace paged
