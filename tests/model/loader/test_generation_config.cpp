// The sampling defaults of a generation_config.json (vLLM's --generation-config auto): which keys count, their ranges,
// overrides, and the folder's file read or missing.
#include <catch2/catch.hpp>

#include <fstream>

#include "model/loader/generation_config.h"
#include "tests/test_data.h"

using namespace paged;
namespace json = boost::json;

namespace {

SamplingDefaults of(const char* text) { return sampling_defaults_of(json::parse(text).as_object(), "gc.json"); }

std::string refusal(const char* text) {
  try {
    of(text);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "<accepted>";
}

}  // namespace

TEST_CASE("generation config: the sampling keys a request may leave out, nothing else", "[loader][generation]") {
  // Llama 3 Instruct's: the eos ids, do_sample and bos are not sampling defaults.
  const SamplingDefaults llama3 = of(R"({"bos_token_id": 128000, "do_sample": true, "eos_token_id": [128001, 128009],
                                        "temperature": 0.6, "top_p": 0.9, "transformers_version": "4.40.0"})");
  CHECK(llama3 == SamplingDefaults{.temperature = 0.6f, .top_p = 0.9f});
  CHECK(describe(llama3) == "temperature 0.6, top_p 0.9");
  const SamplingDefaults all = of(R"({"temperature": 0, "top_p": 1, "top_k": 20, "min_p": 0.05,
                                      "repetition_penalty": 1.05, "max_new_tokens": 256})");
  CHECK(all == SamplingDefaults{.temperature = 0.0f, .top_p = 1.0f, .top_k = 20, .min_p = 0.05f,
                                .repetition_penalty = 1.05f, .max_tokens = 256});
  CHECK(of(R"({"temperature": null})") == SamplingDefaults{});
  CHECK(describe(SamplingDefaults{}).empty());

  CHECK(refusal(R"({"temperature": 2.5})") == "gc.json: temperature 2.5 is outside [0, 2]");
  CHECK(refusal(R"({"top_p": 0})") == "gc.json: top_p 0 is outside (0, 1]");
  CHECK(refusal(R"({"top_k": -2})") == "gc.json: top_k must be an integer of at least -1, got -2");
  CHECK(refusal(R"({"top_k": 1.5})") == "gc.json: top_k must be an integer of at least -1, got 1.5");
  CHECK(refusal(R"({"repetition_penalty": "1.1"})") == "gc.json: repetition_penalty must be a number");
  CHECK(refusal(R"({"max_new_tokens": 0})") == "gc.json: max_new_tokens must be an integer of at least 1, got 0");
  CHECK(refusal(R"({"max_new_tokens": "8"})") == "gc.json: max_new_tokens must be an integer of at least 1, got \"8\"");
}

TEST_CASE("generation config: overrides win field by field; a folder's file or none", "[loader][generation]") {
  const SamplingDefaults base{.temperature = 0.6f, .top_p = 0.9f};
  CHECK(overridden(base, {.temperature = 0.0f, .max_tokens = 8}) ==
        SamplingDefaults{.temperature = 0.0f, .top_p = 0.9f, .max_tokens = 8});
  CHECK(overridden(base, {}) == base);

  test::TempDir dir("paged_genconfig_");
  CHECK(read_sampling_defaults(dir.path()) == SamplingDefaults{});  // no file: no defaults
  std::ofstream(dir.path() / "generation_config.json") << R"({"top_k": 40, "eos_token_id": 2})";
  CHECK(read_sampling_defaults(dir.path()) == SamplingDefaults{.top_k = 40});
  std::ofstream(dir.path() / "generation_config.json") << "[1, 2]";
  CHECK_THROWS_AS(read_sampling_defaults(dir.path()), std::invalid_argument);
  // The shared test models set none (stories260K's do_sample false is not one).
  CHECK(read_sampling_defaults(test::kModel) == SamplingDefaults{});
}
