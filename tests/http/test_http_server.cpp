// Server options: conf/serve.json holds exactly the built-in defaults, and the loader refuses what it does not know.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "http/server.h"
#include "http/websocket_session.h"

using paged::ServerOptions;

namespace {

std::string write_temp(const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("paged-serve-" + std::to_string(std::hash<std::string>{}(text)) + ".json");
  std::ofstream(path) << text;
  return path.string();
}

}  // namespace

TEST_CASE("conf/serve.json holds the built-in server defaults", "[http]") {
  const ServerOptions conf = paged::load_server_options(std::string(PAGED_SOURCE_DIR) + "/conf/serve.json");
  const ServerOptions defaults;
  CHECK(conf.host == defaults.host);
  CHECK(conf.host == "127.0.0.1");  // loopback unless told otherwise
  CHECK(conf.port == defaults.port);
  CHECK(conf.api_keys == defaults.api_keys);
  CHECK(conf.served_model_names == defaults.served_model_names);
  CHECK(paged::load_server_options(write_temp(R"({"server": {"served_model_name": ["a", "b"]}})")).served_model_names ==
        std::vector<std::string>{"a", "b"});
  CHECK_THROWS_AS(paged::load_server_options(write_temp(R"({"server": {"served_model_name": [""]}})")),
                  std::runtime_error);
  CHECK(conf.chat_template_file == defaults.chat_template_file);
  CHECK(conf.body_limit == defaults.body_limit);
  CHECK(conf.read_timeout_s == defaults.read_timeout_s);
  CHECK(conf.write_timeout_s == defaults.write_timeout_s);
  CHECK(conf.pipeline_limit == defaults.pipeline_limit);
  CHECK(conf.io_threads == defaults.io_threads);
  CHECK(conf.ws_max_generations == defaults.ws_max_generations);
  CHECK(conf.generation_config == defaults.generation_config);
  CHECK(conf.override_generation_config == defaults.override_generation_config);
  CHECK(conf.return_tokens_as_token_ids == defaults.return_tokens_as_token_ids);
  CHECK(conf.max_stored_responses == defaults.max_stored_responses);
  CHECK(conf.ssl_certfile == defaults.ssl_certfile);
  CHECK(conf.ssl_keyfile == defaults.ssl_keyfile);
  CHECK(conf.ssl_ca_certs == defaults.ssl_ca_certs);
  CHECK(conf.ssl_cert_reqs == defaults.ssl_cert_reqs);
  CHECK_THROWS_WITH(paged::load_server_options(write_temp(R"({"server": {"ssl_cert_reqs": 3}})")),
                    Catch::Contains("server.ssl_cert_reqs"));
  CHECK(paged::load_server_options(write_temp(R"({"server": {"max_stored_responses": 0}})")).max_stored_responses == 0);
  CHECK_THROWS_WITH(paged::load_server_options(write_temp(R"({"server": {"max_stored_responses": -1}})")),
                    Catch::Contains("server.max_stored_responses"));
}

TEST_CASE("sampling defaults: the model's generation config, none with vllm, overrides over either", "[http]") {
  ServerOptions o = paged::load_server_options(
      write_temp(R"({"server": {"override_generation_config": {"temperature": 0.25, "max_new_tokens": 9}}})"));
  CHECK(o.generation_config == "auto");
  const std::string model = std::string(PAGED_SOURCE_DIR) + "/models/stories260K";  // its file sets none
  CHECK(paged::sampling_defaults(o, model) == paged::SamplingDefaults{.temperature = 0.25f, .max_tokens = 9});
  o.override_generation_config.clear();
  CHECK(paged::sampling_defaults(o, model) == paged::SamplingDefaults{});
  o.generation_config = "vllm";
  o.override_generation_config = R"({"top_k": 5})";
  CHECK(paged::sampling_defaults(o, "/nonexistent") == paged::SamplingDefaults{.top_k = 5});  // vllm reads no folder
  o.override_generation_config = "[1]";
  CHECK_THROWS_WITH(paged::sampling_defaults(o, model), Catch::Contains("--override-generation-config"));
  o.override_generation_config = R"({"temperature": 9})";
  CHECK_THROWS_WITH(paged::sampling_defaults(o, model), Catch::Contains("temperature 9 is outside [0, 2]"));
  o.override_generation_config.clear();
  o.generation_config = std::string(PAGED_SOURCE_DIR) + "/conf";  // a folder without the file: none
  CHECK(paged::sampling_defaults(o, model) == paged::SamplingDefaults{});
  CHECK_THROWS_AS(paged::load_server_options(write_temp(R"({"server": {"generation_config": 1}})")),
                  std::runtime_error);
}

TEST_CASE("server options: keys override defaults, unknown keys and bad values are refused", "[http]") {
  const ServerOptions o = paged::load_server_options(
      write_temp(R"({"server": {"port": 9001, "api_key": "k", "body_limit_bytes": 4096, "host": "0.0.0.0"}})"));
  CHECK(o.port == 9001);
  CHECK(o.api_keys == std::vector<std::string>{"k"});
  CHECK(paged::load_server_options(write_temp(R"({"server": {"api_key": ["a", "b"]}})")).api_keys ==
        std::vector<std::string>{"a", "b"});
  CHECK(paged::load_server_options(write_temp(R"({"server": {"api_key": ""}})")).api_keys.empty());
  CHECK_THROWS_AS(paged::load_server_options(write_temp(R"({"server": {"api_key": ["a", ""]}})")), std::runtime_error);
  CHECK(o.body_limit == 4096);
  CHECK(o.host == "0.0.0.0");
  CHECK(o.pipeline_limit == ServerOptions{}.pipeline_limit);
  CHECK(paged::load_server_options(write_temp(R"({"model": "x"})")).port == ServerOptions{}.port);
  CHECK_THROWS_AS(paged::load_server_options(write_temp(R"({"server": {"prot": 1}})")), std::runtime_error);
  CHECK_THROWS_AS(paged::load_server_options(write_temp(R"({"server": {"port": 70000}})")), std::runtime_error);
  CHECK_THROWS_AS(paged::load_server_options(write_temp(R"({"server": {"io_threads": 0}})")), std::runtime_error);
  CHECK_THROWS_AS(paged::load_server_options(write_temp(R"({"server": {"api_key": 5}})")), std::runtime_error);
  CHECK_THROWS_AS(paged::load_server_options(write_temp(R"({"server": [1]})")), std::runtime_error);
  CHECK_THROWS_AS(paged::load_server_options(write_temp("not json")), std::runtime_error);
  CHECK_THROWS_AS(paged::load_server_options("/nonexistent/serve.json"), std::runtime_error);
}

TEST_CASE("tool-call parser options: the format tool_choice auto is read in, or a clear refusal", "[http][tools]") {
  const ServerOptions conf = paged::load_server_options(std::string(PAGED_SOURCE_DIR) + "/conf/serve.json");
  CHECK(conf.enable_auto_tool_choice == ServerOptions{}.enable_auto_tool_choice);
  CHECK(conf.tool_call_parser == ServerOptions{}.tool_call_parser);
  CHECK(paged::auto_tool_call_format(conf) == paged::openai::ToolCallFormat::none);
  const ServerOptions hermes = paged::load_server_options(
      write_temp(R"({"server": {"enable_auto_tool_choice": true, "tool_call_parser": "hermes"}})"));
  CHECK(paged::auto_tool_call_format(hermes) == paged::openai::ToolCallFormat::hermes);
  ServerOptions o;
  o.tool_call_parser = "llama3_json";
  CHECK(paged::auto_tool_call_format(o) == paged::openai::ToolCallFormat::none);  // a parser, but auto not enabled
  o.enable_auto_tool_choice = true;
  CHECK(paged::auto_tool_call_format(o) == paged::openai::ToolCallFormat::llama3_json);
  o.tool_call_parser = "mistral";
  CHECK(paged::auto_tool_call_format(o) == paged::openai::ToolCallFormat::mistral);
  o.tool_call_parser = "pythonic";
  CHECK(paged::auto_tool_call_format(o) == paged::openai::ToolCallFormat::pythonic);
  o.tool_call_parser = "granite";
  CHECK_THROWS_WITH(paged::auto_tool_call_format(o), Catch::Contains("'granite'"));
  o.tool_call_parser.clear();
  CHECK_THROWS_WITH(paged::auto_tool_call_format(o), Catch::Contains("--tool-call-parser"));
  CHECK_THROWS_AS(paged::load_server_options(write_temp(R"({"server": {"tool_call_parser": 1}})")), std::runtime_error);
}

TEST_CASE("reasoning parser option: the format chat answers' reasoning is split in, or a clear refusal", "[http][reasoning]") {
  const ServerOptions conf = paged::load_server_options(std::string(PAGED_SOURCE_DIR) + "/conf/serve.json");
  CHECK(conf.reasoning_parser == ServerOptions{}.reasoning_parser);
  CHECK(paged::reasoning_format(conf) == paged::openai::ReasoningFormat::none);
  const ServerOptions qwen = paged::load_server_options(write_temp(R"({"server": {"reasoning_parser": "qwen3"}})"));
  CHECK(paged::reasoning_format(qwen) == paged::openai::ReasoningFormat::qwen3);
  ServerOptions o;
  o.reasoning_parser = "deepseek_r1";
  CHECK(paged::reasoning_format(o) == paged::openai::ReasoningFormat::deepseek_r1);
  o.reasoning_parser = "granite";
  CHECK_THROWS_WITH(paged::reasoning_format(o), Catch::Contains("--reasoning-parser: unknown parser 'granite'"));
  CHECK_THROWS_AS(paged::load_server_options(write_temp(R"({"server": {"reasoning_parser": true}})")), std::runtime_error);
}

TEST_CASE("a WebSocket upgrade's handshake fields are checked as RFC 6455 asks", "[http]") {
  namespace http = boost::beast::http;
  const auto upgrade = [](std::string_view version, std::string_view key) {
    http::request<http::string_body> req(http::verb::get, "/v1/stream", 11);
    req.set(http::field::connection, "Upgrade");
    req.set(http::field::upgrade, "websocket");
    if (!version.empty()) req.set(http::field::sec_websocket_version, version);
    if (!key.empty()) req.set(http::field::sec_websocket_key, key);
    return req;
  };
  const std::string rfc_key = "dGhlIHNhbXBsZSBub25jZQ==";  // RFC 6455 section 1.3's sample nonce
  CHECK(paged::server::websocket_handshake_fault(upgrade("13", rfc_key)).status == 0);
  const auto old_version = paged::server::websocket_handshake_fault(upgrade("8", rfc_key));
  CHECK(old_version.status == 426);
  CHECK(old_version.message.find("Sec-WebSocket-Version 8") != std::string::npos);
  CHECK(paged::server::websocket_handshake_fault(upgrade("", rfc_key)).status == 426);
  for (const std::string_view key : {"", "abc", "dGhlIHNhbXBsZSBub25jZQ=", "dGhlIHNhbXBsZSBub25jZQ==x",
                                     "dGhlIHNhbXBsZSBub25j*Q==", "dGhlIHNhbXBsZSBub25jZQAA"}) {
    INFO("key " << key);
    const auto fault = paged::server::websocket_handshake_fault(upgrade("13", key));
    CHECK(fault.status == 400);
    CHECK(fault.message.find("Sec-WebSocket-Key") != std::string::npos);
  }
}
