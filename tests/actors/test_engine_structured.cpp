// Structured outputs end to end on stories260K (a model that never writes JSON on its own) at temperature 1 with
// many seeds: every completion matches its regex (std::regex), is one of its choices, or parses as JSON (Boost.JSON)
// with the schema's keys, types and bounds, checked field by field; refusals name the field.
#include <catch2/catch.hpp>

#include <boost/json.hpp>
#include <regex>

#include "actors/engine.h"
#include "tests/test_data.h"

using namespace paged;

namespace {

EngineConfig structured_config() {
  EngineConfig c;
  c.model_dir = test::kModel;
  c.device = "cpu";
  return c;
}

SamplingParams constrained(StructuredOutput::Kind kind, std::string spec, int n = 2) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.max_tokens = 300;
  p.n = n;
  p.structured = {kind, std::move(spec), "structured_outputs"};
  return p;
}

}  // namespace

TEST_CASE("Structured outputs hold for every seed (regex, choice, JSON schema, json_object)", "[engine][structured]") {
  Engine engine(structured_config());
  const std::vector<std::vector<TokenId>> prompts{engine.tokenizer().encode("Once upon a time", true),
                                                  engine.tokenizer().encode("The cat said", true)};
  using S = StructuredOutput::Kind;
  for (uint64_t seed = 0; seed < 6; ++seed) {
    INFO("seed " << seed);
    SamplingParams regex = constrained(S::regex, "(yes|no), [a-z ]{2,12}\\.");
    regex.seed = seed;
    for (const RequestOutput& r : engine.generate(prompts, regex))
      for (const CompletionOutput& c : r.outputs) {
        INFO(c.text);
        CHECK(std::regex_match(c.text, std::regex("(yes|no), [a-z ]{2,12}\\.")));
        CHECK(c.finish_reason == "stop");
      }
    SamplingParams choice = constrained(S::choice, R"(["red", "green", "blue sky"])");
    choice.seed = seed;
    for (const RequestOutput& r : engine.generate(prompts, choice))
      for (const CompletionOutput& c : r.outputs) CHECK((c.text == "red" || c.text == "green" || c.text == "blue sky"));
    SamplingParams schema = constrained(S::json_schema, R"({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 10}, "age": {"type": "integer", "minimum": 1, "maximum": 99},
        "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 3}, "ok": {"type": "boolean"}},
        "required": ["name", "age"]})");
    schema.seed = seed;
    for (const RequestOutput& r : engine.generate(prompts, schema))
      for (const CompletionOutput& c : r.outputs) {
        INFO(c.text);
        REQUIRE(c.finish_reason == "stop");
        const boost::json::object o = boost::json::parse(c.text).as_object();
        CHECK(o.at("name").as_string().size() <= 10 * 4);  // characters of up to 4 bytes
        const int64_t age = o.at("age").as_int64();
        CHECK((age >= 1 && age <= 99));
        for (const auto& kv : o) CHECK((kv.key() == "name" || kv.key() == "age" || kv.key() == "pets" || kv.key() == "ok"));
        if (o.contains("pets")) {
          CHECK(o.at("pets").as_array().size() <= 3);
          for (const auto& pet : o.at("pets").as_array()) CHECK((pet.as_string() == "cat" || pet.as_string() == "dog"));
        }
        if (o.contains("ok")) CHECK(o.at("ok").is_bool());
      }
    SamplingParams object = constrained(S::json_object, "", 1);
    object.seed = seed;
    object.max_tokens = 400;
    for (const RequestOutput& r : engine.generate(prompts, object))
      for (const CompletionOutput& c : r.outputs) {
        INFO(c.text);
        if (c.finish_reason == "stop") CHECK(boost::json::parse(c.text).is_object());
        CHECK(c.text.front() == '{');
      }
  }
}

TEST_CASE("Structured outputs that cannot be compiled or combined are refused by field", "[engine][structured]") {
  Engine engine(structured_config());
  const std::vector<TokenId> prompt = engine.tokenizer().encode("Once", true);
  using S = StructuredOutput::Kind;
  const auto refused = [&](const SamplingParams& p) {
    try {
      engine.generate({prompt}, p);
    } catch (const InvalidRequest& e) {
      return e.param + ": " + e.what();
    }
    return std::string("<accepted>");
  };
  CHECK_THAT(refused(constrained(S::json_schema, R"({"type": "string", "format": "idn-email"})")),
             Catch::StartsWith("structured_outputs") && Catch::Contains("'idn-email'"));
  CHECK_THAT(refused(constrained(S::grammar, "root ::= undefined")), Catch::Contains("not defined"));
  CHECK_THAT(refused(constrained(S::regex, "(?=a)")), Catch::Contains("lookaround"));
  SamplingParams eos = constrained(S::regex, "a");
  eos.ignore_eos = true;
  CHECK_THAT(refused(eos), Catch::Contains("ignore_eos"));
}
