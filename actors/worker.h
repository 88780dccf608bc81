// A worker: one executor (the whole model, CPU or CUDA) published on a TCP port through CAF's network layer, for an
// engine on another host (EngineConfig::remote_executor). The engine keeps the scheduler, the KV bookkeeping and
// the requests; each step travels to the worker as a PackedStep (actors/step_wire.h) and the samples come back.
// Off loopback only with mutual TLS (actors/tls.h): EngineConfig::tls_dir names the deployment's certificates.
//   paged worker --model DIR --host 0.0.0.0 --port 7000 --tls-dir certs          # on the GPU host
//   paged serve --model DIR --remote-executor gpu-host:7000 --tls-dir certs
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "actors/engine_types.h"

namespace paged {

struct WorkerInfo;

class Worker {
 public:
  /// Loads the model, builds the runner as an engine with tensor_parallel_size 1 would, and listens on host:port
  /// (port 0: any free port, see port()), through TLS when config.tls_dir is set. Throws ModelError on bad options,
  /// a non-loopback host without tls_dir, an unusable tls_dir, or a port it cannot listen on.
  Worker(EngineConfig config, const std::string& host, uint16_t port);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  uint16_t port() const;
  /// What the worker tells an engine that connects: model shape, device, block size and KV pools.
  const WorkerInfo& info() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace paged
