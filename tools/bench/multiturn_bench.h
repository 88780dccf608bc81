// `paged bench --dataset-name multiturn`: the lunchtime benchmark. Conversations return with their whole history,
// so a KV pool that their histories outgrow recomputes them unless the prefix cache keeps them (the CPU tier).
#pragma once

#include "actors/engine_types.h"

namespace paged::cli {
class Args;
}

namespace paged::bench {

/// Runs the multiturn dataset (multiturn_options: C conversations x T turns behind a shared system prompt) through
/// an engine of `config`: every conversation's first turn at once, staggered over one think time; each later turn
/// (the history, its replies included, and a new message; greedy, ignore_eos, --output-len tokens) think time after
/// the conversation's reply. Prints duration, output tok/s, TTFT p50 / p99, prompt tokens computed and hit tokens
/// per tier (a table, or one JSON line with --json). With config.kv_offloading_gib > 0 it runs the same dataset a
/// second time with the CPU tier (and the disk tier below it) off, and prints both and the ratios. UsageError for a bad flag or histories longer
/// than the model's context.
int run_multiturn_bench(cli::Args& args, const EngineConfig& config);

}  // namespace paged::bench
