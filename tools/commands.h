// The `paged serve`, `paged bench` and `paged worker` subcommands.
#pragma once

#include "tools/cli.h"

namespace paged::cli {

/// `paged serve`: conf/serve.json (or --config FILE) gives the defaults, flags override them; blocks until SIGINT
/// or SIGTERM. Returns the exit code.
int run_serve_command(Args& args);

/// `paged bench`: offline throughput of the engine, the way vLLM's benchmark_throughput reports it: requests/s,
/// output tok/s, total tok/s, plus peak running sequences and KV waste. Requests of tools/bench/datasets.h
/// (--dataset-name random (default; --random-input-len 512, --random-output-len 128, --random-range-ratio),
/// sharegpt-like or sharegpt with --dataset-path FILE; --num-prompts 1000, --seed), greedy with ignore_eos; the
/// progress on stderr. Prints a table, or with --json one JSON line; --requests-out FILE saves the lengths.
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
