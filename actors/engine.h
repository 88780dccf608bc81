// The engine: the public face of the actor runtime. Offline use is three lines:
//   paged::Engine engine({.model_dir = "models/stories260K"});
//   auto outputs = engine.generate({"Once upon a time"}, paged::SamplingParams{.max_tokens = 32});
//   std::cout << outputs[0].outputs[0].text;
// Online use (the HTTP server): submit() with a sink that receives events on an actor thread; abort() cancels.
#pragma once

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "actors/engine_types.h"
#include "actors/metrics.h"
#include "model/kv/kv_groups.h"
#include "model/kv/kv_snapshot.h"
#include "model/loader/config.h"
#include "model/tokenizer/tokenizer.h"

namespace paged {

/// Whether the engine can take requests: failed while no replica serves (lost workers, failed executors).
enum class EngineState { ready, failed };

/// Thrown by submit() on a failed engine; the HTTP layer answers 503.
struct EngineUnavailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// One replica of the model as /health lists it.
struct ReplicaInfo {
  std::string address;     // HOST:PORT of its worker; empty for the replica in this process
  bool serving = true;     // false while lost (a lost worker is reconnected with backoff)
  std::string reason;      // why it was lost; empty while serving
};

/// What the engine was built with, for the startup log: the model, where it runs, its weights and KV pools.
struct EngineSummary {
  std::string model_dir, model_type, checkpoint_dtype, compute_dtype, kv_cache_dtype, device;
  std::string kv_disk_dir;       // the disk tier's folder; empty: none
  std::string checkpoint_format; // an FP8 checkpoint loaded here: how (Fp8Checkpoint::describe); empty: none
  int64_t weight_bytes = 0;      // the checkpoint's tensors as loaded here (0: on workers, or random weights)
  double load_seconds = 0.0;     // building the engine (weights, runners, workers' hellos)
  int max_model_len = 0, block_size = 0, tensor_parallel_size = 1;
  KvGroups kv_groups;            // how the layers share the KV blocks: a sliding group keeps its window's only
  struct Pool {
    std::string address;         // the replica's worker; empty: this process
    int64_t kv_blocks = 0, kv_bytes = 0, swap_blocks = 0, swap_bytes = 0;
    int64_t offload_blocks = 0, offload_bytes = 0;  // the prefix cache's CPU tier (--kv-offloading-size)
    int64_t disk_blocks = 0, disk_bytes = 0;        // its disk tier (--kv-disk-dir, --kv-disk-size)
  };
  std::vector<Pool> replicas;
  /// Blocks one sequence of max_model_len tokens keeps over its KV groups (blocks_kept): a sliding group those
  /// overlapping its window, the others all.
  int64_t blocks_per_sequence() const;
  /// Sequences of max_model_len tokens that fit the KV pools at once (summed over the replicas).
  double max_concurrency() const;
};

/// A snapshot of the engine's state, with the reason it failed (empty while ready) and its replicas.
struct EngineHealth {
  EngineState state = EngineState::ready;
  std::string reason;
  std::vector<ReplicaInfo> replicas;
};

/// The KV blocks of one serving replica, as its memory manager's bookkeeping holds them.
struct ReplicaKv {
  size_t index = 0;        // the replica's index (/metrics' replica label)
  std::string address;     // HOST:PORT of its worker; empty for the replica in this process
  KvSnapshot kv;
};

/// A LoRA adapter the engine serves (Engine::load_lora): requests name it by SamplingParams::lora = id.
struct LoraInfo {
  int32_t id = 0;
  std::string name, path;
};

class Engine {
 public:
  /// Loads the model and starts the actors. Throws std::runtime_error (ModelError, TokenizerError) on a bad model.
  explicit Engine(EngineConfig config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Offline generation, blocking until every prompt finished; outputs in input order. `watch`, when given, sees the
  /// progress and may cancel the batch (GenerationCancelled).
  std::vector<RequestOutput> generate(const std::vector<std::string>& prompts, const SamplingParams& params,
                                      const GenerateWatch& watch = {});
  std::vector<RequestOutput> generate(const std::vector<std::vector<TokenId>>& prompts,
                                      const SamplingParams& params, const GenerateWatch& watch = {});

  using Sink = RequestSink;
  /// Starts a request; events go to `sink` (called from an engine thread, never concurrently for one request).
  /// Throws InvalidRequest, EngineOverloaded or EngineUnavailable and then changes nothing.
  RequestId submit(std::vector<TokenId> prompt, SamplingParams params, Sink sink);
  /// Cancels a request: its blocks are freed at once and its sink gets one last event (finish "cancelled").
  /// Unknown or finished ids are ignored.
  void abort(RequestId id);
  /// Ends every running request with the error `reason`, as no replica could serve it (HTTP 503): a server's
  /// shutdown once its grace period is over.
  void abort_all(const std::string& reason);

  /// Checks `params` and a prompt of `prompt_len` tokens against the model; throws InvalidRequest.
  void validate(const SamplingParams& params, size_t prompt_len) const;
  /// Throws InvalidRequest when a prompt id lies outside the model's vocabulary.
  void check_prompt_ids(const std::vector<TokenId>& prompt) const;

  /// Blocks until no request is left and the memory manager has processed every release.
  void wait_idle();

  const Tokenizer& tokenizer() const;
  int max_model_len() const;
  const ModelConfig& model_config() const;
  const EngineConfig& config() const;
  /// Thread-safe view of the counters and histograms, summed over the replicas.
  Metrics& metrics();
  /// Prometheus text of the engine's figures and of each replica's (replicas_prometheus).
  std::string prometheus() const;
  /// Thread-safe snapshot of the state and the replicas.
  EngineHealth health() const;
  /// Asks every serving replica's memory manager for its KvSnapshot and calls `done` once with those that answered
  /// within 2 s, in replica order, on an engine thread. Never blocks: the HTTP layer's handlers may call it.
  void kv_snapshot(std::function<void(std::vector<ReplicaKv>)> done);
  /// What the engine was built with.
  const EngineSummary& summary() const;
  /// Loads the PEFT adapter in folder `path` (model/lora/lora_adapter.h) into every rank of the replica in this
  /// process and serves it as `name`: returns the id its requests set as SamplingParams::lora. Throws
  /// InvalidRequest (param "lora_name") when an adapter of that name is served, ModelError when the adapter does not
  /// fit the model or the engine cannot run adapters (CUDA, workers); nothing changes then.
  int32_t load_lora(const std::string& name, const std::string& path);
  /// Stops serving adapter `name`: requests can no longer name it, and its weights go once its requests in flight
  /// ended. False when no adapter of that name is served.
  bool unload_lora(const std::string& name);
  /// The adapters served, in load order (--lora-modules' first).
  std::vector<LoraInfo> lora_adapters() const;
  /// vLLM's vllm:lora_requests_info gauge (labels max_lora, running_lora_adapters, waiting_lora_adapters: the names
  /// of the adapters with running / waiting requests, joined by commas; the value the time of the scrape), once an
  /// adapter was served; else empty.
  std::string lora_prometheus() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  RequestId start(std::vector<TokenId> prompt, SamplingParams params, Sink sink, bool limit_waiting);
};

}  // namespace paged
