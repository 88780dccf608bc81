// CudaModelRunner: see cuda_runner.h. The layer loop mirrors CpuModelRunner::forward (kernels/cpu/cpu_runner.cpp)
// kernel for kernel; every kernel here has its CPU twin there. Both load the weights the one map of
// model/loader/weight_map.h names, sharded and laid out alike.
//
// Step flow on the compute stream: wait for the swaps whose blocks it uses -> copy-on-write copies -> metadata
// upload -> embedding -> layers (norm, fused QKV GEMM (+bias), Qwen3's q/k head norms, RoPE + cache write, paged
// attention (the layer's sliding window), O GEMM (+bias), residual + norm, fused gate/up GEMM, SiLU-and-mul, down
// GEMM) -> final norm -> LM head on the sampled rows -> sampling -> one synchronisation for the sampled tokens ->
// prompt logprobs, when a chunk asks (LM head and score_tokens over at most max_num_seqs rows at a time, one
// synchronisation each).
// Gemma 3 adds the post norms of both sublayers' outputs (into post_normed), GeGLU for SiLU-and-mul, (1 + weight)
// norms, scaled embeddings, its sliding layers' RoPE, and the final logits' soft-cap; its one-token steps take the
// GEMMs, not the fused GEMVs.
// Single-token steps on one GPU (one-stream decode) use the GEMVs of kernels/cuda/gemv.h, with the residual adds and
// SiLU-and-mul inside the projections: norm, QKV, RoPE, attention, O(+residual), norm, gate/up(+SiLU-and-mul),
// down(+residual); not for a model whose o_proj has a bias (the GEMV adds no bias into the residual). Mixtures of
// experts replace the gate/up, SiLU-and-mul and down with runner_moe.cpp's grouped expert GEMMs (tokens sorted by
// expert, one launch per projection), whose combination adds into the residual on the GEMV path. Decode-only
// steps (one token per sequence) replay a CUDA graph captured per (batch bucket, context bucket): padding rows have
// slot -1 and context 1.
//
// Tensor parallelism (tp_size > 1): the same flow on this rank's shard, with an NCCL all-reduce of the O and down
// GEMMs' partial outputs on the compute stream, captured into the decode graphs like every other kernel (NCCL has
// supported stream capture since 2.9; every rank captures and replays the same shapes in the same order). Ranks
// other than 0 stop after the last layer and synchronise instead of sampling. The embedding and the LM head stay
// replicated: 2 x vocab x hidden bf16 on every rank (4.2 GB for a 70B Llama 3), and rank 0 alone reads the LM head
// each step (2.1 GB there, about 0.5 ms at 4.3 TB/s) while the other ranks wait; vocab-parallel would split both
// at the price of one more collective (a gather of the logits) per step.
#include "kernels/cuda/runner_impl.h"

#include <cstring>
#include <optional>
#include <set>
#include <utility>

#include "model/loader/fp8_checkpoint.h"
#include "model/step_check.h"

namespace paged {

namespace {

// Decode graphs: batch sizes 1, 2, 4, 8, then multiples of 16 (at most 15 padding rows), up to max_num_seqs.
std::vector<int> batch_buckets(int max_num_seqs) {
  std::vector<int> b;
  for (int s : {1, 2, 4, 8})
    if (s < max_num_seqs) b.push_back(s);
  for (int s = 16; s < max_num_seqs; s += 16) b.push_back(s);
  b.push_back(max_num_seqs);
  return b;
}

// Context buckets of the decode grid: powers of two from 256, the last one max_model_len.
std::vector<int> context_buckets(int max_model_len) {
  std::vector<int> c;
  for (int len = 256; len < max_model_len; len *= 2) c.push_back(len);
  c.push_back(max_model_len);
  return c;
}

}  // namespace


int cuda_device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}


void CudaModelRunner::Impl::init_shapes(const ModelConfig& config, const CudaRunnerOptions& options) {
  cfg = config;
  opt = options;
  heads = cfg.num_heads;
  kv_heads = cfg.num_kv_heads;
  kv_groups = kv_groups_of(cfg);
  head_dim = cfg.head_dim;
  hidden = cfg.hidden_size;
  inter = cfg.intermediate_size;
  vocab = cfg.vocab_size;
  eps = static_cast<float>(cfg.rms_norm_eps);
  scale = cfg.attention_scale();
  norm_offset = cfg.norm_plus_one ? 1.0f : 0.0f;
  embedding_scale = bf16_to_float(float_to_bf16(static_cast<float>(cfg.embedding_scale)));
  if (head_dim != 64 && head_dim != 128)
    throw ModelError("the CUDA backend supports head_dim 64 and 128, not " + std::to_string(head_dim));
  if (cfg.rotary_dims() % 4 != 0)
    throw ModelError("the CUDA backend needs a rotary dimension (head_dim x partial_rotary_factor) divisible by 4, "
                     "not " + std::to_string(cfg.rotary_dims()));
  if (kv_heads <= 0 || heads % kv_heads != 0 || heads / kv_heads > 16)
    throw ModelError("the CUDA backend supports GQA groups of at most 16 query heads per KV head");
  if (opt.block_size != 8 && opt.block_size != 16 && opt.block_size != 32)
    throw ModelError("the CUDA backend supports block sizes 8, 16 and 32, not " + std::to_string(opt.block_size));
  if (hidden % 8 != 0 || inter % 8 != 0)
    throw ModelError("the CUDA backend needs hidden_size and intermediate_size divisible by 8");
  if (cfg.is_moe() && (cfg.moe.num_experts % 8 != 0 || cfg.moe.num_experts > cuda::kMaxExperts ||
                       cfg.moe.top_k > cuda::kMaxTopK || opt.fp8_weights))
    throw ModelError("the CUDA backend's mixture of experts needs a multiple of 8 experts up to " +
                     std::to_string(cuda::kMaxExperts) + " and top_k at most " + std::to_string(cuda::kMaxTopK) +
                     ", without FP8 weights (--quantization fp8, or an FP8 checkpoint: --quantization none loads "
                     "it dequantised to bf16) (this model: " + std::to_string(cfg.moe.num_experts) +
                     " experts, top " + std::to_string(cfg.moe.top_k) + ")");
  if (opt.max_loras < 0 || (opt.max_loras > 0 && opt.max_lora_rank < 1))
    throw ModelError("LoRA slots: max_loras " + std::to_string(opt.max_loras) + " and max_lora_rank " +
                     std::to_string(opt.max_lora_rank) + " must be positive");
  map = rank_weight_map(cfg, opt.tp_rank, opt.tp_size);
  const int tp = opt.tp_size;
  if (map.intermediate % 8 != 0)
    throw ModelError("tensor_parallel_size " + std::to_string(tp) + " leaves " + std::to_string(map.intermediate) +
                     " intermediate columns per rank; the CUDA backend needs a multiple of 8");
  if (tp > 1 && (!opt.comm || opt.comm->size() != tp || opt.comm->rank() != opt.tp_rank ||
                 opt.comm->device() != opt.device))
    throw ModelError("tensor-parallel rank " + std::to_string(opt.tp_rank) + " of " + std::to_string(tp) +
                     " needs its NCCL communicator on device " + std::to_string(opt.device));
  heads = map.heads;
  kv_heads = map.kv_heads;
  inter = map.intermediate;
  qkv_dim = (heads + 2 * kv_heads) * head_dim;
  if (opt.max_model_len <= 0) opt.max_model_len = cfg.max_position_embeddings;
  max_seqs = std::max(1, opt.max_num_seqs);
  max_tokens = std::max(opt.max_num_batched_tokens, max_seqs);
  max_rows = std::max(max_seqs, opt.max_logits_rows);
  table_stride = (opt.max_model_len + opt.block_size - 1) / opt.block_size;

  PAGED_CUDA_CHECK(cudaSetDevice(opt.device));
  cudaDeviceProp prop{};
  PAGED_CUDA_CHECK(cudaGetDeviceProperties(&prop, opt.device));
  sm_count = prop.multiProcessorCount;
  l2_bytes = prop.l2CacheSize;
  if (opt.fp8_weights && prop.major * 10 + prop.minor < 89)
    throw ModelError("FP8 weights (--quantization fp8, or an FP8 checkpoint: --quantization none loads it dequantised "
                     "to bf16) need a GPU of compute capability 8.9 or newer (FP8 tensor cores); device " +
                     std::to_string(opt.device) + " has " + std::to_string(prop.major) + "." +
                     std::to_string(prop.minor));
  if (opt.fp8_kv && prop.major * 10 + prop.minor < 89)
    throw ModelError("--kv-cache-dtype fp8 needs a GPU of compute capability 8.9 or newer; device " +
                     std::to_string(opt.device) + " has " + std::to_string(prop.major) + "." +
                     std::to_string(prop.minor));
  if (opt.fp8_weights && (hidden % 16 != 0 || inter % 16 != 0 || (heads * head_dim) % 16 != 0))
    throw ModelError("--quantization fp8 needs hidden_size, the rank's intermediate size and q width divisible by 16");
  PAGED_CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  PAGED_CUDA_CHECK(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking));
  PAGED_CUDA_CHECK(cudaEventCreateWithFlags(&compute_done, cudaEventDisableTiming));
  PAGED_CUDA_CHECK(cudaEventCreateWithFlags(&swap_done, cudaEventDisableTiming));
  for (cudaEvent_t* e : {&step_start, &step_end, &prev_end}) PAGED_CUDA_CHECK(cudaEventCreate(e));
}

std::vector<WeightSlot> CudaModelRunner::Impl::weight_params() {
  std::vector<WeightSlot> params{{&embed, &map.embed}, {&final_norm, &map.final_norm}, {&lm_head, &map.lm_head}};
  for (int l = 0; l < cfg.num_layers; ++l) {
    LayerWeights& L = layers[l];
    const RankLayer& M = map.layers[l];
    // With FP8 weights every linear layer has its FP8 twin, but those an FP8 checkpoint left in their dtype.
    const auto fp8 = [&](Fp8Weight& w, const RankParam& p) {
      const bool left_out = checkpoint && cfg.fp8_checkpoint.enabled && !holds_fp8(*checkpoint, p);
      return opt.fp8_weights && !left_out ? &w : nullptr;
    };
    params.insert(params.end(), {{&L.attn_norm, &M.attn_norm}, {&L.ffn_norm, &M.ffn_norm},
                                 {&L.post_attn_norm, &M.post_attn_norm}, {&L.post_ffn_norm, &M.post_ffn_norm},
                                 {&L.wqkv, &M.wqkv, fp8(L.qkv8, M.wqkv)}, {&L.bqkv, &M.bqkv}, {&L.q_norm, &M.q_norm},
                                 {&L.k_norm, &M.k_norm}, {&L.wo, &M.wo, fp8(L.o8, M.wo)}, {&L.bo, &M.bo},
                                 {&L.w_gate_up, &M.w_gate_up, fp8(L.gate_up8, M.w_gate_up)},
                                 {&L.w_down, &M.w_down, fp8(L.down8, M.w_down)}, {&L.router, &M.router}});
  }
  return params;
}

void CudaModelRunner::Impl::allocate_weights() {
  // Offsets in elements, each tensor starting 256-byte aligned (cuBLASLt's preferred alignment). A parameter without
  // shards (no bias; the LM head of tied embeddings) takes no room and keeps its null pointer. FP8 twins take their
  // codes (bytes) and scales from their own arenas, and the staging room of the largest.
  layers.resize(cfg.num_layers);
  int64_t size = 0, fp8_bytes = 0, fp8_rows = 0, staging = 0;
  std::vector<std::pair<bf16**, int64_t>> offsets;
  std::vector<std::tuple<Fp8Weight*, int64_t, int64_t>> fp8_offsets;
  for (const WeightSlot& slot : weight_params()) {
    if (slot.param->shards.empty()) continue;
    if (slot.fp8) {
      const int64_t rows = slot.param->numel() / slot.param->shards.front().cols;
      fp8_offsets.emplace_back(slot.fp8, fp8_bytes, fp8_rows);
      fp8_bytes += round_up(slot.param->numel(), 256);
      fp8_rows += round_up(rows, 64);
      staging = std::max(staging, slot.param->numel());
      continue;
    }
    offsets.emplace_back(slot.where, size);
    size += round_up(slot.param->numel(), 128);
  }
  arena = device_alloc<bf16>(size);
  for (auto& [where, offset] : offsets) *where = arena.get() + offset;
  if (opt.fp8_weights) {
    fp8_arena = device_alloc<uint8_t>(fp8_bytes);
    fp8_scales = device_alloc<float>(fp8_rows);
    fp8_staging = device_alloc<bf16>(staging);
    for (auto& [w, bytes, rows] : fp8_offsets) *w = {fp8_arena.get() + bytes, fp8_scales.get() + rows};
  }
  if (cfg.tie_word_embeddings) lm_head = embed;
  const std::vector<float> freq = cfg.rope_inv_freq(opt.max_model_len);
  inv_freq = device_alloc<float>(freq.size());
  PAGED_CUDA_CHECK(cudaMemcpy(inv_freq.get(), freq.data(), freq.size() * sizeof(float), cudaMemcpyHostToDevice));
  if (!cfg.local_rope_layers.empty()) {
    const std::vector<float> local = cfg.local_rope_inv_freq();
    local_inv_freq = device_alloc<float>(local.size());
    PAGED_CUDA_CHECK(
        cudaMemcpy(local_inv_freq.get(), local.data(), local.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
}

void CudaModelRunner::Impl::load_weights(const SafeTensors& w) {
  // Copies a shard (rows x columns of its tensor, see model/loader/weight_map.h) densely into dst as bf16. bf16
  // checkpoints go straight from the mapped file; float32, f16 and an FP8 checkpoint's e4m3 codes (times their
  // scales) are converted through a host buffer, about kSlice elements per copy.
  std::vector<uint16_t> staging;
  auto load = [&](const TensorShard& shard, bf16* dst) {
    const TensorView& t = shard_tensor(w, shard);
    const int64_t C = shard.shape.back(), nr = shard.rows, nc = shard.cols;
    const int64_t first = shard.row_begin * C + shard.col_begin;  // the slice's first element in the tensor
    if (t.dtype == DType::bf16) {
      const uint16_t* src = static_cast<const uint16_t*>(t.data) + first;
      if (nc == C)
        PAGED_CUDA_CHECK(cudaMemcpy(dst, src, nr * nc * sizeof(bf16), cudaMemcpyHostToDevice));
      else
        PAGED_CUDA_CHECK(cudaMemcpy2D(dst, nc * sizeof(bf16), src, C * sizeof(bf16), nc * sizeof(bf16), nr,
                                      cudaMemcpyHostToDevice));
      return;
    }
    std::optional<Fp8WeightScales> scales;
    if (t.dtype == DType::f8_e4m3) scales.emplace(w, shard.name, t, cfg.fp8_checkpoint);
    std::vector<float> values;
    auto convert = [&](int64_t at, int64_t len, uint16_t* out) {  // elements [at, at + len) of the tensor
      values.resize(static_cast<size_t>(len));
      t.to_floats(at, len, values.data());
      for (int64_t done = 0; scales && done < len;) {  // FP8: the scales of each row's part of the run
        const int64_t e = at + done, n = std::min(len - done, C - e % C);
        scales->dequantise(e / C, e % C, n, values.data() + done);
        done += n;
      }
      for (int64_t i = 0; i < len; ++i) out[i] = float_to_bf16(values[i]);
    };
    constexpr int64_t kSlice = int64_t{1} << 22;
    if (nc == C) {  // whole rows: one contiguous run
      const int64_t n = nr * nc;
      staging.resize(std::min(n, kSlice));
      for (int64_t at = 0; at < n; at += kSlice) {
        const int64_t len = std::min(kSlice, n - at);
        convert(first + at, len, staging.data());
        PAGED_CUDA_CHECK(cudaMemcpy(dst + at, staging.data(), len * sizeof(bf16), cudaMemcpyHostToDevice));
      }
      return;
    }
    const int64_t per_copy = std::max<int64_t>(1, kSlice / nc);  // rows of a column slice per copy
    staging.resize(std::min(nr, per_copy) * nc);
    for (int64_t r = 0; r < nr; r += per_copy) {
      const int64_t k = std::min(per_copy, nr - r);
      for (int64_t i = 0; i < k; ++i) convert(first + (r + i) * C, nc, staging.data() + i * nc);
      PAGED_CUDA_CHECK(cudaMemcpy(dst + r * nc, staging.data(), k * nc * sizeof(bf16), cudaMemcpyHostToDevice));
    }
  };
  // An FP8 checkpoint's weight with per-tensor or per-channel scales: each shard's codes and its rows' scales go
  // straight into the FP8 twin, back to back.
  auto load_fp8_codes = [&](const WeightSlot& slot) {
    uint8_t* q = slot.fp8->q;
    float* scale = slot.fp8->scale;
    for (const TensorShard& shard : slot.param->shards) {
      const TensorView& t = shard_tensor(w, shard);
      const int64_t C = shard.shape.back();
      const auto* codes = static_cast<const uint8_t*>(t.data) + shard.row_begin * C + shard.col_begin;
      PAGED_CUDA_CHECK(cudaMemcpy2D(q, shard.cols, codes, C, shard.cols, shard.rows, cudaMemcpyHostToDevice));
      const std::vector<float> rows =
          Fp8WeightScales(w, shard.name, t, cfg.fp8_checkpoint).row_scales(shard.row_begin, shard.rows);
      PAGED_CUDA_CHECK(cudaMemcpy(scale, rows.data(), rows.size() * sizeof(float), cudaMemcpyHostToDevice));
      q += shard.numel();
      scale += shard.rows;
    }
  };
  // Each parameter's shards back to back: q, k, v rows of the fused QKV (and its bias), gate and up rows. A copy from
  // pageable memory returns before its DMA has landed, on the legacy stream, which the non-blocking compute stream
  // does not wait for: the device is synchronised before a quantisation reads the staging, and once at the end.
  // FP8 twins of block-scaled (or partly FP8) checkpoint weights are dequantised to bf16 into the staging and
  // quantised again per output row, as a bf16 checkpoint's.
  for (const WeightSlot& slot : weight_params()) {
    if (slot.fp8 && fp8_rows_as_stored(w, *slot.param, cfg.fp8_checkpoint)) {
      load_fp8_codes(slot);
      continue;
    }
    bf16* dst = slot.fp8 ? fp8_staging.get() : *slot.where;
    for (const TensorShard& shard : slot.param->shards) {
      load(shard, dst);
      dst += shard.numel();
    }
    if (slot.fp8) {
      PAGED_CUDA_CHECK(cudaDeviceSynchronize());
      quantize_weight(slot);
    }
  }
  PAGED_CUDA_CHECK(cudaDeviceSynchronize());
  fp8_staging.reset();
}

void CudaModelRunner::Impl::quantize_weight(const WeightSlot& slot) {
  const int64_t cols = slot.param->shards.front().cols, rows = slot.param->numel() / cols;
  PAGED_CUDA_CHECK(cuda::quantize_rows_fp8(fp8_staging.get(), rows, static_cast<int>(cols), slot.fp8->q,
                                           slot.fp8->scale, compute));
  PAGED_CUDA_CHECK(cudaStreamSynchronize(compute));  // the staging is reused by the next tensor
}

void CudaModelRunner::Impl::linear(const Slice& sl, bf16* y, const bf16* x, const bf16* w, const Fp8Weight& w8,
                                   const bf16* bias, int n, int k, bool x_quantized) {
  if (!w8.q) {
    PAGED_CUDA_CHECK(sl.gemm->linear(y, x, w, bias, sl.tokens, n, k, false, sl.stream));
    return;
  }
  uint8_t* const codes = sl.row(act_fp8.get(), fp8_row_width);
  float* const code_scales = sl.row(act_scale.get(), 1);
  if (!x_quantized) PAGED_CUDA_CHECK(cuda::quantize_rows_fp8(x, sl.tokens, k, codes, code_scales, sl.stream));
  PAGED_CUDA_CHECK(sl.gemm->linear_fp8(y, codes, code_scales, w8.q, w8.scale, bias, sl.tokens, n, k, sl.stream));
}

void CudaModelRunner::Impl::random_weights(uint64_t seed) {
  // Linear weights uniform with standard deviation 1/sqrt(fan_in) (activations keep their scale through the
  // layers), norms 1, biases small: a model whose numbers stay finite, which is all a benchmark needs. Replicated
  // tensors are the same on every rank; each rank draws its own shards (streams offset by the rank, none for rank
  // 0, which draws what a single GPU does), row-parallel ones scaled for the whole fan-in that the all-reduce sums.
  uint64_t stream = seed * 1000003;
  const uint64_t shard_offset = static_cast<uint64_t>(opt.tp_rank) << 40;
  auto fill = [&](bf16* p, int64_t n, float scale, float offset, bool shard) {
    PAGED_CUDA_CHECK(cuda::fill_random_bf16(p, n, ++stream + (shard ? shard_offset : 0), scale, offset, compute));
  };
  const float sqrt3 = std::sqrt(3.0f);
  auto linear = [&](bf16* p, int64_t rows, int64_t cols, int64_t fan_in, bool shard) {
    fill(p, rows * cols, sqrt3 / std::sqrt(static_cast<float>(fan_in)), 0.0f, shard);
  };
  fill(embed, int64_t{vocab} * hidden, sqrt3, 0.0f, false);
  const float norm_one = 1.0f - norm_offset;  // every norm scales by 1
  fill(final_norm, hidden, 0.0f, norm_one, false);
  if (!cfg.tie_word_embeddings) linear(lm_head, vocab, hidden, hidden, false);
  // FP8 twins draw the same bf16 values into the staging buffer, then quantise them.
  std::vector<WeightSlot> slots = weight_params();
  const auto slot_of = [&](bf16** where) {
    return *std::find_if(slots.begin(), slots.end(), [where](const WeightSlot& s) { return s.where == where; });
  };
  const auto linear_of = [&](bf16** where, int64_t rows, int64_t cols, int64_t fan_in) {
    const WeightSlot slot = slot_of(where);
    linear(slot.fp8 ? fp8_staging.get() : *where, rows, cols, fan_in, true);
    if (slot.fp8) quantize_weight(slot);
  };
  const int64_t experts = std::max(1, cfg.moe.num_experts);  // MoE: every expert's gate/up and down; dense: one
  for (LayerWeights& L : layers) {
    fill(L.attn_norm, hidden, 0.0f, norm_one, false);
    fill(L.ffn_norm, hidden, 0.0f, norm_one, false);
    if (L.post_attn_norm) fill(L.post_attn_norm, hidden, 0.0f, norm_one, false);
    if (L.post_ffn_norm) fill(L.post_ffn_norm, hidden, 0.0f, norm_one, false);
    linear_of(&L.wqkv, qkv_dim, hidden, hidden);
    if (L.bqkv) fill(L.bqkv, qkv_dim, 0.1f, 0.0f, true);
    if (L.q_norm) fill(L.q_norm, head_dim, 0.0f, norm_one, false);
    if (L.k_norm) fill(L.k_norm, head_dim, 0.0f, norm_one, false);
    if (L.bo) fill(L.bo, hidden, 0.1f, 0.0f, false);
    linear_of(&L.wo, hidden, int64_t{heads} * head_dim, int64_t{cfg.num_heads} * head_dim);
    linear_of(&L.w_gate_up, experts * 2 * inter, hidden, hidden);
    linear_of(&L.w_down, experts * hidden, inter, cfg.intermediate_size);
    if (L.router) linear(L.router, experts, hidden, hidden, false);
  }
  PAGED_CUDA_CHECK(cudaStreamSynchronize(compute));
  fp8_staging.reset();
}

void CudaModelRunner::Impl::allocate_runtime() {
  gemm = std::make_unique<cuda::Gemm>();
  const int64_t T = max_tokens;
  residual = device_alloc<bf16>(T * hidden);
  normed = device_alloc<bf16>(T * hidden);
  qkv = device_alloc<bf16>(T * qkv_dim);
  attn = device_alloc<bf16>(T * heads * head_dim);
  proj = device_alloc<bf16>(T * hidden);
  gate_up = device_alloc<bf16>(T * 2 * inter);
  act = device_alloc<bf16>(T * inter);
  if (cfg.sandwich_norms) post_normed = device_alloc<bf16>(T * hidden);
  if (opt.fp8_weights) {
    fp8_row_width = std::max({hidden, inter, heads * head_dim});
    act_fp8 = device_alloc<uint8_t>(T * fp8_row_width);
    act_scale = device_alloc<float>(T);
  }
  last_hidden = device_alloc<bf16>(int64_t{max_rows} * hidden);
  logits = device_alloc<float>(int64_t{max_rows} * vocab);
  sample_ws = device_alloc<char>(cuda::sampling_workspace_bytes(max_seqs, vocab));
  if (cfg.is_moe()) allocate_moe();
  if (opt.max_loras > 0) allocate_lora();

  buckets = batch_buckets(max_seqs);
  ctx_buckets = context_buckets(opt.max_model_len);
  // The decode workspace serves every (sequences, context) the runner may launch: decode steps pad to a batch bucket,
  // the decode rows of other steps (Plan::decode_seqs) are any number up to max_seqs.
  for (int b = 1; b <= max_seqs; ++b)
    for (int c : ctx_buckets) {
      const int partition = cuda::decode_partition(b, kv_heads, c, sm_count, opt.block_size);
      decode_ws_bytes =
          std::max(decode_ws_bytes, cuda::paged_attention_decode_workspace(b, heads, head_dim, c, partition));
    }
  if (nano_batched()) {
    // Nano-batched decode steps: both nano-batches' workspaces side by side, each 256-byte aligned.
    int highest_priority = 0;
    PAGED_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(nullptr, &highest_priority));
    PAGED_CUDA_CHECK(cudaStreamCreateWithPriority(&nano_stream, cudaStreamNonBlocking, highest_priority));
    for (cudaEvent_t* e : {&products_done[0], &products_done[1], &attention_done[0], &attention_done[1]})
      PAGED_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    const int sms = opt.nano_sm_percent < 100 ? std::max(1, sm_count * opt.nano_sm_percent / 100) : 0;
    nano_gemm = std::make_unique<cuda::Gemm>(size_t{32} << 20, cuda::GemmTuning{.sm_count_target = sms});
    for (int b : buckets) {
      if (b < opt.nano_batch_rows) continue;
      for (int c : ctx_buckets) {
        size_t bytes = 0;
        for (const auto& [first, rows] : nano_batches(b)) {
          const int partition = cuda::decode_partition(rows, kv_heads, c, sm_count, opt.block_size);
          bytes += static_cast<size_t>(round_up(
              static_cast<int64_t>(cuda::paged_attention_decode_workspace(rows, heads, head_dim, c, partition)), 256));
        }
        decode_ws_bytes = std::max(decode_ws_bytes, bytes);
      }
    }
  }
  decode_ws = device_alloc<char>(decode_ws_bytes);

  token_ids.allocate(T);
  positions.allocate(T);
  slots.allocate(int64_t{kv_groups.num_groups()} * T);
  query_start.allocate(max_seqs + 1);
  context_lens.allocate(max_seqs);
  block_tables.allocate(int64_t{kv_groups.num_groups()} * max_seqs * table_stride);
  last_rows.allocate(max_rows);
  sample_rows.allocate(max_seqs);
  logits_row_ids.allocate(max_seqs);
  sampled.allocate(max_seqs);
  logprobs.allocate(max_seqs);
}

bool CudaModelRunner::Impl::one_stream_gemvs() const {
  return opt.tp_size == 1 && !cfg.o_bias && !cfg.sandwich_norms && cfg.activation == Activation::silu &&
         hidden <= cuda::kMaxNormedK;
}

cuda::GemvArgs CudaModelRunner::Impl::gemv_args(GemvProjection p, const LayerWeights& L, bf16* y,
                                                 const bf16* x) const {
  // `norm`: x is the residual stream, normalised by the GEMV itself with this weight (kernels/cuda/gemv.h).
  const auto args = [&](const bf16* w, const Fp8Weight& w8, const bf16* bias, int n, int k, cuda::GemvOutput output,
                        const bf16* norm) {
    return cuda::GemvArgs{.x = x, .w = w8.q ? nullptr : w, .w_fp8 = w8.q, .w_scale = w8.scale, .bias = bias,
                          .y = y, .n = n, .k = k, .output = output, .norm_weight = norm, .norm_eps = eps,
                          .norm_offset = norm_offset, .rope = {}};
  };
  switch (p) {
    case kGemvQkv: return args(L.wqkv, L.qkv8, L.bqkv, qkv_dim, hidden, cuda::GemvOutput::kStore, L.attn_norm);
    case kGemvO: {
      // It follows the decode attention, which leaves the memory idle: its weights go to L2 meanwhile, as much of
      // them as half of L2 holds (the 8B's FP8 16 MB, half of its bf16 32 MB in the H100's 50 MB).
      cuda::GemvArgs a = args(L.wo, L.o8, nullptr, hidden, heads * head_dim, cuda::GemvOutput::kAddToResidual, nullptr);
      const double bytes = double(hidden) * heads * head_dim * (L.o8.q ? 1 : 2);
      a.prefetch_l2 = static_cast<float>(std::min(1.0, double(l2_bytes) / 2 / bytes));
      return a;
    }
    case kGemvGateUp:
      return args(L.w_gate_up, L.gate_up8, nullptr, 2 * inter, hidden, cuda::GemvOutput::kSiluMul, L.ffn_norm);
    default: return args(L.w_down, L.down8, nullptr, hidden, inter, cuda::GemvOutput::kAddToResidual, nullptr);
  }
}

void CudaModelRunner::Impl::tune_gemv_tiles() {
  if (!one_stream_gemvs()) return;
  // Eight layers' own weights a pass (none of them left in L2 by the pass before), three passes timed per tile.
  const int tuned_layers = std::min(cfg.num_layers, 8);
  cudaEvent_t start = nullptr, stop = nullptr;
  PAGED_CUDA_CHECK(cudaEventCreate(&start));
  PAGED_CUDA_CHECK(cudaEventCreate(&stop));
  // The inputs' contents do not matter to the timing, but they are read: zeros, not memory no step wrote yet
  // (compute-sanitizer's initcheck reported those reads), `proj` too (the O and down GEMVs add into it).
  PAGED_CUDA_CHECK(cudaMemsetAsync(residual.get(), 0, sizeof(bf16) * hidden, compute));
  PAGED_CUDA_CHECK(cudaMemsetAsync(proj.get(), 0, sizeof(bf16) * hidden, compute));
  PAGED_CUDA_CHECK(cudaMemsetAsync(attn.get(), 0, sizeof(bf16) * heads * head_dim, compute));
  PAGED_CUDA_CHECK(cudaMemsetAsync(act.get(), 0, sizeof(bf16) * inter, compute));
  for (int p = 0; p < kGemvProjections; ++p) {
    const auto proj_kind = static_cast<GemvProjection>(p);
    if (cfg.is_moe() && (proj_kind == kGemvGateUp || proj_kind == kGemvDown)) continue;  // the MoE block's
    // The buffers the step itself uses (x and y never alias).
    bf16* y = proj_kind == kGemvQkv ? qkv.get() : proj_kind == kGemvGateUp ? act.get() : proj.get();
    const bf16* x = proj_kind == kGemvO ? attn.get() : proj_kind == kGemvDown ? act.get() : residual.get();
    const auto pass = [&](int tile) {
      for (int l = 0; l < tuned_layers; ++l)
        if (cuda::gemv(gemv_args(proj_kind, layers[l], y, x), compute, tile) != cudaSuccess) return false;
      return true;
    };
    float best_ms = 0.f;
    for (int tile = 0; tile < static_cast<int>(cuda::kGemvTiles.size()); ++tile) {
      if (!pass(tile)) {  // not a tile for these weights (the launcher refused it before launching)
        cudaGetLastError();
        continue;
      }
      PAGED_CUDA_CHECK(cudaEventRecord(start, compute));
      for (int r = 0; r < 3; ++r) pass(tile);
      PAGED_CUDA_CHECK(cudaEventRecord(stop, compute));
      PAGED_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0.f;
      PAGED_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      if (gemv_tile[p] < 0 || ms < best_ms) {
        best_ms = ms;
        gemv_tile[p] = tile;
      }
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

void CudaModelRunner::Impl::allocate_kv() {
  // One cache's block: bf16, or FP8 codes and their scales.
  const size_t block_bytes = opt.fp8_kv ? cuda::kv_fp8_block_bytes(kv_heads, opt.block_size, head_dim)
                                        : size_t{2} * kv_heads * opt.block_size * head_dim;
  const size_t all_layers = 2 * size_t(kv_groups.layers_per_block) * block_bytes;  // K and V of a block's layers
  int64_t blocks = opt.num_blocks;
  if (blocks <= 0) {
    // vLLM's rule: the process may use gpu_memory_utilization of the device; what weights, activations and
    // workspaces took is already gone from `free`. 512 MiB stay for CUDA graphs and cuBLAS' own needs.
    size_t free = 0, total = 0;
    PAGED_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    const double budget = total * opt.gpu_memory_utilization - double(total - free) - double(size_t{512} << 20);
    blocks = budget > 0 ? static_cast<int64_t>(budget / all_layers) : 0;
  }
  const int64_t one_sequence = most_blocks_held(kv_groups.windows, opt.max_model_len, opt.block_size, max_tokens);
  if (blocks < one_sequence)
    throw GpuError("KV cache: room for " + std::to_string(blocks) + " blocks, fewer than one sequence of max_model_len " +
                   std::to_string(opt.max_model_len) + " needs (" + std::to_string(one_sequence) +
                   "); raise gpu_memory_utilization or lower max_model_len");
  blocks = std::min<int64_t>(blocks, INT32_MAX);
  kv_memory = device_alloc<char>(blocks * all_layers);
  // Zeros, so that every block holds finite values: the kernels load (and mask) positions before a sliding window
  // from released table entries, staged as block 0, as the padding rows of a decode step read block 0.
  PAGED_CUDA_CHECK(cudaMemset(kv_memory.get(), 0, blocks * all_layers));
  kv = cuda::BlockPool{kv_memory.get(), 2 * kv_groups.layers_per_block, static_cast<int>(blocks), block_bytes};
  const auto swap_blocks = static_cast<int64_t>(opt.swap_space_gib * double(int64_t{1} << 30) / double(all_layers));
  swap_memory = pinned_alloc<char>(std::max<int64_t>(swap_blocks, 0) * all_layers);
  host = cuda::BlockPool{swap_memory.get(), 2 * kv_groups.layers_per_block,
                         static_cast<int>(std::max<int64_t>(swap_blocks, 0)),
                         block_bytes};
  swapping = BlocksInFlight(kv.num_blocks);
}

void CudaModelRunner::Impl::allocate_lora() {
  const bool dense_mlp = !cfg.is_moe();  // the experts take no pairs (load_lora_adapter refuses them)
  lora_map = lora_layout(cfg.num_layers,
                         {LoraShape{qkv_dim, hidden}, LoraShape{hidden, heads * head_dim},
                          LoraShape{2 * inter, hidden, dense_mlp}, LoraShape{hidden, inter, dense_mlp}},
                         opt.max_lora_rank);
  lora_weights = device_alloc<bf16>(lora_map.weights * opt.max_loras);
  lora_scales = device_alloc<float>(lora_map.scales * opt.max_loras);
  lora_v = device_alloc<float>(int64_t{max_tokens} * opt.max_loras * lora_map.max_rank);
  lora_v16 = device_alloc<bf16>(int64_t{max_tokens} * opt.max_loras * lora_map.max_rank);
  lora_rows.allocate(max_tokens);
  slot_lora.assign(opt.max_loras, 0);
  slot_used.assign(opt.max_loras, 0);
}

int CudaModelRunner::Impl::lora_slot(int32_t id, std::vector<int32_t>& step) {
  const auto adapter = loras.find(id);
  if (adapter == loras.end())
    throw ModelError("chunk of LoRA adapter " + std::to_string(id) + ", which this runner does not hold");
  int slot = static_cast<int>(std::find(slot_lora.begin(), slot_lora.end(), id) - slot_lora.begin());
  if (slot == opt.max_loras) {
    slot = static_cast<int>(std::find(slot_lora.begin(), slot_lora.end(), 0) - slot_lora.begin());
    if (slot == opt.max_loras) {
      slot = -1;
      for (int s = 0; s < opt.max_loras; ++s)
        if (std::find(step.begin(), step.end(), slot_lora[s]) == step.end() &&
            (slot < 0 || slot_used[s] < slot_used[slot]))
          slot = s;
      if (slot < 0)
        throw ModelError("step of more LoRA adapters than the runner's " + std::to_string(opt.max_loras) +
                         " slots (max_loras)");
    }
    // After the steps before it on the compute stream, which may still read the slot's previous adapter.
    const HostLora& host = adapter->second;
    for (const LoraCopy& c : lora_slot_copies(lora_map, opt.max_loras, slot)) {
      const size_t size = c.scales ? sizeof(float) : sizeof(uint16_t);
      void* dst = c.scales ? static_cast<void*>(lora_scales.get() + c.dst)
                           : static_cast<void*>(lora_weights.get() + c.dst);
      const void* src = c.scales ? static_cast<const void*>(host.scales.data() + c.src)
                                 : static_cast<const void*>(host.weights.data() + c.src);
      PAGED_CUDA_CHECK(cudaMemcpy2DAsync(dst, c.dst_pitch * size, src, c.width * size, c.width * size, c.rows,
                                         cudaMemcpyHostToDevice, compute));
    }
    slot_lora[slot] = id;
  }
  if (std::find(step.begin(), step.end(), id) == step.end()) step.push_back(id);
  slot_used[slot] = ++lora_uses;
  return slot;
}

void CudaModelRunner::add_lora(int32_t id, const LoraAdapter& adapter) {
  Impl& m = *impl_;
  if (m.opt.max_loras == 0)
    throw ModelError("this CUDA runner has no LoRA slots (the engine starts it with them under --enable-lora)");
  if (id <= 0 || m.loras.count(id)) throw ModelError("LoRA adapter id " + std::to_string(id) + " is taken or not > 0");
  Impl::HostLora host;
  pack_lora(adapter, m.lora_map, host.weights, host.scales);
  m.loras.emplace(id, std::move(host));
}

void CudaModelRunner::remove_lora(int32_t id) {
  Impl& m = *impl_;
  m.loras.erase(id);
  for (int32_t& held : m.slot_lora)
    if (held == id) held = 0;  // free: a later upload into it follows every step that read it on the stream
}

CudaModelRunner::Impl::Plan CudaModelRunner::Impl::prepare(const StepBatch& batch) {
  Plan plan;
  const int B = opt.block_size;
  const int n = static_cast<int>(batch.seqs.size());
  if (n > max_seqs)
    throw ModelError("step of " + std::to_string(n) + " sequences exceeds max_num_seqs " + std::to_string(max_seqs));
  bool decode = n > 0;
  int max_table = 1, tokens = 0;
  const int G = kv_groups.num_groups();
  for (const SeqChunk& c : batch.seqs) {
    decode = decode && c.tokens.size() == 1;
    tokens += static_cast<int>(c.tokens.size());
  }
  if (tokens > max_tokens)
    throw ModelError("step of " + std::to_string(tokens) + " tokens exceeds max_num_batched_tokens " +
                     std::to_string(max_tokens));
  plan.decode = decode;
  query_start.host[0] = 0;
  int t = 0;
  int lead_ctx = 0;  // the longest context of the leading one-token chunks (plan.decode_seqs of them)
  plan.logits_row.assign(n, -1);
  std::vector<int32_t> step_loras;  // the adapters this step has placed in slots
  for (int s = 0; s < n; ++s) {
    const SeqChunk& c = batch.seqs[s];
    const int lora = c.lora != 0 ? lora_slot(c.lora, step_loras) : -1;
    plan.lora = plan.lora || lora >= 0;
    const int ctx = c.start_pos + static_cast<int>(c.tokens.size());
    const int needed = (ctx + B - 1) / B;
    if (ctx > opt.max_model_len)
      throw ModelError("context of " + std::to_string(ctx) + " tokens exceeds max_model_len " +
                       std::to_string(opt.max_model_len));
    if (auto bad = check_chunk_tables(c, kv_groups.windows, kv.num_blocks, B))
      throw ModelError("chunk" + bad->describe());
    for (int g = 0; g < G; ++g) {
      const std::vector<int32_t>& table = table_of(c, g);
      int32_t* const row = block_tables.host.get() + (int64_t{g} * max_seqs + s) * table_stride;
      for (int b = 0; b < needed; ++b) row[b] = std::max(table[b], 0);  // a released block (before every window of
                                                                         // the group) is read as block 0, and masked
    }
    max_table = std::max(max_table, needed);
    for (size_t i = 0; i < c.tokens.size(); ++i, ++t) {
      if (c.tokens[i] < 0 || c.tokens[i] >= vocab) throw ModelError("token id out of range");
      const int pos = c.start_pos + static_cast<int>(i);
      token_ids.host[t] = c.tokens[i];
      positions.host[t] = pos;
      if (opt.max_loras > 0) lora_rows.host[t] = lora;
      for (int g = 0; g < G; ++g) slots.host[int64_t{g} * max_tokens + t] = kv_slot(table_of(c, g), pos, B);
    }
    query_start.host[s + 1] = t;
    context_lens.host[s] = ctx;
    plan.max_q = std::max(plan.max_q, static_cast<int>(c.tokens.size()));
    if (plan.decode_seqs == s && c.tokens.size() == 1) {
      ++plan.decode_seqs;
      lead_ctx = std::max(lead_ctx, ctx);
    }
    if (!c.samples.empty()) {
      // Decode steps run the LM head on every row (row s is sequence s); others gather the sampled rows first: the
      // last token's, or with drafts each position verified (chunk_sample), in order from logits_row[s].
      plan.logits_row[s] = decode ? s : plan.logits_rows;
      for (int k = c.num_drafts; k >= 0; --k) {
        if (plan.logits_rows == max_rows)
          throw ModelError("step samples more than the " + std::to_string(max_rows) +
                           " positions the runner holds logits for (max_num_seqs, more with speculation)");
        last_rows.host[plan.logits_rows++] = t - 1 - k;
      }
    }
  }
  plan.tokens = t;
  plan.seqs = n;
  if (decode) {
    // Pad to the batch bucket: token 0 at position 0, written nowhere (slot -1), attending to one cached token of
    // block 0 (any valid block: its output is never read).
    const int rows = *std::lower_bound(buckets.begin(), buckets.end(), n);
    for (int s = n; s < rows; ++s) {
      token_ids.host[s] = 0;
      positions.host[s] = 0;
      if (opt.max_loras > 0) lora_rows.host[s] = -1;
      query_start.host[s + 1] = s + 1;
      context_lens.host[s] = 1;
      for (int g = 0; g < G; ++g) {
        slots.host[int64_t{g} * max_tokens + s] = -1;
        block_tables.host[(int64_t{g} * max_seqs + s) * table_stride] = 0;
      }
    }
    plan.tokens = plan.seqs = plan.decode_seqs = rows;
    plan.logits_rows = rows;
  } else if (int64_t{plan.decode_seqs} * kv_heads < sm_count) {
    plan.decode_seqs = 0;
  }
  if (plan.decode_seqs > 0) {
    plan.grid_ctx = *std::lower_bound(ctx_buckets.begin(), ctx_buckets.end(), lead_ctx);
    plan.partition = cuda::decode_partition(plan.decode_seqs, kv_heads, plan.grid_ctx, sm_count, B);
  }
  if (decode && nano_batched() && !plan.lora && plan.seqs >= opt.nano_batch_rows) {
    const auto batches = nano_batches(plan.seqs);
    plan.nano_first = batches[0].second;
    for (int i = 0; i < 2; ++i)
      plan.nano_partition[i] = cuda::decode_partition(batches[i].second, kv_heads, plan.grid_ctx, sm_count, B);
  }
  // Uploads on the compute stream: ordered before the kernels that read them, after the previous step's.
  PAGED_CUDA_CHECK(token_ids.upload(plan.tokens, compute));
  PAGED_CUDA_CHECK(positions.upload(plan.tokens, compute));
  if (plan.lora) PAGED_CUDA_CHECK(lora_rows.upload(plan.tokens, compute));
  for (int g = 0; g < G; ++g) {
    const int64_t group = int64_t{g} * max_tokens;
    PAGED_CUDA_CHECK(cudaMemcpyAsync(slots.device.get() + group, slots.host.get() + group,
                                     plan.tokens * sizeof(int64_t), cudaMemcpyHostToDevice, compute));
  }
  PAGED_CUDA_CHECK(query_start.upload(plan.seqs + 1, compute));
  PAGED_CUDA_CHECK(context_lens.upload(plan.seqs, compute));
  if (!decode) PAGED_CUDA_CHECK(last_rows.upload(plan.logits_rows, compute));
  // Only the used columns of each table row travel.
  for (int g = 0; g < G; ++g) {
    const int64_t group = int64_t{g} * max_seqs * table_stride;
    PAGED_CUDA_CHECK(cudaMemcpy2DAsync(block_tables.device.get() + group, table_stride * sizeof(int32_t),
                                       block_tables.host.get() + group, table_stride * sizeof(int32_t),
                                       max_table * sizeof(int32_t), plan.seqs, cudaMemcpyHostToDevice, compute));
  }
  return plan;
}

std::array<std::pair<int, int>, 2> CudaModelRunner::Impl::nano_batches(int rows) {
  const int first = rows / 2;
  return {std::pair{0, first}, std::pair{first, rows - first}};
}

void CudaModelRunner::Impl::enqueue_forward(const Plan& plan) {
  const int T = plan.tokens;
  PAGED_CUDA_CHECK(
      cuda::gather_rows(residual.get(), embed, token_ids.device.get(), T, hidden, vocab, embedding_scale, compute));
  if (plan.nano_first == 0) {
    Slice whole{.tokens = T, .seqs = plan.seqs, .decode_seqs = plan.decode_seqs, .partition = plan.partition,
                .stream = compute, .gemm = gemm.get(), .decode_ws = decode_ws.get(),
                .decode_ws_bytes = decode_ws_bytes};
    for (int l = 0; l < cfg.num_layers; ++l) {
      enqueue_before_attention(plan, whole, l);
      enqueue_attention(plan, whole, l, compute);
      enqueue_after_attention(plan, whole, l);
    }
    if (opt.tp_rank == 0) enqueue_final_norm(plan, whole);
  } else {
    // Two nano-batches: the attention of one on the compute stream beside the linear layers of the other on
    // nano_stream, in turn (NanoFlow). nano_stream: norm, QKV, RoPE of layer 0 for nano-batch 0, then 1; the compute
    // stream: layer 0's attention of nano-batch 0 (beside nano-batch 1's QKV), then 1 (beside nano-batch 0's O, MLP
    // and layer 1's QKV), and so on. Each hand-over is an event; all of it is captured into the decode graphs
    // (the nano stream joins the capture at its first wait).
    const auto hand_over = [](cudaEvent_t e, cudaStream_t from, cudaStream_t to) {
      PAGED_CUDA_CHECK(cudaEventRecord(e, from));
      PAGED_CUDA_CHECK(cudaStreamWaitEvent(to, e, 0));
    };
    const auto batches = nano_batches(plan.seqs);
    std::array<Slice, 2> nano;
    size_t ws_offset = 0;
    for (int i = 0; i < 2; ++i) {
      const auto [first, rows] = batches[i];
      const size_t ws = cuda::paged_attention_decode_workspace(rows, heads, head_dim, plan.grid_ctx,
                                                               plan.nano_partition[i]);
      nano[i] = Slice{.first = first, .tokens = rows, .seqs = rows, .decode_seqs = rows,
                      .partition = plan.nano_partition[i], .stream = nano_stream, .gemm = nano_gemm.get(),
                      .decode_ws = decode_ws.get() + ws_offset, .decode_ws_bytes = decode_ws_bytes - ws_offset};
      ws_offset += static_cast<size_t>(round_up(static_cast<int64_t>(ws), 256));
    }
    hand_over(products_done[0], compute, nano_stream);
    for (Slice& sl : nano) {
      enqueue_before_attention(plan, sl, 0);
      PAGED_CUDA_CHECK(cudaEventRecord(products_done[&sl - nano.data()], nano_stream));
    }
    for (int l = 0; l < cfg.num_layers; ++l) {
      for (int i = 0; i < 2; ++i) {
        PAGED_CUDA_CHECK(cudaStreamWaitEvent(compute, products_done[i], 0));
        enqueue_attention(plan, nano[i], l, compute);
        PAGED_CUDA_CHECK(cudaEventRecord(attention_done[i], compute));
      }
      for (int i = 0; i < 2; ++i) {
        PAGED_CUDA_CHECK(cudaStreamWaitEvent(nano_stream, attention_done[i], 0));
        enqueue_after_attention(plan, nano[i], l);
        if (l + 1 < cfg.num_layers)
          enqueue_before_attention(plan, nano[i], l + 1);
        else
          enqueue_final_norm(plan, nano[i]);
        PAGED_CUDA_CHECK(cudaEventRecord(products_done[i], nano_stream));
      }
    }
    hand_over(products_done[1], nano_stream, compute);  // after nano-batch 0's too (same stream)
  }
  if (opt.tp_rank != 0 || plan.logits_rows == 0) return;  // only rank 0 computes logits
  const bf16* rows = normed.get();
  if (!plan.decode) {
    PAGED_CUDA_CHECK(cuda::gather_rows(last_hidden.get(), normed.get(), last_rows.device.get(), plan.logits_rows,
                                       hidden, T, 1.0f, compute));
    rows = last_hidden.get();
  }
  lm_head_logits(rows, plan.logits_rows);
}

void CudaModelRunner::Impl::enqueue_before_attention(const Plan& plan, Slice& sl, int l) {
  const int T = sl.tokens;
  const cudaStream_t s = sl.stream;
  const LayerWeights& L = layers[l];
  bf16* const residual_rows = sl.row(residual.get(), hidden);
  bf16* const normed_rows = sl.row(normed.get(), hidden);
  bf16* const qkv_rows = sl.row(qkv.get(), qkv_dim);
  const bool fused = takes_gemvs(plan, sl);
  // Gemma 3's sliding layers: their own RoPE base, no scaling. The FP8 cache: RoPE in place (no caches here), then
  // the keys and values quantised into it.
  const bool local_rope = cfg.uses_local_rope(l);
  const cuda::GemvRope rope{
      .k_cache = opt.fp8_kv ? nullptr : reinterpret_cast<bf16*>(k_cache(l)),
      .v_cache = opt.fp8_kv ? nullptr : reinterpret_cast<bf16*>(v_cache(l)),
      .position = sl.row(positions.device.get(), 1), .slot = sl.row(layer_slots(l), 1),
      .inv_freq = local_rope ? local_inv_freq.get() : inv_freq.get(), .num_heads = heads, .num_kv_heads = kv_heads,
      .head_dim = head_dim, .rotary_dim = cfg.rotary_dims(), .block_size = opt.block_size,
      .attention_factor = local_rope ? 1.0f : static_cast<float>(cfg.rope_scaling.attention_factor)};
  // One stream: the QKV GEMV applies RoPE and writes the cache itself, unless per-head norms come between.
  const bool rope_in_gemv = fused && !L.q_norm;
  if (fused) {
    cuda::GemvArgs args = gemv_args(kGemvQkv, L, qkv_rows, residual_rows);
    if (rope_in_gemv) {
      args.output = cuda::GemvOutput::kRope;
      args.rope = rope;
    }
    PAGED_CUDA_CHECK(cuda::gemv(args, s, gemv_tile[kGemvQkv]));
  } else {
    // FP8 weights: the norm also writes its rows' codes and scales, the QKV product's input, and only those unless
    // LoRA pairs read the bf16 rows.
    uint8_t* const codes = sl.row(act_fp8.get(), fp8_row_width);
    float* const code_scales = sl.row(act_scale.get(), 1);
    const cuda::Fp8Rows qkv_in = L.qkv8.q ? cuda::Fp8Rows{codes, code_scales} : cuda::Fp8Rows{};
    bf16* const qkv_normed = L.qkv8.q && !plan.lora ? nullptr : normed_rows;
    // What add_rms_norm folds into the residual: the previous sublayer's output, `proj` or with post norms
    // `post_normed`.
    bf16* const sublayer_out = sl.row(cfg.sandwich_norms ? post_normed.get() : proj.get(), hidden);
    if (l == 0)
      PAGED_CUDA_CHECK(cuda::rms_norm(qkv_normed, residual_rows, L.attn_norm, T, hidden, eps, norm_offset, s, qkv_in));
    else
      PAGED_CUDA_CHECK(cuda::add_rms_norm(qkv_normed, residual_rows, sublayer_out, L.attn_norm, T, hidden, eps,
                                          norm_offset, s, qkv_in, std::exchange(sl.pending, {})));
    // FP8 QKV: the product's scale pass is rope_and_cache's (not with LoRA rows: their pairs add to the scaled
    // product).
    if (L.qkv8.q && !plan.lora) {
      PAGED_CUDA_CHECK(sl.gemm->product_fp8(qkv_rows, codes, L.qkv8.q, T, qkv_dim, hidden, s));
      sl.qkv_scales = {code_scales, L.qkv8.scale, L.bqkv};
    } else {
      linear(sl, qkv_rows, normed_rows, L.wqkv, L.qkv8, L.bqkv, qkv_dim, hidden, qkv_in.q != nullptr);
      lora(plan, sl, qkv_rows, normed_rows, l, kLoraQkv);
    }
  }
  auto* const k8 = opt.fp8_kv ? reinterpret_cast<uint8_t*>(k_cache(l)) : nullptr;
  auto* const v8 = opt.fp8_kv ? reinterpret_cast<uint8_t*>(v_cache(l)) : nullptr;
  if (rope_in_gemv) {
    if (opt.fp8_kv)  // the GEMV rotated the keys in place
      PAGED_CUDA_CHECK(cuda::cache_kv_fp8(qkv_rows, k8, v8, rope.slot, T, heads, kv_heads, head_dim, opt.block_size,
                                          qkv_dim, s));
    return;
  }
  // The product's scales, the per-head norms, RoPE and the cache write (FP8: quantised) in one pass.
  const cuda::RopeExtras extras{.product = std::exchange(sl.qkv_scales, {}), .q_norm = L.q_norm, .k_norm = L.k_norm,
                                .norm_eps = eps, .norm_offset = norm_offset, .k_fp8 = k8, .v_fp8 = v8};
  PAGED_CUDA_CHECK(cuda::rope_and_cache(qkv_rows, rope.k_cache, rope.v_cache, rope.position, rope.slot, rope.inv_freq,
                                        T, heads, kv_heads, head_dim, rope.rotary_dim, rope.attention_factor,
                                        opt.block_size, qkv_dim, s, extras));
}

void CudaModelRunner::Impl::enqueue_attention(const Plan& plan, const Slice& sl, int l, cudaStream_t s) {
  const bool fp8_kv = opt.fp8_kv;
  cuda::PagedAttentionArgs a{.out = sl.row(attn.get(), heads * head_dim), .q = sl.row(qkv.get(), qkv_dim),
                             .q_stride = qkv_dim,
                             .k_cache = fp8_kv ? nullptr : reinterpret_cast<bf16*>(k_cache(l)),
                             .v_cache = fp8_kv ? nullptr : reinterpret_cast<bf16*>(v_cache(l)),
                             .k_fp8 = fp8_kv ? reinterpret_cast<uint8_t*>(k_cache(l)) : nullptr,
                             .v_fp8 = fp8_kv ? reinterpret_cast<uint8_t*>(v_cache(l)) : nullptr,
                             .block_tables = sl.row(layer_tables(l), table_stride),
                             .query_start = query_start.device.get(),  // prefill rows: whole steps only
                             .context_lens = sl.row(context_lens.device.get(), 1), .num_seqs = sl.decode_seqs,
                             .max_blocks_per_seq = table_stride, .num_heads = heads, .num_kv_heads = kv_heads,
                             .head_dim = head_dim, .block_size = opt.block_size, .scale = scale,
                             .window = cfg.sliding_window(l)};
  if (sl.decode_seqs > 0)
    PAGED_CUDA_CHECK(cuda::paged_attention_decode(a, plan.grid_ctx, sl.partition, sl.decode_ws,
                                                  sl.decode_ws_bytes, s));
  if (sl.decode_seqs < sl.seqs) {  // the other sequences: their rows of the same arrays
    a.block_tables += int64_t{sl.decode_seqs} * table_stride;
    a.query_start += sl.decode_seqs;
    a.context_lens += sl.decode_seqs;
    a.num_seqs = sl.seqs - sl.decode_seqs;
    PAGED_CUDA_CHECK(cuda::paged_attention_prefill(a, plan.max_q, s));
  }
}

void CudaModelRunner::Impl::enqueue_after_attention(const Plan& plan, Slice& sl, int l) {
  const int T = sl.tokens;
  const cudaStream_t s = sl.stream;
  const LayerWeights& L = layers[l];
  bf16* const residual_rows = sl.row(residual.get(), hidden);
  bf16* const normed_rows = sl.row(normed.get(), hidden);
  bf16* const attn_rows = sl.row(attn.get(), heads * head_dim);
  bf16* const proj_rows = sl.row(proj.get(), hidden);
  bf16* const gate_up_rows = sl.row(gate_up.get(), 2 * inter);
  bf16* const act_rows = sl.row(act.get(), inter);
  uint8_t* const codes = sl.row(act_fp8.get(), fp8_row_width);  // the input codes of the next FP8 product
  float* const code_scales = sl.row(act_scale.get(), 1);
  if (takes_gemvs(plan, sl)) {
    PAGED_CUDA_CHECK(cuda::gemv(gemv_args(kGemvO, L, residual_rows, attn_rows), s, gemv_tile[kGemvO]));
    if (cfg.is_moe()) {
      PAGED_CUDA_CHECK(cuda::rms_norm(normed_rows, residual_rows, L.ffn_norm, T, hidden, eps, norm_offset, s));
      moe_mlp(residual_rows, normed_rows, L, T, true);
      return;
    }
    PAGED_CUDA_CHECK(cuda::gemv(gemv_args(kGemvGateUp, L, act_rows, residual_rows), s, gemv_tile[kGemvGateUp]));
    PAGED_CUDA_CHECK(cuda::gemv(gemv_args(kGemvDown, L, residual_rows, act_rows), s, gemv_tile[kGemvDown]));
    return;
  }
  // Row-parallel GEMMs leave a partial sum of `proj` [T][hidden] on every rank; the all-reduce completes it.
  const auto reduce_proj = [&] {
    if (opt.tp_size > 1) opt.comm->all_reduce_sum(proj_rows, size_t(T) * hidden, NcclType::bf16, s);
  };
  const auto post_norm = [&](const bf16* weight) {
    if (weight)
      PAGED_CUDA_CHECK(cuda::rms_norm(sl.row(post_normed.get(), hidden), proj_rows, weight, T, hidden, eps,
                                      norm_offset, s));
  };
  bf16* const sublayer_out = sl.row(cfg.sandwich_norms ? post_normed.get() : proj.get(), hidden);
  // On one GPU without post norms, the scale pass of the O and down projections' FP8 products is left to the
  // add_rms_norm that reads them (with tensor parallelism the partial products are summed first, at their scales).
  // Not in steps with LoRA rows: their pairs add to the scaled products.
  const bool defer_scales = opt.tp_size == 1 && !cfg.sandwich_norms && !plan.lora;
  if (L.o8.q && defer_scales) {
    PAGED_CUDA_CHECK(cuda::quantize_rows_fp8(attn_rows, T, heads * head_dim, codes, code_scales, s));
    PAGED_CUDA_CHECK(sl.gemm->product_fp8(proj_rows, codes, L.o8.q, T, hidden, heads * head_dim, s));
    sl.pending = {code_scales, L.o8.scale, L.bo};
  } else {
    linear(sl, proj_rows, attn_rows, L.wo, L.o8, L.bo, hidden, heads * head_dim);
    lora(plan, sl, proj_rows, attn_rows, l, kLoraO);
  }
  reduce_proj();
  post_norm(L.post_attn_norm);
  // FP8 MLP: the norm writes the gate/up product's input codes; the gate/up product's scale pass, the activation and
  // the quantisation of the down projection's input are one kernel (the passes around FP8 products, each a launch,
  // took about a third of the products' time at decode batch sizes). Steps with LoRA rows take the passes apart
  // (the gate/up pairs add to the scaled product, before the activation).
  const bool fp8_mlp = !cfg.is_moe() && L.gate_up8.q && L.down8.q && !plan.lora;
  PAGED_CUDA_CHECK(cuda::add_rms_norm(fp8_mlp ? nullptr : normed_rows, residual_rows, sublayer_out, L.ffn_norm, T,
                                      hidden, eps, norm_offset, s,
                                      fp8_mlp ? cuda::Fp8Rows{codes, code_scales} : cuda::Fp8Rows{},
                                      std::exchange(sl.pending, {})));
  if (cfg.is_moe()) {
    moe_mlp(proj_rows, normed_rows, L, T, false);
  } else if (fp8_mlp) {
    PAGED_CUDA_CHECK(sl.gemm->product_fp8(gate_up_rows, codes, L.gate_up8.q, T, 2 * inter, hidden, s));
    PAGED_CUDA_CHECK(cuda::act_and_mul_fp8(codes, code_scales, gate_up_rows, code_scales, L.gate_up8.scale, T, inter,
                                           cfg.activation == Activation::gelu_tanh, s));
    if (defer_scales) {
      PAGED_CUDA_CHECK(sl.gemm->product_fp8(proj_rows, codes, L.down8.q, T, hidden, inter, s));
      sl.pending = {code_scales, L.down8.scale, nullptr};
    } else {
      PAGED_CUDA_CHECK(sl.gemm->linear_fp8(proj_rows, codes, code_scales, L.down8.q, L.down8.scale, nullptr, T,
                                           hidden, inter, s));
    }
  } else {
    linear(sl, gate_up_rows, normed_rows, L.w_gate_up, L.gate_up8, nullptr, 2 * inter, hidden);
    lora(plan, sl, gate_up_rows, normed_rows, l, kLoraGateUp);
    if (cfg.activation == Activation::gelu_tanh)
      PAGED_CUDA_CHECK(cuda::gelu_tanh_and_mul(act_rows, gate_up_rows, T, inter, s));
    else
      PAGED_CUDA_CHECK(cuda::silu_and_mul(act_rows, gate_up_rows, T, inter, s));
    linear(sl, proj_rows, act_rows, L.w_down, L.down8, nullptr, hidden, inter);
    lora(plan, sl, proj_rows, act_rows, l, kLoraDown);
  }
  reduce_proj();
  post_norm(L.post_ffn_norm);
}

void CudaModelRunner::Impl::enqueue_final_norm(const Plan& plan, Slice& sl) {
  bf16* const normed_rows = sl.row(normed.get(), hidden);
  bf16* const residual_rows = sl.row(residual.get(), hidden);
  if (takes_gemvs(plan, sl))  // the GEMVs added every sublayer into the residual
    PAGED_CUDA_CHECK(
        cuda::rms_norm(normed_rows, residual_rows, final_norm, sl.tokens, hidden, eps, norm_offset, sl.stream));
  else
    PAGED_CUDA_CHECK(cuda::add_rms_norm(normed_rows, residual_rows,
                                        sl.row(cfg.sandwich_norms ? post_normed.get() : proj.get(), hidden),
                                        final_norm, sl.tokens, hidden, eps, norm_offset, sl.stream, {},
                                        std::exchange(sl.pending, {})));
}

void CudaModelRunner::Impl::lora(const Plan& plan, const Slice& sl, bf16* y, const bf16* x, int l, LoraProjection p) {
  if (!plan.lora) return;
  const LoraBlock& b = lora_map.layers[l][p];
  const int64_t S = opt.max_loras;
  const cuda::LoraArgs args{.row_slot = sl.row(lora_rows.device.get(), 1), .a = lora_weights.get() + S * b.a,
                            .b = lora_weights.get() + S * b.b, .scales = lora_scales.get() + S * b.scale,
                            .slots = opt.max_loras, .rank = b.rank, .n = b.n, .k = b.k};
  PAGED_CUDA_CHECK(cuda::add_lora(*sl.gemm, y, x, lora_v.get(), lora_v16.get(), sl.tokens, args, sl.stream));
}

void CudaModelRunner::Impl::lm_head_logits(const bf16* rows, int n) {
  PAGED_CUDA_CHECK(gemm->linear(logits.get(), rows, lm_head, nullptr, n, vocab, hidden, true, compute));
  if (cfg.final_logit_softcap > 0.0)
    PAGED_CUDA_CHECK(
        cuda::soft_cap(logits.get(), int64_t{n} * vocab, static_cast<float>(cfg.final_logit_softcap), compute));
}

void CudaModelRunner::Impl::run(const StepBatch& batch, Plan& plan) {
  PAGED_CUDA_CHECK(cudaSetDevice(opt.device));
  if (!swapping.empty()) {
    // Swaps still copying: this step waits for them only if it reads a swapped-in block or writes over a
    // swapped-out one (a block of its tables or copies); else it runs beside them on the compute stream.
    const cudaError_t copied = cudaEventQuery(swap_done);
    if (copied != cudaErrorNotReady) {
      PAGED_CUDA_CHECK(copied);
      swapping.clear();
    } else if (swapping.touched_by(batch)) {
      PAGED_CUDA_CHECK(cudaStreamWaitEvent(compute, swap_done, 0));
      swapping.clear();
    }
  }
  PAGED_CUDA_CHECK(cudaEventRecord(step_start, compute));
  if (!batch.copies.empty()) {
    // Copy-on-write before anything of this step writes the cache.
    if (batch.copies.size() > pairs_capacity) {
      pairs_capacity = std::max(batch.copies.size(), size_t{256});
      PAGED_CUDA_CHECK(cudaStreamSynchronize(compute));  // the old staging may still be in flight
      copy_pairs.allocate(2 * pairs_capacity);
    }
    for (size_t i = 0; i < batch.copies.size(); ++i) {
      const auto [src, dst] = batch.copies[i];
      if (src < 0 || src >= kv.num_blocks || dst < 0 || dst >= kv.num_blocks)
        throw ModelError("copy-on-write block out of range");
      copy_pairs.host[2 * i] = src;
      copy_pairs.host[2 * i + 1] = dst;
    }
    PAGED_CUDA_CHECK(copy_pairs.upload(2 * batch.copies.size(), compute));
    PAGED_CUDA_CHECK(cuda::copy_blocks(kv, copy_pairs.device.get(), static_cast<int>(batch.copies.size()), compute));
  }
  plan = prepare(batch);
  if (plan.seqs == 0) return;
  if (!plan.decode || !opt.cuda_graphs) {
    enqueue_forward(plan);
    return;
  }
  const std::tuple<int, int, bool> key{plan.seqs, plan.grid_ctx, plan.lora};
  if (auto it = graphs.find(key); it != graphs.end()) {
    PAGED_CUDA_CHECK(cudaGraphLaunch(it->second, compute));
    return;
  }
  // First step of this shape: run it eagerly (which also makes the GEMM plans), then capture it for the next ones.
  enqueue_forward(plan);
  const auto capture_start = std::chrono::steady_clock::now();
  cudaGraph_t graph = nullptr;
  PAGED_CUDA_CHECK(cudaStreamBeginCapture(compute, cudaStreamCaptureModeThreadLocal));
  try {
    enqueue_forward(plan);
  } catch (...) {
    cudaStreamEndCapture(compute, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  PAGED_CUDA_CHECK(cudaStreamEndCapture(compute, &graph));
  cudaGraphExec_t exec = nullptr;
  // Kernel nodes keep their stream's priority (the nano-batches' linear layers ahead of the attention beside them).
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagUseNodePriority);
  cudaGraphDestroy(graph);
  check(e, "cudaGraphInstantiate");
  graphs.emplace(key, exec);
  ++captured;
  capture_us += (std::chrono::steady_clock::now() - capture_start) / std::chrono::microseconds(1);
}

void CudaModelRunner::Impl::tune_decode_gemms() {
  // The decode steps' products, each over up to eight layers' own weights (of every kind the layers hold: bf16, or
  // FP8 codes); their inputs random rows (timing on zeros would run at clocks that real data does not).
  const int top = buckets.back();
  PAGED_CUDA_CHECK(cuda::fill_random_bf16(normed.get(), int64_t{top} * hidden, 1, 1.f, 0.f, compute));
  PAGED_CUDA_CHECK(cuda::fill_random_bf16(attn.get(), int64_t{top} * heads * head_dim, 2, 1.f, 0.f, compute));
  PAGED_CUDA_CHECK(cuda::fill_random_bf16(act.get(), int64_t{top} * inter, 3, 1.f, 0.f, compute));
  if (act_fp8) PAGED_CUDA_CHECK(cuda::quantize_rows_fp8(act.get(), top, inter, act_fp8.get(), act_scale.get(), compute));
  const int step = std::max(1, cfg.num_layers / 8);
  // One product over the sampled layers' weights of member `w` (bf16) or `w8` (FP8 codes), whichever each holds.
  const auto tune = [&](cuda::Gemm& g, int m, bf16* y, const bf16* x, int n, int k, bf16* LayerWeights::*w,
                        Fp8Weight LayerWeights::*w8, const bf16* bias) {
    std::vector<const bf16*> ws;
    std::vector<const uint8_t*> codes;
    for (int l = 0; l < cfg.num_layers; l += step) {
      if (const Fp8Weight& q = layers[l].*w8; q.q)
        codes.push_back(q.q);
      else
        ws.push_back(layers[l].*w);
    }
    if (!ws.empty()) PAGED_CUDA_CHECK(g.tune_linear(y, x, ws, bias, m, n, k, false, compute));
    if (!codes.empty()) PAGED_CUDA_CHECK(g.tune_product_fp8(y, act_fp8.get(), codes, m, n, k, compute));
  };
  const LayerWeights& L0 = layers.front();
  const auto tune_layer = [&](cuda::Gemm& g, int m) {
    tune(g, m, qkv.get(), normed.get(), qkv_dim, hidden, &LayerWeights::wqkv, &LayerWeights::qkv8, L0.bqkv);
    tune(g, m, proj.get(), attn.get(), hidden, heads * head_dim, &LayerWeights::wo, &LayerWeights::o8, L0.bo);
    if (!cfg.is_moe()) {
      tune(g, m, gate_up.get(), normed.get(), 2 * inter, hidden, &LayerWeights::w_gate_up, &LayerWeights::gate_up8,
           nullptr);
      tune(g, m, proj.get(), act.get(), hidden, inter, &LayerWeights::w_down, &LayerWeights::down8, nullptr);
    }
  };
  std::set<int> nano_rows;  // the nano-batches' row counts, for nano_gemm
  for (const int m : buckets) {
    if (m > 1 || !one_stream_gemvs()) tune_layer(*gemm, m);
    if (nano_gemm && m >= opt.nano_batch_rows)
      for (const auto& [first, rows] : nano_batches(m)) nano_rows.insert(rows);
    if (opt.tp_rank == 0) {
      const bf16* head[] = {lm_head};
      PAGED_CUDA_CHECK(gemm->tune_linear(logits.get(), normed.get(), head, nullptr, m, vocab, hidden, true, compute));
    }
  }
  for (const int m : nano_rows) tune_layer(*nano_gemm, m);
}

CudaModelRunner::CudaModelRunner(const ModelConfig& config, const SafeTensors& weights, CudaRunnerOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->init_shapes(with_expert_layout(config, weights), options);
  impl_->checkpoint = &weights;
  impl_->allocate_weights();
  impl_->load_weights(weights);
  impl_->checkpoint = nullptr;
  impl_->allocate_runtime();
  impl_->allocate_kv();
  impl_->tune_gemv_tiles();
  impl_->tune_decode_gemms();
}

CudaModelRunner::CudaModelRunner(const ModelConfig& config, uint64_t seed, CudaRunnerOptions options)
    : impl_(std::make_unique<Impl>()) {
  impl_->init_shapes(config, options);
  impl_->allocate_weights();
  impl_->random_weights(seed);
  impl_->allocate_runtime();
  impl_->allocate_kv();
  impl_->tune_gemv_tiles();
  impl_->tune_decode_gemms();
}

CudaModelRunner::~CudaModelRunner() {
  if (impl_) {
    cudaSetDevice(impl_->opt.device);
    cudaDeviceSynchronize();  // nothing in flight may outlive the buffers it uses
  }
}

void CudaModelRunner::Impl::step_cost(StepCost& cost) {
  PAGED_CUDA_CHECK(cudaEventSynchronize(step_end));
  float busy_ms = 0, idle_ms = 0;
  PAGED_CUDA_CHECK(cudaEventElapsedTime(&busy_ms, step_start, step_end));
  if (prev_end_recorded) PAGED_CUDA_CHECK(cudaEventElapsedTime(&idle_ms, prev_end, step_start));
  std::swap(step_end, prev_end);
  prev_end_recorded = true;
  cost.busy_us = static_cast<int64_t>(busy_ms * 1e3f);
  cost.idle_before_us = static_cast<int64_t>(idle_ms * 1e3f);
  cost.graphs_captured = std::exchange(captured, 0);
  cost.graph_capture_us = std::exchange(capture_us, 0);
}

StepResult CudaModelRunner::execute(const StepBatch& batch) {
  Impl::Plan plan;
  impl_->run(batch, plan);
  if (impl_->opt.tp_rank == 0) {
    StepResult result = impl_->sample(batch, plan);
    impl_->score_prompts(batch, result);
    impl_->step_cost(result.cost);
    PAGED_CUDA_CHECK(cudaEventRecord(impl_->compute_done, impl_->compute));
    return result;
  }
  // The other ranks sample nothing. They wait for their part of the step all the same, so that the next step may
  // rewrite the staging its uploads read (rank 0's wait for the sampled tokens ends later anyway).
  PAGED_CUDA_CHECK(cudaEventRecord(impl_->compute_done, impl_->compute));
  PAGED_CUDA_CHECK(cudaStreamSynchronize(impl_->compute));
  return {};
}

std::vector<std::vector<float>> CudaModelRunner::forward(const StepBatch& batch) {
  Impl::Plan plan;
  impl_->run(batch, plan);
  std::vector<std::vector<float>> out;
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    if (impl_->opt.tp_rank != 0 || plan.logits_row.empty() || plan.logits_row[s] < 0) continue;
    out.emplace_back(impl_->vocab);
    PAGED_CUDA_CHECK(cudaMemcpyAsync(out.back().data(), impl_->logits.get() + int64_t{plan.logits_row[s]} * impl_->vocab,
                                     impl_->vocab * sizeof(float), cudaMemcpyDeviceToHost, impl_->compute));
  }
  PAGED_CUDA_CHECK(cudaStreamSynchronize(impl_->compute));
  PAGED_CUDA_CHECK(cudaEventRecord(impl_->compute_done, impl_->compute));
  return out;
}

void CudaModelRunner::Impl::swap(const cuda::BlockPool& from, const cuda::BlockPool& to,
                                 const std::vector<BlockPair>& pairs) {
  if (pairs.empty()) return;
  PAGED_CUDA_CHECK(cudaSetDevice(opt.device));
  // After the last step that wrote the blocks (compute_done), before the next that uses them (`swapping`).
  PAGED_CUDA_CHECK(cuda::swap_blocks(from, to, pairs, copy, compute_done, swap_done));  // checks every pair first
  for (const auto& [src, dst] : pairs) swapping.add(&from == &kv ? src : dst);
}

void CudaModelRunner::swap_out(const std::vector<BlockPair>& device_to_cpu) {
  impl_->swap(impl_->kv, impl_->host, device_to_cpu);
}

void CudaModelRunner::swap_in(const std::vector<BlockPair>& cpu_to_device) {
  impl_->swap(impl_->host, impl_->kv, cpu_to_device);
}

int64_t CudaModelRunner::host_block_bytes() const {
  return static_cast<int64_t>(impl_->host.num_caches) * static_cast<int64_t>(impl_->host.block_bytes);
}

void CudaModelRunner::read_host_block(int32_t block, std::span<std::byte> out) {
  const cuda::BlockPool& host = impl_->host;
  if (block < 0 || block >= host.num_blocks || static_cast<int64_t>(out.size()) != host_block_bytes())
    throw std::out_of_range("host block " + std::to_string(block) + " is outside the host pool, or the size is wrong");
  PAGED_CUDA_CHECK(cudaSetDevice(impl_->opt.device));
  PAGED_CUDA_CHECK(cudaStreamSynchronize(impl_->copy));
  for (int c = 0; c < host.num_caches; ++c)
    std::memcpy(out.data() + static_cast<size_t>(c) * host.block_bytes, host.block(c, block), host.block_bytes);
}

void CudaModelRunner::write_host_block(int32_t block, std::span<const std::byte> in) {
  const cuda::BlockPool& host = impl_->host;
  if (block < 0 || block >= host.num_blocks || static_cast<int64_t>(in.size()) != host_block_bytes())
    throw std::out_of_range("host block " + std::to_string(block) + " is outside the host pool, or the size is wrong");
  PAGED_CUDA_CHECK(cudaSetDevice(impl_->opt.device));
  PAGED_CUDA_CHECK(cudaStreamSynchronize(impl_->copy));
  for (int c = 0; c < host.num_caches; ++c)
    std::memcpy(host.block(c, block), in.data() + static_cast<size_t>(c) * host.block_bytes, host.block_bytes);
}

int CudaModelRunner::num_blocks() const { return impl_->kv.num_blocks; }
int CudaModelRunner::num_swap_blocks() const { return impl_->host.num_blocks; }

}  // namespace paged
