// What crosses the engine's face: its configuration, the errors it refuses requests with, and the events and
// outputs of a request. Kept apart from the Engine class so that the actors it spawns can name them.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/sampling/sample.h"
#include "model/scheduling/scheduler_policy.h"
#include "model/speculative/ngram.h"

namespace paged {

/// A request the engine refuses (bad parameters, prompt too long, ids out of vocabulary). `param` names the field.
struct InvalidRequest : std::invalid_argument {
  InvalidRequest(const std::string& message, std::string param_name)
      : std::invalid_argument(message), param(std::move(param_name)) {}
  std::string param;
};

/// The engine is over its waiting-queue limit (HTTP 503).
struct EngineOverloaded : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct EngineConfig {
  std::string model_dir;
  std::string device = "auto";          // auto | cpu | cuda
  std::string load_format = "auto";     // auto: the checkpoint; dummy: random weights (benchmarks; CUDA only)
  /// "fp8": linear weights as FP8 e4m3 per output channel (CUDA, sm89+); "none": as the checkpoint holds them (an
  /// FP8 checkpoint dequantised); "auto": the checkpoint's (fp8 for a pre-quantised FP8 checkpoint on CUDA).
  std::string quantization = "auto";
  /// KV cache storage (vLLM's --kv-cache-dtype): "auto" (the compute dtype: bf16 on CUDA, float32 on the CPU) or
  /// "fp8" (e4m3 with a scale per token and KV head, about half the bytes; CUDA, sm89+; "fp8_e4m3" is its other name).
  std::string kv_cache_dtype = "auto";
  /// vLLM's --dtype: "auto" (the device's: bf16 on CUDA, float32 on the CPU), or that one named ("bfloat16" /
  /// "bf16" on CUDA, "float32" / "float" on the CPU); another is refused: the kernels compute in those only.
  std::string dtype = "auto";
  /// vLLM's --enforce-eager: no CUDA graphs (every decode step launched kernel by kernel).
  bool enforce_eager = false;
  /// --nano-batch-rows N (CUDA): decode steps of at least N rows run as two nano-batches, the attention of one
  /// beside the linear layers of the other (CudaRunnerOptions::nano_batch_rows); 0: never.
  int nano_batch_rows = 0;
  /// vLLM's --seed (`paged serve`): the seeds of requests that give none are drawn from a generator started at
  /// this value, one a request in the order they arrive, so that the same requests sent in the same order sample
  /// the same tokens; unset: started from std::random_device.
  std::optional<uint64_t> seed;
  /// vLLM's --max-logprobs: most logprobs / prompt_logprobs a request may ask, at most kMaxLogprobs.
  int max_logprobs = 20;
  int block_size = 16;
  std::optional<int> num_kv_blocks;     // device pool size; default: from memory (CPU: fits max_num_seqs contexts)
  double swap_space_gib = 4.0;          // CPU swap pool, GiB (vLLM's --swap-space)
  /// CPU tier of the prefix cache, GiB (vLLM's --kv-offloading-size): cached blocks evicted from the device pool
  /// stay findable there and a hit copies them back. Its own part of the host pool, after the swap space: local
  /// runners allocate swap_space_gib + this; a worker's host pool is split in this proportion (start the worker with
  /// the same two flags). 0: off.
  double kv_offloading_gib = 0.0;
  /// Disk tier of the prefix cache: blocks the CPU tier drops are written to files in this folder (created if
  /// missing), named by the model's identity and the block's token prefix, read back on a hit (verified) and kept
  /// across restarts, at most kv_disk_gib of them (least recently used deleted). Empty: off. Needs the CPU tier, a
  /// checkpoint (not load_format dummy) and no workers.
  std::string kv_disk_dir;
  double kv_disk_gib = 0.0;
  double gpu_memory_utilization = 0.9;
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;    // per-step token budget (prefill chunks + decodes)
  int long_prefill_token_threshold = 0; // tokens one sequence computes per step at most (PlanLimits); 0: no limit
  std::optional<int> max_model_len;     // default: the model's max positions
  bool enable_prefix_caching = true;
  /// Two steps in flight on a replica of one executor (vLLM's --async-scheduling): step N+1 goes to the executor
  /// before N returned, so the host work between steps overlaps the device's.
  bool async_scheduling = true;
  /// vLLM's --speculative-config with method "ngram" (model/speculative/ngram.h): a decoding sequence proposes up to
  /// num_speculative_tokens drafts from its own earlier tokens and one step verifies them, so a step may yield
  /// several of its tokens. Greedy and sampled outputs are those of decoding without it (each position is sampled
  /// from the model's own distribution); steps are then planned one after another (async_scheduling is off). Not for
  /// beam search or the first token of n > 1. Off: num_speculative_tokens 0.
  NgramSpeculation speculative_config;
  /// vLLM's --enable-lora: the engine serves LoRA adapters (PEFT folders, model/lora/lora_adapter.h) beside the base
  /// model, any mix of them and the base model in one step; a request picks one by SamplingParams::lora (the HTTP API
  /// by its name as the request's model). On CUDA the executor keeps max_loras slots of max_lora_rank for them (the
  /// KV pool gets what is left), FP8 weights too. Off: lora_modules and Engine::load_lora are refused.
  bool enable_lora = false;
  /// --lora-modules: the adapters loaded at start; adapter i gets id i + 1. With workers, each worker loads the same
  /// list (checked at connection) and Engine::load_lora is refused.
  struct LoraModule {
    std::string name, path;
  };
  std::vector<LoraModule> lora_modules;
  int max_lora_rank = 16;  // vLLM's --max-lora-rank: an adapter with a larger r is refused at start
  /// vLLM's --max-loras: adapters the running sequences use at once (a request of another waits; the base model is
  /// not counted).
  int max_loras = 1;
  PreemptionMode preemption_mode = PreemptionMode::recompute;
  /// vLLM's --scheduling-policy priority: requests are admitted by SamplingParams::priority (lower first), then
  /// arrival, and preempted lowest priority first. Off (fcfs): a request with a priority other than 0 is refused.
  bool priority_scheduling = false;
  int tensor_parallel_size = 1;
  int max_waiting_requests = 4096;      // submit() beyond this throws EngineOverloaded (generate() is not limited)
  /// "host:port" of each `paged worker` (actors/worker.h), one replica of the model each, reached through CAF's
  /// network layer: this engine keeps one scheduler and KV bookkeeping per replica, the router and the requests.
  /// device, load_format, num_kv_blocks, swap_space_gib, gpu_memory_utilization and tensor_parallel_size are then
  /// the workers'. Empty: one replica in this process.
  std::vector<std::string> workers;
  /// A deployment's folder of `paged gen-certs` (actors/tls_certs.h): the connections to the workers (and a worker's
  /// listening port) then take mutual TLS with its certificates. Empty: plain TCP, for loopback only.
  std::string tls_dir;
  /// Called as the weights load here (SafeTensors::LoadObserver: bytes loaded, of all); empty: silent.
  std::function<void(int64_t loaded_bytes, int64_t total_bytes)> on_load_progress;
};

using RequestId = uint64_t;

/// New output of one completion (index i of n) since the previous event.
struct CompletionDelta {
  int index = 0;
  std::string text;                       // complete UTF-8 only
  std::vector<TokenId> token_ids;
  std::vector<SampledToken> logprobs;     // parallel to token_ids when logprobs were requested
  std::optional<std::string> finish_reason;  // "stop" | "length" | "cancelled" once this completion ends
};

/// What a sink receives. Events of one request arrive in order, on an engine thread; the last has done = true.
/// Streams with n > 1 interleave deltas of the different indices. Beam search and best_of > n deliver
/// everything in the final event.
struct RequestEvent {
  RequestId id = 0;
  std::vector<CompletionDelta> deltas;
  bool done = false;
  int prompt_tokens = 0;
  int cached_tokens = 0;                  // prompt tokens found in the prefix cache at its first admission
  int completion_tokens = 0;              // so far, over all completions
  std::optional<std::string> error;       // the request failed inside the engine
  bool unavailable = false;               // with error: no replica of the model can serve it (HTTP 503)
  /// prompt_logprobs asked: once, in the first event after the whole prompt was scored, entry i for prompt token
  /// i + 1 (the first has none); empty in every other event.
  std::vector<PromptLogprob> prompt_logprobs;
};

struct CompletionOutput {
  int index = 0;
  std::string text;
  std::vector<TokenId> token_ids;
  std::vector<SampledToken> logprobs;
  double cumulative_logprob = 0.0;
  std::string finish_reason;
};

struct RequestOutput {
  RequestId id = 0;
  std::string prompt;
  std::vector<TokenId> prompt_token_ids;
  std::vector<PromptLogprob> prompt_logprobs;  // prompt_logprobs asked: entry i for prompt token i + 1
  int num_cached_tokens = 0;                   // prompt tokens found in the prefix cache (vLLM's)
  std::vector<CompletionOutput> outputs;
};

/// Receives a request's events (see RequestEvent), on an engine thread, never concurrently for one request.
using RequestSink = std::function<void(RequestEvent)>;

/// Where a blocking Engine::generate stands: prompts finished, of all, and tokens generated so far.
struct GenerateProgress {
  size_t finished = 0;
  size_t total = 0;
  int64_t generated_tokens = 0;
};
/// Called by Engine::generate on the calling thread about every 100 ms while it waits, and once more at the end;
/// returning false cancels the batch (its requests are aborted, their blocks freed, and generate throws
/// GenerationCancelled once every one ended).
using GenerateWatch = std::function<bool(const GenerateProgress&)>;

/// Thrown by Engine::generate when its GenerateWatch cancelled the batch.
struct GenerationCancelled : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace paged
