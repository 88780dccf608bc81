// `paged bench serve`: vLLM's online serving benchmark (vllm bench serve) against an OpenAI-compatible server.
#pragma once

#include <string>
#include <vector>

namespace paged::bench {

/// `paged bench serve --base-url URL [flags]` with argv[first..] its flags: streams --num-prompts completions from
/// URL's --endpoint (/v1/completions) at --request-rate (Poisson arrivals shaped by --burstiness; inf: a burst), at
/// most --max-concurrency at once, and prints vLLM's result table (TTFT, TPOT, ITL, E2EL; throughput; goodput under
/// --goodput KEY:MS ...) on stdout, the progress on stderr, the full result to --result-file. Failed requests are
/// counted and reported, and the exit code stays 0 (as vLLM); a server that cannot be reached at the start (GET
/// /v1/models) is an error. UsageError for a bad flag.
int run_bench_serve_command(int argc, char** argv, int first);

/// argv[first..] with every run of plain words after a flag in `multi_value` split into one flag per word:
/// `--goodput ttft:500 tpot:50` becomes `--goodput ttft:500 --goodput tpot:50` (vLLM's nargs="+").
std::vector<std::string> expand_multi_value_flags(int argc, char** argv, int first,
                                                  const std::vector<std::string>& multi_value);

}  // namespace paged::bench
