#include "actors/worker.h"

#include <caf/io/all.hpp>

#include "actors/actors.h"
#include "actors/tls.h"
#include "model/constraint/sequence_constraints.h"
#include "model/kv/kv_groups.h"
#include "model/loader/config.h"
#include "model/lora/lora_adapter.h"
#include "model/tokenizer/load_tokenizer.h"

namespace paged {

namespace {

// Ends the executor: it takes an exit only once `stopping` is set (worker_executor_actor).
void stop_executor(std::atomic<bool>& stopping, caf::actor& executor) {
  stopping = true;
  caf::anon_send_exit(executor, caf::exit_reason::user_shutdown);
  executor = nullptr;
}

}  // namespace

struct Worker::Impl {
  WorkerInfo info;
  std::unique_ptr<HeldTlsFiles> tls_files;  // outlives the system, which reads them on every connection
  std::unique_ptr<caf::actor_system_config> sys_cfg;
  std::unique_ptr<caf::actor_system> system;
  caf::actor executor;
  std::shared_ptr<std::atomic<bool>> stopping = std::make_shared<std::atomic<bool>>(false);
  uint16_t port = 0;
};

Worker::Worker(EngineConfig c, const std::string& host, uint16_t port) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  if (c.tensor_parallel_size != 1) throw ModelError("a worker runs the whole model: --tensor-parallel-size must be 1");
  if (!c.workers.empty()) throw ModelError("a worker runs its executor itself: no --workers");
  if (const std::string why = plain_listen_refusal(host, c.tls_dir); !why.empty()) throw ModelError(why);
  // The transport first: a bad --tls-dir fails before the model is loaded.
  m.sys_cfg = std::make_unique<caf::actor_system_config>();
  register_message_types(*m.sys_cfg);
  m.tls_files = load_transport(*m.sys_cfg, c.tls_dir);
  const ModelConfig model = load_model_config(c.model_dir);
  const int max_model_len = resolve_config(c, model, true);
  std::unique_ptr<const SafeTensors> weights =
      c.load_format == "dummy" ? nullptr : std::make_unique<const SafeTensors>(c.model_dir, c.on_load_progress);
  const KvGroups groups = kv_groups_of(model);
  RankRunner built = make_local_runner(c, model, groups, max_model_len, weights.get());
  // Its LoRA adapters, ids in --lora-modules' order (the engine's must be the same: WorkerInfo tells them).
  std::vector<std::string> lora_names;
  std::vector<uint64_t> lora_hashes;
  for (size_t i = 0; i < c.lora_modules.size(); ++i) {
    const EngineConfig::LoraModule& a = c.lora_modules[i];
    LoraAdapter adapter;
    try {
      adapter = load_lora_adapter(a.path, model, 0, 1, c.max_lora_rank);
    } catch (const ModelError& e) {
      throw ModelError("--lora-modules " + a.name + ": " + e.what());
    }
    built.runner->add_lora(static_cast<int32_t>(i + 1), adapter);
    lora_names.push_back(a.name);
    lora_hashes.push_back(adapter.content_hash);
  }
  // Structured outputs: the masks are made here, from the tokenizer's vocabulary, while each step runs.
  std::shared_ptr<const Tokenizer> tokenizer = load_tokenizer(c.model_dir);
  auto constraints = std::make_shared<constraint::SequenceConstraints>(
      std::make_shared<const constraint::TokenTrie>(*tokenizer), tokenizer);
  m.info = WorkerInfo{.device = c.device,
                      .num_layers = model.num_layers,
                      .hidden_size = model.hidden_size,
                      .num_heads = model.num_heads,
                      .num_kv_heads = model.num_kv_heads,
                      .head_dim = model.head_dim,
                      .vocab_size = model.vocab_size,
                      .block_size = c.block_size,
                      .max_model_len = max_model_len,
                      .max_num_seqs = c.max_num_seqs,
                      .max_num_batched_tokens = c.max_num_batched_tokens,
                      .max_sampled_positions = max_sampled_positions(c.max_num_seqs, c.speculative_config),
                      .num_blocks = built.num_blocks,
                      .num_swap_blocks = built.num_swap_blocks,
                      .kv_windows = groups.windows,
                      .layers_per_block = groups.layers_per_block,
                      .lora_names = std::move(lora_names),
                      .lora_hashes = std::move(lora_hashes)};
  m.system = std::make_unique<caf::actor_system>(*m.sys_cfg);
  // Not detached, although a step blocks its thread: the worker runs no other actor of its own, and a detached
  // actor would make the system's shutdown wait for the last reference to it, which a connection's teardown in
  // CAF's network layer sometimes keeps (the shutdown then hung).
  m.executor = m.system->spawn(worker_executor_actor, std::move(built.runner), m.info, std::move(constraints),
                                std::shared_ptr<const std::atomic<bool>>(m.stopping));
  auto bound = publish_executor(m.executor, host, port);
  if (!bound) {
    stop_executor(*m.stopping, m.executor);
    const std::string why = m.system->render(bound.error());
    m.system.reset();
    throw ModelError("cannot listen on " + host + ":" + std::to_string(port) + ": " + why);
  }
  m.port = *bound;
}

Worker::~Worker() {
  if (!impl_ || !impl_->system) return;
  // The middleman holds the published actor: without the unpublish the system would wait for it forever.
  impl_->system->middleman().unpublish(impl_->executor, impl_->port);
  stop_executor(*impl_->stopping, impl_->executor);
  impl_->system.reset();
}

uint16_t Worker::port() const { return impl_->port; }

const WorkerInfo& Worker::info() const { return impl_->info; }

}  // namespace paged
