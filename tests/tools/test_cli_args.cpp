// The command line's fallbacks from a configuration file (conf/serve.json's "engine"): file values where no flag is
// given, flags over them, unknown keys and bad values refused naming the key.
#include <catch2/catch.hpp>

#include <boost/json.hpp>
#include <functional>
#include <string>
#include <vector>

#include "model/json_file.h"
#include "tools/cli.h"

using namespace paged;
using namespace paged::cli;

namespace {

/// Args over `words` (after "paged serve"), with the engine switches.
Args args_of(std::vector<std::string> words) {
  static std::vector<std::string> storage;
  storage = {"paged", "serve"};
  storage.insert(storage.end(), words.begin(), words.end());
  std::vector<char*> argv;
  for (std::string& w : storage) argv.push_back(w.data());
  return Args(static_cast<int>(argv.size()), argv.data(), 2, engine_switches());
}

std::string usage_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("conf/serve.json's engine object holds the engine's built-in defaults", "[cli]") {
  const boost::json::object root = read_json_object<std::runtime_error>(std::string(PAGED_SOURCE_DIR) + "/conf/serve.json");
  Args args = args_of({"models/x"});
  args.fall_back_to(root.at("engine").as_object(), "serve.json: engine");
  const EngineConfig c = engine_config(args), d;
  args.reject_unknown();  // every key of the file is an engine flag
  CHECK(c.device == d.device);
  CHECK(c.load_format == d.load_format);
  CHECK(c.block_size == d.block_size);
  CHECK(c.num_kv_blocks == d.num_kv_blocks);
  CHECK(c.swap_space_gib == d.swap_space_gib);
  CHECK(c.gpu_memory_utilization == d.gpu_memory_utilization);
  CHECK(c.max_num_seqs == d.max_num_seqs);
  CHECK(c.max_num_batched_tokens == d.max_num_batched_tokens);
  CHECK(c.lora_modules.empty());
  CHECK(c.max_lora_rank == d.max_lora_rank);
  CHECK(c.max_loras == d.max_loras);
  CHECK(c.max_model_len == d.max_model_len);
  CHECK(c.enable_prefix_caching == d.enable_prefix_caching);
  CHECK(c.preemption_mode == d.preemption_mode);
  CHECK(c.tensor_parallel_size == d.tensor_parallel_size);
  CHECK(c.max_waiting_requests == d.max_waiting_requests);
  CHECK(c.workers == d.workers);
  CHECK(c.tls_dir == d.tls_dir);
  CHECK(c.nano_batch_rows == d.nano_batch_rows);
}

TEST_CASE("file values apply where no flag is given, and flags win", "[cli]") {
  const auto file = boost::json::parse(R"({"block_size": 32, "max_num_seqs": 8, "enable_prefix_caching": false,
      "swap_space": 0.5, "workers": ["h1:7000", "h2:7001"], "max_model_len": null, "preemption_mode": "swap"})");
  Args args = args_of({"m", "--max-num-seqs", "4", "--enable-prefix-caching"});
  args.fall_back_to(file.as_object(), "f: engine");
  const EngineConfig c = engine_config(args);
  args.reject_unknown();
  CHECK(c.block_size == 32);
  CHECK(c.max_num_seqs == 4);
  CHECK(c.enable_prefix_caching);
  CHECK(c.swap_space_gib == 0.5);
  CHECK(c.workers == std::vector<std::string>{"h1:7000", "h2:7001"});
  CHECK_FALSE(c.max_model_len.has_value());
  CHECK(c.preemption_mode == PreemptionMode::swap);
}

TEST_CASE("unknown keys and bad values in the file are refused naming the key", "[cli]") {
  auto with = [](const char* json) {
    return usage_error([&] {
      Args args = args_of({"m"});
      args.fall_back_to(boost::json::parse(json).as_object(), "f: engine");
      engine_config(args);
      args.reject_unknown();
    });
  };
  CHECK(with(R"({"max_num_seq": 8})") == "unknown key f: engine.max_num_seq");
  CHECK(with(R"({"block_size": "big"})") == "f: engine.block_size expects an integer, got 'big'");
  CHECK(with(R"({"enable_prefix_caching": "yes"})") == "f: engine.enable_prefix_caching is true or false, got 'yes'");
  CHECK(with(R"({"workers": [7000]})") == "f: engine.workers must be a list of strings");
  CHECK(with(R"({"block_size": {"a": 1}})").find("f: engine.block_size must be") == 0);
  CHECK(with(R"({"block_size": 0})") == "--block-size must be in [1, 256]");
  CHECK(with(R"({"block_size": 16})").empty());
  CHECK(with(R"({"speculative_config": {"method": "ngram", "num_speculative_tokens": 0}})") ==
        "f: engine.speculative_config: num_speculative_tokens must be at least 1");
  CHECK(with(R"({"speculative_config": {"method": "medusa", "num_speculative_tokens": 2}})")
            .find("f: engine.speculative_config.method must be \"ngram\"") == 0);
  CHECK(with(R"({"speculative_config": {"method": "ngram", "num_speculative_tokens": 2, "draft_tp": 1}})") ==
        "f: engine.speculative_config: 'draft_tp' is not supported (method, num_speculative_tokens, "
        "prompt_lookup_max, prompt_lookup_min are)");
  CHECK(with(R"({"speculative_config": {}})").empty());  // off
  CHECK(with(R"({"speculative_config": null})").empty());
}

TEST_CASE("--speculative-config takes vLLM's JSON for n-gram speculation, from the flag or the file", "[cli]") {
  Args args = args_of({"m", "--speculative-config",
                       R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4})"});
  EngineConfig c = engine_config(args);
  args.reject_unknown();
  CHECK(c.speculative_config.num_speculative_tokens == 3);
  CHECK(c.speculative_config.prompt_lookup_max == 4);
  CHECK(c.speculative_config.prompt_lookup_min == 4);  // one bound given is both (vLLM's)
  Args from_file = args_of({"m"});
  from_file.fall_back_to(boost::json::parse(R"({"speculative_config": {"method": "ngram",
      "num_speculative_tokens": 5, "prompt_lookup_min": 2}})").as_object(), "f: engine");
  c = engine_config(from_file);
  CHECK(c.speculative_config.num_speculative_tokens == 5);
  CHECK(c.speculative_config.prompt_lookup_min == 2);
  CHECK(c.speculative_config.prompt_lookup_max == 2);
  Args neither = args_of({"m", "--speculative-config", R"({"method": "ngram", "num_speculative_tokens": 2})"});
  c = engine_config(neither);
  CHECK(c.speculative_config.prompt_lookup_min == 5);
  CHECK(c.speculative_config.prompt_lookup_max == 5);
  Args none = args_of({"m"});
  CHECK_FALSE(engine_config(none).speculative_config.enabled());
}

TEST_CASE("vLLM's --dtype, --enforce-eager, --max-logprobs, --trust-remote-code; --nano-batch-rows", "[cli]") {
  Args args = args_of({"m", "--dtype", "bfloat16", "--enforce-eager", "--max-logprobs", "5", "--trust-remote-code"});
  const EngineConfig c = engine_config(args);
  args.reject_unknown();
  CHECK(c.dtype == "bfloat16");
  CHECK(c.enforce_eager);
  CHECK(c.max_logprobs == 5);
  const auto refused = [](std::vector<std::string> words) {
    return usage_error([&] {
      Args a = args_of(words);
      engine_config(a);
    });
  };
  CHECK(refused({"m", "--dtype", "float16"}).find("--dtype must be auto, bfloat16 (CUDA) or float32 (CPU)") == 0);
  CHECK(refused({"m", "--max-logprobs", "21"}).find("--max-logprobs must be in [0, 20]") == 0);
  CHECK(refused({"m", "--nano-batch-rows", "-1"}).find("--nano-batch-rows must be >= 0") == 0);
  CHECK(engine_config(args).nano_batch_rows == 0);
  Args nano = args_of({"m", "--nano-batch-rows", "512"});
  CHECK(engine_config(nano).nano_batch_rows == 512);
}

TEST_CASE("vLLM's --enable-lora --lora-modules take NAME=PATH and JSON entries, several after the flag", "[cli]") {
  Args args = args_of({"--enable-lora", "--lora-modules", "sql=/a/sql", R"({"name": "chat", "path": "/b/c", "base_model_name": "m"})",
                       "m", "--max-lora-rank", "64", "--max-loras", "2"});
  EngineConfig c = engine_config(args);
  args.reject_unknown();
  CHECK(c.model_dir == "m");
  REQUIRE(c.lora_modules.size() == 2);
  CHECK(c.lora_modules[0].name == "sql");
  CHECK(c.lora_modules[0].path == "/a/sql");
  CHECK(c.lora_modules[1].name == "chat");
  CHECK(c.lora_modules[1].path == "/b/c");
  CHECK(c.max_lora_rank == 64);
  CHECK(c.max_loras == 2);
  Args from_file = args_of({"m"});
  from_file.fall_back_to(boost::json::parse(R"({"enable_lora": true, "lora_modules": ["a=/x", "b=/y"]})").as_object(),
                         "f: engine");
  c = engine_config(from_file);
  REQUIRE(c.lora_modules.size() == 2);
  CHECK(c.lora_modules[1].name == "b");
  CHECK(c.lora_modules[1].path == "/y");
  const auto refused = [](std::vector<std::string> words) {
    return usage_error([&] {
      Args a = args_of(words);
      engine_config(a);
    });
  };
  CHECK(refused({"m", "--lora-modules", "a=/x"}) == "--lora-modules needs --enable-lora");
  CHECK(refused({"m", "--enable-lora", "--lora-modules", "=/x"}).find("--lora-modules takes NAME=PATH") == 0);
  CHECK(refused({"m", "--enable-lora", "--lora-modules", R"({"name": "a"})"}).find("needs \"name\" and \"path\"") !=
        std::string::npos);
  CHECK(refused({"m", "--enable-lora", "--lora-modules", R"({"name": "a", "path": "/p", "x": "1"})"})
            .find("'x' is not supported") != std::string::npos);
  CHECK(refused({"m", "--max-lora-rank", "0"}) == "--max-lora-rank must be in [1, 512]");
}
