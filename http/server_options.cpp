#include "http/server_options.h"

#include <boost/json.hpp>
#include <filesystem>
#include <stdexcept>

#include "model/json_file.h"
#include "model/loader/generation_config.h"

namespace paged {
namespace json = boost::json;

ServerOptions load_server_options(const std::string& json_file) {
  const json::object root = read_json_object<std::runtime_error>(json_file);
  ServerOptions o;
  for (const auto& kv : root)  // "engine" holds the engine flags' values (read by `paged serve`, tools/cli.h)
    if (kv.key() != "model" && kv.key() != "server" && kv.key() != "engine")
      throw std::runtime_error(json_file + ": unknown key " + std::string(kv.key()) + " (model, server, engine)");
  if (const json::value* model = root.if_contains("model")) {
    if (!model->is_string()) throw std::runtime_error(json_file + ": \"model\" must be a string (a folder)");
    const std::filesystem::path path(std::string(model->get_string()));
    o.model = (path.is_absolute() ? path : std::filesystem::path(json_file).parent_path() / path).lexically_normal();
  }
  const json::value* server = root.if_contains("server");
  if (!server) return o;
  if (!server->is_object()) throw std::runtime_error(json_file + ": \"server\" must be an object");
  for (const auto& kv : server->get_object()) {
    const std::string key(kv.key());
    const json::value& v = kv.value();
    auto bad = [&](const char* what) { return std::runtime_error(json_file + ": server." + key + " must be " + what); };
    auto text = [&] {
      if (!v.is_string()) throw bad("a string");
      return std::string(v.get_string());
    };
    // One string ("": none) or a list of non-empty ones.
    auto strings = [&](const char* what) {
      std::vector<std::string> out;
      if (v.is_string()) {
        if (!v.get_string().empty()) out.emplace_back(v.get_string());
      } else if (v.is_array()) {
        for (const auto& item : v.get_array()) {
          if (!item.is_string() || item.get_string().empty()) throw bad(what);
          out.emplace_back(item.get_string());
        }
      } else {
        throw bad(what);
      }
      return out;
    };
    auto positive = [&](int64_t max) {
      if (!v.is_int64() || v.get_int64() < 1 || v.get_int64() > max) throw bad("a positive integer");
      return v.get_int64();
    };
    if (key == "host") {
      o.host = text();
    } else if (key == "port") {
      if (!v.is_int64() || v.get_int64() < 0 || v.get_int64() > 65535) throw bad("a port number");
      o.port = static_cast<uint16_t>(v.get_int64());
    } else if (key == "api_key") {
      o.api_keys = strings("a key or a list of non-empty keys");
    } else if (key == "served_model_name") {
      o.served_model_names = strings("a name or a list of non-empty names");
    } else if (key == "chat_template") {
      o.chat_template_file = text();
    } else if (key == "body_limit_bytes") {
      o.body_limit = static_cast<size_t>(positive(int64_t{1} << 32));
    } else if (key == "read_timeout_s") {
      o.read_timeout_s = static_cast<int>(positive(86400));
    } else if (key == "write_timeout_s") {
      o.write_timeout_s = static_cast<int>(positive(86400));
    } else if (key == "pipeline_limit") {
      o.pipeline_limit = static_cast<size_t>(positive(1024));
    } else if (key == "io_threads") {
      o.io_threads = static_cast<int>(positive(256));
    } else if (key == "ws_max_generations") {
      o.ws_max_generations = static_cast<int>(positive(4096));
    } else if (key == "ws_max_outbox_bytes") {
      o.ws_max_outbox_bytes = static_cast<size_t>(positive(int64_t{1} << 34));
    } else if (key == "max_prompts_per_request") {
      o.max_prompts_per_request = static_cast<size_t>(positive(1 << 20));
    } else if (key == "max_sequences_per_request") {
      o.max_sequences_per_request = static_cast<size_t>(positive(1 << 24));
    } else if (key == "ssl_keyfile") {
      o.ssl_keyfile = text();
    } else if (key == "ssl_certfile") {
      o.ssl_certfile = text();
    } else if (key == "ssl_ca_certs") {
      o.ssl_ca_certs = text();
    } else if (key == "ssl_cert_reqs") {
      if (!v.is_int64() || v.get_int64() < 0 || v.get_int64() > 2) throw bad("0, 1 or 2");
      o.ssl_cert_reqs = static_cast<int>(v.get_int64());
    } else if (key == "max_stored_responses") {
      if (!v.is_int64() || v.get_int64() < 0 || v.get_int64() > 1000000) throw bad("an integer in [0, 1000000]");
      o.max_stored_responses = static_cast<size_t>(v.get_int64());
    } else if (key == "stats_interval_s") {
      if (!v.is_int64() || v.get_int64() < 0 || v.get_int64() > 86400) throw bad("an integer in [0, 86400]");
      o.stats_interval_s = static_cast<int>(v.get_int64());
    } else if (key == "allowed_origins") {
      if (!v.is_array()) throw bad("a list of origins");
      for (const auto& origin : v.get_array()) {
        if (!origin.is_string()) throw bad("a list of origins");
        o.allowed_origins.emplace_back(origin.get_string());
      }
    } else if (key == "log_requests") {
      if (!v.is_bool()) throw bad("true or false");
      o.log_requests = v.get_bool();
    } else if (key == "trust_request_chat_template") {
      if (!v.is_bool()) throw bad("true or false");
      o.trust_request_chat_template = v.get_bool();
    } else if (key == "enable_auto_tool_choice") {
      if (!v.is_bool()) throw bad("true or false");
      o.enable_auto_tool_choice = v.get_bool();
    } else if (key == "tool_call_parser") {
      if (!v.is_string()) throw bad("a parser's name (llama3_json, hermes, mistral, pythonic) or \"\"");
      o.tool_call_parser = std::string(v.get_string());
    } else if (key == "reasoning_parser") {
      if (!v.is_string()) throw bad("a parser's name (deepseek_r1, qwen3) or \"\"");
      o.reasoning_parser = std::string(v.get_string());
    } else if (key == "structured_outputs_in_reasoning") {
      if (!v.is_bool()) throw bad("true or false");
      o.structured_outputs_in_reasoning = v.get_bool();
    } else if (key == "return_tokens_as_token_ids") {
      if (!v.is_bool()) throw bad("true or false");
      o.return_tokens_as_token_ids = v.get_bool();
    } else if (key == "generation_config") {
      if (!v.is_string()) throw bad("\"auto\", \"vllm\" or a folder");
      o.generation_config = std::string(v.get_string());
    } else if (key == "override_generation_config") {
      if (!v.is_object()) throw bad("an object of sampling defaults");
      o.override_generation_config = v.get_object().empty() ? "" : json::serialize(v);
    } else if (key == "shutdown_timeout_s") {
      if (!v.is_int64() || v.get_int64() < 0 || v.get_int64() > 86400) throw bad("an integer in [0, 86400]");
      o.shutdown_timeout_s = static_cast<int>(v.get_int64());
    } else {
      throw std::runtime_error(json_file + ": unknown key server." + key);
    }
  }
  return o;
}

SamplingDefaults sampling_defaults(const ServerOptions& options, const std::string& model_dir) {
  SamplingDefaults defaults;
  if (options.generation_config == "auto")
    defaults = read_sampling_defaults(model_dir);
  else if (options.generation_config != "vllm")
    defaults = read_sampling_defaults(options.generation_config);
  if (options.override_generation_config.empty()) return defaults;
  boost::system::error_code ec;
  const json::value over = json::parse(options.override_generation_config, ec);
  if (ec || !over.is_object())
    throw std::invalid_argument("--override-generation-config: a JSON object, got " +
                                options.override_generation_config);
  return overridden(defaults, sampling_defaults_of(over.get_object(), "--override-generation-config"));
}

openai::ToolCallFormat auto_tool_call_format(const ServerOptions& options) {
  std::optional<openai::ToolCallFormat> format;
  if (!options.tool_call_parser.empty()) {
    format = openai::tool_call_parser_named(options.tool_call_parser);
    if (!format)
      throw std::invalid_argument("--tool-call-parser: unknown parser '" + options.tool_call_parser +
                                  "' (llama3_json, hermes, mistral or pythonic)");
  }
  if (!options.enable_auto_tool_choice) return openai::ToolCallFormat::none;
  if (!format)
    throw std::invalid_argument("--enable-auto-tool-choice needs --tool-call-parser (llama3_json, hermes, mistral or pythonic)");
  return *format;
}

openai::ReasoningFormat reasoning_format(const ServerOptions& options) {
  if (options.reasoning_parser.empty()) return openai::ReasoningFormat::none;
  const std::optional<openai::ReasoningFormat> format = openai::reasoning_parser_named(options.reasoning_parser);
  if (!format)
    throw std::invalid_argument("--reasoning-parser: unknown parser '" + options.reasoning_parser +
                                "' (deepseek_r1 or qwen3)");
  return *format;
}

}  // namespace paged
