// Fuzzing what the server parses from the network: request bodies of /v1/completions, /v1/chat/completions,
// /tokenize and /detokenize (valid ones mutated byte by byte and field by field with hostile values: huge, negative
// and non-finite numbers, deep nesting, invalid UTF-8, wrong types), the structured outputs they carry compiled as
// the engine compiles them and run as the runner runs them (token masks over stories260K's vocabulary, the sampled
// token accepted), structured outputs and request chat templates of their own (mutations of valid ones and targeted
// nasties: recursion, ambiguity, nested and huge counted repetitions, loops, string multiplication, deep nesting), and
// model answers read by every tool-call format (a prompt can steer what a model writes), whole and as a stream.
// Each input must parse or be refused with the project's error (InvalidRequest, GrammarError, TemplateError) within
// kBudget; any other exception, or a slower input, fails naming it. Part of paged_tests, and built on its own with
// AddressSanitizer and UBSan (paged_fuzz_request, see CMakeLists.txt), which turn a bad memory access into a failure.
#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "http/openai.h"
#include "http/tool_call_parser.h"
#include "model/constraint/structured_output.h"
#include "model/constraint/token_mask.h"
#include "model/template/jinja.h"
#include "model/tokenizer/load_tokenizer.h"
#include "tests/draw.h"
#include "tests/test_data.h"

using namespace paged;
using namespace paged::test;

namespace {

// What one input may take: 2 s, five times that under the sanitizers (their checks slow the code that much). The
// inputs that blew up took minutes or never ended; the slowest refused one takes ~0.1 s here, ~0.2 s on a loaded
// machine, so the bound catches a blow-up without timing a busy CI machine.
#if defined(__SANITIZE_ADDRESS__)
constexpr auto kBudget = std::chrono::milliseconds(10000);
#else
constexpr auto kBudget = std::chrono::milliseconds(2000);
#endif
constexpr int kMutatedBodies = 3000;
constexpr int kMutatedConstraints = 600;
constexpr int kMutatedTemplates = 600;
constexpr int kMaskSteps = 24;  // tokens a compiled constraint is run over

struct Served {
  std::unique_ptr<Tokenizer> tok = load_tokenizer(kModel);
  ChatTemplate chat = *ChatTemplate::load(kModel, std::string(PAGED_SOURCE_DIR) + "/conf/chat_templates/llama2.jinja");
  std::shared_ptr<const constraint::TokenTrie> trie = std::make_shared<const constraint::TokenTrie>(*tok);
  openai::ModelInfo info() const {
    openai::ModelInfo m{tok.get(), tok->vocab_size(), 512, "stories260K", &chat};
    m.trust_request_chat_template = true;
    m.tool_call_parser = openai::ToolCallFormat::hermes;
    return m;
  }
};

const Served& served() {
  static const Served s;
  return s;
}

// Runs a compiled constraint as a sequence would: the mask of each step, then one allowed token accepted (the one
// before again when it is allowed, half of the time: repetitions are what drive nesting and ambiguity deep).
void run_constraint(const std::shared_ptr<const constraint::Grammar>& g, Draw& d) {
  if (!g) return;
  const std::vector<TokenId> stop_ids = served().tok->eos_ids();
  auto automaton = std::make_shared<constraint::ConstraintAutomaton>(g, served().trie, stop_ids);
  constraint::TokenConstraint c(automaton, true);
  std::vector<uint32_t> mask(constraint::mask_words(c.vocab_size()));
  TokenId last = -1;
  for (int step = 0; step < kMaskSteps && !c.stopped(); ++step) {
    c.fill_mask({}, mask);
    std::vector<TokenId> allowed;
    for (TokenId id = 0; id < c.vocab_size(); ++id)
      if (constraint::mask_allows(mask, id)) allowed.push_back(id);
    if (allowed.empty()) break;
    const bool again = last >= 0 && d.coin() && constraint::mask_allows(mask, last);
    last = again ? last : d.pick(allowed);
    REQUIRE(c.accept(last));  // what the mask allows is taken
  }
}

// Times `f` (an input's whole handling): it must return within kBudget. `what` names the input in a failure.
template <class F>
void within_budget(const std::string& what, F&& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  const auto took = std::chrono::steady_clock::now() - start;
  INFO(what.substr(0, 2000));
  CHECK(std::chrono::duration_cast<std::chrono::milliseconds>(took) <= kBudget);
}

// Outcomes: accepted, refused with the project's error.
struct Tally {
  int accepted = 0, refused = 0;
};

void compile_and_run(const StructuredOutput& s, Draw& d, Tally& t) {
  try {
    run_constraint(constraint::compile_structured_output(s), d);
    ++t.accepted;
  } catch (const constraint::GrammarError&) {
    ++t.refused;
  }
}

// A request body to its end, as the server and the engine take it: parsed, and its structured output compiled and
// run. Anything but InvalidRequest or GrammarError escapes and fails the test.
void take_body(openai::Endpoint e, const std::string& body, Draw& d, Tally& t) {
  within_budget(body, [&] {
    try {
      const openai::Request r = openai::parse_request(e, body, served().info());
      compile_and_run(r.params.structured, d, t);
    } catch (const InvalidRequest&) {
      ++t.refused;
    }
  });
}

// Hostile JSON values for any field.
std::vector<std::string> hostile_values() {
  std::vector<std::string> v = {
      "null", "true", "false", "0", "-1", "1", "2", "0.5", "-0.0", "1e999", "-1e999", "1e-999", "1e308", "3.4e39",
      "-3.4e39", "2147483647", "2147483648", "-2147483649", "4294967297", "9223372036854775807",
      "9223372036854775808", "18446744073709551615", "18446744073709551616", "-9223372036854775809",
      "123456789012345678901234567890", "\"\"", "\"x\"", "\"\\u0000\"", "\"\\ud800\"", "\"\\udc00\\ud800\"",
      "\"\xff\xfe\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"", "\"\xe2\x82\"", "[]", "{}", "[null]", "[-1]", "[1e999]",
      "[\"\"]", "[[1]]", "{\"a\":1}", "{\"0\":1e999}", "{\"-1\":1}", "{\"99999999999\":1}", "{\"1\":\"x\"}",
      "[\"\\ud800\"]", "{\"type\":\"json_object\"}", "{\"type\":\"json_schema\"}", "\"auto\"", "\"required\""};
  v.push_back("\"" + std::string(100000, 'a') + "\"");
  v.push_back(std::string(2000, '[') + std::string(2000, ']'));  // deeper than Boost.JSON's default depth
  v.push_back(std::string(60, '[') + "1" + std::string(60, ']'));
  std::string many = "[";
  for (int i = 0; i < 5000; ++i) many += (i ? ",1" : "1");
  v.push_back(many + "]");
  std::string bias = "{";
  for (int i = 0; i < 600; ++i) bias += (i ? ",\"" : "\"") + std::to_string(i) + "\":100";
  v.push_back(bias + "}");
  return v;
}

const std::vector<std::string> kFields = {
    "model", "prompt", "messages", "n", "best_of", "max_tokens", "max_completion_tokens", "min_tokens", "temperature",
    "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias",
    "logprobs", "top_logprobs", "prompt_logprobs", "stop", "stop_token_ids", "stream", "stream_options", "echo",
    "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "include_stop_str_in_output",
    "use_beam_search", "truncate_prompt_tokens", "response_format", "structured_outputs", "guided_json",
    "guided_regex", "guided_choice", "guided_grammar", "tools", "tool_choice", "parallel_tool_calls",
    "chat_template", "chat_template_kwargs", "add_generation_prompt", "continue_final_message", "suffix", "user",
    "cache_salt", "priority", "return_tokens_as_token_ids",
    "unknown_field"};

const std::vector<std::string> kCompletionBodies = {
    R"({"prompt": "Once upon a time", "max_tokens": 8})",
    R"({"prompt": ["a", "b"], "n": 2, "temperature": 0.7, "top_p": 0.9, "seed": 7, "stop": ["x", "yz"]})",
    R"({"prompt": [1, 2, 3], "logprobs": 2, "logit_bias": {"5": -100}, "stop_token_ids": [2]})",
    R"({"prompt": "x", "best_of": 3, "n": 2, "presence_penalty": 0.5, "frequency_penalty": -0.5, "min_tokens": 2})",
    R"({"prompt": "x", "guided_regex": "(ab|cd){1,3}[0-9]+", "max_tokens": 12})",
    R"({"prompt": "x", "guided_choice": ["yes", "no", "maybe"]})",
    R"({"prompt": "x", "guided_grammar": "root ::= \"[\" num (\",\" num)* \"]\"\nnum ::= [0-9]+"})",
    R"({"prompt": "x", "response_format": {"type": "json_object"}, "stream": true,
        "stream_options": {"include_usage": true}})",
    R"({"prompt": "x", "structured_outputs": {"json": {"type": "object", "properties": {"a": {"type": "integer",
        "minimum": -5, "maximum": 500}, "b": {"type": "array", "items": {"type": "string", "maxLength": 4}}},
        "required": ["a"]}}})"};

const std::vector<std::string> kChatBodies = {
    R"({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8})",
    R"({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}], "top_logprobs": 2, "logprobs": true})",
    R"({"messages": [{"role": "user", "content": "Hi"}], "chat_template":
        "{% for m in messages %}{{ m.role }}:{{ m.content }}\n{% endfor %}", "chat_template_kwargs": {"x": 1}})",
    R"({"messages": [{"role": "user", "content": "weather?"}], "tools": [{"type": "function", "function": {"name":
        "get", "description": "d", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
        "required": ["city"]}}}], "tool_choice": "required"})",
    R"({"messages": [{"role": "user", "content": "Hi"}], "response_format": {"type": "json_schema", "json_schema":
        {"name": "n", "schema": {"type": "object", "properties": {"x": {"enum": ["a", "b", 1, null]}}}}}})"};

// A byte-level mutation of `text`: bytes flipped, inserted, deleted, a span duplicated or moved.
std::string mutate_bytes(Draw& d, std::string text) {
  const std::string specials = "{}[]\":,\\0123456789eE+-.nultrfase \xff\x80\xc3";
  for (int k = d.in(1, 4); k > 0; --k) {
    const size_t at = text.empty() ? 0 : d.index(text.size());
    switch (d.in(0, 4)) {
      case 0: if (!text.empty()) text[at] = static_cast<char>(d.bits()); break;
      case 1: text.insert(at, 1, specials[d.index(specials.size())]); break;
      case 2: if (!text.empty()) text.erase(at, d.in(1, 8)); break;
      case 3: if (!text.empty()) text.insert(at, text.substr(at, d.in(1, 64))); break;
      default: if (!text.empty()) text.insert(d.index(text.size()), text.substr(at, d.in(1, 16))); break;
    }
  }
  return text;
}

// A field-level mutation of a valid body: one field set to a hostile value (a whole JSON text spliced in).
std::string mutate_field(Draw& d, const std::string& body, const std::vector<std::string>& hostile) {
  const boost::json::object o = boost::json::parse(body).as_object();
  std::string out = "{";
  const std::string field = d.pick(kFields);
  for (const auto& [k, v] : o)
    if (k != field) out += boost::json::serialize(boost::json::string(k)) + ":" + boost::json::serialize(v) + ",";
  return out + "\"" + field + "\":" + d.pick(hostile) + "}";
}

// Targeted structured outputs: recursion, ambiguity, huge counts, deep nesting.
std::vector<StructuredOutput> nasty_constraints() {
  using K = StructuredOutput::Kind;
  std::vector<StructuredOutput> v = {
      {K::regex, "(a{1000}){1000}"}, {K::regex, "((a{100}){100}){100}"}, {K::regex, "(a*)*b"}, {K::regex, "(a|a)*"},
      {K::regex, "((a+)+)+$"}, {K::regex, "a{4294967296}"}, {K::regex, "a{2147483647,}"}, {K::regex, "a{99999999999}"},
      {K::regex, "[\\x{10FFFF}-\\x{0}]"}, {K::regex, "(?:(?:(?:(?:a|b|c|d|e|f|g){2,9}){2,9}){2,9})"},
      {K::regex, std::string(300, '(') + "a" + std::string(300, ')')}, {K::regex, "(a|b|c|d|e|f|g|h|i|j){64}"},
      {K::regex, ".{0,100000}"}, {K::regex, "\\"}, {K::regex, "[z-a]"}, {K::regex, "(?<n>a)\\k<n>"},
      {K::grammar, "root ::= \"a\" root \"b\" | \"a\" root \"c\" | \"x\""},
      {K::grammar, "root ::= root \"a\" | \"b\""}, {K::grammar, "root ::= x\nx ::= y\ny ::= x"},
      {K::grammar, "root ::= (\"a\"{1000}){1000}"}, {K::grammar, "root ::= [a-z]{0,4294967295}"},
      {K::grammar, "root ::= " + std::string(400, '(') + "\"a\"" + std::string(400, ')')},
      {K::grammar, "root ::= \"\\xff\\x80\" [^\\x00-\\x{10FFFF}]"},
      {K::json_schema, R"({"$ref": "#"})"}, {K::json_schema, R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})"},
      {K::json_schema, R"({"type": "array", "items": {"$ref": "#"}})"},
      {K::json_schema, R"({"anyOf": [{"type": "array", "items": {"$ref": "#"}}, {"type": "array", "items": {"$ref": "#"}}]})"},
      {K::json_schema, R"({"anyOf": [{"$ref": "#"}, {"type": "null"}]})"},
      {K::json_schema, R"({"type": "string", "minLength": 100000000})"},
      {K::json_schema, R"({"type": "string", "minLength": 5000, "maxLength": 1e300})"},
      {K::json_schema, R"({"type": "array", "minItems": 1000000, "items": {"type": "array", "minItems": 1000000}})"},
      {K::json_schema, R"({"type": "integer", "minimum": -1e300, "maximum": 1e300})"},
      {K::json_schema, R"({"type": "number", "minimum": 1e308, "exclusiveMaximum": -1e308})"},
      {K::json_schema, R"({"type": "string", "pattern": "(a{1000}){1000}"})"},
      {K::json_schema, R"({"type": "object", "properties": {"a": {"$ref": "#/properties/a"}}})"},
      {K::json_schema, R"({"$ref": "http://example.com/x"})"}, {K::json_schema, R"({"$ref": "#/$defs/\u0000"})"},
      {K::json_schema, R"({"allOf": [{"$ref": "#"}]})"}, {K::json_schema, R"({"allOf": [{"allOf": [{"$ref": "#"}]}, {}]})"},
      {K::json_schema, R"({"$defs": {"n": {"properties": {"k": {"$ref": "#/$defs/n", "required": ["k"]}}}}, "$ref": "#/$defs/n", "type": "object"})"},
      {K::json_schema, R"({"allOf": [{"type": ["string", "null"]}, {"type": "number"}]})"}, {K::json_schema, R"({"allOf": 5})"},
      {K::json_schema, R"({"type": "string", "format": "uri", "maxLength": 2147483647})"},
      {K::json_schema, R"({"type": "string", "format": "email", "maxLength": 100000})"},
      {K::json_schema, R"({"type": "string", "format": 7})"}, {K::json_schema, R"({"type": "array", "prefixItems": {}})"},
      {K::json_schema, R"({"type": "array", "prefixItems": [{}, {}, {}], "maxItems": 0})"},
      {K::json_schema, R"({"type": "array", "prefixItems": [{"$ref": "#"}], "items": {"$ref": "#"}, "minItems": 100000})"},
      {K::choice, "[]"}, {K::choice, "[1]"}, {K::choice, R"([""])"}, {K::choice, R"(["\ud800"])"}};
  {
    // A large schema named by thousands of allOf branches, each with the same property: the merge is bounded.
    std::string big = R"({"type": "object", "properties": {"a": {"enum": [)";
    for (int i = 0; i < 3000; ++i) big += (i ? "," : "") + std::to_string(i);
    big += R"(]}}, "required": ["a"]})";
    std::string many = R"({"$defs": {"x": )" + big + R"(}, "allOf": [)";
    for (int i = 0; i < 4000; ++i) many += (i ? "," : "") + std::string(R"({"$ref": "#/$defs/x"})");
    v.push_back({K::json_schema, many + "]}"});
  }
  std::string nested = "{}";
  for (int i = 0; i < 200; ++i) nested = R"({"type": "array", "items": )" + nested + "}";
  v.push_back({K::json_schema, nested});
  std::string defs = R"({"$ref": "#/$defs/d0", "$defs": {)";  // d_i: two alternatives both of d_(i+1)
  for (int i = 0; i < 24; ++i)
    defs += "\"d" + std::to_string(i) + R"(": {"anyOf": [{"type": "array", "items": {"$ref": "#/$defs/d)" +
            std::to_string(i + 1) + R"("}}, {"type": "array", "items": {"$ref": "#/$defs/d)" + std::to_string(i + 1) +
            "\"}}]},";
  v.push_back({K::json_schema, defs + R"("d24": {"type": "integer"}}})"});
  std::string chain = "root ::= r0\n";  // every rule's two alternatives: 2^30 stacks at the start
  for (int i = 0; i < 30; ++i)
    chain += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + " \"a\" | r" + std::to_string(i + 1) + " \"b\"\n";
  v.push_back({K::grammar, chain + "r30 ::= \"x\""});
  std::string choices = "[";
  for (int i = 0; i < 20000; ++i) choices += (i ? ",\"a" : "\"a") + std::to_string(i) + "\"";
  v.push_back({K::choice, choices + "]"});
  return v;
}

// `unit` written `n` times.
std::string repeated(const std::string& unit, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += unit;
  return out;
}

// Targeted templates: loops, recursion, string multiplication, deep nesting, syntax far off.
std::vector<std::string> nasty_templates() {
  std::vector<std::string> v = {
      "{% for i in range(1000000000) %}x{% endfor %}",
      "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
      "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
      "{% macro f() %}{{ f() ~ f() }}{% endmacro %}{{ f() }}",
      "{{ 'a' * 1000000000 }}", "{{ ('a' * 1000000) * 1000 }}", "{{ [1] * 1000000000 }}",
      "{% set s = namespace(x='a') %}{% for i in range(64) %}{% set s.x = s.x ~ s.x %}{% endfor %}{{ s.x }}",
      "{% set l = [] %}{% for i in range(10000000) %}{% set _ = l.append(i) %}{% endfor %}",
      "{{ range(999999999999) | list | length }}", "{{ 10 ** 10 ** 10 }}", "{{ 1 / 0 }}", "{{ 1 // 0 }}",
      "{{ 1 % 0 }}", "{{ -9223372036854775807 - 2 }}", "{{ 9223372036854775807 * 2 }}", "{{ 9223372036854775807 + 1 }}",
      "{{ (-9223372036854775807 - 1) // -1 }}", "{{ (-9223372036854775807 - 1) % -1 }}", "{{ 'abc'[9223372036854775807:] }}",
      "{{ 'abc'[-9223372036854775807 - 1] }}", "{{ 'abc'[::0] }}", "{{ 'x' | center(1000000000) }}",
      "{{ 'x' | indent(1000000000) }}", "{{ messages | tojson(indent=1000000000) }}",
      "{{ 'a'.ljust(999999999999) }}", "{{ 'a'.replace('', 'bbbb') * 100000 }}", "{% raw %}", "{% for %}", "{{",
      "{% if %}{% endif %}", "{% set x = x %}{{ x }}", "{{ x.__class__ }}", "{{ cycler }}", "{% include 'x' %}",
      "{% extends 'x' %}", "{% import 'x' as y %}", "{{ lipsum(1000000) }}", "{{ range(1, 10, 0) | list }}",
      "{{ '%s' % 'a' }}", "{{ 'a' | format(1,2,3) }}"};
  v.push_back("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}");
  v.push_back("{{ " + std::string(5000, '[') + std::string(5000, ']') + " }}");
  v.push_back(std::string(3000, '{') + "% if true %}" + std::string(3000, '}'));
  v.push_back(repeated("{% if true %}", 3000) + repeated("{% endif %}", 3000));
  v.push_back("{{ " + repeated("not ", 20000) + "1 }}");
  v.push_back("{{ " + repeated("-", 20000) + "1 }}");
  v.push_back("{{ 'a'" + repeated(" | upper", 20000) + " }}");
  v.push_back("{{ messages" + repeated("[0]", 20000) + " }}");
  return v;
}

// What a chat template renders with: a few messages, the BOS token, the generation prompt asked.
boost::json::object template_variables() {
  boost::json::object vars;
  vars["messages"] = boost::json::parse(R"([{"role": "user", "content": "Hi"}, {"role": "assistant",
      "content": "Hello"}, {"role": "user", "content": "\u00e9\ud83d\ude00"}])");
  vars["bos_token"] = "<s>";
  vars["add_generation_prompt"] = true;
  return vars;
}

// Renders `source` as a request's template: the default limits, template_variables().
void render_template(const std::string& source, Tally& t) {
  within_budget(source, [&] {
    try {
      (void)jinja::Template(source).render(template_variables());
      ++t.accepted;
    } catch (const jinja::TemplateError&) {
      ++t.refused;
    }
  });
}

}  // namespace

TEST_CASE("hostile and mutated request bodies are parsed or refused with InvalidRequest, in time", "[fuzz][openai]") {
  Draw d(20261201);
  const std::vector<std::string> hostile = hostile_values();
  Tally t;
  for (const auto& [e, bodies] : {std::pair{openai::Endpoint::completions, kCompletionBodies},
                                  std::pair{openai::Endpoint::chat, kChatBodies}}) {
    for (const std::string& body : bodies) {  // the valid bodies are valid
      INFO(body);
      REQUIRE_NOTHROW(openai::parse_request(e, body, served().info()));
    }
    for (const std::string& field : kFields)
      for (const std::string& value : hostile) {
        const std::string& body = d.pick(bodies);
        std::string spliced = body.substr(0, body.size() - 1) + ",\"" + field + "\":" + value + "}";
        take_body(e, spliced, d, t);
      }
    for (int i = 0; i < kMutatedBodies; ++i) {
      const std::string& body = d.pick(bodies);
      take_body(e, d.coin() ? mutate_bytes(d, body) : mutate_field(d, body, hostile), d, t);
    }
  }
  for (const std::string& value : hostile) {
    for (const std::string& body : {R"({"prompt": )" + value + "}", R"({"tokens": )" + value + "}",
                                    R"({"messages": )" + value + "}", R"({"prompt": "x", "add_special_tokens": )" + value + "}"})
      within_budget(body, [&] {
        try {
          (void)openai::tokenize_body(body, served().info());
          ++t.accepted;
        } catch (const InvalidRequest&) {
          ++t.refused;
        }
        try {
          (void)openai::detokenize_body(body, served().info());
          ++t.accepted;
        } catch (const InvalidRequest&) {
          ++t.refused;
        }
      });
  }
  CHECK(t.accepted > 300);
  CHECK(t.refused > 3000);
}

TEST_CASE("hostile and mutated structured outputs compile and run, or are refused with GrammarError, in time",
          "[fuzz][constraint]") {
  Draw d(7);
  using K = StructuredOutput::Kind;
  const std::vector<StructuredOutput> valid = {
      {K::regex, "(ab|cd){1,3}[0-9]+"}, {K::regex, "[a-z]+@[a-z]+\\.(com|org)"}, {K::regex, "\\d{3}-\\d{4}"},
      {K::grammar, "root ::= \"[\" num (\",\" num)* \"]\"\nnum ::= [0-9]+"},
      {K::grammar, "root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\nterm ::= [0-9]+ | \"(\" expr \")\""},
      {K::json_schema, R"({"type": "object", "properties": {"a": {"type": "integer", "minimum": 3}, "b": {"type":
          "array", "items": {"type": "string", "pattern": "^[a-c]{2}$"}, "maxItems": 3}}, "required": ["a"]})"},
      {K::json_schema, R"({"$defs": {"n": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"next":
          {"$ref": "#/$defs/n"}}}]}}, "$ref": "#/$defs/n"})"},
      {K::json_object, ""}, {K::choice, R"(["yes", "no", "maybe"])"}};
  Tally t;
  for (const StructuredOutput& s : valid) {
    INFO(s.spec);
    REQUIRE_NOTHROW(run_constraint(constraint::compile_structured_output(s), d));
  }
  for (const StructuredOutput& s : nasty_constraints()) within_budget(s.spec.substr(0, 300), [&] { compile_and_run(s, d, t); });
  for (int i = 0; i < kMutatedConstraints; ++i) {
    StructuredOutput s = d.pick(valid);
    s.spec = mutate_bytes(d, s.spec);
    within_budget(s.spec, [&] { compile_and_run(s, d, t); });
  }
  CHECK(t.accepted > 100);
  CHECK(t.refused > 100);
}

TEST_CASE("hostile and mutated request chat templates render or are refused with TemplateError, in time",
          "[fuzz][template]") {
  Draw d(11);
  const std::vector<std::string> valid = {
      "{% for m in messages %}{{ m.role }}: {{ m.content | trim }}\n{% endfor %}",
      "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]{% else %}"
      "{{ m.content }}{% endif %}{% endfor %}",
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}"
      "{% macro r(x) %}{{ x | upper }}{% endmacro %}{{ r('a') ~ r('b') }}{{ messages | tojson }}",
      "{{ messages[0]['content'][::-1] }}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"};
  Tally t;
  for (const std::string& s : valid) {
    INFO(s);
    REQUIRE_NOTHROW(jinja::Template(s).render(template_variables()));
  }
  for (const std::string& s : nasty_templates()) render_template(s, t);
  for (int i = 0; i < kMutatedTemplates; ++i) render_template(mutate_bytes(d, d.pick(valid)), t);
  CHECK(t.accepted > 50);
  CHECK(t.refused > 50);
}

TEST_CASE("hostile and mutated model answers are read by every tool-call format, whole and as a stream, in time",
          "[fuzz][openai][tools]") {
  Draw d(20261205);
  using F = openai::ToolCallFormat;
  const std::vector<std::pair<F, std::string>> answers = {
      {F::hermes, "Sure.<tool_call>{\"name\": \"get\", \"arguments\": {\"city\": \"Oslo\"}}</tool_call>"},
      {F::llama3_json, "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": [1, 2]}}; {\"name\": \"b\", \"parameters\": {}}"},
      {F::mistral, "Ok.[TOOL_CALLS][{\"name\": \"get\", \"arguments\": {\"q\": \"a]b\"}}]"},
      {F::mistral, "[TOOL_CALLS]get[ARGS]{\"city\": \"Oslo\"}[TOOL_CALLS]ping[CALL_ID]abc123XYZ[ARGS]{}"},
      {F::pythonic, "<|python_start|>[get(city='Os\\'lo', n=[1, (2, 3.5e2)], m={'k': None}), ping()]<|python_end|>"},
      {F::json_list, "[{\"name\": \"a\", \"parameters\": {\"s\": \"[x]\"}}]"},
      {F::arguments, "{\"city\": \"Rome\"}"},
  };
  // Targeted nasties: deep nesting, unterminated strings and escapes, huge texts, bytes that are not UTF-8.
  const std::vector<std::string> nasties = {
      "[f(a=" + std::string(5000, '[') + ")]",           "[f(a=" + std::string(5000, '(') + ")]",
      "[TOOL_CALLS]f[ARGS]" + std::string(5000, '{'),    "<tool_call>" + std::string(20000, '{'),
      "[f(a='\\x4', b='\\U0011FFFF', c='\\ud800')]",  "[f(a=\"\\",
      "[TOOL_CALLS]" + std::string(100000, 'a'),          "[f(" + std::string(100000, 'a') + "=1)]",
      "[f(a='\xff\xfe')]",                                std::string(200000, '['),
  };
  int calls = 0;
  const auto read = [&](F format, const std::string& text) {
    within_budget(text, [&] {
      const openai::ToolCallScan whole = openai::scan_tool_calls(format, text, true, "f");
      calls += static_cast<int>(whole.calls.size());
      for (const openai::ToolCallText& c : whole.calls) {  // a whole answer's calls are complete, valid JSON
        CHECK(c.complete);
        CHECK_NOTHROW(boost::json::parse(c.arguments));
      }
      // A few of its prefixes as a stream's: what they send as content is where the whole answer's starts.
      for (int k = 0; k < 4; ++k) {
        const size_t cut = text.empty() ? 0 : d.index(text.size() + 1);
        const openai::ToolCallScan part = openai::scan_tool_calls(format, std::string_view(text).substr(0, cut), false, "f");
        if (whole.calls.empty()) CHECK(text.starts_with(part.content));
        else CHECK(whole.content.starts_with(part.content));
      }
    });
  };
  for (const auto& [format, answer] : answers) {
    read(format, answer);
    for (int i = 0; i < 400; ++i) read(format, mutate_bytes(d, answer));
  }
  for (const std::string& nasty : nasties)
    for (F format : {F::hermes, F::llama3_json, F::mistral, F::pythonic, F::json_list}) read(format, nasty);
  CHECK(calls > 200);  // the mutations leave many answers readable
}
