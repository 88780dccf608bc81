// The CUDA runner driven directly through the ModelRunner interface, without the engine:
//
//   bench_cuda_runner decode [--batches 1,16,64,256] [--prompt 512] [--steps 128] [--max-model-len 2048]
//                            [--logprobs-rows K] [--penalty-rows K] [--fp8] [--fp8-kv]
//                            [--shape llama3-8b|qwen3-30b-a3b] [--nano-batch-rows N] [--nano-sm-percent P]
//       A Llama-3-8B-shaped model with random bf16 weights (32 layers, hidden 4096, 32 heads, 8 KV heads,
//       intermediate 14336, vocab 128256): prefill of `batch` random prompts, then `steps` greedy decode steps
//       timed end to end (host work, CUDA graphs, sampling and the token download included). Batch 1 is set
//       against the one-stream limit of reading 16 GB of weights per token at 4.3 TB/s (about 270 tok/s).
//       --logprobs-rows K: the first K sequences of each batch also ask 5 logprobs (sampled on the CPU from their
//       downloaded logits), the cost of a few such requests in a batch; --penalty-rows K: the first K also carry a
//       repetition penalty of 1.1 and a presence penalty of 0.2. --fp8: the linear weights in FP8 (--quantization fp8); --fp8-kv: the KV cache in FP8
//       (--kv-cache-dtype fp8).
//       --shape qwen3-30b-a3b: a Qwen3-30B-A3B-shaped mixture of experts instead (48 layers, hidden 2048, 32 heads,
//       4 KV heads, head_dim 128, 128 experts of intermediate 768, top-8, vocab 151936), batch 1 set against its
//       weight-read limit: the active parameters (3.3B) x 2 bytes / 4.8 TB/s.
//       --nano-batch-rows N: decode steps of N rows or more as two nano-batches (CudaRunnerOptions::nano_batch_rows),
//       their linear layers on nano-sm-percent of the SMs (75).
//
//   bench_cuda_runner moe-gemm [--tokens 1,16,64,256,1024,4096,16384]
//       The grouped expert GEMMs (kernels/cuda/moe.h) of the Qwen3-30B-A3B shape at each token count, tokens routed
//       to top-8 of 128 experts uniformly at random: gate/up and down each, as the active experts' weight bytes read
//       per second and the TFLOP/s of the rows computed; then the rest of the MoE block at the runner's layout
//       (router GEMM, route_topk, group_experts, silu_and_mul, combine_experts), microseconds each.
//
//   bench_cuda_runner fp8-error [--prompts 8] [--prompt 128] [--model DIR]
//       The same model (random Llama-3-8B-shaped, or the checkpoint DIR) in bf16 and with FP8 weights: the relative
//       L2 error of the FP8 logits against bf16's after a prefill of random prompts, and how often argmax agrees.
//
//   bench_cuda_runner ops [--batch 1] [--context 576]
//       Times each kernel of one decode step at the same shape (one layer's ops, the attention at each partition
//       size with '*' at the runner's, the LM head, greedy sampling) with CUDA events, and the step they add up to:
//       where a decode step's time goes. From batch 2, also whether two
//       halves of the batch overlap on two streams: one half's attention beside the other's gate/up and down
//       products, alone and together, the products on a high-priority stream limited to 100-50% of the SMs (the
//       question before splitting decode steps into nano-batches).
//
//   bench_cuda_runner gemv [--layers 32]
//       The one-stream GEMVs (kernels/cuda/gemv.h) of the Llama-3-8B projections over `layers` layers' own weights
//       (none served from L2), bf16 and FP8, with each tile of kGemvTiles: time per projection, its weight-read
//       bandwidth, and the four projections of all layers, what one token's layers read. Then the layers as the step
//       chains them (with the decode attention between QKV and O), with and without GemvArgs::prefetch_l2 on each
//       projection.
//
//   bench_cuda_runner gemm [--rows 16,64,160,256,512,1024,4096] [--candidates 8,32] [--fp8]
//       Each Linear of the Llama-3-8B shape (qkv, o, gate_up, down, LM head) at each m, through Gemm::linear with
//       cuBLASLt's heuristic choice and with the fastest of its first K candidates for each K of --candidates (bf16:
//       "sN", the plan splits k in N parts); weights rotate over copies of >= 512 MB, so that none is served from L2
//       as in a real step.
//       --fp8: the FP8 path of --quantization fp8 instead (no LM head): the activations quantised per row, then
//       Gemm::linear_fp8 (the product of the codes and the scale pass), all three timed together, and beside them
//       the quantisation and the scale pass each alone.
//
//   bench_cuda_runner prefill-ops [--prompt 2048] [--tokens 16384] [--fp8] [--fp8-kv]
//       One layer of a prefill step of whole prompts (`tokens` rows, `prompt` tokens each), each kernel as the runner
//       enqueues it timed with CUDA events: the four products (TFLOP/s), the prefill attention (TFLOP/s of its causal
//       multiply-adds) and the passes around them (norms, RoPE and the cache write, SiLU-and-mul; with --fp8 the FP8
//       path's: the norms writing the products' input codes, the products left unscaled for the kernel after them,
//       act_and_mul_fp8), and their shares of the layer: where a prefill-bound step's time goes.
//
//   bench_cuda_runner lora [--rows 1,16,64,256,2048,16384] [--rank 16] [--slots 1]
//       The LoRA pairs of one Llama-3-8B layer (kernels/cuda/lora.h) at each row count: rank-r pairs on every
//       projection (q, k, v, o, gate, up, down) in slots of room for r, the rows all of one adapter (--slots S:
//       rows taken round-robin by S adapters), each linear layer's add_lora in microseconds beside the layer's four
//       bf16 products at the same rows (cuBLASLt), and the share of the products' time LoRA adds.
//
//   bench_cuda_runner parity --model DIR --prompts FILE --steps N --out PREFIX [--group G] [--cpu]
//       Greedy generation on a checkpoint, for the Hugging Face comparison of tools/gpu/hf_parity.py. FILE holds
//       one prompt per line as token ids; they run in groups of G sequences (default: all in one batch). Writes
//       PREFIX.tokens.json ({"tokens": [[...], ...]}, N tokens per prompt), PREFIX.logits.bin (float32
//       [prompts][vocab], the logits after each prompt's last token) and PREFIX.step1_logits.bin (the same after
//       the first generated token).
//       --cpu also writes PREFIX.cpu_logits.bin from the float32 CPU runner (the tight float32 check).
//
// Built everywhere (bench_*.cpp always are); without the CUDA backend it says so and exits.
#include <cstdio>

#ifndef PAGED_HAVE_CUDA

int main() {
  std::puts("bench_cuda_runner: no CUDA (built without the CUDA backend)");
  return 0;
}

#else

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_runner.h"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/kv_fp8.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/layer_ops.h"
#include "kernels/cuda/lora.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/random_fill.h"
#include "kernels/cuda/rope_cache.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cpu/cpu_runner.h"
#include "model/kv/kv_groups.h"
#include "model/lora/lora_layout.h"
#include "model/moe/expert_routing.h"

namespace {

using namespace paged;

// A sequence of the driver: its ids and its blocks, a table per KV group of the model (contiguous ranges handed out
// in order; the runner does not care where blocks are).
struct Sequence {
  std::vector<TokenId> prompt, output;
  std::vector<std::vector<int32_t>> tables;
};

// `c` reading the sequence's tables: the first as its block_table, the others as its group_tables.
void set_tables(SeqChunk& c, const Sequence& s) {
  c.block_table = s.tables.at(0);
  c.group_tables.assign(s.tables.begin() + 1, s.tables.end());
}

SamplingParams greedy_params() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}
const SamplingParams kGreedy = greedy_params();

SampleSpec greedy_spec(const Sequence& s) {
  SampleSpec spec;
  spec.params = &kGreedy;
  spec.prompt = &s.prompt;
  spec.output = &s.output;
  return spec;
}

// Steps that prefill every sequence's whole prompt, at most `budget` tokens a step (a prompt is never split here).
std::vector<StepBatch> prefill_steps(const std::vector<Sequence>& seqs, int budget, bool sample) {
  std::vector<StepBatch> steps(1);
  int used = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int n = static_cast<int>(seqs[i].prompt.size());
    if (used + n > budget && used > 0) {
      steps.emplace_back();
      used = 0;
    }
    SeqChunk c;
    c.seq = i;
    c.tokens = seqs[i].prompt;
    c.start_pos = 0;
    set_tables(c, seqs[i]);
    if (sample) c.samples.push_back(greedy_spec(seqs[i]));
    steps.back().seqs.push_back(std::move(c));
    used += n;
  }
  return steps;
}

const SamplingParams kPenalised = [] {
  SamplingParams p = kGreedy;
  p.repetition_penalty = 1.1f;
  p.presence_penalty = 0.2f;
  return p;
}();

// One decode step of every sequence; the first `logprobs_rows` also ask 5 logprobs, the first `penalty_rows` carry
// penalties.
StepBatch decode_step(const std::vector<Sequence>& seqs, size_t logprobs_rows = 0, size_t penalty_rows = 0) {
  StepBatch b;
  for (size_t i = 0; i < seqs.size(); ++i) {
    SeqChunk c;
    c.seq = i;
    c.tokens = {seqs[i].output.back()};
    c.start_pos = static_cast<int32_t>(seqs[i].prompt.size() + seqs[i].output.size() - 1);
    set_tables(c, seqs[i]);
    c.samples.push_back(greedy_spec(seqs[i]));
    if (i < logprobs_rows) c.samples.back().num_logprobs = 5;
    if (i < penalty_rows) c.samples.back().params = &kPenalised;
    b.seqs.push_back(std::move(c));
  }
  return b;
}

// Blocks for `tokens_each` tokens of every sequence in each of the model's `groups` KV groups.
void assign_blocks(std::vector<Sequence>& seqs, int tokens_each, int block_size, int available, int groups) {
  int next = 0;
  for (Sequence& s : seqs) {
    const int n = (tokens_each + block_size - 1) / block_size;
    if (next + groups * n > available) throw std::runtime_error("the KV pool is too small for this run");
    s.tables.assign(groups, {});
    for (auto& table : s.tables)
      for (int b = 0; b < n; ++b) table.push_back(next++);
  }
}

TokenId argmax(const std::vector<float>& v) {
  return static_cast<TokenId>(std::max_element(v.begin(), v.end()) - v.begin());  // first maximum, as the sampler
}

std::map<std::string, std::string> flags(int argc, char** argv) {
  std::map<std::string, std::string> f;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) throw std::runtime_error("unexpected argument " + a);
    a = a.substr(2);
    if (a == "cpu" || a == "fp8" || a == "fp8-kv") {
      f[a] = "1";
    } else if (i + 1 < argc) {
      f[a] = argv[++i];
    } else {
      throw std::runtime_error("--" + a + " needs a value");
    }
  }
  return f;
}

ModelConfig llama3_8b() {
  ModelConfig c;
  c.model_type = "llama";
  c.hidden_size = 4096;
  c.num_layers = 32;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.intermediate_size = 14336;
  c.vocab_size = 128256;
  c.max_position_embeddings = 8192;
  c.rope_theta = 500000.0;
  c.rope_scaling.llama3 = true;
  c.rope_scaling.factor = 8.0;
  c.rope_scaling.low_freq_factor = 1.0;
  c.rope_scaling.high_freq_factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 8192;
  c.rms_norm_eps = 1e-5;
  c.torch_dtype = "bfloat16";
  return c;
}

ModelConfig qwen3_30b_a3b() {
  // intermediate_size: each expert's (moe_intermediate_size).
  return ModelConfig{.model_type = "qwen3_moe", .hidden_size = 2048, .num_layers = 48, .num_heads = 32,
                     .num_kv_heads = 4, .head_dim = 128, .intermediate_size = 768, .vocab_size = 151936,
                     .max_position_embeddings = 40960, .rope_theta = 1000000.0, .rms_norm_eps = 1e-6,
                     .qk_norm = true, .moe = {.num_experts = 128, .top_k = 8, .renormalize = true},
                     .torch_dtype = "bfloat16"};
}

// The parameters one token reads: every layer's attention and norms, its dense MLP or its router and top_k experts,
// the final norm, the LM head and the embedding (counted whole, as model cards count active parameters).
double active_parameters(const ModelConfig& c) {
  const double H = c.hidden_size, D = c.head_dim, I = c.intermediate_size;
  const double attention = H * D * (2.0 * c.num_heads + 2.0 * c.num_kv_heads) + (c.qk_norm ? 2 * D : 0) + 2 * H;
  const double mlp = c.is_moe() ? c.moe.num_experts * H + c.moe.top_k * 3 * H * I : 3 * H * I;
  return c.num_layers * (attention + mlp) + H + double(c.vocab_size) * H * (c.tie_word_embeddings ? 1 : 2);
}

int run_decode(std::map<std::string, std::string>& f) {
  std::vector<int> batches;
  {
    std::stringstream in(f.count("batches") ? f["batches"] : "1,16,64,256");
    for (std::string item; std::getline(in, item, ',');) batches.push_back(std::stoi(item));
  }
  const int prompt = f.count("prompt") ? std::stoi(f["prompt"]) : 512;
  const int steps = f.count("steps") ? std::stoi(f["steps"]) : 128;
  const size_t logprobs_rows = f.count("logprobs-rows") ? std::stoul(f["logprobs-rows"]) : 0;
  const size_t penalty_rows = f.count("penalty-rows") ? std::stoul(f["penalty-rows"]) : 0;
  const std::string shape = f.count("shape") ? f["shape"] : "llama3-8b";
  if (shape != "llama3-8b" && shape != "qwen3-30b-a3b")
    throw std::runtime_error("--shape " + shape + ": llama3-8b or qwen3-30b-a3b");
  const ModelConfig cfg = shape == "llama3-8b" ? llama3_8b() : qwen3_30b_a3b();
  // One stream's limit: the 8B's 16 GB at 4.3 TB/s (its figures so far); the MoE's active weights read once per
  // token at the H200's 4.8 TB/s.
  const double limit_tok_s = cfg.is_moe() ? 4.8e12 / (2.0 * active_parameters(cfg)) : 270.0;
  CudaRunnerOptions opt;
  opt.block_size = 16;
  opt.max_num_seqs = *std::max_element(batches.begin(), batches.end());
  opt.max_num_batched_tokens = 8192;
  opt.max_model_len = f.count("max-model-len") ? std::stoi(f["max-model-len"]) : 2048;
  opt.swap_space_gib = 0;
  opt.fp8_weights = f.count("fp8") > 0;
  opt.fp8_kv = f.count("fp8-kv") > 0;
  if (f.count("nano-batch-rows")) opt.nano_batch_rows = std::stoi(f["nano-batch-rows"]);
  if (f.count("nano-sm-percent")) opt.nano_sm_percent = std::stoi(f["nano-sm-percent"]);
  const auto t_load = std::chrono::steady_clock::now();
  CudaModelRunner runner(cfg, uint64_t{42}, opt);
  std::printf("%s shape, random %s weights: ready in %.1f s, %d KV blocks of %d tokens (%s); %.2fB active "
              "parameters, one-stream weight-read limit %.0f tok/s\n",
              shape.c_str(), opt.fp8_weights ? "FP8" : "bf16",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count(), runner.num_blocks(),
              opt.block_size, opt.fp8_kv ? "FP8 KV" : "bf16 KV", active_parameters(cfg) / 1e9, limit_tok_s);
  std::mt19937 rng(7);
  std::uniform_int_distribution<TokenId> token(0, cfg.vocab_size - 1);
  for (int batch : batches) {
    std::vector<Sequence> seqs(batch);
    for (Sequence& s : seqs)
      for (int i = 0; i < prompt; ++i) s.prompt.push_back(token(rng));
    assign_blocks(seqs, prompt + steps + 2, opt.block_size, runner.num_blocks(), kv_groups_of(cfg).num_groups());
    const auto t0 = std::chrono::steady_clock::now();
    for (const StepBatch& step : prefill_steps(seqs, opt.max_num_batched_tokens, true)) {
      const StepResult r = runner.execute(step);
      for (size_t i = 0; i < r.seqs.size(); ++i) seqs[r.seqs[i]].output.push_back(r.samples[i][0][0].token);
    }
    const double prefill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int64_t busy_us = 0, idle_us = 0;  // the device's, from the runner's step costs (CUDA events)
    auto decode_once = [&] {
      const StepResult r = runner.execute(decode_step(seqs, logprobs_rows, penalty_rows));
      for (size_t i = 0; i < r.seqs.size(); ++i) seqs[r.seqs[i]].output.push_back(r.samples[i][0][0].token);
      busy_us += r.cost.busy_us;
      idle_us += r.cost.idle_before_us;
    };
    decode_once();  // captures this bucket's graph
    decode_once();
    busy_us = idle_us = 0;
    const auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) decode_once();
    const double decode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    const double tok_s = double(batch) * steps / decode_s;
    std::printf("batch %4d: prefill %6.0f tok/s | decode %7.2f ms/step, %8.0f tok/s", batch,
                double(batch) * prompt / prefill_s, 1e3 * decode_s / steps, tok_s);
    if (logprobs_rows) std::printf(" (%zu rows with logprobs)", std::min(logprobs_rows, seqs.size()));
    if (penalty_rows) std::printf(" (%zu rows with penalties)", std::min(penalty_rows, seqs.size()));
    if (batch == 1)
      std::printf(" (%.0f%% of the %.0f tok/s weight-read limit)", 100.0 * tok_s / limit_tok_s, limit_tok_s);
    std::printf("; device busy %.3f ms, idle %.1f us a step\n", busy_us / 1e3 / steps, double(idle_us) / steps);
    if (batch == 1 && !cfg.is_moe()) std::printf("RESULT one_stream_decode_tok_s %.1f (target >= 216)\n", tok_s);
    if (batch == 1 && cfg.is_moe())
      std::printf("RESULT moe_one_stream_decode_tok_s %.1f (weight-read limit %.0f)\n", tok_s, limit_tok_s);
  }
  return 0;
}

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cuda::describe_launch_error(e));
}

template <typename T>
T* device_array(size_t n) {
  void* p = nullptr;
  cuda_ok(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc");
  return static_cast<T*>(p);
}

// n random bf16 values on the device (seeded by n), uniform in offset +- scale.
cuda::bf16* random_bf16(size_t n, float scale, float offset, cudaStream_t s) {
  cuda::bf16* p = device_array<cuda::bf16>(n);
  cuda_ok(cuda::fill_random_bf16(p, n, n, scale, offset, s), "fill");
  return p;
}

// Mean microseconds of one launch(i): `warmup` untimed calls (i = 0 .. warmup - 1), then `reps` calls enqueued back
// to back on `s` (i = warmup ..) between two events.
template <class Launch>
double mean_launch_us(cudaStream_t s, int warmup, int reps, const char* name, Launch&& launch) {
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  cuda_ok(cudaEventCreate(&e0), "event");
  cuda_ok(cudaEventCreate(&e1), "event");
  for (int i = 0; i < warmup; ++i) cuda_ok(launch(i), name);
  cuda_ok(cudaEventRecord(e0, s), "record");
  for (int i = 0; i < reps; ++i) cuda_ok(launch(warmup + i), name);
  cuda_ok(cudaEventRecord(e1, s), "record");
  cuda_ok(cudaEventSynchronize(e1), "sync");
  float ms = 0;
  cuda_ok(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 1e3 * ms / reps;
}

int run_ops(std::map<std::string, std::string>& f) {
  using cuda::bf16;
  const int m = f.count("batch") ? std::stoi(f["batch"]) : 1;
  const int ctx = f.count("context") ? std::stoi(f["context"]) : 576;
  const ModelConfig cfg = llama3_8b();
  const int H = cfg.hidden_size, I = cfg.intermediate_size, V = cfg.vocab_size, D = cfg.head_dim;
  const int heads = cfg.num_heads, kvh = cfg.num_kv_heads, qkv_dim = (heads + 2 * kvh) * D, bs = 16;
  const int blocks_per_seq = (ctx + bs - 1) / bs, num_blocks = m * blocks_per_seq;
  cudaStream_t s = nullptr;
  cuda_ok(cudaStreamCreate(&s), "stream");
  auto random = [&](size_t n, float scale, float offset = 0.f) { return random_bf16(n, scale, offset, s); };
  bf16 *w_qkv = random(size_t(qkv_dim) * H, 0.02f), *w_o = random(size_t(H) * heads * D, 0.02f);
  bf16 *w_gu = random(size_t(2) * I * H, 0.02f), *w_down = random(size_t(H) * I, 0.02f);
  bf16 *w_head = random(size_t(V) * H, 0.02f), *norm_w = random(H, 0.f, 1.f);
  bf16 *x = random(size_t(m) * H, 1.f), *res = random(size_t(m) * H, 1.f), *normed = random(size_t(m) * H, 1.f);
  bf16 *qkv = random(size_t(m) * qkv_dim, 1.f), *attn = random(size_t(m) * heads * D, 1.f);
  bf16 *gu = random(size_t(m) * 2 * I, 1.f), *act = random(size_t(m) * I, 1.f);
  const size_t cache_elems = size_t(num_blocks) * kvh * bs * D;
  bf16 *kc = random(cache_elems, 1.f), *vc = random(cache_elems, 1.f);
  float* logits = device_array<float>(size_t(m) * V);
  std::vector<int32_t> tables(num_blocks), lens(m, ctx), positions(m, ctx - 1);
  std::vector<int64_t> slots(m);
  for (int i = 0; i < num_blocks; ++i) tables[i] = i;
  for (int i = 0; i < m; ++i) slots[i] = int64_t{i} * blocks_per_seq * bs + ctx - 1;
  int32_t *d_tables = device_array<int32_t>(tables.size()), *d_lens = device_array<int32_t>(m);
  int32_t *d_pos = device_array<int32_t>(m), *d_tok = device_array<int32_t>(m);
  int64_t* d_slots = device_array<int64_t>(m);
  cuda_ok(cudaMemcpy(d_tables, tables.data(), tables.size() * 4, cudaMemcpyHostToDevice), "copy");
  cuda_ok(cudaMemcpy(d_lens, lens.data(), m * 4, cudaMemcpyHostToDevice), "copy");
  cuda_ok(cudaMemcpy(d_pos, positions.data(), m * 4, cudaMemcpyHostToDevice), "copy");
  cuda_ok(cudaMemcpy(d_slots, slots.data(), m * 8, cudaMemcpyHostToDevice), "copy");
  const std::vector<float> freq = cfg.rope_inv_freq();
  float* d_freq = device_array<float>(freq.size());
  cuda_ok(cudaMemcpy(d_freq, freq.data(), freq.size() * 4, cudaMemcpyHostToDevice), "copy");
  std::vector<cuda::SamplingRow> rows(m);
  cuda::SamplingRow* d_rows = device_array<cuda::SamplingRow>(m);
  cuda_ok(cudaMemcpy(d_rows, rows.data(), m * sizeof(rows[0]), cudaMemcpyHostToDevice), "copy");
  const size_t sample_ws_bytes = cuda::sampling_workspace_bytes(m, V);
  void* sample_ws = device_array<char>(sample_ws_bytes);
  float* d_logprobs = device_array<float>(m);
  cuda::Gemm gemm;

  const cuda::PagedAttentionArgs a{.out = attn, .q = qkv, .q_stride = qkv_dim, .k_cache = kc, .v_cache = vc,
                                   .block_tables = d_tables, .context_lens = d_lens, .num_seqs = m,
                                   .max_blocks_per_seq = blocks_per_seq, .num_heads = heads, .num_kv_heads = kvh,
                                   .head_dim = D, .block_size = bs, .scale = 0.0884f};
  // The runner's decode graphs cover contexts up to a power of two from 256: the grid it launches for `ctx`.
  const int grid_ctx = std::max(256, int(std::bit_ceil(unsigned(ctx))));
  // Sized for the most partitions (64 tokens each).
  const size_t attn_ws_bytes = cuda::paged_attention_decode_workspace(m, heads, D, grid_ctx, 64);
  void* attn_ws = device_array<char>(attn_ws_bytes);

  // One layer's kernel time two ways: the cuBLASLt path of batched steps and the GEMV path of single-token steps
  // (the norms, RoPE and the cache write, residual adds and SiLU-and-mul inside the projections). The attention at
  // the runner's partition (cuda::decode_partition) counts in both.
  int device = 0, sms = 0;
  cuda_ok(cudaGetDevice(&device), "device");
  cuda_ok(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "attribute");
  const int runner_partition = cuda::decode_partition(m, kvh, grid_ctx, sms, bs);
  double cublas_layer_us = 0, gemv_layer_us = 0;
  enum Layer { kNone, kCublas, kGemv, kBoth };
  auto time = [&](const char* name, double bytes, Layer layer, auto&& launch) {
    const double us = mean_launch_us(s, 3, 50, name, [&](int) { return launch(); });
    if (layer == kCublas || layer == kBoth) cublas_layer_us += us;
    if (layer == kGemv || layer == kBoth) gemv_layer_us += us;
    std::printf("  %-34s %8.1f us", name, us);
    if (bytes > 0) std::printf("  %6.2f TB/s", bytes / us / 1e6);
    std::printf("\n");
    return us;
  };
  // The GEMV path at any batch runs the single-row kernel once per row: where cuBLASLt overtakes it.
  // `norm`: the GEMV normalises its x itself (the QKV and gate/up projections of the runner's one-stream step);
  // `prefetch`: GemvArgs::prefetch_l2 (the O projection's).
  auto gemv = [&](bf16* y, const bf16* in, const bf16* w, int n, int k, cuda::GemvOutput out, bool norm = false,
                  float prefetch = 0.0f) {
    cuda::GemvArgs g{.w = w, .n = n, .k = k, .output = out, .norm_weight = norm ? norm_w : nullptr,
                     .norm_eps = 1e-5f, .prefetch_l2 = prefetch};
    g.rope = {.k_cache = kc, .v_cache = vc, .inv_freq = d_freq, .num_heads = heads, .num_kv_heads = kvh,
              .head_dim = D, .rotary_dim = D, .block_size = bs};
    const int y_width = out == cuda::GemvOutput::kSiluMul ? n / 2 : n;
    for (int row = 0; row < m; ++row) {
      g.x = in + int64_t{row} * k;
      g.y = y + int64_t{row} * y_width;
      g.rope.position = d_pos + row;
      g.rope.slot = d_slots + row;
      if (const cudaError_t e = cuda::gemv(g, s); e != cudaSuccess) return e;
    }
    return cudaSuccess;
  };
  std::printf("decode ops at batch %d, context %d (Llama-3-8B shapes), back-to-back launches:\n", m, ctx);
  time("add_rms_norm", 0, kCublas, [&] { return cuda::add_rms_norm(normed, res, x, norm_w, m, H, 1e-5f, 0.0f, s); });
  time("gemm qkv", 2.0 * qkv_dim * H, kCublas,
       [&] { return gemm.linear(qkv, normed, w_qkv, nullptr, m, qkv_dim, H, false, s); });
  time("rope_and_cache", 0, kCublas, [&] {
    return cuda::rope_and_cache(qkv, kc, vc, d_pos, d_slots, d_freq, m, heads, kvh, D, D, 1.0f, bs, qkv_dim, s);
  });
  {  // With FP8 weights and the FP8 cache: the QKV product's scale pass, RoPE and the quantised cache write, as
     // three passes and as rope_and_cache's one (the caches' bytes hold the FP8 layout too).
    float* sx = device_array<float>(m);
    float* sw = device_array<float>(qkv_dim);
    // Only the scales are used: the codes of x and of the weight share one buffer, as large as the larger.
    uint8_t* codes = device_array<uint8_t>(size_t(std::max(m, qkv_dim)) * H);
    cuda_ok(cuda::fill_random_bf16(x, size_t(m) * H, 5, 1.f, 0.f, s), "fill");
    cuda_ok(cuda::quantize_rows_fp8(x, m, H, codes, sx, s), "quantise");
    cuda_ok(cuda::quantize_rows_fp8(w_qkv, qkv_dim, H, codes, sw, s), "quantise");
    auto* k8 = reinterpret_cast<uint8_t*>(kc);
    auto* v8 = reinterpret_cast<uint8_t*>(vc);
    time("scale + rope + cache_kv_fp8 (3 passes)", 0, kNone, [&] {
      cudaError_t e = cuda::scale_fp8_product(qkv, sx, sw, nullptr, m, qkv_dim, s);
      if (e == cudaSuccess)
        e = cuda::rope_and_cache(qkv, nullptr, nullptr, d_pos, d_slots, d_freq, m, heads, kvh, D, D, 1.0f, bs,
                                 qkv_dim, s);
      return e == cudaSuccess ? cuda::cache_kv_fp8(qkv, k8, v8, d_slots, m, heads, kvh, D, bs, qkv_dim, s) : e;
    });
    time("rope_and_cache, FP8 product and cache", 0, kNone, [&] {
      return cuda::rope_and_cache(qkv, nullptr, nullptr, d_pos, d_slots, d_freq, m, heads, kvh, D, D, 1.0f, bs,
                                  qkv_dim, s, {.product = {sx, sw, nullptr}, .k_fp8 = k8, .v_fp8 = v8});
    });
    // bf16 values again
    cuda_ok(cuda::fill_random_bf16(qkv, size_t(m) * qkv_dim, 6, 1.f, 0.f, s), "fill");
    cuda_ok(cuda::fill_random_bf16(kc, cache_elems, 7, 1.f, 0.f, s), "fill");
    cuda_ok(cuda::fill_random_bf16(vc, cache_elems, 8, 1.f, 0.f, s), "fill");
  }
  // Up to kMaxDecodeCluster partitions merge in one thread block cluster when the grid is one wave, else in a
  // second kernel (attention.h).
  for (int partition = 64; partition <= std::min(grid_ctx, cuda::kMaxDecodePartition); partition *= 2) {
    const int parts = (grid_ctx + partition - 1) / partition;
    const std::string name = "attention decode, " + std::to_string(parts) + " x " + std::to_string(partition) +
                             (parts > 1 && parts <= cuda::kMaxDecodeCluster ? " (a cluster if one wave)" : "") +
                             (partition == runner_partition ? " *" : "");
    time(name.c_str(), 4.0 * m * ctx * kvh * D, partition == runner_partition ? kBoth : kNone, [&] {
      return cuda::paged_attention_decode(a, grid_ctx, partition, attn_ws, attn_ws_bytes, s);
    });
  }
  time("gemm o", 2.0 * H * heads * D, kCublas,
       [&] { return gemm.linear(x, attn, w_o, nullptr, m, H, heads * D, false, s); });
  time("add_rms_norm", 0, kCublas, [&] { return cuda::add_rms_norm(normed, res, x, norm_w, m, H, 1e-5f, 0.0f, s); });
  time("gemm gate_up", 4.0 * I * H, kCublas,
       [&] { return gemm.linear(gu, normed, w_gu, nullptr, m, 2 * I, H, false, s); });
  time("silu_and_mul", 0, kCublas, [&] { return cuda::silu_and_mul(act, gu, m, I, s); });
  time("gemm down", 2.0 * H * I, kCublas, [&] { return gemm.linear(x, act, w_down, nullptr, m, H, I, false, s); });
  // The GEMV path at a large batch: a launch a row, seconds a projection, and never the runner's path there (the
  // layer total below skips it too).
  if (m <= 256) {
    time("gemv qkv (+norm, rope, cache)", 2.0 * qkv_dim * H, kGemv,
         [&] { return gemv(qkv, res, w_qkv, qkv_dim, H, cuda::GemvOutput::kRope, true); });
    time("gemv o (+residual)", 2.0 * H * heads * D, kGemv,
         [&] { return gemv(res, attn, w_o, H, heads * D, cuda::GemvOutput::kAddToResidual); });
    time("gemv gate_up (+norm, silu_and_mul)", 4.0 * I * H, kGemv,
         [&] { return gemv(act, res, w_gu, 2 * I, H, cuda::GemvOutput::kSiluMul, true); });
    time("gemv down (+residual)", 2.0 * H * I, kGemv,
         [&] { return gemv(res, act, w_down, H, I, cuda::GemvOutput::kAddToResidual); });
  }
  if (m == 1) {
    // The decode attention leaves the memory idle (latency-bound at one token): the O projection launched early
    // can pull its weights into L2 meanwhile. Attention and O back to back, over four layers' O weights in turn
    // (more than L2 holds, so none stays there from the previous pass), without and with the prefetch.
    std::vector<bf16*> w_os{w_o};
    for (int l = 1; l < 4; ++l) w_os.push_back(random(size_t(H) * heads * D, 0.02f));
    for (const auto& [partition, prefetch] : {std::pair{64, 0.0f}, std::pair{64, 0.5f}, std::pair{64, 1.0f},
                                              std::pair{128, 0.0f}, std::pair{128, 0.5f}, std::pair{128, 1.0f}}) {
      const std::string label = "attention (x " + std::to_string(partition) + ") + gemv o, prefetch " +
                                std::to_string(prefetch).substr(0, 3);
      const char* name = label.c_str();
      const double us = mean_launch_us(s, 4, 48, name, [&](int i) {
        if (const cudaError_t e = cuda::paged_attention_decode(a, grid_ctx, partition, attn_ws, attn_ws_bytes, s);
            e != cudaSuccess)
          return e;
        return gemv(res, attn, w_os[i % 4], H, heads * D, cuda::GemvOutput::kAddToResidual, false, prefetch);
      });
      std::printf("  %-44s %8.1f us\n", name, us);
    }
  }
  const double head_us = time("lm head (float32 logits)", 2.0 * V * H, kNone,
                              [&] { return gemm.linear(logits, normed, w_head, nullptr, m, V, H, true, s); });
  const double sample_us = time("greedy sampling", 0, kNone, [&] {
    return cuda::sample_tokens(d_tok, d_logprobs, logits, nullptr, d_rows, m, V, sample_ws, sample_ws_bytes, s);
  });
  const auto per_step = [&](const char* label, double us) {
    std::printf("  %s %.1f us; 32 layers + head + sampling = %.2f ms of kernels per step\n", label, us,
                (32 * us + head_us + sample_us) / 1e3);
  };
  per_step("one layer", cublas_layer_us);
  if (m <= 256) per_step("one GEMV layer", gemv_layer_us);
  if (m < 2) return 0;
  // Whether two halves of the batch overlap on two streams: one half's attention (reads the KV cache) beside the
  // other half's gate/up and down products (read the weights, and compute), each alone on the whole GPU and then
  // together, the products on a stream of the highest priority and limited to a share of the SMs (cuBLASLt's SM
  // count target): unlimited, its kernels take every SM and the two run one after the other.
  const int half = m / 2, rest = m - half;
  int least = 0, greatest = 0;
  cuda_ok(cudaDeviceGetStreamPriorityRange(&least, &greatest), "priorities");
  cudaStream_t s2 = nullptr, s_products = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  cuda_ok(cudaStreamCreate(&s2), "stream");
  cuda_ok(cudaStreamCreateWithPriority(&s_products, cudaStreamNonBlocking, greatest), "stream");
  cuda_ok(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming), "event");
  cuda_ok(cudaEventCreateWithFlags(&join, cudaEventDisableTiming), "event");
  cuda::PagedAttentionArgs first = a;  // sequences 0 .. half - 1
  first.num_seqs = half;
  const int partition = 512;
  const auto attention = [&](cudaStream_t st) {
    return cuda::paged_attention_decode(first, ctx, partition, attn_ws, attn_ws_bytes, st);
  };
  const auto mlp = [&](cuda::Gemm& g, cudaStream_t st) {  // rows half .. m - 1
    cudaError_t e =
        g.linear(gu + size_t(half) * 2 * I, normed + size_t(half) * H, w_gu, nullptr, rest, 2 * I, H, false, st);
    if (e == cudaSuccess)
      e = g.linear(x + size_t(half) * H, act + size_t(half) * I, w_down, nullptr, rest, H, I, false, st);
    return e;
  };
  const double attention_us = mean_launch_us(s, 3, 50, "attention half", [&](int) { return attention(s); });
  const double mlp_us = mean_launch_us(s, 3, 50, "mlp half", [&](int) { return mlp(gemm, s); });
  const double serial_us = attention_us + mlp_us;
  std::printf("  two streams: attention of %d sequences (partition %d) %.1f us, gate_up + down of %d rows %.1f us, "
              "%.1f us one after the other\n",
              half, partition, attention_us, rest, mlp_us, serial_us);
  for (const int percent : {100, 90, 75, 60, 50}) {
    cuda::Gemm limited(size_t{32} << 20, cuda::GemmTuning{.sm_count_target = percent < 100 ? sms * percent / 100 : 0});
    const double alone_us = mean_launch_us(s, 3, 50, "mlp half, limited", [&](int) { return mlp(limited, s); });
    const double both_us = mean_launch_us(s, 3, 50, "both halves", [&](int) {
      cudaError_t e = cudaEventRecord(fork, s);
      if (e == cudaSuccess) e = cudaStreamWaitEvent(s2, fork);
      if (e == cudaSuccess) e = cudaStreamWaitEvent(s_products, fork);
      if (e == cudaSuccess) e = attention(s2);
      if (e == cudaSuccess) e = mlp(limited, s_products);
      if (e == cudaSuccess) e = cudaEventRecord(join, s2);
      if (e == cudaSuccess) e = cudaStreamWaitEvent(s, join);
      if (e == cudaSuccess) e = cudaEventRecord(join, s_products);
      if (e == cudaSuccess) e = cudaStreamWaitEvent(s, join);
      return e;
    });
    std::printf("    products on %3d%% of the SMs (alone %.1f us): together %.1f us, %.1f%% less than one after the "
                "other\n",
                percent, alone_us, both_us, 100.0 * (serial_us - both_us) / serial_us);
  }
  cudaEventDestroy(fork);
  cudaEventDestroy(join);
  cudaStreamDestroy(s2);
  cudaStreamDestroy(s_products);
  return 0;
}

// One layer of a prefill step, kernel by kernel, as the runner enqueues it for `tokens` rows that are whole prompts
// of `prompt` tokens: bf16, or with --fp8 the FP8 path (the norms writing the products' input codes, the products
// left unscaled for the kernel after them, act_and_mul_fp8), with --fp8-kv the FP8 cache. Where a prefill-bound
// step goes between the products, the attention and the passes around them.
int run_prefill_ops(std::map<std::string, std::string>& f) {
  using cuda::bf16;
  const int P = f.count("prompt") ? std::stoi(f["prompt"]) : 2048;
  const int want = f.count("tokens") ? std::stoi(f["tokens"]) : 16384;
  const bool fp8 = f.count("fp8") > 0, fp8_kv = f.count("fp8-kv") > 0;
  const int bs = 16;
  if (P <= 0 || P % bs != 0 || want < P)
    throw std::runtime_error("--prompt: a positive multiple of 16, at most --tokens");
  const int S = want / P, T = S * P;  // whole prompts
  const ModelConfig cfg = llama3_8b();
  const int H = cfg.hidden_size, I = cfg.intermediate_size, D = cfg.head_dim;
  const int heads = cfg.num_heads, kvh = cfg.num_kv_heads, qkv_dim = (heads + 2 * kvh) * D;
  const int blocks_per_seq = P / bs, num_blocks = S * blocks_per_seq;
  cudaStream_t s = nullptr;
  cuda_ok(cudaStreamCreate(&s), "stream");
  auto random = [&](size_t n, float scale, float offset = 0.f) { return random_bf16(n, scale, offset, s); };
  // A linear layer's weight [n][k]: bf16, and with --fp8 its codes and row scales as the runner quantises them.
  struct Weight {
    bf16* w;
    uint8_t* q = nullptr;
    float* scale = nullptr;
  };
  auto weight = [&](int n, int k) {
    Weight w{random(size_t(n) * k, 0.02f)};
    if (fp8) {
      w.q = device_array<uint8_t>(size_t(n) * k);
      w.scale = device_array<float>(n);
      cuda_ok(cuda::quantize_rows_fp8(w.w, n, k, w.q, w.scale, s), "quantise");
    }
    return w;
  };
  const Weight w_qkv = weight(qkv_dim, H), w_o = weight(H, heads * D), w_gu = weight(2 * I, H), w_down = weight(H, I);
  bf16* norm_w = random(H, 0.f, 1.f);
  bf16 *x = random(size_t(T) * H, 1.f), *res = random(size_t(T) * H, 1.f), *normed = random(size_t(T) * H, 1.f);
  bf16 *qkv = random(size_t(T) * qkv_dim, 1.f), *attn = random(size_t(T) * heads * D, 1.f);
  bf16 *gu = random(size_t(T) * 2 * I, 1.f), *act = random(size_t(T) * I, 1.f);
  uint8_t* codes = device_array<uint8_t>(size_t(T) * I);  // the next product's input codes (I >= H)
  float* row_scale = device_array<float>(T);
  cuda_ok(cuda::quantize_rows_fp8(act, T, I, codes, row_scale, s), "quantise");
  const size_t cache_bytes = std::max<size_t>(size_t(num_blocks) * kvh * bs * D * sizeof(bf16),
                                              size_t(num_blocks) * cuda::kv_fp8_block_bytes(kvh, bs, D));
  char *kc = device_array<char>(cache_bytes), *vc = device_array<char>(cache_bytes);
  cuda_ok(cudaMemset(kc, 0, cache_bytes), "memset");
  cuda_ok(cudaMemset(vc, 0, cache_bytes), "memset");
  // Sequence q's blocks are q * blocks_per_seq onwards, so token t's slot is t.
  std::vector<int32_t> tables(num_blocks), starts(S + 1), lens(S, P), positions(T);
  std::vector<int64_t> slots(T);
  for (int i = 0; i < num_blocks; ++i) tables[i] = i;
  for (int q = 0; q <= S; ++q) starts[q] = q * P;
  for (int t = 0; t < T; ++t) positions[t] = t % P, slots[t] = t;
  int32_t *d_tables = device_array<int32_t>(num_blocks), *d_starts = device_array<int32_t>(S + 1);
  int32_t *d_lens = device_array<int32_t>(S), *d_pos = device_array<int32_t>(T);
  int64_t* d_slots = device_array<int64_t>(T);
  cuda_ok(cudaMemcpy(d_tables, tables.data(), tables.size() * 4, cudaMemcpyHostToDevice), "copy");
  cuda_ok(cudaMemcpy(d_starts, starts.data(), starts.size() * 4, cudaMemcpyHostToDevice), "copy");
  cuda_ok(cudaMemcpy(d_lens, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice), "copy");
  cuda_ok(cudaMemcpy(d_pos, positions.data(), positions.size() * 4, cudaMemcpyHostToDevice), "copy");
  cuda_ok(cudaMemcpy(d_slots, slots.data(), slots.size() * 8, cudaMemcpyHostToDevice), "copy");
  const std::vector<float> freq = cfg.rope_inv_freq();
  float* d_freq = device_array<float>(freq.size());
  cuda_ok(cudaMemcpy(d_freq, freq.data(), freq.size() * 4, cudaMemcpyHostToDevice), "copy");
  cuda::Gemm gemm;
  auto* const k8 = fp8_kv ? reinterpret_cast<uint8_t*>(kc) : nullptr;
  auto* const v8 = fp8_kv ? reinterpret_cast<uint8_t*>(vc) : nullptr;
  bf16* const kb = fp8_kv ? nullptr : reinterpret_cast<bf16*>(kc);
  bf16* const vb = fp8_kv ? nullptr : reinterpret_cast<bf16*>(vc);
  const cuda::PagedAttentionArgs a{.out = attn, .q = qkv, .q_stride = qkv_dim, .k_cache = kb, .v_cache = vb,
                                   .k_fp8 = k8, .v_fp8 = v8, .block_tables = d_tables, .query_start = d_starts,
                                   .context_lens = d_lens, .num_seqs = S, .max_blocks_per_seq = blocks_per_seq,
                                   .num_heads = heads, .num_kv_heads = kvh, .head_dim = D, .block_size = bs,
                                   .scale = 0.0884f};
  // The attention's multiply-adds: causal, every query head against the keys up to its position.
  const double attention_flop = 4.0 * S * (double(P) * (P + 1) / 2) * heads * D;
  double products_us = 0, attention_us = 0, passes_us = 0;
  enum Kind { kProduct, kAttention, kPass };
  auto time = [&](const char* name, Kind kind, double flop, auto&& launch) {
    const double us = mean_launch_us(s, 2, 10, name, [&](int) { return launch(); });
    (kind == kProduct ? products_us : kind == kAttention ? attention_us : passes_us) += us;
    std::printf("  %-40s %9.1f us", name, us);
    if (flop > 0) std::printf("  %6.0f TFLOP/s", flop / us / 1e6);
    std::printf("\n");
  };
  const auto product = [&](bf16* y, const bf16* in, const Weight& w, int n, int k) {
    return fp8 ? gemm.product_fp8(y, codes, w.q, T, n, k, s) : gemm.linear(y, in, w.w, nullptr, T, n, k, false, s);
  };
  const cuda::Fp8Rows rows = fp8 ? cuda::Fp8Rows{codes, row_scale} : cuda::Fp8Rows{};
  const auto pending = [&](const Weight& w) {
    return fp8 ? cuda::Fp8Product{row_scale, w.scale, nullptr} : cuda::Fp8Product{};
  };
  std::printf("prefill ops: %d prompts of %d tokens (%d rows), %s weights, %s cache (Llama-3-8B shapes), back-to-back "
              "launches:\n", S, P, T, fp8 ? "FP8" : "bf16", fp8_kv ? "FP8" : "bf16");
  time(fp8 ? "add_rms_norm (down's scales, codes)" : "add_rms_norm", kPass, 0, [&] {
    return cuda::add_rms_norm(fp8 ? nullptr : normed, res, x, norm_w, T, H, 1e-5f, 0.0f, s, rows, pending(w_down));
  });
  time("product qkv", kProduct, 2.0 * T * qkv_dim * H, [&] { return product(qkv, normed, w_qkv, qkv_dim, H); });
  time(fp8 ? "rope_and_cache (qkv's scales)" : "rope_and_cache", kPass, 0, [&] {
    const cuda::RopeExtras extras{.product = pending(w_qkv), .k_fp8 = k8, .v_fp8 = v8};
    return cuda::rope_and_cache(qkv, kb, vb, d_pos, d_slots, d_freq, T, heads, kvh, D, D, 1.0f, bs, qkv_dim, s,
                                extras);
  });
  time("attention prefill", kAttention, attention_flop, [&] { return cuda::paged_attention_prefill(a, P, s); });
  if (fp8)
    time("quantize_rows_fp8 (o's input)", kPass, 0,
         [&] { return cuda::quantize_rows_fp8(attn, T, heads * D, codes, row_scale, s); });
  time("product o", kProduct, 2.0 * T * H * heads * D, [&] { return product(x, attn, w_o, H, heads * D); });
  time(fp8 ? "add_rms_norm (o's scales, codes)" : "add_rms_norm", kPass, 0, [&] {
    return cuda::add_rms_norm(fp8 ? nullptr : normed, res, x, norm_w, T, H, 1e-5f, 0.0f, s, rows, pending(w_o));
  });
  time("product gate_up", kProduct, 4.0 * T * I * H, [&] { return product(gu, normed, w_gu, 2 * I, H); });
  time(fp8 ? "act_and_mul_fp8" : "silu_and_mul", kPass, 0, [&] {
    return fp8 ? cuda::act_and_mul_fp8(codes, row_scale, gu, row_scale, w_gu.scale, T, I, false, s)
               : cuda::silu_and_mul(act, gu, T, I, s);
  });
  time("product down", kProduct, 2.0 * T * H * I, [&] { return product(x, act, w_down, H, I); });
  const double layer_us = products_us + attention_us + passes_us;
  std::printf("  one layer %.1f us: products %.1f (%.0f%%), attention %.1f (%.0f%%), passes %.1f (%.0f%%); 32 layers "
              "= %.1f ms a step\n",
              layer_us, products_us, 100 * products_us / layer_us, attention_us, 100 * attention_us / layer_us,
              passes_us, 100 * passes_us / layer_us, 32 * layer_us / 1e3);
  return 0;
}

int run_gemv(std::map<std::string, std::string>& f) {
  using cuda::bf16;
  const int layers = f.count("layers") ? std::stoi(f["layers"]) : 32;
  const ModelConfig cfg = llama3_8b();
  const int H = cfg.hidden_size, I = cfg.intermediate_size, D = cfg.head_dim;
  const int qkv_dim = (cfg.num_heads + 2 * cfg.num_kv_heads) * D;
  struct Projection {
    const char* name;
    int n, k;
    cuda::GemvOutput output;
  };
  const Projection projections[] = {{"qkv", qkv_dim, H, cuda::GemvOutput::kStore},
                                    {"o", H, cfg.num_heads * D, cuda::GemvOutput::kAddToResidual},
                                    {"gate_up", 2 * I, H, cuda::GemvOutput::kSiluMul},
                                    {"down", H, I, cuda::GemvOutput::kAddToResidual}};
  cudaStream_t s = nullptr;
  cuda_ok(cudaStreamCreate(&s), "stream");
  // Each layer's weights, bf16 and their FP8 codes with per-row scales.
  struct Weights {
    bf16* w;
    uint8_t* q;
    float* scale;
  };
  std::vector<std::vector<Weights>> weights(std::size(projections));
  for (size_t p = 0; p < std::size(projections); ++p)
    for (int l = 0; l < layers; ++l) {
      const size_t n = size_t(projections[p].n) * projections[p].k;
      Weights w{device_array<bf16>(n), device_array<uint8_t>(n), device_array<float>(projections[p].n)};
      cuda_ok(cuda::fill_random_bf16(w.w, n, n, 0.02f, 0.f, s), "fill");
      cuda_ok(cuda::quantize_rows_fp8(w.w, projections[p].n, projections[p].k, w.q, w.scale, s), "quantize");
      weights[p].push_back(w);
    }
  bf16* x = device_array<bf16>(I);
  bf16* y = device_array<bf16>(2 * I);
  cuda_ok(cuda::fill_random_bf16(x, I, I, 1.f, 0.f, s), "fill");
  cuda_ok(cuda::fill_random_bf16(y, 2 * I, 2 * I, 1.f, 0.f, s), "fill");
  std::printf("one-stream GEMVs over %d layers' weights (Llama-3-8B shapes), us per launch and TB/s:\n", layers);
  std::printf("%-5s %-12s", "type", "tile");
  for (const Projection& p : projections) std::printf(" | %-16s", p.name);
  std::printf(" | all layers\n");
  for (const bool fp8 : {false, true})
    for (size_t t = 0; t < cuda::kGemvTiles.size(); ++t) {
      const cuda::GemvTile tile = cuda::kGemvTiles[t];
      if (tile.tensor_cores && !fp8) continue;  // FP8 weights only
      const bool chosen = int(t) == (fp8 ? cuda::kGemvTileFp8 : cuda::kGemvTileBf16);
      char label[32];
      std::snprintf(label, sizeof label, "%d/%d/%d%s%s", tile.split, tile.rows, tile.unroll,
                    tile.tensor_cores ? " mma" : "", chosen ? "*" : "");
      std::printf("%-5s %-12s", fp8 ? "fp8" : "bf16", label);
      double total_us = 0, total_bytes = 0;
      for (size_t p = 0; p < std::size(projections); ++p) {
        const Projection& pr = projections[p];
        const auto pass = [&](int) {
          for (int l = 0; l < layers; ++l) {
            const Weights& w = weights[p][l];
            const cuda::GemvArgs g{.x = x, .w = fp8 ? nullptr : w.w, .w_fp8 = fp8 ? w.q : nullptr,
                                   .w_scale = fp8 ? w.scale : nullptr, .y = y, .n = pr.n, .k = pr.k,
                                   .output = pr.output};
            if (const cudaError_t e = cuda::gemv(g, s, int(t)); e != cudaSuccess) return e;
          }
          return cudaSuccess;
        };
        const double us = mean_launch_us(s, 1, 5, pr.name, pass) / layers;
        const double bytes = double(pr.n) * pr.k * (fp8 ? 1 : 2);
        total_us += us * layers;
        total_bytes += bytes * layers;
        std::printf(" | %7.1f %5.2f TB/s", us, bytes / us / 1e6);
      }
      std::printf(" | %.3f ms %.2f TB/s\n", total_us / 1e3, total_bytes / total_us / 1e6);
    }

  // The layers as the one-stream step runs them (default tiles): QKV with its norm, the decode attention (context
  // 640, latency-bound), O into the residual, gate/up with its norm, down; with GemvArgs::prefetch_l2 on the
  // projections (q: QKV, o: O, g: gate/up, d: down) of each variant, "o1 g.25": all of O's weights, a quarter of
  // gate/up's.
  const int ctx = 640, bs = 16, blocks = ctx / bs, kvh = cfg.num_kv_heads, heads = cfg.num_heads;
  const size_t cache_elems = size_t(blocks) * kvh * bs * D;
  bf16 *kc = device_array<bf16>(cache_elems), *vc = device_array<bf16>(cache_elems);
  bf16 *qkv = device_array<bf16>(qkv_dim), *attn = device_array<bf16>(heads * D), *res = device_array<bf16>(H);
  bf16* norm_w = device_array<bf16>(H);
  cuda_ok(cuda::fill_random_bf16(kc, cache_elems, 1, 1.f, 0.f, s), "fill");
  cuda_ok(cuda::fill_random_bf16(vc, cache_elems, 2, 1.f, 0.f, s), "fill");
  cuda_ok(cuda::fill_random_bf16(qkv, qkv_dim, 3, 1.f, 0.f, s), "fill");
  cuda_ok(cuda::fill_random_bf16(res, H, 4, 1.f, 0.f, s), "fill");
  cuda_ok(cuda::fill_random_bf16(norm_w, H, 5, 0.f, 1.f, s), "fill");
  std::vector<int32_t> table(blocks);
  for (int i = 0; i < blocks; ++i) table[i] = i;
  int32_t *d_table = device_array<int32_t>(blocks), *d_len = device_array<int32_t>(1);
  cuda_ok(cudaMemcpy(d_table, table.data(), blocks * 4, cudaMemcpyHostToDevice), "copy");
  cuda_ok(cudaMemcpy(d_len, &ctx, 4, cudaMemcpyHostToDevice), "copy");
  const cuda::PagedAttentionArgs a{.out = attn, .q = qkv, .q_stride = qkv_dim, .k_cache = kc, .v_cache = vc,
                                   .block_tables = d_table, .context_lens = d_len, .num_seqs = 1,
                                   .max_blocks_per_seq = blocks, .num_heads = heads, .num_kv_heads = kvh,
                                   .head_dim = D, .block_size = bs, .scale = 0.0884f};
  const size_t ws_bytes = cuda::paged_attention_decode_workspace(1, heads, D, ctx, 64);
  void* ws = device_array<char>(ws_bytes);
  int l2_bytes = 0;
  cuda_ok(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, 0), "attribute");
  std::printf("the layer chain (QKV, attention at context %d, O, gate/up, down), us per layer over %d layers "
              "(L2: %.0f MB):\n", ctx, layers, l2_bytes / 1e6);
  for (const bool fp8 : {false, true})
    for (const char* variant : {"", "o.5", "o.75", "o1", "o1 g.1", "o1 g.25", "q.1 o1 g.1 d.1", "q.25 o1 g.25 d.25"}) {
      float fraction[4] = {};
      std::stringstream in(variant);
      for (std::string item; in >> item;) fraction[std::string("qogd").find(item[0])] = std::stof(item.substr(1));
      const auto chain = [&](int) {
        for (int l = 0; l < layers; ++l) {
          for (size_t p = 0; p < std::size(projections); ++p) {
            const Projection& pr = projections[p];
            const Weights& w = weights[p][l];
            const bool normed = p == 0 || p == 2;
            const cuda::GemvArgs g{.x = p == 1 ? attn : p == 3 ? y : res, .w = fp8 ? nullptr : w.w,
                                   .w_fp8 = fp8 ? w.q : nullptr, .w_scale = fp8 ? w.scale : nullptr,
                                   .y = p == 0 ? qkv : p == 2 ? y : res, .n = pr.n, .k = pr.k, .output = pr.output,
                                   .norm_weight = normed ? norm_w : nullptr, .norm_eps = 1e-5f,
                                   .prefetch_l2 = fraction[p]};
            if (const cudaError_t e = cuda::gemv(g, s); e != cudaSuccess) return e;
            if (p == 0)
              if (const cudaError_t e = cuda::paged_attention_decode(a, ctx, 64, ws, ws_bytes, s); e != cudaSuccess)
                return e;
          }
        }
        return cudaSuccess;
      };
      const double us = mean_launch_us(s, 1, 5, "chain", chain) / layers;
      std::printf("%-5s prefetch '%s': %7.1f us a layer, %.3f ms for 32\n", fp8 ? "fp8" : "bf16", variant, us,
                  32 * us / 1e3);
    }
  return 0;
}

// The comma-separated integers of flag `name`, or of `fallback` when it is not given.
std::vector<int> int_list(std::map<std::string, std::string>& f, const char* name, const char* fallback) {
  std::vector<int> v;
  std::stringstream in(f.count(name) ? f[name] : fallback);
  for (std::string item; std::getline(in, item, ',');) v.push_back(std::stoi(item));
  return v;
}

int run_gemm(std::map<std::string, std::string>& f) {
  using cuda::bf16;
  const std::vector<int> rows = int_list(f, "rows", "16,64,160,256,512,1024,4096");
  const std::vector<int> candidates = int_list(f, "candidates", "8,32");
  const bool fp8 = f.count("fp8") > 0;
  const ModelConfig cfg = llama3_8b();
  const int H = cfg.hidden_size, I = cfg.intermediate_size, V = cfg.vocab_size;
  const int qkv_dim = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, max_m = *std::max_element(rows.begin(), rows.end());
  struct Shape {
    const char* name;
    int n, k;
    bool f32;
  };
  std::vector<Shape> shapes{{"qkv", qkv_dim, H, false}, {"o", H, cfg.num_heads * cfg.head_dim, false},
                            {"gate_up", 2 * I, H, false}, {"down", H, I, false}};
  if (!fp8) shapes.push_back({"lm_head", V, H, true});
  cudaStream_t s = nullptr;
  cuda_ok(cudaStreamCreate(&s), "stream");
  bf16* x = device_array<bf16>(size_t(max_m) * I);
  cuda_ok(cuda::fill_random_bf16(x, size_t(max_m) * I, size_t(max_m) * I, 1.f, 0.f, s), "fill");
  float* y = device_array<float>(size_t(max_m) * V);
  uint8_t* x8 = fp8 ? device_array<uint8_t>(size_t(max_m) * I) : nullptr;
  float* x_scale = fp8 ? device_array<float>(max_m) : nullptr;
  std::vector<std::pair<std::string, cuda::GemmTuning>> configs{{"heuristic", {.max_rows = 0, .candidates = 1}}};
  for (int c : candidates) configs.push_back({"best of " + std::to_string(c), {.max_rows = 1 << 20, .candidates = c}});
  std::printf("%s products\n%-8s %6s", fp8 ? "FP8 (quantise x, product, scales)" : "bf16", "linear", "m");
  for (const auto& [label, tuning] : configs) std::printf(" | %-22s", label.c_str());
  if (fp8) std::printf(" | of which: quantise x, scale pass");
  std::printf("\n");
  const size_t w_bytes_per_elem = fp8 ? 1 : 2;
  for (const Shape& sh : shapes) {
    const size_t w_elems = size_t(sh.n) * sh.k;
    const int copies = std::max<int>(2, int((size_t{512} << 20) / (w_elems * w_bytes_per_elem)) + 1);
    std::vector<void*> w(copies);
    std::vector<float*> w_scale(copies, nullptr);
    bf16* staging = fp8 ? device_array<bf16>(w_elems) : nullptr;
    for (int i = 0; i < copies; ++i) {
      if (!fp8) {
        w[i] = device_array<bf16>(w_elems);
        cuda_ok(cuda::fill_random_bf16(static_cast<bf16*>(w[i]), w_elems, w_elems + i, 0.02f, 0.f, s), "fill");
        continue;
      }
      w[i] = device_array<uint8_t>(w_elems);
      w_scale[i] = device_array<float>(sh.n);
      cuda_ok(cuda::fill_random_bf16(staging, w_elems, w_elems + i, 0.02f, 0.f, s), "fill");
      cuda_ok(cuda::quantize_rows_fp8(staging, sh.n, sh.k, static_cast<uint8_t*>(w[i]), w_scale[i], s), "quantise");
    }
    if (staging) {
      cuda_ok(cudaStreamSynchronize(s), "sync");
      cudaFree(staging);
    }
    for (int m : rows) {
      std::printf("%-8s %6d", sh.name, m);
      for (const auto& [label, tuning] : configs) {
        cuda::Gemm gemm(size_t{32} << 20, tuning);
        auto launch = [&](int i) -> cudaError_t {
          const int c = i % copies;
          if (!fp8) return gemm.linear(y, x, static_cast<const bf16*>(w[c]), nullptr, m, sh.n, sh.k, sh.f32, s);
          if (cudaError_t e = cuda::quantize_rows_fp8(x, m, sh.k, x8, x_scale, s); e != cudaSuccess) return e;
          return gemm.linear_fp8(reinterpret_cast<bf16*>(y), x8, x_scale, static_cast<const uint8_t*>(w[c]),
                                 w_scale[c], nullptr, m, sh.n, sh.k, s);
        };
        const double us = mean_launch_us(s, copies, std::max(copies, 20), sh.name, launch);
        const double bytes = double(w_bytes_per_elem) * w_elems + 2.0 * m * sh.k + (sh.f32 ? 4.0 : 2.0) * m * sh.n;
        std::printf(" | %7.1f us %4.2f TB/s %4.0fT", us, bytes / us / 1e6, 2.0 * m * w_elems / us / 1e6);
        if (!fp8) std::printf(" s%d", gemm.plan_splits(m, sh.n, sh.k, sh.f32, false));  // the plan's K parts
      }
      if (fp8) {  // the two passes around the product, each alone: what a product without them would save
        const double quantise_us = mean_launch_us(s, 3, 20, "quantise", [&](int) {
          return cuda::quantize_rows_fp8(x, m, sh.k, x8, x_scale, s);
        });
        const double scale_us = mean_launch_us(s, 3, 20, "scale pass", [&](int) {
          return cuda::scale_fp8_product(reinterpret_cast<bf16*>(y), x_scale, w_scale[0], nullptr, m, sh.n, s);
        });
        std::printf(" | %7.1f us, %7.1f us", quantise_us, scale_us);
      }
      std::printf("\n");
    }
    for (void* p : w) cudaFree(p);
    for (float* p : w_scale) cudaFree(p);
  }
  return 0;
}

int run_lora(std::map<std::string, std::string>& f) {
  using cuda::bf16;
  const std::vector<int> rows = int_list(f, "rows", "1,16,64,256,2048,16384");
  const int rank = f.count("rank") ? std::stoi(f["rank"]) : 16;
  const int slots = f.count("slots") ? std::stoi(f["slots"]) : 1;
  if (rank < 1 || slots < 1) throw std::runtime_error("--rank and --slots must be positive");
  const ModelConfig cfg = llama3_8b();
  const int H = cfg.hidden_size, I = cfg.intermediate_size, D = cfg.head_dim;
  const int qkv_dim = (cfg.num_heads + 2 * cfg.num_kv_heads) * D;
  const std::array<LoraShape, kLoraProjections> shapes{LoraShape{qkv_dim, H}, LoraShape{H, cfg.num_heads * D},
                                                       LoraShape{2 * I, H}, LoraShape{H, I}};
  const char* names[kLoraProjections] = {"qkv", "o", "gate_up", "down"};
  const LoraLayout layout = lora_layout(1, shapes, rank);
  const int max_m = *std::max_element(rows.begin(), rows.end());
  cudaStream_t s = nullptr;
  cuda_ok(cudaStreamCreate(&s), "stream");
  // Every rank column used (q, k and v pairs of rank r each; gate and up), scales 1: the slots' whole room.
  bf16* weights = device_array<bf16>(size_t(layout.weights) * slots);
  cuda_ok(cuda::fill_random_bf16(weights, size_t(layout.weights) * slots, 7, 0.02f, 0.f, s), "fill");
  float* scales = device_array<float>(size_t(layout.scales) * slots);
  const std::vector<float> ones(size_t(layout.scales) * slots, 1.0f);
  cuda_ok(cudaMemcpy(scales, ones.data(), ones.size() * sizeof(float), cudaMemcpyHostToDevice), "scales");
  std::vector<int32_t> row_slot(max_m);
  for (int i = 0; i < max_m; ++i) row_slot[i] = i % slots;
  int32_t* d_slots = device_array<int32_t>(max_m);
  cuda_ok(cudaMemcpy(d_slots, row_slot.data(), max_m * sizeof(int32_t), cudaMemcpyHostToDevice), "slots");
  bf16* x = device_array<bf16>(size_t(max_m) * I);
  cuda_ok(cuda::fill_random_bf16(x, size_t(max_m) * I, 3, 1.f, 0.f, s), "fill");
  bf16* y = device_array<bf16>(size_t(max_m) * 2 * I);
  float* v = device_array<float>(size_t(max_m) * slots * layout.max_rank);
  bf16* v16 = device_array<bf16>(size_t(max_m) * slots * layout.max_rank);
  std::vector<bf16*> w(kLoraProjections);
  for (int p = 0; p < kLoraProjections; ++p) {
    const size_t n = size_t(shapes[p].n) * shapes[p].k;
    w[p] = device_array<bf16>(n);
    cuda_ok(cuda::fill_random_bf16(w[p], n, 11 + p, 0.02f, 0.f, s), "fill");
  }
  cuda::Gemm gemm;
  std::printf("LoRA pairs of rank %d on every projection of a Llama-3-8B layer, %d adapter(s), us:\n", rank, slots);
  std::printf("%6s | %-30s | %-30s | %s\n", "rows", "add_lora qkv / o / gate_up / down", "products qkv / o / gate_up / down",
              "LoRA / products");
  for (int m : rows) {
    double lora_us[kLoraProjections], product_us[kLoraProjections], lora_sum = 0, product_sum = 0;
    for (int p = 0; p < kLoraProjections; ++p) {
      const LoraBlock& b = layout.layers[0][p];
      const cuda::LoraArgs args{.row_slot = d_slots, .a = weights + slots * b.a, .b = weights + slots * b.b,
                                .scales = scales + slots * b.scale, .slots = slots, .rank = b.rank, .n = b.n,
                                .k = b.k};
      lora_us[p] = mean_launch_us(s, 3, 20, names[p],
                                  [&](int) { return cuda::add_lora(gemm, y, x, v, v16, m, args, s); });
      product_us[p] = mean_launch_us(s, 3, 20, names[p], [&](int) {
        return gemm.linear(y, x, w[p], nullptr, m, shapes[p].n, shapes[p].k, false, s);
      });
      lora_sum += lora_us[p];
      product_sum += product_us[p];
    }
    std::printf("%6d | %6.1f %6.1f %7.1f %7.1f  | %6.1f %6.1f %7.1f %7.1f  | %.1f%%\n", m, lora_us[0], lora_us[1],
                lora_us[2], lora_us[3], product_us[0], product_us[1], product_us[2], product_us[3],
                100.0 * lora_sum / product_sum);
  }
  for (void* p : {static_cast<void*>(weights), static_cast<void*>(scales), static_cast<void*>(d_slots),
                  static_cast<void*>(x), static_cast<void*>(y), static_cast<void*>(v), static_cast<void*>(v16)})
    cudaFree(p);
  for (bf16* p : w) cudaFree(p);
  return 0;
}

int run_moe_gemm(std::map<std::string, std::string>& f) {
  using cuda::bf16;
  const std::vector<int> token_counts = int_list(f, "tokens", "1,16,64,256,1024,4096,16384");
  const ModelConfig cfg = qwen3_30b_a3b();
  const int E = cfg.moe.num_experts, k = cfg.moe.top_k, H = cfg.hidden_size, I = cfg.intermediate_size;
  const int max_t = *std::max_element(token_counts.begin(), token_counts.end()), max_slots = max_t * k;
  cudaStream_t s = nullptr;
  cuda_ok(cudaStreamCreate(&s), "stream");
  const size_t gate_up_elems = size_t(E) * 2 * I * H, down_elems = size_t(E) * H * I;
  bf16 *w_gate_up = device_array<bf16>(gate_up_elems), *w_down = device_array<bf16>(down_elems);
  bf16 *x = device_array<bf16>(size_t(max_t) * H), *gate_up = device_array<bf16>(size_t(max_slots) * 2 * I);
  bf16* y = device_array<bf16>(size_t(max_slots) * H);
  cuda_ok(cuda::fill_random_bf16(w_gate_up, gate_up_elems, 1, 0.02f, 0.f, s), "fill");
  cuda_ok(cuda::fill_random_bf16(w_down, down_elems, 2, 0.02f, 0.f, s), "fill");
  cuda_ok(cuda::fill_random_bf16(x, size_t(max_t) * H, 3, 1.f, 0.f, s), "fill");
  const int max_tiles = max_expert_tiles(max_slots, E, 16);
  int32_t* ids = device_array<int32_t>(max_slots);
  int32_t* groups = device_array<int32_t>(size_t(E) + 1 + 3 * size_t(max_slots) + 2 * size_t(max_tiles));
  const cuda::ExpertGroupsView view{groups, groups + E + 1, groups + E + 1 + max_slots,
                                    groups + E + 1 + 2 * size_t(max_slots), groups + E + 1 + 3 * size_t(max_slots),
                                    groups + E + 1 + 3 * size_t(max_slots) + max_tiles};
  // The rest of the MoE block (the router, the grouping, SiLU-and-mul, the combination), timed beside the products.
  bf16* w_router = device_array<bf16>(size_t(E) * H);
  cuda_ok(cuda::fill_random_bf16(w_router, size_t(E) * H, 4, 0.02f, 0.f, s), "fill");
  float* router_logits = device_array<float>(size_t(max_t) * E);
  float* route_weights = device_array<float>(max_slots);
  bf16* act = device_array<bf16>(size_t(max_slots) * I);
  bf16* out = device_array<bf16>(size_t(max_t) * H);
  cuda::Gemm router_gemm(size_t{4} << 20, cuda::GemmTuning{.candidates = 1});
  const auto time_us = [&](const char* label, auto&& launch) {
    return mean_launch_us(s, 1, 20, label, [&](int) { return launch(); });
  };
  std::mt19937 rng(5);
  std::printf("grouped expert GEMMs, Qwen3-30B-A3B shape (%d experts, top-%d, hidden %d, intermediate %d), tokens "
              "routed uniformly:\n", E, k, H, I);
  for (const int tokens : token_counts) {
    // top-k distinct experts per token, uniformly; the experts used and their weight bytes.
    std::vector<int32_t> chosen;
    std::vector<bool> used(E, false);
    for (int t = 0; t < tokens; ++t) {
      std::vector<int32_t> all(E);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      chosen.insert(chosen.end(), all.begin(), all.begin() + k);
      for (int j = 0; j < k; ++j) used[all[j]] = true;
    }
    const int active = static_cast<int>(std::count(used.begin(), used.end(), true)), slots = tokens * k;
    // Every layout (a GEMV per slot while a grid row per slot fits, tiles of 16, 64 and 128); '*' the runner's choice.
    const int picked = cuda::expert_product_layout(slots, E);
    cuda_ok(cudaMemcpyAsync(ids, chosen.data(), chosen.size() * sizeof(int32_t), cudaMemcpyHostToDevice, s), "copy");
    for (const int layout : {0, 16, 64, 128}) {
      if (layout == 0 && slots > 4096) continue;
      const int tile = layout == 0 ? 16 : layout;
      cuda_ok(cuda::group_experts(view, ids, slots, k, E, tile, s), "group_experts");
      cuda::GroupedGemmArgs g{.y = gate_up, .x = x, .x_rows = view.sorted_token, .w = w_gate_up,
                              .offsets = view.offsets, .tile_expert = view.tile_expert, .tile_row = view.tile_row,
                              .max_tiles = max_expert_tiles(slots, E, tile), .n = 2 * I, .k = H, .tile_rows = tile,
                              .gemv_slots = layout == 0 ? slots : 0, .num_experts = E};
      cuda::GroupedGemmArgs d = g;
      d.y = y;
      d.x = gate_up;  // the down product's input: any [slots][I] rows serve for timing
      d.x_rows = nullptr;
      d.w = w_down;
      d.n = H;
      d.k = I;
      for (const auto& [label, args] : {std::pair{"gate_up", g}, std::pair{"down", d}}) {
        const double us = time_us(label, [&] { return cuda::grouped_linear(args, s); });
        const double weights = 2.0 * active * args.n * args.k;
        std::printf("tokens %6d %-7s: %8.1f us, %3d experts' weights at %5.2f TB/s, %6.1f TFLOP/s (%s%s)\n", tokens,
                    label, us, active, weights / us / 1e6, 2.0 * slots * args.n * args.k / us / 1e6,
                    layout == 0 ? "GEMVs" : ("tiles of " + std::to_string(layout)).c_str(),
                    layout == picked ? " *" : "");
      }
    }
    const int tile = picked == 0 ? 16 : picked;
    const double router = time_us("router", [&] {
      return router_gemm.linear(router_logits, x, w_router, nullptr, tokens, E, H, true, s);
    });
    const double route = time_us("route_topk", [&] {
      return cuda::route_topk(ids, route_weights, router_logits, tokens, E, k, true, s);
    });
    const double group = time_us("group_experts", [&] { return cuda::group_experts(view, ids, slots, k, E, tile, s); });
    const double silu = time_us("silu_and_mul", [&] { return cuda::silu_and_mul(act, gate_up, slots, I, s); });
    const double combine = time_us("combine_experts", [&] {
      return cuda::combine_experts(out, y, view.slot_position, route_weights, tokens, k, H, true, s);
    });
    std::printf("tokens %6d rest of the block: router GEMM %.1f us, route_topk %.1f, group_experts %.1f, "
                "silu_and_mul %.1f, combine_experts %.1f\n", tokens, router, route, group, silu, combine);
  }
  for (void* p : {static_cast<void*>(w_gate_up), static_cast<void*>(w_down), static_cast<void*>(x),
                  static_cast<void*>(gate_up), static_cast<void*>(y), static_cast<void*>(ids),
                  static_cast<void*>(groups), static_cast<void*>(w_router), static_cast<void*>(router_logits),
                  static_cast<void*>(route_weights), static_cast<void*>(act), static_cast<void*>(out)})
    cudaFree(p);
  return 0;
}

int run_fp8_error(std::map<std::string, std::string>& f) {
  const int n = f.count("prompts") ? std::stoi(f["prompts"]) : 8;
  const int prompt = f.count("prompt") ? std::stoi(f["prompt"]) : 128;
  const bool checkpoint = f.count("model") > 0;
  const ModelConfig cfg = checkpoint ? load_model_config(f["model"]) : llama3_8b();
  const std::unique_ptr<SafeTensors> weights = checkpoint ? std::make_unique<SafeTensors>(f["model"]) : nullptr;
  CudaRunnerOptions opt;
  opt.num_blocks = n * ((prompt + 15) / 16);
  opt.max_num_seqs = n;
  opt.max_num_batched_tokens = n * prompt;
  opt.max_model_len = prompt;
  opt.swap_space_gib = 0;
  opt.gpu_memory_utilization = 0.45;  // two runners side by side
  std::mt19937 rng(9);
  std::uniform_int_distribution<TokenId> token(0, cfg.vocab_size - 1);
  std::vector<Sequence> seqs(n);
  for (Sequence& s : seqs)
    for (int i = 0; i < prompt; ++i) s.prompt.push_back(token(rng));
  assign_blocks(seqs, prompt, opt.block_size, opt.num_blocks, kv_groups_of(cfg).num_groups());
  const StepBatch step = prefill_steps(seqs, opt.max_num_batched_tokens, true).at(0);
  std::vector<std::vector<float>> logits[2];
  for (int fp8 = 0; fp8 < 2; ++fp8) {
    opt.fp8_weights = fp8 == 1;
    auto runner = checkpoint ? std::make_unique<CudaModelRunner>(cfg, *weights, opt)
                             : std::make_unique<CudaModelRunner>(cfg, uint64_t{42}, opt);
    logits[fp8] = runner->forward(step);
  }
  double sum = 0, worst = 0;
  int agree = 0;
  for (int i = 0; i < n; ++i) {
    double num = 0, den = 0;
    for (size_t v = 0; v < logits[0][i].size(); ++v) {
      const double d = double(logits[1][i][v]) - logits[0][i][v];
      num += d * d;
      den += double(logits[0][i][v]) * logits[0][i][v];
    }
    const double err = std::sqrt(num / den);
    sum += err;
    worst = std::max(worst, err);
    agree += argmax(logits[0][i]) == argmax(logits[1][i]);
  }
  std::printf("RESULT fp8_logits_relative_l2 mean %.4f max %.4f over %d prompts of %d tokens; argmax agrees on %d\n",
              sum / n, worst, n, prompt, agree);
  return 0;
}

void write_floats(const std::string& path, const std::vector<std::vector<float>>& rows) {
  std::ofstream out(path, std::ios::binary);
  for (const auto& r : rows) out.write(reinterpret_cast<const char*>(r.data()), r.size() * sizeof(float));
  if (!out) throw std::runtime_error("cannot write " + path);
}

int run_parity(std::map<std::string, std::string>& f) {
  for (const char* need : {"model", "prompts", "steps", "out"})
    if (!f.count(need)) throw std::runtime_error(std::string("parity needs --") + need);
  const std::string dir = f["model"], out = f["out"];
  const int steps = std::stoi(f["steps"]);
  std::vector<Sequence> seqs;
  {
    std::ifstream in(f["prompts"]);
    for (std::string line; std::getline(in, line);) {
      std::stringstream ids(line);
      Sequence s;
      for (TokenId id; ids >> id;) s.prompt.push_back(id);
      if (!s.prompt.empty()) seqs.push_back(std::move(s));
    }
  }
  const ModelConfig cfg = load_model_config(dir);
  const SafeTensors weights(dir);
  size_t longest = 0;
  for (const Sequence& s : seqs) longest = std::max(longest, s.prompt.size());
  CudaRunnerOptions opt;
  opt.block_size = 16;
  opt.max_num_seqs = static_cast<int>(seqs.size());
  opt.max_num_batched_tokens = 8192;
  opt.max_model_len = static_cast<int>(longest) + steps + 16;
  const int groups = kv_groups_of(cfg).num_groups();
  opt.num_blocks = static_cast<int>(seqs.size()) * groups * ((opt.max_model_len + opt.block_size - 1) / opt.block_size);
  opt.swap_space_gib = 0;
  CudaModelRunner runner(cfg, weights, opt);
  assign_blocks(seqs, opt.max_model_len, opt.block_size, runner.num_blocks(), groups);

  // Groups of at most --group sequences run one after the other (default: all at once). Each group's first two
  // steps go through forward(): the logits after the prompt (a prefill) and after the first generated token (a
  // decode step: with --group 1, the single-token GEMV path), and the greedy tokens from them.
  const size_t group = f.count("group") ? std::max(1, std::stoi(f["group"])) : seqs.size();
  std::vector<std::vector<float>> first(seqs.size()), second(seqs.size());
  for (size_t g0 = 0; g0 < seqs.size(); g0 += group) {
    std::vector<Sequence> part(seqs.begin() + g0, seqs.begin() + std::min(seqs.size(), g0 + group));
    for (const StepBatch& step : prefill_steps(part, opt.max_num_batched_tokens, true)) {
      auto logits = runner.forward(step);
      for (size_t i = 0; i < step.seqs.size(); ++i) {
        part[step.seqs[i].seq].output.push_back(argmax(logits[i]));
        first[g0 + step.seqs[i].seq] = std::move(logits[i]);
      }
    }
    if (steps > 1) {
      auto logits = runner.forward(decode_step(part));
      for (size_t i = 0; i < part.size(); ++i) {
        part[i].output.push_back(argmax(logits[i]));
        second[g0 + i] = std::move(logits[i]);
      }
    }
    for (int i = 2; i < steps; ++i) {
      const StepResult r = runner.execute(decode_step(part));
      for (size_t j = 0; j < r.seqs.size(); ++j) part[r.seqs[j]].output.push_back(r.samples[j][0][0].token);
    }
    for (size_t i = 0; i < part.size(); ++i) seqs[g0 + i].output = std::move(part[i].output);
  }
  write_floats(out + ".logits.bin", first);
  if (steps > 1) write_floats(out + ".step1_logits.bin", second);
  std::ofstream json(out + ".tokens.json");
  json << "{\"tokens\": [";
  for (size_t i = 0; i < seqs.size(); ++i) {
    json << (i ? ", [" : "[");
    for (size_t j = 0; j < seqs[i].output.size(); ++j) json << (j ? ", " : "") << seqs[i].output[j];
    json << "]";
  }
  json << "]}\n";

  if (f.count("cpu")) {
    CpuRunnerOptions copt;
    copt.block_size = opt.block_size;
    copt.num_blocks = opt.num_blocks;
    copt.max_model_len = opt.max_model_len;  // the same LongRoPE factors as the CUDA runner
    CpuModelRunner cpu(cfg, weights, copt);
    std::vector<std::vector<float>> cpu_first;
    for (const StepBatch& step : prefill_steps(seqs, opt.max_num_batched_tokens, true))
      for (auto& l : cpu.forward(step)) cpu_first.push_back(std::move(l));
    write_floats(out + ".cpu_logits.bin", cpu_first);
  }
  std::printf("parity: %zu prompts, %d greedy tokens each, vocab %d\n", seqs.size(), steps, cfg.vocab_size);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: bench_cuda_runner decode|ops|prefill-ops|gemv|gemm|lora|moe-gemm|fp8-error|parity [flags]\n");
    return 2;
  }
  if (paged::cuda_device_count() == 0) {
    std::puts("bench_cuda_runner: no CUDA device");
    return 0;
  }
  try {
    auto f = flags(argc, argv);
    const std::string mode = argv[1];
    if (mode == "decode") return run_decode(f);
    if (mode == "parity") return run_parity(f);
    if (mode == "ops") return run_ops(f);
    if (mode == "prefill-ops") return run_prefill_ops(f);
    if (mode == "gemm") return run_gemm(f);
    if (mode == "gemv") return run_gemv(f);
    if (mode == "lora") return run_lora(f);
    if (mode == "moe-gemm") return run_moe_gemm(f);
    if (mode == "fp8-error") return run_fp8_error(f);
    std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_runner: %s\n", e.what());
    return 1;
  }
}

#endif
