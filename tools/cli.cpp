#include "tools/cli.h"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "model/sampling/params_check.h"

namespace paged::cli {

Args::Args(int argc, char** argv, int first, const std::vector<std::string>& switches) {
  const auto is_switch = [&](const std::string& name) {
    return std::find(switches.begin(), switches.end(), name) != switches.end();
  };
  std::optional<std::string> positional;
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0) {
      if (positional) throw UsageError("unexpected argument '" + a + "' (the model is already " + *positional + ")");
      positional = a;
      continue;
    }
    std::string name = a.substr(2), value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
      if (is_switch(name) && value != "true" && value != "false")
        throw UsageError("--" + name + " is on or off: --" + name + ", --no-" + name + " or --" + name + "=true|false");
    } else if (is_switch(name)) {
      value = "true";
    } else if (name.rfind("no-", 0) == 0 && is_switch(name.substr(3))) {
      name = name.substr(3);
      value = "false";
    } else if (i + 1 >= argc || std::string_view(argv[i + 1]).rfind("--", 0) == 0) {
      valueless_.push_back(name);  // reject_unknown names it if unknown, get() if it needs a value
      continue;
    } else {
      value = argv[++i];
    }
    values_[name].push_back(value);
    // vLLM's --lora-modules takes several values: NAME=PATH or a JSON object each, up to the next flag.
    if (name == "lora-modules")
      while (i + 1 < argc && argv[i + 1][0] != '-' &&
             (std::string_view(argv[i + 1]).find('=') != std::string_view::npos || argv[i + 1][0] == '{'))
        values_[name].push_back(argv[++i]);
  }
  if (positional) {
    if (values_.count("model")) throw UsageError("the model is given twice: as " + *positional + " and --model");
    values_["model"].push_back(*positional);
  }
}

void Args::fall_back_to(const boost::json::object& options, const std::string& where) {
  fallbacks_where_ = where;
  for (const auto& [key, value] : options) {
    std::string name(key);
    std::replace(name.begin(), name.end(), '_', '-');
    const std::string label = where + "." + std::string(key);
    std::optional<std::string>& slot = fallbacks_[name];
    if (value.is_string()) {
      slot = std::string(value.get_string());
    } else if (value.is_bool()) {
      slot = value.get_bool() ? "true" : "false";
    } else if (value.is_int64() || value.is_uint64() || value.is_double()) {
      slot = boost::json::serialize(value);
    } else if (value.is_array()) {
      std::string joined;
      for (const auto& item : value.get_array()) {
        if (!item.is_string()) throw UsageError(label + " must be a list of strings");
        joined += (joined.empty() ? "" : ",") + std::string(item.get_string());
      }
      if (!value.get_array().empty()) slot = joined;  // [] is the default (none)
    } else if (value.is_object() && name == "speculative-config") {  // the one option that is JSON itself
      if (!value.get_object().empty()) slot = boost::json::serialize(value);  // {} is the default (none)
    } else if (!value.is_null()) {
      throw UsageError(label + " must be a string, a number, true/false, a list of strings or null");
    }
  }
}

std::string Args::label(const std::string& name) const {
  if (values_.count(name) || !fallbacks_.count(name)) return "--" + name;
  std::string key = name;
  std::replace(key.begin(), key.end(), '-', '_');
  return fallbacks_where_ + "." + key;
}

std::optional<std::string> Args::get(const std::string& name) {
  used_[name] = true;
  if (std::find(valueless_.begin(), valueless_.end(), name) != valueless_.end())
    throw UsageError("flag --" + name + " needs a value");
  if (auto it = values_.find(name); it != values_.end()) return it->second.back();
  if (auto it = fallbacks_.find(name); it != fallbacks_.end()) return it->second;
  return std::nullopt;
}

std::vector<std::string> Args::get_all(const std::string& name) {
  used_[name] = true;
  if (auto it = values_.find(name); it != values_.end()) return it->second;
  if (auto it = fallbacks_.find(name); it != fallbacks_.end() && it->second) return {*it->second};
  return {};
}

bool Args::has(const std::string& name) {
  used_[name] = true;
  if (values_.count(name)) return true;
  auto it = fallbacks_.find(name);
  return it != fallbacks_.end() && it->second.has_value();
}

bool Args::get_bool(const std::string& name, bool fallback) {
  const std::optional<std::string> v = get(name);
  if (v && *v != "true" && *v != "false") throw UsageError(label(name) + " is true or false, got '" + *v + "'");
  return v ? *v == "true" : fallback;
}

int Args::get_int(const std::string& name, int fallback) {
  auto v = get(name);
  if (!v) return fallback;
  try {
    size_t pos = 0;
    long long x = std::stoll(*v, &pos);
    if (pos != v->size() || x < INT32_MIN || x > INT32_MAX) throw std::invalid_argument("");
    return static_cast<int>(x);
  } catch (const std::exception&) {
    throw UsageError(label(name) + " expects an integer, got '" + *v + "'");
  }
}

double Args::get_double(const std::string& name, double fallback) {
  auto v = get(name);
  if (!v) return fallback;
  try {
    size_t pos = 0;
    double x = std::stod(*v, &pos);
    if (pos != v->size()) throw std::invalid_argument("");
    return x;
  } catch (const std::exception&) {
    throw UsageError(label(name) + " expects a number, got '" + *v + "'");
  }
}

void Args::reject_unknown() const {
  for (const std::string& name : valueless_)
    if (!used_.count(name)) throw UsageError("unknown flag --" + name);
  for (const auto& [name, _] : values_)
    if (!used_.count(name)) throw UsageError("unknown flag --" + name);
  for (const auto& [name, _] : fallbacks_)
    if (!used_.count(name)) throw UsageError("unknown key " + label(name));
}

std::vector<std::string> engine_switches() {
  return {"enable-prefix-caching", "async-scheduling", "use-beam-search", "ignore-eos", "skip-special-tokens",
          "guided-json-object", "enforce-eager", "trust-remote-code", "enable-lora"};
}

NgramSpeculation speculative_config(const std::string& text, const std::string& label) {
  boost::system::error_code ec;
  const boost::json::value v = boost::json::parse(text, ec);
  if (ec || !v.is_object())
    throw UsageError(label + " takes a JSON object, such as '{\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
                             "\"prompt_lookup_max\": 4}', got '" + text + "'");
  const boost::json::object& o = v.get_object();
  const auto integer = [&](const char* key) -> std::optional<int> {
    const boost::json::value* x = o.if_contains(key);
    if (!x || x->is_null()) return std::nullopt;
    if (!x->is_int64() || x->get_int64() < INT32_MIN || x->get_int64() > INT32_MAX)
      throw UsageError(label + "." + key + " must be an integer");
    return static_cast<int>(x->get_int64());
  };
  for (const auto& [key, _] : o)
    if (key != "method" && key != "num_speculative_tokens" && key != "prompt_lookup_max" && key != "prompt_lookup_min")
      throw UsageError(label + ": '" + std::string(key) + "' is not supported (method, num_speculative_tokens, "
                                                          "prompt_lookup_max, prompt_lookup_min are)");
  const boost::json::value* method = o.if_contains("method");
  if (!method || !method->is_string() || method->get_string() != "ngram")
    throw UsageError(label + ".method must be \"ngram\" (n-gram lookup in the sequence's own tokens; draft models, "
                             "EAGLE and MTP are not supported)");
  NgramSpeculation c;
  const std::optional<int> k = integer("num_speculative_tokens");
  if (!k) throw UsageError(label + ".num_speculative_tokens is required");
  c.num_speculative_tokens = *k;
  // vLLM's defaults: one bound given is both; neither is 5.
  const std::optional<int> lo = integer("prompt_lookup_min"), hi = integer("prompt_lookup_max");
  c.prompt_lookup_min = lo.value_or(hi.value_or(5));
  c.prompt_lookup_max = hi.value_or(lo.value_or(5));
  if (*k == 0 || !c.error().empty())
    throw UsageError(label + ": " + (*k == 0 ? "num_speculative_tokens must be at least 1" : c.error()));
  return c;
}

std::vector<EngineConfig::LoraModule> lora_modules(const std::string& value, const std::string& label) {
  std::vector<EngineConfig::LoraModule> out;
  if (!value.empty() && value.front() == '{') {  // vLLM's JSON form: {"name": ..., "path": ..., "base_model_name": ...}
    boost::system::error_code ec;
    const boost::json::value v = boost::json::parse(value, ec);
    if (ec || !v.is_object()) throw UsageError(label + ": '" + value + "' is not a JSON object");
    EngineConfig::LoraModule m;
    for (const auto& [key, item] : v.get_object()) {
      if (!item.is_string()) throw UsageError(label + ": '" + std::string(key) + "' must be a string");
      if (key == "name") m.name = item.get_string();
      else if (key == "path") m.path = item.get_string();
      else if (key != "base_model_name")  // the model the server serves: the only base an adapter has here
        throw UsageError(label + ": '" + std::string(key) + "' is not supported (name, path, base_model_name)");
    }
    if (m.name.empty() || m.path.empty()) throw UsageError(label + ": a JSON entry needs \"name\" and \"path\"");
    out.push_back(std::move(m));
    return out;
  }
  for (size_t begin = 0; begin <= value.size();) {  // NAME=PATH[,NAME=PATH...] (a configuration file's list)
    const size_t comma = std::min(value.find(',', begin), value.size());
    const std::string item = value.substr(begin, comma - begin);
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
      throw UsageError(label + " takes NAME=PATH (or a JSON object), got '" + item + "'");
    out.push_back({item.substr(0, eq), item.substr(eq + 1)});
    begin = comma + 1;
  }
  return out;
}

EngineConfig engine_config(Args& args, const std::string& default_model) {
  EngineConfig c;
  std::optional<std::string> model = args.get("model");
  if (!model && !default_model.empty()) model = default_model;
  if (!model) throw UsageError("the model is required: paged COMMAND MODEL_DIR (or --model DIR)");
  c.model_dir = *model;
  c.device = args.get("device").value_or("auto");
  c.block_size = args.get_int("block-size", c.block_size);
  if (args.has("num-kv-blocks")) c.num_kv_blocks = args.get_int("num-kv-blocks", 0);
  c.swap_space_gib = args.get_double("swap-space", c.swap_space_gib);
  c.kv_offloading_gib = args.get_double("kv-offloading-size", c.kv_offloading_gib);
  c.kv_disk_dir = args.get("kv-disk-dir").value_or("");
  c.kv_disk_gib = args.get_double("kv-disk-size", c.kv_disk_gib);
  c.gpu_memory_utilization = args.get_double("gpu-memory-utilization", c.gpu_memory_utilization);
  c.max_num_seqs = args.get_int("max-num-seqs", c.max_num_seqs);
  c.max_num_batched_tokens = args.get_int("max-num-batched-tokens", c.max_num_batched_tokens);
  c.long_prefill_token_threshold = args.get_int("long-prefill-token-threshold", c.long_prefill_token_threshold);
  if (args.has("max-model-len")) c.max_model_len = args.get_int("max-model-len", 0);
  c.enable_prefix_caching = args.get_bool("enable-prefix-caching", c.enable_prefix_caching);
  c.async_scheduling = args.get_bool("async-scheduling", c.async_scheduling);
  if (auto spec = args.get("speculative-config"))
    c.speculative_config = speculative_config(*spec, args.label("speculative-config"));
  if (auto policy = args.get("scheduling-policy")) {
    if (*policy != "fcfs" && *policy != "priority") throw UsageError("--scheduling-policy must be fcfs or priority");
    c.priority_scheduling = *policy == "priority";
  }
  if (auto mode = args.get("preemption-mode")) {
    if (*mode == "swap") c.preemption_mode = PreemptionMode::swap;
    else if (*mode == "recompute") c.preemption_mode = PreemptionMode::recompute;
    else throw UsageError("--preemption-mode must be swap or recompute");
  }
  c.tensor_parallel_size = args.get_int("tensor-parallel-size", c.tensor_parallel_size);
  c.max_waiting_requests = args.get_int("max-waiting-requests", c.max_waiting_requests);
  c.load_format = args.get("load-format").value_or(c.load_format);
  c.quantization = args.get("quantization").value_or(c.quantization);
  c.kv_cache_dtype = args.get("kv-cache-dtype").value_or(c.kv_cache_dtype);
  c.dtype = args.get("dtype").value_or(c.dtype);
  c.enforce_eager = args.get_bool("enforce-eager", c.enforce_eager);
  c.nano_batch_rows = args.get_int("nano-batch-rows", c.nano_batch_rows);
  c.max_logprobs = args.get_int("max-logprobs", c.max_logprobs);
  c.enable_lora = args.get_bool("enable-lora", c.enable_lora);
  for (const std::string& value : args.get_all("lora-modules"))
    for (EngineConfig::LoraModule& m : lora_modules(value, args.label("lora-modules")))
      c.lora_modules.push_back(std::move(m));
  if (!c.lora_modules.empty() && !c.enable_lora) throw UsageError("--lora-modules needs --enable-lora");
  c.max_lora_rank = args.get_int("max-lora-rank", c.max_lora_rank);
  c.max_loras = args.get_int("max-loras", c.max_loras);
  if (c.max_lora_rank < 1 || c.max_lora_rank > 512) throw UsageError("--max-lora-rank must be in [1, 512]");
  if (c.max_loras < 1) throw UsageError("--max-loras must be positive");
  // vLLM's --trust-remote-code lets a checkpoint run Python of its own; every family here is built in, so there is
  // no such code to trust or refuse: taken, and nothing changes.
  args.get_bool("trust-remote-code", false);
  if (c.kv_cache_dtype != "auto" && c.kv_cache_dtype != "fp8" && c.kv_cache_dtype != "fp8_e4m3")
    throw UsageError("--kv-cache-dtype must be auto, fp8 or fp8_e4m3, got '" + c.kv_cache_dtype + "'");
  if (c.quantization != "auto" && c.quantization != "fp8" && c.quantization != "none")
    throw UsageError("--quantization must be auto, fp8 or none, got '" + c.quantization + "'");
  // --workers H:P[,H:P...]: one replica per worker; --remote-executor H:P (the older name) is one worker.
  const std::optional<std::string> workers = args.get("workers"), remote_executor = args.get("remote-executor");
  if (workers && remote_executor) throw UsageError("--remote-executor is --workers with one entry: pass one of them");
  if (const std::optional<std::string>& list = workers ? workers : remote_executor) {
    for (size_t begin = 0; begin <= list->size();) {
      const size_t comma = std::min(list->find(',', begin), list->size());
      if (comma == begin) throw UsageError("--workers takes HOST:PORT[,HOST:PORT...], got '" + *list + "'");
      c.workers.push_back(list->substr(begin, comma - begin));
      begin = comma + 1;
    }
  }
  c.tls_dir = args.get("tls-dir").value_or("");
  if (c.load_format != "auto" && c.load_format != "dummy") throw UsageError("--load-format must be auto or dummy");
  if (c.max_waiting_requests < 1) throw UsageError("--max-waiting-requests must be positive");
  if (c.device != "auto" && c.device != "cpu" && c.device != "cuda")
    throw UsageError("--device must be auto, cpu or cuda");
  if (c.block_size < 1 || c.block_size > 256) throw UsageError("--block-size must be in [1, 256]");
  if (c.max_num_seqs < 1) throw UsageError("--max-num-seqs must be positive");
  if (c.nano_batch_rows < 0) throw UsageError("--nano-batch-rows must be >= 0 (0: decode steps run whole)");
  if (c.max_num_batched_tokens < 1) throw UsageError("--max-num-batched-tokens must be positive");
  if (c.long_prefill_token_threshold < 0) throw UsageError("--long-prefill-token-threshold must be >= 0");
  if (c.max_model_len && *c.max_model_len < 1) throw UsageError("--max-model-len must be positive");
  if (c.tensor_parallel_size < 1) throw UsageError("--tensor-parallel-size must be positive");
  if (!(c.gpu_memory_utilization > 0 && c.gpu_memory_utilization <= 1))
    throw UsageError("--gpu-memory-utilization must be in (0, 1]");
  if (!(c.swap_space_gib >= 0 && c.swap_space_gib < 1e6)) throw UsageError("--swap-space must be a number of GiB >= 0");
  if (!(c.kv_offloading_gib >= 0 && c.kv_offloading_gib < 1e6))
    throw UsageError("--kv-offloading-size must be a number of GiB >= 0");
  if (!(c.kv_disk_gib >= 0 && c.kv_disk_gib < 1e9)) throw UsageError("--kv-disk-size must be a number of GiB >= 0");
  if (c.num_kv_blocks && *c.num_kv_blocks < 1) throw UsageError("--num-kv-blocks must be positive");
  if (c.dtype != "auto" && c.dtype != "bfloat16" && c.dtype != "bf16" && c.dtype != "float32" && c.dtype != "float")
    throw UsageError("--dtype must be auto, bfloat16 (CUDA) or float32 (CPU), got '" + c.dtype + "'");
  if (c.max_logprobs < 0 || c.max_logprobs > kMaxLogprobs)
    throw UsageError("--max-logprobs must be in [0, " + std::to_string(kMaxLogprobs) + "]");
  return c;
}

std::optional<uint64_t> seed_flag(Args& args) {
  const std::optional<std::string> v = args.get("seed");
  if (!v) return std::nullopt;
  try {
    size_t pos = 0;
    // stoull would accept "-1" (as 2^64 - 1) and "12abc" (as 12).
    if (v->empty() || !std::isdigit(static_cast<unsigned char>((*v)[0]))) throw std::invalid_argument("");
    const uint64_t seed = std::stoull(*v, &pos);
    if (pos != v->size()) throw std::invalid_argument("");
    return seed;
  } catch (const std::exception&) {
    throw UsageError("--seed expects a non-negative integer, got '" + *v + "'");
  }
}

SamplingParams sampling_params(Args& args) {
  SamplingParams p;
  p.max_tokens = args.get_int("max-tokens", p.max_tokens);
  p.min_tokens = args.get_int("min-tokens", p.min_tokens);
  p.temperature = static_cast<float>(args.get_double("temperature", p.temperature));
  p.top_p = static_cast<float>(args.get_double("top-p", p.top_p));
  p.top_k = args.get_int("top-k", p.top_k);
  p.min_p = static_cast<float>(args.get_double("min-p", p.min_p));
  if (const std::optional<uint64_t> seed = seed_flag(args)) p.seed = *seed;
  p.n = args.get_int("n", p.n);
  p.best_of = args.get_int("best-of", p.best_of);
  p.use_beam_search = args.get_bool("use-beam-search", false);
  p.length_penalty = static_cast<float>(args.get_double("length-penalty", p.length_penalty));
  p.repetition_penalty = static_cast<float>(args.get_double("repetition-penalty", p.repetition_penalty));
  p.presence_penalty = static_cast<float>(args.get_double("presence-penalty", p.presence_penalty));
  p.frequency_penalty = static_cast<float>(args.get_double("frequency-penalty", p.frequency_penalty));
  p.ignore_eos = args.get_bool("ignore-eos", false);
  p.skip_special_tokens = args.get_bool("skip-special-tokens", true);
  p.include_stop_str_in_output = args.get_bool("include-stop-str-in-output", false);
  if (args.has("logprobs")) p.logprobs = args.get_int("logprobs", 0);
  if (args.has("prompt-logprobs")) p.prompt_logprobs = args.get_int("prompt-logprobs", 0);
  p.stop = args.get_all("stop");
  // A flag's comma-separated token ids.
  const auto token_ids = [&](const char* flag) {
    std::vector<TokenId> ids;
    if (auto v = args.get(flag)) {
      std::stringstream ss(*v);
      std::string item;
      while (std::getline(ss, item, ',')) {
        try {
          size_t pos = 0;
          ids.push_back(std::stoi(item, &pos));
          if (pos != item.size()) throw std::invalid_argument("");
        } catch (const std::exception&) {
          throw UsageError(std::string("--") + flag + " expects comma-separated integers");
        }
      }
    }
    return ids;
  };
  p.stop_token_ids = token_ids("stop-token-ids");
  p.allowed_token_ids = token_ids("allowed-token-ids");
  if (args.has("allowed-token-ids") && p.allowed_token_ids.empty())
    throw UsageError("--allowed-token-ids expects at least one token id");
  p.bad_words = args.get_all("bad-words");
  if (auto v = args.get("logit-bias")) {  // ID:BIAS,ID:BIAS
    std::stringstream ss(*v);
    std::string item;
    while (std::getline(ss, item, ',')) {
      try {
        const size_t colon = item.find(':');
        if (colon == std::string::npos) throw std::invalid_argument("");
        size_t id_end = 0, bias_end = 0;
        const TokenId id = std::stoi(item.substr(0, colon), &id_end);
        const float bias = std::stof(item.substr(colon + 1), &bias_end);
        if (id_end != colon || bias_end != item.size() - colon - 1 || !p.logit_bias.emplace(id, bias).second)
          throw std::invalid_argument("");
      } catch (const std::exception&) {
        throw UsageError("--logit-bias expects comma-separated TOKEN_ID:BIAS pairs, each id once");
      }
    }
  }
  // Structured outputs (vLLM's StructuredOutputsParams, as the Python API passes them): at most one.
  using Kind = StructuredOutput::Kind;
  const auto structured = [&](Kind kind, const std::string& flag, std::string spec) {
    if (p.structured.kind != Kind::none)
      throw UsageError("only one of --guided-json, --guided-regex, --guided-choice, --guided-grammar, "
                       "--guided-structural-tag and --guided-json-object may be given");
    std::string field = flag;  // as the engine names a request field: guided_json
    std::replace(field.begin(), field.end(), '-', '_');
    p.structured = {.kind = kind, .spec = std::move(spec), .field = std::move(field)};
  };
  for (const auto& [flag, kind] : {std::pair{"guided-json", Kind::json_schema}, std::pair{"guided-regex", Kind::regex},
                                   std::pair{"guided-choice", Kind::choice}, std::pair{"guided-grammar", Kind::grammar},
                                   std::pair{"guided-structural-tag", Kind::structural_tag}})
    if (auto v = args.get(flag)) structured(kind, flag, *v);
  if (args.get_bool("guided-json-object", false)) structured(Kind::json_object, "guided-json-object", "");
  if (auto v = args.get("guided-whitespace-pattern")) {
    if (p.structured.kind != Kind::json_schema && p.structured.kind != Kind::json_object)
      throw UsageError("--guided-whitespace-pattern applies to --guided-json or --guided-json-object only");
    p.structured.whitespace = *v;
  }
  return p;
}

}  // namespace paged::cli
