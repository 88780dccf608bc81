// paged: the command-line entry point. Subcommands: generate (offline), serve (HTTP/WebSocket API), bench (offline
// throughput), bench serve (vLLM's serving benchmark against a server), worker, gen-certs.
#include <boost/json.hpp>

#include <algorithm>
#include <fstream>
#include <iostream>

#include "actors/engine.h"
#include "tools/bench/serve_bench.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/crash_report.h"
#include "model/unicode/utf8.h"

namespace {

constexpr const char* kUsage = R"(usage:
  paged generate MODEL_DIR (--prompt TEXT | --prompts-file FILE.jsonl) [--max-tokens N] [--temperature T]
                 [--top-p P] [--top-k K] [--min-p P] [--seed S] [--n N] [--best-of N] [--use-beam-search]
                 [--length-penalty L] [--repetition-penalty R] [--presence-penalty P] [--frequency-penalty F]
                 [--stop STR] [--[no-]include-stop-str-in-output] [--stop-token-ids A,B] [--[no-]ignore-eos]
                 [--[no-]skip-special-tokens] [--min-tokens N] [--logprobs K] [--prompt-logprobs K]
                 [--allowed-token-ids A,B] [--bad-words WORD] [--logit-bias ID:BIAS,...] [--guided-json SCHEMA | --guided-regex RE | --guided-choice '["a", "b"]' |
                 --guided-grammar GBNF | --guided-structural-tag JSON | --guided-json-object]
                 [--guided-whitespace-pattern RE]
                 [--lora NAME] [--json] [--stats] [engine flags]
  paged serve MODEL_DIR [--host 127.0.0.1] [--port 8000] [--api-key KEY] [--chat-template FILE]
              [--served-model-name NAME] [--shutdown-timeout 30] [--stats-interval 10 | --disable-log-stats]
              [--enable-log-requests | --disable-log-requests] [--enable-server-load-tracking] [--seed S]
              [--allowed-origins '["*"]' | ORIGIN,ORIGIN] [--trust-request-chat-template]
              [--enable-auto-tool-choice --tool-call-parser llama3_json|hermes|mistral|pythonic]
              [--reasoning-parser deepseek_r1|qwen3]
              [--structured-outputs-in-reasoning] [--return-tokens-as-token-ids] [--generation-config auto|vllm|DIR]
              [--override-generation-config '{"temperature": 0.7}'] [--max-stored-responses 1000]
              [--ssl-certfile FILE --ssl-keyfile FILE [--ssl-ca-certs FILE --ssl-cert-reqs 0|1|2]]
              [--config conf/serve.json] [engine flags]
  paged bench MODEL_DIR [--num-prompts 1000] [--dataset-name random|sharegpt-like|sharegpt] [--dataset-path FILE]
              [--random-input-len 512] [--random-output-len 128] [--random-range-ratio 0] [--random-prefix-len 0] [--seed S]
              [--requests-out FILE.json] [--json] [--profile] [--floor-only] [--lora-path DIR] [engine flags]
              (offline throughput through the engine: a table, or with --json one JSON line; on CUDA beside the
              H200 floor of the same requests; --profile adds the step profile: per kind of step, device busy and
              idle time and host time, on stderr; --floor-only: that floor alone, from config.json, no run;
              --lora-path with --enable-lora: the adapter loaded --max-loras times, each request of one at random)
  paged bench MODEL_DIR --dataset-name multiturn [--num-conversations 32] [--num-turns 8] [--system-prompt-len 1024]
              [--message-len 128] [--output-len 128] [--think-time 0.5] [--seed S] [--json] [engine flags]
              (conversations that send their whole history each turn: TTFT p50/p99, output tok/s, hit tokens per
              tier, prompt tokens computed; with --kv-offloading-size, the same run again without the CPU tier)
  paged bench serve --base-url http(s)://HOST:PORT [--endpoint /v1/completions] [--model NAME] [--tokenizer DIR]
              [--api-key KEY] [--num-prompts 1000] [--dataset-name random|sharegpt-like|sharegpt]
              [--dataset-path FILE] [--random-input-len 1024] [--random-output-len 128] [--random-range-ratio 0]
              [--seed S] [--request-rate inf] [--burstiness 1] [--max-concurrency N] [--goodput KEY:MS ...]
              [--percentile-metrics ttft,tpot,itl] [--metric-percentiles 99] [--ignore-eos] [--disable-tqdm]
              [--result-file FILE.json] [--json-schema FILE] [--ssl-ca-certs CA.pem]
              (vLLM's serving benchmark against a running server; KEY of ttft, tpot, e2el; sharegpt needs
              --tokenizer; the API key also from OPENAI_API_KEY or PAGED_API_KEY; --json-schema: every request's
              answer constrained to that schema, structured outputs; https:// checks the server's certificate
              against --ssl-ca-certs, else the system's CAs)
  paged worker MODEL_DIR [--host 127.0.0.1] [--port 7000] [--tls-dir DIR] [engine flags]
               (runs one replica of the model for an engine started elsewhere with --workers; a --host off
               loopback needs --tls-dir)
  paged gen-certs DIR [--host NAME]... [--days 825] [--force]
               (writes a deployment's ca.pem, node.pem, node-key.pem for --tls-dir DIR on every host)
MODEL_DIR may also be given as --model DIR (serve: conf/serve.json's "model" when neither is). Every on/off flag
takes --NAME, --no-NAME or --NAME=true|false. --help and --version work with every command. serve reads the API key
from --api-key, else the environment variable PAGED_API_KEY.
engine flags:
  --device cuda|cpu|auto  --block-size B  --num-kv-blocks N  --swap-space GiB  --gpu-memory-utilization F
  --kv-offloading-size GiB (the prefix cache's CPU tier)  --kv-disk-dir DIR --kv-disk-size GiB (its disk tier)
  --max-num-seqs N  --max-num-batched-tokens N  --max-model-len N  --[no-]enable-prefix-caching
  --long-prefill-token-threshold N (a sequence's tokens in one step at most: long prompts in chunks; 0: no limit)
  --preemption-mode swap|recompute  --tensor-parallel-size N  --[no-]async-scheduling
  --scheduling-policy fcfs|priority (priority: a request's `priority`, lower first, then arrival)
  --max-waiting-requests N  --load-format auto|dummy  --quantization auto|fp8|none (FP8 weights, CUDA;
    auto: a pre-quantised FP8 checkpoint's own, none: it dequantised)
  --kv-cache-dtype auto|fp8 (fp8: e4m3 KV with per-token scales, about twice the blocks; CUDA)
  --dtype auto|bfloat16|float32 (the device's: bfloat16 on CUDA, float32 on the CPU)  --enforce-eager (no CUDA
            graphs)  --max-logprobs N (20)  --trust-remote-code (taken: every family is built in)
  --nano-batch-rows N (CUDA: decode steps of N rows or more as two nano-batches on two streams, the attention of
            one beside the linear layers of the other; 0: off)
  --workers HOST:PORT[,HOST:PORT...] (one replica per `paged worker`; a lost one is reconnected and its requests
            move to another; --remote-executor HOST:PORT is one)
  --tls-dir DIR (mutual TLS with the workers, with the files of `paged gen-certs DIR`)
  --speculative-config '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}' (drafts from
            the sequence's own earlier tokens, verified in one step; outputs as without it)
  --enable-lora --lora-modules NAME=PATH [NAME=PATH ...] (PEFT LoRA adapters, each served as a model; also
            '{"name": ..., "path": ...}')  --max-lora-rank N (16)  --max-loras N (1: at once)
)";

namespace json = boost::json;
using namespace paged;

std::vector<std::string> read_prompts_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open prompts file " + path);
  std::vector<std::string> prompts;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(lineno) + ": ";
    if (!utf8::is_valid(line)) throw std::runtime_error(where + "the line is not valid UTF-8");
    boost::system::error_code ec;
    json::value v = json::parse(line, ec);
    if (ec) throw std::runtime_error(where + "not valid JSON (" + ec.message() + ")");
    if (!v.is_object() || !v.as_object().contains("prompt") || !v.at("prompt").is_string())
      throw std::runtime_error(where + "expected {\"prompt\": \"...\"}");
    prompts.emplace_back(v.at("prompt").as_string());
  }
  if (prompts.empty()) throw std::runtime_error("no prompts in " + path);
  return prompts;
}

json::array to_json(const std::vector<TokenId>& ids) {
  json::array a;
  for (TokenId t : ids) a.push_back(t);
  return a;
}

int generate(cli::Args& args) {
  EngineConfig config = cli::engine_config(args);
  SamplingParams params = cli::sampling_params(args);
  const bool as_json = args.get_bool("json", false), stats = args.get_bool("stats", false);
  auto prompt = args.get("prompt");
  auto file = args.get("prompts-file");
  const std::optional<std::string> lora = args.get("lora");
  args.reject_unknown();
  if (prompt.has_value() == file.has_value()) throw cli::UsageError("give exactly one of --prompt and --prompts-file");
  std::vector<std::string> prompts = prompt ? std::vector<std::string>{*prompt} : read_prompts_file(*file);

  Engine engine(config);
  if (lora) {  // one of --lora-modules' adapters runs every prompt
    for (const LoraInfo& l : engine.lora_adapters())
      if (l.name == *lora) params.lora = l.id;
    if (params.lora == 0) throw cli::UsageError("--lora " + *lora + ": no adapter of that name in --lora-modules");
  }
  // A refused sampling flag is a usage error, not a prompt's.
  const auto flag_error = [](const InvalidRequest& e) {
    std::string flag = e.param;
    std::replace(flag.begin(), flag.end(), '_', '-');
    return cli::UsageError("invalid --" + flag + ": " + e.what());
  };
  // The sampling flags first, against a one-token prompt.
  try {
    engine.validate(params, 1);
  } catch (const InvalidRequest& e) {
    throw flag_error(e);
  }
  // Tokenize and validate every prompt first: a bad one fails the command before any work starts.
  std::vector<std::vector<TokenId>> ids;
  for (size_t i = 0; i < prompts.size(); ++i) {
    try {
      ids.push_back(engine.tokenizer().encode(prompts[i], true));
      engine.validate(params, ids.back().size());
      engine.check_prompt_ids(ids.back());  // a tokenizer larger than the model's vocabulary
    } catch (const std::exception& e) {
      throw std::runtime_error("prompt " + std::to_string(i + 1) + ": " + e.what());
    }
  }
  std::vector<RequestOutput> outputs;
  try {
    outputs = engine.generate(ids, params);
  } catch (const InvalidRequest& e) {  // a structured output that does not compile
    throw flag_error(e);
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const RequestOutput& r = outputs[i];
    if (as_json) {
      json::object o;
      o["prompt"] = prompts[i];
      o["prompt_token_ids"] = to_json(r.prompt_token_ids);
      if (params.prompt_logprobs) {  // entry i scores prompt token i + 1, as vLLM's (its first entry, None, left out)
        json::array lps;
        for (const PromptLogprob& t : r.prompt_logprobs) lps.push_back(t.logprob);
        o["prompt_logprobs"] = std::move(lps);
      }
      json::array outs;
      for (const auto& c : r.outputs) {
        json::object co;
        co["text"] = c.text;
        co["token_ids"] = to_json(c.token_ids);
        co["finish_reason"] = c.finish_reason;
        if (params.logprobs) {
          json::array lps;
          for (const auto& t : c.logprobs) lps.push_back(t.logprob);
          co["logprobs"] = std::move(lps);
        }
        outs.push_back(std::move(co));
      }
      o["outputs"] = std::move(outs);
      std::cout << json::serialize(o) << '\n';
    } else {
      for (const auto& c : r.outputs) std::cout << prompts[i] << c.text << "\n" << (r.outputs.size() > 1 ? "--\n" : "");
    }
  }
  if (stats) {
    engine.wait_idle();
    Metrics& m = engine.metrics();
    json::object s;
    s["preemptions"] = m.preemptions.load();
    s["swapped_out_blocks"] = m.swapped_out_blocks.load();
    s["prefix_cache_hit_tokens"] = m.prefix_cache_hit_tokens.load();
    s["kv_offload_hit_tokens"] = m.offload_hit_tokens.load();
    s["kv_offloaded_blocks"] = m.offloaded_blocks.load();
    s["kv_disk_hit_tokens"] = m.disk_hit_tokens.load();
    s["prompt_tokens_computed"] = m.prompt_tokens_computed.load();
    s["kv_blocks_total"] = m.kv_blocks_total.load();
    s["kv_blocks_free_at_end"] = m.kv_blocks_free.load();
    s["peak_running_seqs"] = m.peak_running_seqs.load();
    std::cout << json::serialize(json::object{{"stats", s}}) << '\n';
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  cli::install_crash_report();
  if (argc < 2) {  // a usage error: the message and the usage go to stderr, as for every other one
    std::cerr << "paged: missing command\n" << kUsage;
    return 2;
  }
  // --help and --version anywhere on the line, for every command.
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      return 0;
    }
    if (a == "--version") {
      std::cout << "paged " << PAGED_VERSION << "\n";
      return 0;
    }
  }
  const std::string cmd = argv[1];
  try {
    auto switches = cli::engine_switches();
    switches.insert(switches.end(), {"json", "stats", "force", "enable-log-requests", "disable-log-requests",
                                     "disable-log-stats", "enable-server-load-tracking",
                                     "trust-request-chat-template", "enable-auto-tool-choice",
                                     "structured-outputs-in-reasoning",
                                     "profile", "floor-only"});
    if (cmd == "gen-certs") {
      if (argc < 3 || std::string(argv[2]).rfind("--", 0) == 0)
        throw cli::UsageError("gen-certs needs the folder to write: paged gen-certs DIR");
      cli::Args args(argc, argv, 3, switches);
      return cli::run_gen_certs_command(argv[2], args);
    }
    if (cmd == "bench" && argc > 2 && std::string_view(argv[2]) == "serve")
      return bench::run_bench_serve_command(argc, argv, 3);
    cli::Args args(argc, argv, 2, switches);
    if (cmd == "generate") return generate(args);
    if (cmd == "serve") return cli::run_serve_command(args);
    if (cmd == "bench") return cli::run_bench_command(args);
    if (cmd == "worker") return cli::run_worker_command(args);
    throw cli::UsageError("unknown command '" + cmd + "'");
  } catch (const cli::UsageError& e) {
    std::cerr << "paged: " << e.what() << "\n" << kUsage;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "paged: error: " << e.what() << "\n";
    return 1;
  }
}
