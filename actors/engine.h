// The engine: the public face of the actor runtime. Offline use is three lines:
//   paged::Engine engine({.model_dir = "models/stories260K"});
//   auto outputs = engine.generate({"Once upon a time"}, paged::SamplingParams{.max_tokens = 32});
//   std::cout << outputs[0].outputs[0].text;
// Online use (the HTTP server): submit() with a sink that receives events on an actor thread; abort() cancels.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "actors/metrics.h"
#include "model/loader/config.h"
#include "model/sampling/sampling_params.h"
#include "model/scheduling/scheduler_policy.h"
#include "model/step.h"
#include "model/tokenizer/tokenizer.h"

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
  int block_size = 16;
  std::optional<int> num_kv_blocks;     // device pool size; default: from memory (CPU: fits max_num_seqs contexts)
  double swap_space_gib = 4.0;          // CPU swap pool, GiB (vLLM's --swap-space)
  double gpu_memory_utilization = 0.9;
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;    // per-step token budget (prefill chunks + decodes)
  std::optional<int> max_model_len;     // default: the model's max positions
  bool enable_prefix_caching = true;
  PreemptionMode preemption_mode = PreemptionMode::recompute;
  int tensor_parallel_size = 1;
  int max_waiting_requests = 4096;      // submit() beyond this throws EngineOverloaded (generate() is not limited)
  /// "host:port" of a `paged worker` (actors/worker.h): the model runs there, reached through CAF's network
  /// layer, and this engine keeps the scheduler, the KV bookkeeping and the requests. device, load_format,
  /// num_kv_blocks, swap_space_gib and gpu_memory_utilization are then the worker's.
  std::string remote_executor;
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
  int completion_tokens = 0;              // so far, over all completions
  std::optional<std::string> error;       // the request failed inside the engine
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
  std::vector<CompletionOutput> outputs;
};

class Engine {
 public:
  /// Loads the model and starts the actors. Throws std::runtime_error (ModelError, TokenizerError) on a bad model.
  explicit Engine(EngineConfig config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Offline generation, blocking until every prompt finished; outputs in input order.
  std::vector<RequestOutput> generate(const std::vector<std::string>& prompts, const SamplingParams& params);
  std::vector<RequestOutput> generate(const std::vector<std::vector<TokenId>>& prompts,
                                      const SamplingParams& params);

  using Sink = std::function<void(RequestEvent)>;
  /// Starts a request; events go to `sink` (called from an engine thread, never concurrently for one request).
  /// Throws InvalidRequest or EngineOverloaded and then changes nothing.
  RequestId submit(std::vector<TokenId> prompt, SamplingParams params, Sink sink);
  /// Cancels a request: its blocks are freed at once and its sink gets one last event (finish "cancelled").
  /// Unknown or finished ids are ignored.
  void abort(RequestId id);

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
  /// Thread-safe view of the counters and histograms.
  Metrics& metrics();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  RequestId start(std::vector<TokenId> prompt, SamplingParams params, Sink sink, bool limit_waiting);
};

}  // namespace paged
