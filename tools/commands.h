// The `paged serve`, `paged bench` and `paged worker` subcommands.
#pragma once

#include "tools/cli.h"

namespace paged::cli {

/// `paged serve`: conf/serve.json (or --config FILE) gives the defaults, flags override them; blocks until SIGINT
/// or SIGTERM. Returns the exit code.
int run_serve_command(Args& args);

/// `paged bench`: offline throughput of the engine on synthetic requests (random prompt ids, ignore_eos), the way
/// vLLM's benchmark_throughput reports it: requests/s, output tok/s, total tok/s, plus peak running sequences and
/// KV waste. --num-prompts N, --input-len L --output-len O (fixed lengths) or --dataset sharegpt (seeded
/// lognormal lengths, mean input 161 and output 338 as ShareGPT in the PagedAttention paper, pruned like vLLM's
/// benchmark: prompt <= 1024, prompt + output <= 2048), --seed S.
/// Prints one JSON line.
int run_bench_command(Args& args);

/// `paged worker`: builds the model's executor (engine flags as for serve; tensor-parallel size 1) and publishes it
/// on --host (127.0.0.1) / --port (7000; 0 picks a free one) for engines started with --workers; with
/// --tls-dir DIR through mutual TLS, which a host off loopback requires (UsageError without it).
/// Prints "paged worker: listening on HOST:PORT ..." once ready and blocks until SIGINT or SIGTERM.
int run_worker_command(Args& args);

/// `paged gen-certs DIR [--host NAME]... [--days N] [--force]`: writes a new deployment's ca.pem, node.pem and
/// node-key.pem into DIR (actors/tls_certs.h) and says what to do with them. Returns the exit code.
int run_gen_certs_command(const std::string& dir, Args& args);

}  // namespace paged::cli
