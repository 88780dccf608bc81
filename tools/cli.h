// Command-line parsing shared by the subcommands of `paged`: engine flags and sampling flags with vLLM's names.
#pragma once

#include <boost/json.hpp>

#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "actors/engine.h"

namespace paged::cli {

/// A bad command line: printed with the usage, exit code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Flags as given: `--name value`, `--name=value`, a switch (`--name` / `--no-name`, or `--name=true|false`), and
/// one positional argument, the model (vLLM's `serve MODEL`), which counts as --model.
class Args {
 public:
  /// `switches` are flags that take no value (each also as --no-NAME).
  Args(int argc, char** argv, int first, const std::vector<std::string>& switches);
  /// The flag's last value; UsageError when it was given without one.
  std::optional<std::string> get(const std::string& name);
  /// Every value of a repeatable flag, in order.
  std::vector<std::string> get_all(const std::string& name);
  bool has(const std::string& name);
  /// A switch: true for --name, false for --no-name, `fallback` when neither is given.
  bool get_bool(const std::string& name, bool fallback);
  int get_int(const std::string& name, int fallback);
  double get_double(const std::string& name, double fallback);
  /// Throws UsageError naming any flag that no getter asked for (and any key of the fallbacks).
  void reject_unknown() const;
  /// Values for flags not given on the command line, from a JSON object of a configuration file (conf/serve.json's
  /// "engine"): key max_num_seqs is flag --max-num-seqs; a string, number or boolean is the flag's value, a list of
  /// strings its values joined by commas, an object (speculative_config only) its JSON text, null the flag's
  /// default. `where` names the object in messages.
  void fall_back_to(const boost::json::object& options, const std::string& where);
  /// How messages name a flag: "--name", or "WHERE.key" when its value came from the fallbacks.
  std::string label(const std::string& name) const;

 private:

  std::map<std::string, std::vector<std::string>> values_;
  std::map<std::string, std::optional<std::string>> fallbacks_;  // flag name -> value (nullopt: the default)
  std::string fallbacks_where_;
  std::map<std::string, bool> used_;
  std::vector<std::string> valueless_;  // flags given last or before another flag, that are not switches
};

/// Engine flags: --model (or the positional MODEL), --device, --block-size, --num-kv-blocks, --swap-space, --gpu-memory-utilization,
/// --max-num-seqs, --max-num-batched-tokens, --max-model-len, --[no-]enable-prefix-caching, --preemption-mode,
/// --tensor-parallel-size, --max-waiting-requests, --load-format auto|dummy, --workers (or --remote-executor), --tls-dir,
/// --speculative-config JSON, --enable-lora with --lora-modules, --max-lora-rank, --max-loras.
/// `default_model`: the model when neither is given (conf/serve.json's); empty: the model is required.
EngineConfig engine_config(Args& args, const std::string& default_model = "");
/// vLLM's --lora-modules entries in `value`: NAME=PATH (several joined by commas: a configuration file's list) or
/// a JSON object {"name", "path", "base_model_name"}. Throws UsageError naming `label` for anything else.
std::vector<EngineConfig::LoraModule> lora_modules(const std::string& value, const std::string& label);
/// vLLM's --speculative-config JSON for method "ngram": num_speculative_tokens (required, 1 to 16), prompt_lookup_max
/// and prompt_lookup_min (one given is both; neither: 5). Throws UsageError naming `label` and what is wrong (another
/// method, an unknown key, a bad value).
NgramSpeculation speculative_config(const std::string& text, const std::string& label);
/// Sampling flags: --max-tokens, --temperature, --top-p, --top-k, --min-p, --seed, --n, --best-of,
/// --[no-]use-beam-search, --length-penalty, --repetition-penalty, --presence-penalty, --frequency-penalty, --stop (repeatable),
/// --stop-token-ids, --allowed-token-ids, --bad-words (repeatable), --logit-bias ID:BIAS,..., --[no-]ignore-eos,
/// --[no-]skip-special-tokens, --[no-]include-stop-str-in-output, --min-tokens, --logprobs; structured outputs:
/// --guided-json SCHEMA, --guided-regex RE, --guided-choice '["a", "b"]', --guided-grammar GBNF,
/// --guided-structural-tag JSON or --guided-json-object, with --guided-whitespace-pattern RE for the JSON ones.
SamplingParams sampling_params(Args& args);
/// --seed as a non-negative integer (below 2^64), nullopt when absent. Throws UsageError for anything else.
std::optional<uint64_t> seed_flag(Args& args);
/// Switches the two functions above understand.
std::vector<std::string> engine_switches();

}  // namespace paged::cli
