#include "actors/engine.h"

#include <chrono>
#include <condition_variable>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include <filesystem>
#include <fstream>

#include "actors/actors.h"
#include "actors/tls.h"
#include "model/hash_mix.h"
#include "kernels/cpu/cpu_runner.h"
#include "model/loader/safetensors.h"
#include "model/lora/lora_adapter.h"
#include "model/constraint/sequence_constraints.h"
#include "model/tokenizer/load_tokenizer.h"
#include "kernels/cpu/local_all_reduce.h"
#include "model/sampling/bad_words.h"
#include "model/sampling/params_check.h"
#ifdef PAGED_HAVE_CUDA
#include "kernels/cuda/cuda_runner.h"
#include "kernels/cuda/nccl_comm.h"
#endif

namespace paged {

namespace {

/// One replica of the model: its executors (tensor-parallel ranks in this process, or the proxy of its worker), the
/// memory manager and scheduler the engine keeps for it, and its own figures.
struct Replica {
  size_t index = 0;
  std::string address;                 // HOST:PORT of its worker; empty: in this process
  Metrics metrics;                     // engine_ready: 1 while it serves
  std::vector<caf::actor> executors;
  MemoryManager memory_manager;
  caf::actor scheduler;
  bool serving = false;                // guarded by Engine::Impl::state_mu, with reason and generation
  std::string reason;
  uint64_t generation = 0;             // which start of the replica its actors' functors belong to
};

/// A worker that answered hello with the model this engine runs: the proxy that stands for it, and its pools.
struct JoinedWorker {
  caf::actor proxy;
  WorkerInfo info;
};

}  // namespace

struct Engine::Impl {
  EngineConfig config;
  ModelConfig model;
  KvGroups kv_groups;  // kv_groups_of(model): how its layers share the KV blocks
  std::unique_ptr<Tokenizer> tokenizer;
  /// Structured outputs: the automata live requests use, over the tokenizer's vocabulary (a worker keeps its own).
  std::unique_ptr<constraint::ConstraintCache> constraints;
  Metrics metrics;                              // the totals over the replicas, and the request histograms
  std::unique_ptr<HeldTlsFiles> tls_files;      // outlives the system, which reads them on every connection
  std::unique_ptr<caf::actor_system_config> sys_cfg;
  std::unique_ptr<caf::actor_system> system;
  std::vector<std::unique_ptr<Replica>> replicas;  // fixed once constructed
  caf::actor router;
  caf::actor reconnect_actor;                   // reconnects lost workers, with backoff (reconnector())
  std::shared_ptr<LocalAllReduce> all_reduce;
  std::atomic<uint64_t> next_id{1};
  std::mt19937_64 seed_rng{std::random_device{}()};
  std::mutex seed_mu;
  int max_model_len = 0;
  EngineSummary summary;
  int64_t max_seq_blocks = 0;  // blocks one sequence can hold in every replica's KV pool (admission keeps 1% free)
  int64_t max_seq_tokens = 0;  // the longest sequence those blocks hold (longest_sequence)
  // LoRA adapters by id (Engine::load_lora): what requests of each are salted with, and how many are in flight, so
  // that an unloaded adapter's weights go when its last request ends. Guarded by lora_mu; lora_load_mu keeps loads
  // one at a time (their files are read without lora_mu).
  struct LoraEntry {
    std::string name, path;
    uint64_t hash = 0;
    bool served = true;
    int in_flight = 0;
  };
  mutable std::mutex lora_mu;
  std::mutex lora_load_mu;
  std::map<int32_t, LoraEntry> loras;
  int32_t next_lora = 1;
  std::vector<uint64_t> worker_lora_hashes;  // with --workers: the first worker's adapters (every worker's must match)
  /// Gives adapter `id` to each executor of the replica in this process, rank r ranks[r]; the first error once every
  /// executor answered, empty when all took it.
  std::string give_lora(int32_t id, const std::vector<std::shared_ptr<const LoraAdapter>>& ranks);
  /// Tells the executors to drop adapter `id` (no answer awaited).
  void drop_lora(int32_t id);
  /// The entry of adapter `id` while it is served (lora_mu held); else throws InvalidRequest naming "model".
  const LoraEntry& served_lora(int32_t id) const {
    const auto it = loras.find(id);
    if (it == loras.end() || !it->second.served)
      throw InvalidRequest("no LoRA adapter " + std::to_string(id) + " is served", "model");
    return it->second;
  }
  LoraEntry& served_lora(int32_t id) { return const_cast<LoraEntry&>(std::as_const(*this).served_lora(id)); }
  /// A request of adapter id ended: its weights go when it was unloaded and this was the last.
  void lora_request_ended(int32_t id);
  ~Impl();
  uint64_t kv_identity = 0;    // what makes this engine's KV (the disk tier's files carry it); 0: no disk tier
  int64_t disk_blocks = 0;     // the disk tier's size in blocks
  mutable std::mutex state_mu;  // guards state, failure, stopping and the replicas' serving, reason, generation
  // Held by the reconnector while it joins a worker and starts its replica (both use `system`), and by ~Engine to set
  // stopping: the engine is not torn down in the middle of a join (a lost worker's reconnection racing the end of the
  // engine used the system as it was being destroyed).
  std::mutex join_mu;
  EngineState state = EngineState::ready;
  std::string failure;    // why the engine failed; empty while ready
  bool stopping = false;  // the engine is being destroyed: its actors' ends are no failure

  uint64_t random_seed() {
    std::lock_guard lock(seed_mu);
    return seed_rng();
  }

  // Why a worker's hello does not fit this engine (another model, block size, smaller limits, or, once the engine
  // admits sequences, a KV pool too small for them); empty when it fits.
  std::string misfit(const WorkerInfo& info) const;
  // Connects to the worker at `address`, says hello through a new proxy and checks the answer. Throws ModelError
  // "--workers ADDRESS: why".
  JoinedWorker join_worker(const std::string& address);
  // Spawns the replica's memory manager and scheduler over its executors, and watches them all: the first to end
  // makes the replica lost. Call with the replica's executors set and serving false.
  // `sampled_positions`: the most positions its runner samples a step (PlanLimits::max_sampled_positions).
  void start_replica(Replica& r, int num_blocks, int num_host_blocks, int sampled_positions);
  // The replica's actor of generation `generation` ended with `reason`: the replica is lost (the first call counts),
  // its other actors end (its requests move to another replica), the engine fails when none serves, and a worker is
  // reconnected.
  void replica_lost(size_t index, uint64_t generation, const caf::error& reason);
  // A lost worker answered again: it serves once more, with a fresh KV bookkeeping.
  void replica_joined(size_t index, JoinedWorker joined);
  // The behaviour of `reconnector` (detached: a connection attempt blocks its thread): (reconnect_atom, replica,
  // attempt) tries once and, failing, again after a delay that doubles from kFirstRetry up to kLongestRetry.
  caf::behavior reconnector(caf::event_based_actor* self);
};


namespace {

bool cuda_available() {
#ifdef PAGED_HAVE_CUDA
  return cuda_device_count() > 0;
#else
  return false;
#endif
}

}  // namespace

namespace {

// Why the engine of (resolved) config `c` cannot run LoRA adapters; empty when it can.
std::string lora_unsupported(const EngineConfig& c) {
  if (!c.workers.empty())
    return "with --workers the LoRA adapters are fixed at start: the same --lora-modules on the head and every worker";
  if (!c.enable_lora) return "LoRA adapters need --enable-lora";
  return "";
}

}  // namespace

int resolve_config(EngineConfig& c, const ModelConfig& model, bool local_device) {
  const int max_model_len = c.max_model_len.value_or(model.max_position_embeddings);
  if (max_model_len < 1 || max_model_len > model.max_position_embeddings)
    throw ModelError("max_model_len must be in [1, " + std::to_string(model.max_position_embeddings) + "]");
  if (c.block_size < 1 || c.block_size > 256) throw ModelError("block_size must be in [1, 256]");
  if (c.max_num_seqs < 1) throw ModelError("max_num_seqs must be positive");
  if (c.max_num_batched_tokens < 1) throw ModelError("max_num_batched_tokens must be positive");
  if (c.long_prefill_token_threshold < 0) throw ModelError("long_prefill_token_threshold must be >= 0");
  if (c.tensor_parallel_size < 1) throw ModelError("tensor_parallel_size must be positive");
  if (const std::string bad = c.speculative_config.error(); !bad.empty())
    throw ModelError("speculative_config: " + bad);
  if (c.max_logprobs < 0 || c.max_logprobs > kMaxLogprobs)
    throw ModelError("max_logprobs must be in [0, " + std::to_string(kMaxLogprobs) + "]");
  if (c.load_format != "auto" && c.load_format != "dummy") throw ModelError("load_format must be auto or dummy");
  if (c.quantization != "auto" && c.quantization != "fp8" && c.quantization != "none")
    throw ModelError("quantization must be auto, fp8 or none, not '" + c.quantization + "'");
  if (c.kv_cache_dtype == "fp8_e4m3") c.kv_cache_dtype = "fp8";
  if (c.kv_cache_dtype != "auto" && c.kv_cache_dtype != "fp8")
    throw ModelError("kv_cache_dtype must be auto, fp8 or fp8_e4m3, not '" + c.kv_cache_dtype + "'");
  if (c.kv_offloading_gib > 0 && !c.enable_prefix_caching)
    throw ModelError("--kv-offloading-size keeps evicted prefix-cache blocks: it needs prefix caching on");
  if (!c.kv_disk_dir.empty()) {
    if (!(c.kv_disk_gib > 0)) throw ModelError("--kv-disk-dir needs --kv-disk-size GiB > 0");
    if (!(c.kv_offloading_gib > 0))
      throw ModelError("--kv-disk-dir keeps the blocks the CPU tier drops: it needs --kv-offloading-size");
    if (!c.workers.empty()) throw ModelError("--kv-disk-dir: the disk tier is not available with --workers");
    if (c.load_format == "dummy") throw ModelError("--kv-disk-dir: random weights (--load-format dummy) make no KV to keep");
  } else if (c.kv_disk_gib > 0) {
    throw ModelError("--kv-disk-size needs --kv-disk-dir");
  }
  if (c.max_lora_rank < 1 || c.max_lora_rank > 512) throw ModelError("max_lora_rank must be in [1, 512]");
  if (c.max_loras < 1) throw ModelError("max_loras must be positive");
  for (size_t i = 0; i < c.lora_modules.size(); ++i) {
    const EngineConfig::LoraModule& a = c.lora_modules[i];
    if (a.name.empty() || a.path.empty()) throw ModelError("--lora-modules: each adapter needs a name and a path");
    for (size_t j = 0; j < i; ++j)
      if (c.lora_modules[j].name == a.name) throw ModelError("--lora-modules names '" + a.name + "' twice");
  }
  if (!local_device) return max_model_len;
  if (c.device == "auto") c.device = cuda_available() ? "cuda" : "cpu";
  if (c.device != "cpu" && c.device != "cuda") throw ModelError("device must be cpu, cuda or auto");
  if (c.device == "cuda" && !cuda_available()) throw ModelError("--device cuda: no CUDA device is available");
  if (c.load_format == "dummy" && c.device != "cuda")
    throw ModelError("--load-format dummy (random weights) needs --device cuda");
  if (c.quantization == "auto")  // as vLLM: a pre-quantised FP8 checkpoint runs in FP8 where FP8 runs
    c.quantization = model.fp8_checkpoint.enabled && c.device == "cuda" ? "fp8" : "none";
  if (c.quantization == "fp8" && c.device != "cuda")
    throw ModelError("--quantization fp8 needs --device cuda (a GPU of compute capability 8.9 or newer); the CPU "
                     "executor computes in float32");
  if (c.kv_cache_dtype == "fp8" && c.device != "cuda")
    throw ModelError("--kv-cache-dtype fp8 needs --device cuda (a GPU of compute capability 8.9 or newer); the CPU "
                     "executor keeps its KV cache in float32");
  if (!c.lora_modules.empty())  // before the weights load
    if (const std::string why = lora_unsupported(c); !why.empty()) throw ModelError("--lora-modules: " + why);
  if (c.dtype != "auto") {
    const bool cuda = c.device == "cuda";
    if (cuda ? c.dtype != "bfloat16" && c.dtype != "bf16" : c.dtype != "float32" && c.dtype != "float")
      throw ModelError("--dtype " + c.dtype + ": the " +
                       (cuda ? std::string("CUDA executor computes in bfloat16") : "CPU executor computes in float32") +
                       " (--dtype auto takes the device's)");
  }
  return max_model_len;
}

namespace {

// Bytes of one KV block: K and V of a block's layer slots, per token and KV head `per_head` bytes.
int64_t kv_block_bytes(const ModelConfig& model, const KvGroups& groups, int block_size, int64_t per_head) {
  return int64_t{2} * groups.layers_per_block * model.num_kv_heads * block_size * per_head;
}

// KV pools of CPU runners: at most 4 GiB of float32 K and V over all ranks unless --num-kv-blocks says otherwise,
// and the host pool from --swap-space plus --kv-offloading-size.
std::pair<int, int> cpu_pools(const EngineConfig& c, const ModelConfig& model, const KvGroups& groups,
                              int max_model_len) {
  const int64_t block_bytes = kv_block_bytes(model, groups, c.block_size, model.head_dim * int64_t{sizeof(float)});
  const int64_t blocks_per_seq =
      most_blocks_held(groups.windows, max_model_len, c.block_size, c.max_num_batched_tokens);
  const int64_t cap = (int64_t{4} << 30) / block_bytes;
  const int num_blocks =
      c.num_kv_blocks.value_or(static_cast<int>(std::min<int64_t>(c.max_num_seqs * blocks_per_seq, cap)));
  const double swap_blocks = (c.swap_space_gib + c.kv_offloading_gib) * double(int64_t{1} << 30) / double(block_bytes);
  if (swap_blocks > double(std::numeric_limits<int32_t>::max()))
    throw ModelError("--swap-space and --kv-offloading-size are too large for this model's block size");
  return {num_blocks, static_cast<int>(swap_blocks)};
}

#ifdef PAGED_HAVE_CUDA
CudaRunnerOptions cuda_options(const EngineConfig& c, int max_model_len) {
  return {.block_size = c.block_size,
          .num_blocks = c.num_kv_blocks.value_or(0),
          .gpu_memory_utilization = c.gpu_memory_utilization,
          .swap_space_gib = c.swap_space_gib + c.kv_offloading_gib,  // the host pool: swap space and CPU tier
          .max_num_seqs = c.max_num_seqs,
          .max_num_batched_tokens = c.max_num_batched_tokens,
          .max_logits_rows = max_sampled_positions(c.max_num_seqs, c.speculative_config),
          .max_model_len = max_model_len,
          .cuda_graphs = !c.enforce_eager,
          .nano_batch_rows = c.nano_batch_rows,
          .fp8_weights = c.quantization == "fp8",
          .fp8_kv = c.kv_cache_dtype == "fp8",
          .max_loras = c.enable_lora ? c.max_loras : 0,
          .max_lora_rank = c.max_lora_rank};
}
#endif

// What makes this engine's KV, for the disk tier's files: the compute dtype, block size, the layers a block holds
// (KvGroups) and tensor parallelism, config.json, and each checkpoint file's name, size and modification time (a
// rewritten checkpoint changes it).
uint64_t kv_identity(const EngineConfig& c, const KvGroups& groups) {
  namespace fs = std::filesystem;
  uint64_t h = hash_mix(0x6b762d6964ULL, c.device == "cuda" ? 2 : 4);
  h = hash_mix(h, static_cast<uint64_t>(groups.layers_per_block));  // the layers a block holds
  h = hash_mix(hash_mix(h, c.quantization == "fp8"), c.kv_cache_dtype == "fp8");  // FP8 weights, the FP8 layout
  h = hash_mix(hash_mix(h, static_cast<uint64_t>(c.block_size)), static_cast<uint64_t>(c.tensor_parallel_size));
  const auto mix_text = [&](const std::string& text) {
    for (unsigned char ch : text) h = hash_mix(h, ch);
    h = hash_mix(h, text.size());
  };
  std::ifstream config(fs::path(c.model_dir) / "config.json", std::ios::binary);
  mix_text(std::string(std::istreambuf_iterator<char>(config), {}));
  std::vector<fs::path> checkpoint;
  for (const auto& entry : fs::directory_iterator(c.model_dir))
    if (entry.path().extension() == ".safetensors") checkpoint.push_back(entry.path());
  std::sort(checkpoint.begin(), checkpoint.end());
  for (const fs::path& file : checkpoint) {
    mix_text(file.filename().string());
    h = hash_mix(h, fs::file_size(file));
    h = hash_mix(h, static_cast<uint64_t>(fs::last_write_time(file).time_since_epoch().count()));
  }
  return h == 0 ? 1 : h;
}

// "host:port" -> (host, port); ModelError when it is not one.
std::pair<std::string, uint16_t> host_and_port(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon != std::string::npos && colon > 0 && colon + 1 < address.size() &&
      address.find_first_not_of("0123456789", colon + 1) == std::string::npos && address.size() - colon <= 6)
    port = std::stoi(address.substr(colon + 1));
  if (port < 1 || port > 65535)
    throw ModelError("--workers takes HOST:PORT entries with a port in [1, 65535], got '" + address + "'");
  return {address.substr(0, colon), static_cast<uint16_t>(port)};
}

}  // namespace

std::pair<int, int> split_host_pool(int host_blocks, const EngineConfig& c) {
  const double total = c.swap_space_gib + c.kv_offloading_gib;
  const int offload = total > 0 ? static_cast<int>(double(host_blocks) * (c.kv_offloading_gib / total)) : 0;
  return {host_blocks - offload, offload};
}

RankRunner make_local_runner(const EngineConfig& c, const ModelConfig& model, const KvGroups& groups,
                             int max_model_len, const SafeTensors* weights) {
  if (c.device == "cpu") {
    const auto [num_blocks, num_swap_blocks] = cpu_pools(c, model, groups, max_model_len);
    auto runner = std::make_shared<CpuModelRunner>(
        model, *weights,
        CpuRunnerOptions{.block_size = c.block_size, .num_blocks = num_blocks, .num_swap_blocks = num_swap_blocks,
                         .max_model_len = max_model_len});
    return {std::move(runner), num_blocks, num_swap_blocks};
  }
#ifndef PAGED_HAVE_CUDA
  throw ModelError("this build has no CUDA executor");
#else
  const CudaRunnerOptions options = cuda_options(c, max_model_len);
  std::shared_ptr<CudaModelRunner> runner = weights ? std::make_shared<CudaModelRunner>(model, *weights, options)
                                                    : std::make_shared<CudaModelRunner>(model, 0, options);
  const int num_blocks = runner->num_blocks(), num_swap_blocks = runner->num_swap_blocks();
  return {std::move(runner), num_blocks, num_swap_blocks};
#endif
}

std::string Engine::Impl::misfit(const WorkerInfo& info) const {
  const ModelConfig& mc = model;
  if (info.num_layers != mc.num_layers || info.hidden_size != mc.hidden_size || info.num_heads != mc.num_heads ||
      info.num_kv_heads != mc.num_kv_heads || info.head_dim != mc.head_dim || info.vocab_size != mc.vocab_size)
    return "the worker runs a different model (" + std::to_string(info.num_layers) + " layers, hidden " +
           std::to_string(info.hidden_size) + ", vocab " + std::to_string(info.vocab_size) + ")";
  if (info.kv_windows != kv_groups.windows || info.layers_per_block != kv_groups.layers_per_block) {
    const auto groups = [](const std::vector<int>& windows, int layers) {
      std::string s = "KV groups of windows [";
      for (size_t g = 0; g < windows.size(); ++g) s += (g ? ", " : "") + std::to_string(windows[g]);
      return s + "], " + std::to_string(layers) + " layers a block";
    };
    return "the worker's model has " + groups(info.kv_windows, info.layers_per_block) + ", this engine's " +
           groups(kv_groups.windows, kv_groups.layers_per_block) + " (config.json sliding_window, layer_types)";
  }
  if (info.block_size != config.block_size)
    return "the worker's KV blocks hold " + std::to_string(info.block_size) + " tokens, this engine's " +
           std::to_string(config.block_size) + " (--block-size)";
  if (info.max_model_len < max_model_len)
    return "the worker serves contexts of at most " + std::to_string(info.max_model_len) +
           " tokens; pass --max-model-len " + std::to_string(info.max_model_len) + " or less";
  if (info.max_num_seqs < config.max_num_seqs || info.max_num_batched_tokens < config.max_num_batched_tokens)
    return "the worker takes steps of at most " + std::to_string(info.max_num_seqs) + " sequences and " +
           std::to_string(info.max_num_batched_tokens) + " tokens; pass --max-num-seqs and " +
           "--max-num-batched-tokens no larger";
  std::vector<std::string> loras;
  for (const EngineConfig::LoraModule& a : config.lora_modules) loras.push_back(a.name);
  if (info.lora_names != loras) {
    const auto list = [](const std::vector<std::string>& names) {
      std::string s;
      for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
      return "[" + s + "]";
    };
    return "the worker serves the LoRA adapters " + list(info.lora_names) + ", this engine's --lora-modules names " +
           list(loras) + " (give the head and every worker the same, in the same order)";
  }
  if (!worker_lora_hashes.empty() && info.lora_hashes != worker_lora_hashes)
    return "the worker's LoRA adapters hold other weights than the first worker's of the same names";
  if (info.num_blocks < 1) return "the worker's KV cache has no blocks";
  if (info.num_swap_blocks < 0) return "the worker reports " + std::to_string(info.num_swap_blocks) + " swap blocks";
  if (info.max_sampled_positions < config.max_num_seqs)
    return "the worker samples at most " + std::to_string(info.max_sampled_positions) +
           " positions a step, fewer than --max-num-seqs " + std::to_string(config.max_num_seqs);
  if (max_seq_blocks > info.num_blocks - info.num_blocks / 100)
    return "the worker's KV cache holds fewer blocks per sequence than this engine admits (" +
           std::to_string(max_seq_blocks) + ")";
  return "";
}

JoinedWorker Engine::Impl::join_worker(const std::string& address) {
  const auto [host, port] = host_and_port(address);
  try {
    const caf::actor worker = connect_executor(*system, host, port);
    // The proxy says hello: the worker serves this engine while the proxy lives.
    const caf::actor proxy = system->spawn(remote_executor_proxy, worker, model.vocab_size);
    WorkerInfo info;
    std::string error;
    {
      caf::scoped_actor self{*system};
      self->request(proxy, std::chrono::seconds(60), hello_atom::value)
          .receive([&](WorkerInfo& i) { info = std::move(i); },
                   [&](caf::error& e) { error = system->render(e); });
    }
    if (error.empty()) error = misfit(info);
    if (!error.empty()) {
      caf::anon_send_exit(proxy, caf::exit_reason::user_shutdown);
      throw ModelError(error);
    }
    return {proxy, std::move(info)};
  } catch (const ModelError& e) {
    throw ModelError("--workers " + address + ": " + e.what());
  }
}

void Engine::Impl::start_replica(Replica& r, int num_blocks, int num_host_blocks, int sampled_positions) {
  const ReplicaMetricsWriter writer{&metrics, &r.metrics};
  const auto [num_swap_blocks, num_offload_blocks] = split_host_pool(num_host_blocks, config);
  r.memory_manager = system->spawn(
      memory_manager_actor,
      KvCacheOptions{.block_size = config.block_size, .num_device_blocks = num_blocks,
                     .num_cpu_blocks = num_swap_blocks, .num_offload_blocks = num_offload_blocks,
                     .num_disk_blocks = disk_blocks,
                     .disk_keys = kv_identity ? KvDiskStore::list_keys(config.kv_disk_dir, kv_identity)
                                              : std::vector<uint64_t>{},
                     .enable_prefix_caching = config.enable_prefix_caching,
                     .group_windows = kv_groups.windows},
      writer);
  SchedulerSetup setup;
  setup.limits = {config.max_num_seqs, config.max_num_batched_tokens, config.preemption_mode, sampled_positions,
                  config.max_loras, config.long_prefill_token_threshold};
  setup.max_model_len = max_model_len;
  setup.block_size = config.block_size;
  setup.executors = r.executors;
  setup.async_scheduling = config.async_scheduling && !config.speculative_config.enabled();
  setup.speculation = config.speculative_config;
  setup.memory_manager = r.memory_manager;
  setup.metrics = writer;
  r.scheduler = spawn_scheduler(*system, setup);
  uint64_t generation = 0;
  {
    std::lock_guard lock(state_mu);
    generation = ++r.generation;
    r.serving = true;
    r.reason.clear();
    r.metrics.engine_ready = 1;
  }
  // Before the engine's own shutdown, an actor of the replica ends only when an executor failed or its worker was
  // lost (an idle scheduler does not notice a lost worker). The functors run on the actor's thread, before the
  // system (and with it this) is destroyed.
  std::vector<caf::actor> watched = r.executors;
  watched.push_back(r.scheduler);
  for (const caf::actor& actor : watched)
    actor->attach_functor([this, index = r.index, generation](const caf::error& reason) {
      replica_lost(index, generation, reason);
    });
}

void Engine::Impl::replica_lost(size_t index, uint64_t generation, const caf::error& reason) {
  std::lock_guard lock(state_mu);
  Replica& r = *replicas[index];
  if (stopping || !r.serving || r.generation != generation) return;
  r.serving = false;
  r.reason = system->render(reason);
  r.metrics.engine_ready = 0;
  // The reason goes on to the other actors, unless it is none (which would not end them) or user_shutdown (which the
  // request actors take as the engine's own end): they move to another replica.
  const caf::error end = !reason || reason == caf::exit_reason::normal || reason == caf::exit_reason::user_shutdown
                             ? caf::error{caf::exit_reason::kill}
                             : reason;
  const auto exit = [&end](const auto& actor) {
    caf::anon_send<caf::message_priority::high>(caf::actor_cast<caf::actor>(actor),
                                                caf::exit_msg{caf::actor_addr{}, end});
  };
  for (const caf::actor& actor : r.executors) exit(actor);
  exit(r.scheduler);
  exit(r.memory_manager);
  if (std::none_of(replicas.begin(), replicas.end(), [](const auto& x) { return x->serving; })) {
    state = EngineState::failed;
    failure = (replicas.size() == 1 ? "the engine's executor is gone: " : "every replica is lost; the last: ") +
              r.reason;
    metrics.engine_ready = 0;
  }
  if (!r.address.empty()) caf::anon_send(reconnect_actor, reconnect_atom::value, index, 0);
}

void Engine::Impl::replica_joined(size_t index, JoinedWorker joined) {
  Replica& r = *replicas[index];
  {
    std::lock_guard lock(state_mu);
    if (stopping) {
      caf::anon_send_exit(joined.proxy, caf::exit_reason::user_shutdown);
      return;
    }
  }
  r.executors = {joined.proxy};
  // A worker started without --speculative-config samples max_num_seqs positions: drafts take what the engine's
  // sequences leave of them.
  start_replica(r, joined.info.num_blocks, joined.info.num_swap_blocks,
                std::min(max_sampled_positions(config.max_num_seqs, config.speculative_config),
                         joined.info.max_sampled_positions));
  {
    std::lock_guard lock(state_mu);
    state = EngineState::ready;
    failure.clear();
    metrics.engine_ready = 1;
  }
  caf::anon_send(router, replica_atom::value, index, r.scheduler);
}

namespace {

constexpr auto kFirstRetry = std::chrono::milliseconds(250);
constexpr auto kLongestRetry = std::chrono::seconds(5);

}  // namespace

caf::behavior Engine::Impl::reconnector(caf::event_based_actor* self) {
  return {
      [this, self](reconnect_atom a, size_t index, int attempt) {
        std::lock_guard joining(join_mu);
        {
          std::lock_guard lock(state_mu);
          if (stopping || replicas[index]->serving) return;
        }
        try {
          replica_joined(index, join_worker(replicas[index]->address));
        } catch (const std::exception& e) {
          std::lock_guard lock(state_mu);
          replicas[index]->reason = e.what();
          const auto delay =
              std::min<std::chrono::milliseconds>(kFirstRetry * (1 << std::min(attempt, 5)), kLongestRetry);
          self->delayed_send(self, delay, a, index, attempt + 1);
        }
      },
  };
}

int64_t EngineSummary::blocks_per_sequence() const {
  return block_size > 0 && kv_groups.num_groups() > 0 ? blocks_kept(kv_groups, max_model_len, block_size) : 0;
}

double EngineSummary::max_concurrency() const {
  int64_t blocks = 0;
  for (const Pool& p : replicas) blocks += p.kv_blocks;
  return blocks_per_sequence() > 0 ? double(blocks) / double(blocks_per_sequence()) : 0.0;
}

Engine::Engine(EngineConfig config) : impl_(std::make_unique<Impl>()) {
  const auto started = std::chrono::steady_clock::now();
  Impl& m = *impl_;
  m.config = std::move(config);
  EngineConfig& c = m.config;
  if (c.seed) m.seed_rng.seed(*c.seed);
  m.model = load_model_config(c.model_dir);
  m.kv_groups = kv_groups_of(m.model);
  m.tokenizer = load_tokenizer(c.model_dir);
  m.constraints =
      std::make_unique<constraint::ConstraintCache>(std::make_shared<const constraint::TokenTrie>(*m.tokenizer));
  const bool remote = !c.workers.empty();
  m.max_model_len = resolve_config(c, m.model, !remote);
  const int tp = c.tensor_parallel_size;
  if (remote && tp != 1)
    throw ModelError("--workers: each worker runs a whole replica of the model on its own device: "
                     "--tensor-parallel-size must be 1");
  if (!remote && !c.tls_dir.empty())
    throw ModelError("--tls-dir secures the connections to workers: it needs --workers");
  if (!c.kv_disk_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(c.kv_disk_dir, ec);
    if (ec || !std::filesystem::is_directory(c.kv_disk_dir))
      throw ModelError("--kv-disk-dir " + c.kv_disk_dir + ": not a folder that can be created");
    const int64_t element = c.device == "cuda" ? 2 : 4;
    const int64_t block_bytes = kv_block_bytes(m.model, m.kv_groups, c.block_size, m.model.head_dim * element);
    m.kv_identity = kv_identity(c, m.kv_groups);
    m.disk_blocks = static_cast<int64_t>(c.kv_disk_gib * double(int64_t{1} << 30) / double(block_bytes));
  }
  // This rank's files of the disk tier; null without one.
  const auto disk_store = [dir = c.kv_disk_dir, identity = m.kv_identity](int rank) -> std::shared_ptr<const KvDiskStore> {
    return identity ? std::make_shared<const KvDiskStore>(dir, identity, rank) : nullptr;
  };
  m.sys_cfg = std::make_unique<caf::actor_system_config>();
  register_message_types(*m.sys_cfg);
  if (remote) m.tls_files = load_transport(*m.sys_cfg, c.tls_dir);
  m.system = std::make_unique<caf::actor_system>(*m.sys_cfg);
  // Every replica's KV pools, in replica order; the checkpoint's bytes loaded here.
  std::vector<std::pair<int, int>> pools;
  int64_t weight_bytes = 0;
  if (remote) {
    // Each executor lives in a `paged worker`: check that it runs this model with this KV layout, then talk to it
    // through a local proxy, so that its scheduler sees one executor actor.
    for (const std::string& address : c.workers) {
      for (const auto& r : m.replicas)
        if (r->address == address) throw ModelError("--workers names " + address + " twice");
      JoinedWorker joined = m.join_worker(address);
      if (m.replicas.empty()) m.worker_lora_hashes = joined.info.lora_hashes;
      auto& r = m.replicas.emplace_back(std::make_unique<Replica>());
      r->index = m.replicas.size() - 1;
      r->address = address;
      r->executors = {joined.proxy};
      if (c.device == "auto" || m.replicas.size() == 1) c.device = joined.info.device;
      pools.emplace_back(joined.info.num_blocks, joined.info.num_swap_blocks);
    }
  } else {
    int num_blocks = 0, num_swap_blocks = 0;
    std::vector<std::shared_ptr<ModelRunner>> runners;
    const bool dummy = c.load_format == "dummy";
    std::shared_ptr<const SafeTensors> weights =
        dummy ? nullptr : std::make_shared<const SafeTensors>(c.model_dir, c.on_load_progress);
    if (weights) weight_bytes = weights->total_bytes();
    auto& replica = m.replicas.emplace_back(std::make_unique<Replica>());
    std::vector<caf::actor>& executors = replica->executors;
    if (tp == 1) {
      RankRunner built = make_local_runner(c, m.model, m.kv_groups, m.max_model_len, weights.get());
      num_blocks = built.num_blocks;
      num_swap_blocks = built.num_swap_blocks;
      runners.push_back(std::move(built.runner));
  } else if (c.device == "cpu") {
    std::tie(num_blocks, num_swap_blocks) = cpu_pools(c, m.model, m.kv_groups, m.max_model_len);
    m.all_reduce = std::make_shared<LocalAllReduce>(tp);
    for (int rank = 0; rank < tp; ++rank)
      runners.push_back(std::make_shared<CpuModelRunner>(
          m.model, *weights,
          CpuRunnerOptions{.block_size = c.block_size, .num_blocks = num_blocks, .num_swap_blocks = num_swap_blocks,
                           .tp_rank = rank, .tp_size = tp, .all_reduce = m.all_reduce.get(),
                           .max_model_len = m.max_model_len}));
  } else {
#ifndef PAGED_HAVE_CUDA
    throw ModelError("this build has no CUDA executor");
#else
    const CudaRunnerOptions options = cuda_options(c, m.max_model_len);
    // One detached executor per GPU, rank r on device r. Each builds its runner on its own thread, since joining
    // the NCCL group blocks until every rank has: all ranks get their init (the unique id travels in it) before
    // the engine waits for any answer. The KV manager gets the smallest pools any rank has room for.
    const int visible = cuda_device_count();
    if (visible < tp)
      throw ModelError("--tensor-parallel-size " + std::to_string(tp) + " needs " + std::to_string(tp) +
                       " GPUs, one per rank; " + std::to_string(visible) + " visible");
    RankSetup setup;
    setup.join = [tp](int rank, const NcclUniqueId& id) -> std::shared_ptr<void> {
      return std::make_shared<NcclComm>(id, rank, tp, rank);
    };
    setup.build = [model = m.model, weights, dummy, options, tp](int rank, const std::shared_ptr<void>& group) {
      CudaRunnerOptions o = options;
      o.device = rank;
      o.tp_rank = rank;
      o.tp_size = tp;
      o.comm = std::static_pointer_cast<NcclComm>(group);
      std::shared_ptr<CudaModelRunner> runner = dummy ? std::make_shared<CudaModelRunner>(model, 0, o)
                                                      : std::make_shared<CudaModelRunner>(model, *weights, o);
      return RankRunner{runner, runner->num_blocks(), runner->num_swap_blocks()};
    };
    setup.disk = disk_store;
    const NcclUniqueId id = nccl_unique_id();
    for (int rank = 0; rank < tp; ++rank)
      executors.push_back(m.system->spawn<caf::detached>(rank_executor_actor, setup));
    std::vector<RankReady> ready(tp);
    {
      caf::scoped_actor self{*m.system};
      std::vector<decltype(self->request(executors[0], caf::infinite, init_atom::value, 0, id))> pending;
      for (int rank = 0; rank < tp; ++rank)
        pending.push_back(self->request(executors[rank], caf::infinite, init_atom::value, rank, id));
      for (int rank = 0; rank < tp; ++rank)
        pending[rank].receive([&](RankReady& r) { ready[rank] = std::move(r); },
                              [&](caf::error& e) { ready[rank].error = m.system->render(e); });
    }
    for (int rank = 0; rank < tp; ++rank) {
      if (ready[rank].error.empty()) continue;
      // Every executor ends, each tearing its NCCL share down on its own thread, before the system goes.
      for (auto& e : executors) caf::anon_send_exit(e, caf::exit_reason::user_shutdown);
      executors.clear();
      if (ready[rank].model_error) throw ModelError(ready[rank].error);
      throw GpuError("tensor-parallel rank " + std::to_string(rank) + ": " + ready[rank].error);
    }
    num_blocks = ready[0].num_blocks;
    num_swap_blocks = ready[0].num_swap_blocks;
    for (const RankReady& r : ready) {
      num_blocks = std::min(num_blocks, r.num_blocks);
      num_swap_blocks = std::min(num_swap_blocks, r.num_swap_blocks);
    }
#endif
    }
    for (size_t rank = 0; rank < runners.size(); ++rank)
      executors.push_back(
          m.system->spawn<caf::detached>(executor_actor, runners[rank], disk_store(static_cast<int>(rank))));
    pools.emplace_back(num_blocks, num_swap_blocks);
  }
  int smallest = std::numeric_limits<int>::max();
  for (const auto& [num_blocks, num_swap_blocks] : pools) smallest = std::min(smallest, num_blocks);
  if (smallest < 1) throw ModelError("the KV cache has no blocks (--num-kv-blocks)");
  m.max_seq_blocks = smallest - smallest / 100;
  m.max_seq_tokens =
      longest_sequence(m.kv_groups.windows, m.max_seq_blocks, c.block_size, c.max_num_batched_tokens);

  m.reconnect_actor =
      m.system->spawn<caf::detached>([&m](caf::event_based_actor* self) { return m.reconnector(self); });
  for (size_t i = 0; i < m.replicas.size(); ++i)
    m.start_replica(*m.replicas[i], pools[i].first, pools[i].second,
                    max_sampled_positions(c.max_num_seqs, c.speculative_config));
  RouterSetup router;
  for (const auto& r : m.replicas) {
    router.schedulers.push_back(r->scheduler);
    router.replica_metrics.push_back(&r->metrics);
  }
  router.metrics = &m.metrics;
  router.options.block_size = c.block_size;
  m.router = spawn_router(*m.system, std::move(router));
  for (size_t i = 0; i < c.lora_modules.size(); ++i) {
    const EngineConfig::LoraModule& a = c.lora_modules[i];
    if (remote) {  // the workers loaded them, ids in this order (misfit checked their names and weights)
      std::lock_guard lock(m.lora_mu);
      m.loras[m.next_lora++] = {a.name, a.path, m.worker_lora_hashes.at(i)};
      continue;
    }
    try {
      load_lora(a.name, a.path);
    } catch (const std::exception& e) {
      throw ModelError("--lora-modules " + a.name + ": " + e.what());
    }
  }
  m.metrics.engine_ready = 1;

  EngineSummary& s = m.summary;
  s.model_dir = c.model_dir;
  s.kv_disk_dir = c.kv_disk_dir;
  s.model_type = m.model.model_type;
  s.checkpoint_dtype = m.model.torch_dtype;
  s.device = c.device;
  s.compute_dtype = c.device == "cuda" ? "bfloat16" : "float32";  // the CPU runner computes in float32
  if (!remote) s.checkpoint_format = m.model.fp8_checkpoint.describe(c.quantization == "fp8", s.compute_dtype);
  s.kv_cache_dtype = c.kv_cache_dtype == "fp8" ? "fp8_e4m3" : s.compute_dtype;
  s.max_model_len = m.max_model_len;
  s.block_size = c.block_size;
  s.kv_groups = m.kv_groups;
  s.tensor_parallel_size = c.tensor_parallel_size;
  s.weight_bytes = weight_bytes;
  // A block of every layer's K and V: per token and KV head, head_dim elements (FP8: bytes and a float32 scale).
  const int64_t element = c.device == "cuda" ? 2 : 4;
  const int64_t per_head = c.kv_cache_dtype == "fp8" ? m.model.head_dim + 4 : m.model.head_dim * element;
  const int64_t block_bytes = kv_block_bytes(m.model, m.kv_groups, c.block_size, per_head);
  for (size_t i = 0; i < m.replicas.size(); ++i) {
    const auto [swap_blocks, offload_blocks] = split_host_pool(pools[i].second, c);
    s.replicas.push_back({m.replicas[i]->address, pools[i].first, pools[i].first * block_bytes, swap_blocks,
                          swap_blocks * block_bytes, offload_blocks, offload_blocks * block_bytes, m.disk_blocks,
                          m.disk_blocks * block_bytes});
  }
  s.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

// Ends the actors and the system, whether the engine was built or its constructor threw after starting them.
Engine::Impl::~Impl() {
  if (!system) return;
  {
    std::scoped_lock lock(join_mu, state_mu);  // after a join in progress: its replica is shut down below
    stopping = true;
  }
  const auto end = [](const auto& a) {
    if (a) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  };
  end(router);
  end(reconnect_actor);
  for (auto& r : replicas) {
    end(r->scheduler);
    end(r->memory_manager);
    for (auto& e : r->executors) end(e);
  }
  // The system waits for every detached actor to be destroyed: drop our handles first.
  router = nullptr;
  reconnect_actor = nullptr;
  for (auto& r : replicas) {
    r->scheduler = nullptr;
    r->memory_manager = nullptr;
    r->executors.clear();
  }
  system.reset();
}

Engine::~Engine() = default;

void Engine::validate(const SamplingParams& p, size_t prompt_len) const {
  const Impl& m = *impl_;
  const int vocab = m.model.vocab_size;
  if (prompt_len == 0) throw InvalidRequest("the prompt is empty", "prompt");
  if (p.priority != 0 && !m.config.priority_scheduling)
    throw InvalidRequest("'priority' needs the server's priority scheduling (--scheduling-policy priority)",
                         "priority");
  if (std::optional<FieldError> bad = check_sampling_params(p, vocab))
    throw InvalidRequest(bad->message, bad->field);
  if (p.lora != 0) {
    std::lock_guard lock(m.lora_mu);
    m.served_lora(p.lora);
  }
  for (const auto& [asked, field] : {std::pair{p.logprobs, "logprobs"}, std::pair{p.prompt_logprobs, "prompt_logprobs"}})
    if (asked && *asked > m.config.max_logprobs)
      throw InvalidRequest("'" + std::string(field) + "' asks " + std::to_string(*asked) + " logprobs; this server "
                           "returns at most " + std::to_string(m.config.max_logprobs) + " (--max-logprobs)", field);
  if (static_cast<int64_t>(prompt_len) + p.max_tokens > m.max_model_len)
    throw InvalidRequest("this model's maximum context length is " + std::to_string(m.max_model_len) +
                             " tokens; the prompt has " + std::to_string(prompt_len) + " and max_tokens asks for " +
                             std::to_string(p.max_tokens),
                         prompt_len >= static_cast<size_t>(m.max_model_len) ? "prompt" : "max_tokens");
  // A sequence that could outgrow the whole KV pool would be preempted forever: refuse it up front. Its sliding
  // groups hold their window's blocks and its chunks' only (most_blocks_held), however long it grows.
  if (most_blocks_held(m.kv_groups.windows, static_cast<int64_t>(prompt_len) + p.max_tokens, m.config.block_size,
                       m.config.max_num_batched_tokens) > m.max_seq_blocks)
    throw InvalidRequest("the prompt (" + std::to_string(prompt_len) + " tokens) plus max_tokens (" +
                             std::to_string(p.max_tokens) + ") exceeds what one sequence can hold in the KV cache (" +
                             std::to_string(m.max_seq_tokens) + " tokens; see --num-kv-blocks)",
                         "max_tokens");
  // A beam-search step needs every beam: they must fit the pool together. They share the prompt's full blocks
  // (forks, swaps; after a recompute preemption through the prefix cache only).
  if (p.use_beam_search) {
    const int beams = std::max({1, p.n, p.best_of});
    const auto needed = [&](int64_t max_tokens) {
      return most_blocks_held_by_forks(m.kv_groups.windows, static_cast<int64_t>(prompt_len),
                                       static_cast<int64_t>(prompt_len) + max_tokens, beams, m.config.block_size,
                                       m.config.max_num_batched_tokens, m.config.enable_prefix_caching);
    };
    if (const int64_t blocks = needed(p.max_tokens); blocks > m.max_seq_blocks) {
      // The width is at fault when even one token a beam does not fit; else the length.
      const bool too_wide = needed(1) > m.max_seq_blocks;
      throw InvalidRequest(std::to_string(beams) + " beams of the prompt (" + std::to_string(prompt_len) +
                               " tokens) plus max_tokens (" + std::to_string(p.max_tokens) + ") need " +
                               std::to_string(blocks) + " KV-cache blocks at once; the pool holds " +
                               std::to_string(m.max_seq_blocks) +
                               (too_wide ? ", too few for that many beams even for one token" : "") +
                               " (see --num-kv-blocks)",
                           !too_wide ? "max_tokens" : p.best_of > p.n ? "best_of" : "n");
    }
  }
}

void Engine::check_prompt_ids(const std::vector<TokenId>& prompt) const {
  const int vocab = impl_->model.vocab_size;
  for (TokenId id : prompt)
    if (id < 0 || id >= vocab)
      throw InvalidRequest("prompt token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                               std::to_string(vocab) + ")", "prompt");
}

RequestId Engine::submit(std::vector<TokenId> prompt, SamplingParams params, Sink sink) {
  {
    std::lock_guard lock(impl_->state_mu);
    if (impl_->state == EngineState::failed) throw EngineUnavailable(impl_->failure);
  }
  return start(std::move(prompt), std::move(params), std::move(sink), true);
}

RequestId Engine::start(std::vector<TokenId> prompt, SamplingParams params, Sink sink, bool limit_waiting) {
  Impl& m = *impl_;
  if (!params.bad_words.empty()) {
    validate(params, prompt.size());  // the words as written, then (below) the tokens they become
    try {
      params.bad_words_token_ids = bad_words_token_ids(*m.tokenizer, params.bad_words);
    } catch (const TokenizerError& e) {
      throw InvalidRequest(e.what(), "bad_words");
    }
  }
  validate(params, prompt.size());
  check_prompt_ids(prompt);
  if (limit_waiting && m.metrics.waiting_requests + m.metrics.unqueued_requests >= m.config.max_waiting_requests)
    throw EngineOverloaded("the server is overloaded: too many requests are waiting");
  RequestSpec spec;
  spec.id = m.next_id++;
  spec.seed = params.seed.value_or(m.random_seed());
  if (!params.ignore_eos)
    for (TokenId id : m.model.eos_token_ids) spec.stop_ids.push_back(id);
  if (!params.ignore_eos)
    for (TokenId id : m.tokenizer->eos_ids())
      if (std::find(spec.stop_ids.begin(), spec.stop_ids.end(), id) == spec.stop_ids.end()) spec.stop_ids.push_back(id);
  for (TokenId id : params.stop_token_ids) spec.stop_ids.push_back(id);
  if (std::optional<FieldError> bad = check_allowed_tokens_left(params, spec.stop_ids))
    throw InvalidRequest(bad->message, bad->field);
  if (params.structured.kind != StructuredOutput::Kind::none) {
    // The scheduler's copy advances over the tokens; a worker builds its own from the step's SamplingParams.
    try {
      spec.constraint = m.constraints->make(params.structured, spec.stop_ids,
                                            m.tokenizer->decode(prompt, params.skip_special_tokens));
    } catch (const constraint::GrammarError& e) {
      throw InvalidRequest(e.what(), params.structured.field);
    }
  }
  if (params.lora != 0) {  // its KV is found by its own adapter's requests only; counted until it ends
    std::lock_guard lock(m.lora_mu);
    auto& lora = m.served_lora(params.lora);  // again: it may have been unloaded since validate()
    params.cache_salt = hash_mix(params.cache_salt, lora.hash);
    ++lora.in_flight;
    sink = [&m, id = params.lora, sink = std::move(sink)](RequestEvent ev) {
      const bool done = ev.done;
      sink(std::move(ev));
      if (done) m.lora_request_ended(id);
    };
  }
  spec.prompt = std::make_shared<const std::vector<TokenId>>(std::move(prompt));
  spec.params = std::make_shared<const SamplingParams>(std::move(params));
  m.metrics.unqueued_requests += 1;  // until a scheduler has it (or the router refused it)
  spawn_request(*m.system, spec, m.tokenizer.get(), std::move(sink), m.router, &m.metrics);
  return spec.id;
}

void Engine::abort(RequestId id) { caf::anon_send(impl_->router, abort_atom::value, id, std::string()); }

void Engine::abort_all(const std::string& reason) { caf::anon_send(impl_->router, abort_atom::value, reason); }

void Engine::wait_idle() {
  std::vector<caf::actor> schedulers;
  {
    std::lock_guard lock(impl_->state_mu);
    for (const auto& r : impl_->replicas)
      if (r->serving) schedulers.push_back(r->scheduler);
  }
  caf::scoped_actor self{*impl_->system};
  for (const caf::actor& scheduler : schedulers)
    self->request(scheduler, caf::infinite, drained_atom::value).receive([](bool) {}, [](caf::error&) {});
}

std::vector<RequestOutput> Engine::generate(const std::vector<std::vector<TokenId>>& prompts,
                                            const SamplingParams& params, const GenerateWatch& watch) {
  // Check every prompt before starting any, so that a bad one leaves nothing running.
  for (const auto& p : prompts) {
    validate(params, p.size());
    check_prompt_ids(p);
  }
  // What the sinks update, shared with them: if start() throws for a later prompt, the requests already started
  // still send their last events after this call has returned.
  struct Run {
    std::vector<RequestOutput> outputs;
    std::mutex mu;
    std::condition_variable cv;
    size_t remaining = 0;
    int64_t generated = 0;
    std::optional<std::string> failure;
  };
  const auto run = std::make_shared<Run>();
  run->outputs.resize(prompts.size());
  run->remaining = prompts.size();
  for (size_t i = 0; i < prompts.size(); ++i) {
    RequestOutput& out = run->outputs[i];
    out.prompt_token_ids = prompts[i];
    out.outputs.resize(std::max(1, params.n));
    for (size_t k = 0; k < out.outputs.size(); ++k) out.outputs[k].index = static_cast<int>(k);
    try {
      out.id = start(prompts[i], params, [run, i](RequestEvent ev) {
        std::lock_guard lock(run->mu);
        RequestOutput& out = run->outputs[i];
        for (auto& d : ev.deltas) {
          if (d.index >= static_cast<int>(out.outputs.size())) continue;
          CompletionOutput& o = out.outputs[d.index];
          o.text += d.text;
          run->generated += static_cast<int64_t>(d.token_ids.size());
          o.token_ids.insert(o.token_ids.end(), d.token_ids.begin(), d.token_ids.end());
          o.logprobs.insert(o.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
          for (const auto& t : d.logprobs) o.cumulative_logprob += t.logprob;
          if (d.finish_reason) o.finish_reason = *d.finish_reason;
        }
        if (!ev.prompt_logprobs.empty()) out.prompt_logprobs = std::move(ev.prompt_logprobs);
        out.num_cached_tokens = ev.cached_tokens;
        if (ev.error) run->failure = *ev.error;
        if (ev.done && --run->remaining == 0) run->cv.notify_all();
      }, false);
    } catch (...) {
      for (size_t j = 0; j < i; ++j) abort(run->outputs[j].id);  // nothing of a failed call keeps running
      throw;
    }
  }
  std::unique_lock lock(run->mu);
  bool cancelled = false;
  for (;;) {
    const bool all_done = run->cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return run->remaining == 0; });
    if (watch && !cancelled) {  // every 100 ms, and once at the end
      const GenerateProgress progress{prompts.size() - run->remaining, prompts.size(), run->generated};
      lock.unlock();  // the watch may take its time (Python waits for its GIL)
      cancelled = !watch(progress);
      if (cancelled)
        for (const RequestOutput& o : run->outputs) abort(o.id);  // each ends with one last event: remaining reaches 0
      lock.lock();
    }
    if (all_done) break;
  }
  if (cancelled) throw GenerationCancelled("generation cancelled");
  if (run->failure) throw std::runtime_error(*run->failure);
  return std::move(run->outputs);
}

std::vector<RequestOutput> Engine::generate(const std::vector<std::string>& prompts, const SamplingParams& params,
                                            const GenerateWatch& watch) {
  std::vector<std::vector<TokenId>> ids;
  for (const auto& p : prompts) ids.push_back(impl_->tokenizer->encode(p, true));
  auto out = generate(ids, params, watch);
  for (size_t i = 0; i < prompts.size(); ++i) out[i].prompt = prompts[i];
  return out;
}

const Tokenizer& Engine::tokenizer() const { return *impl_->tokenizer; }

std::string Engine::Impl::give_lora(int32_t id, const std::vector<std::shared_ptr<const LoraAdapter>>& ranks) {
  const std::vector<caf::actor>& executors = replicas.at(0)->executors;
  std::string error;
  caf::scoped_actor self{*system};
  for (size_t rank = 0; rank < executors.size(); ++rank)
    self->request(executors[rank], caf::infinite, lora_atom::value, LoraMsg{id, ranks.at(rank)})
        .receive([](bool) {}, [&](caf::error& e) {
          if (error.empty()) error = system->render(e);
        });
  return error;
}

void Engine::Impl::drop_lora(int32_t id) {
  for (const caf::actor& e : replicas.at(0)->executors) caf::anon_send(e, lora_atom::value, LoraMsg{id, nullptr});
}

void Engine::Impl::lora_request_ended(int32_t id) {
  {
    std::lock_guard lock(lora_mu);
    const auto it = loras.find(id);
    if (it == loras.end() || --it->second.in_flight > 0 || it->second.served) return;
    loras.erase(it);
  }
  drop_lora(id);
}

int32_t Engine::load_lora(const std::string& name, const std::string& path) {
  Impl& m = *impl_;
  std::lock_guard load(m.lora_load_mu);
  if (name.empty()) throw InvalidRequest("a LoRA adapter needs a name", "lora_name");
  {
    std::lock_guard lock(m.lora_mu);
    for (const auto& [id, e] : m.loras)
      if (e.served && e.name == name)
        throw InvalidRequest("a LoRA adapter named '" + name + "' is served already", "lora_name");
  }
  if (const std::string why = lora_unsupported(m.config); !why.empty()) throw ModelError(why);
  const int tp = m.config.tensor_parallel_size;
  std::vector<std::shared_ptr<const LoraAdapter>> ranks;
  for (int rank = 0; rank < tp; ++rank)
    ranks.push_back(std::make_shared<const LoraAdapter>(
        load_lora_adapter(path, m.model, rank, tp, m.config.max_lora_rank)));
  int32_t id = 0;
  {
    std::lock_guard lock(m.lora_mu);
    id = m.next_lora++;
  }
  if (const std::string error = m.give_lora(id, ranks); !error.empty()) {
    m.drop_lora(id);
    throw ModelError("LoRA adapter " + name + ": " + error);
  }
  std::lock_guard lock(m.lora_mu);
  m.loras[id] = {name, path, ranks[0]->content_hash};
  return id;
}

bool Engine::unload_lora(const std::string& name) {
  Impl& m = *impl_;
  if (!m.config.workers.empty()) throw InvalidRequest(lora_unsupported(m.config), "lora_name");
  int32_t gone = 0;
  {
    std::lock_guard lock(m.lora_mu);
    const auto it = std::find_if(m.loras.begin(), m.loras.end(),
                                 [&](const auto& e) { return e.second.served && e.second.name == name; });
    if (it == m.loras.end()) return false;
    it->second.served = false;
    if (it->second.in_flight > 0) return true;  // its last request drops the weights
    gone = it->first;
    m.loras.erase(it);
  }
  m.drop_lora(gone);
  return true;
}

std::vector<LoraInfo> Engine::lora_adapters() const {
  std::lock_guard lock(impl_->lora_mu);
  std::vector<LoraInfo> out;
  for (const auto& [id, e] : impl_->loras)
    if (e.served) out.push_back({id, e.name, e.path});
  return out;
}

std::string Engine::lora_prometheus() const {
  const Impl& m = *impl_;
  const auto [running, waiting] = m.metrics.lora_use.adapters();
  std::lock_guard lock(m.lora_mu);
  if (m.next_lora == 1) return "";  // no adapter was ever served
  const auto names = [&](const std::vector<int32_t>& ids) {
    std::vector<std::string> out;
    for (int32_t id : ids)
      if (const auto it = m.loras.find(id); it != m.loras.end()) out.push_back(it->second.name);
    return out;
  };
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return lora_requests_info(names(running), names(waiting), m.config.max_loras,
                            std::chrono::duration<double>(now).count());
}

const ModelConfig& Engine::model_config() const { return impl_->model; }
const EngineConfig& Engine::config() const { return impl_->config; }
const EngineSummary& Engine::summary() const { return impl_->summary; }
Metrics& Engine::metrics() { return impl_->metrics; }
int Engine::max_model_len() const { return impl_->max_model_len; }

EngineHealth Engine::health() const {
  std::lock_guard lock(impl_->state_mu);
  EngineHealth health{impl_->state, impl_->failure, {}};
  for (const auto& r : impl_->replicas) health.replicas.push_back({r->address, r->serving, r->reason});
  return health;
}

void Engine::kv_snapshot(std::function<void(std::vector<ReplicaKv>)> done) {
  std::vector<ReplicaKv> replicas;
  std::vector<MemoryManager> managers;
  {
    std::lock_guard lock(impl_->state_mu);
    for (const auto& r : impl_->replicas)
      if (r->serving) {
        replicas.push_back({r->index, r->address, {}});
        managers.push_back(r->memory_manager);
      }
  }
  collect_kv_snapshots(*impl_->system, std::move(managers),
                       [replicas = std::move(replicas), done = std::move(done)](
                           std::vector<std::optional<KvSnapshot>> answers) mutable {
                         std::vector<ReplicaKv> out;
                         for (size_t i = 0; i < answers.size(); ++i)
                           if (answers[i])
                             out.push_back({replicas[i].index, replicas[i].address, std::move(*answers[i])});
                         done(std::move(out));
                       },
                       std::chrono::seconds(2));
}

std::string Engine::prometheus() const {
  std::vector<ReplicaView> views;
  for (const auto& r : impl_->replicas) views.push_back({r->index, r->address.empty() ? "local" : r->address, &r->metrics});
  return impl_->metrics.prometheus() + replicas_prometheus(views);
}

}  // namespace paged
