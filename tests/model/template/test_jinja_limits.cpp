// The limits of a render (model/template/jinja/budget.h): a template from a request cannot loop, allocate or
// recurse without bound. Each hostile template fails with a TemplateError naming the limit, at once; real chat
// templates on long conversations stay far below every limit.
#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <vector>

#include <boost/json.hpp>

#include "model/template/chat_template.h"
#include "model/template/jinja.h"
#include "tests/test_data.h"

namespace json = boost::json;
using paged::jinja::RenderLimits;
using paged::jinja::Template;
using paged::jinja::TemplateError;

namespace {

// The message `source` fails with (parsing or rendering with `limits`), or "" when it renders.
std::string failure(const std::string& source, const json::object& variables = {}, const RenderLimits& limits = {}) {
  try {
    Template(source).render(variables, limits);
  } catch (const TemplateError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("a render stops at its step, byte, depth and time limits", "[chat][jinja]") {
  const auto start = std::chrono::steady_clock::now();
  // Steps: 4 million loop iterations over one list (with time to reach the step limit on a slow build: under
  // AddressSanitizer 2 million steps take longer than the default 2 s).
  CHECK(contains(failure("{% set r = range(2000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}", {},
                         RenderLimits{.max_time = std::chrono::minutes(1)}),
                 "steps to render"));
  // Bytes: a string doubled 40 times, a huge range, an indent, a tojson indent and a replace that explode.
  const std::string doubling = "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
                               "{% endfor %}{{ ns.s | length }}";
  CHECK(contains(failure(doubling), "MiB"));
  CHECK(contains(failure("{{ range(1000000000000) | length }}"), "MiB"));
  CHECK(contains(failure("{{ 'a\\nb' | indent(1000000000000) }}"), "MiB"));
  CHECK(contains(failure("{{ [[1]] | tojson(indent=1000000000000) }}"), "MiB"));
  const std::string s128k = "{% set ns = namespace(s='ab') %}{% for i in range(16) %}{% set ns.s = ns.s ~ ns.s %}"
                            "{% endfor %}";
  CHECK(contains(failure(s128k + "{{ ns.s.replace('', ns.s) | length }}"), "MiB"));
  CHECK(contains(failure(s128k + "{{ ns.s.replace('a', ns.s) | length }}"), "MiB"));
  CHECK(contains(failure(s128k + "{{ ns.s | join(ns.s) | length }}"), "MiB"));
  // Depth: recursion, nested parentheses, a chain of 100,000 operators, lists in lists, a namespace in itself.
  CHECK(contains(failure("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"), "nests"));
  CHECK(contains(failure("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}"), "nests deeper"));
  std::string chain = "{{ 1";
  for (int i = 0; i < 100000; ++i) chain += " + 1";
  CHECK(contains(failure(chain + " }}"), "nests"));
  CHECK(contains(failure("{% set ns = namespace(a=[]) %}{% for i in range(1000) %}{% set ns.a = [ns.a] %}{% endfor %}"),
                 "lists and dicts nest deeper"));
  CHECK(contains(failure("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns | tojson }}"), "nest deeper"));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
  // Time: cheap steps over a large string, each reading all of it.
  const json::object big{{"big", std::string(size_t{1} << 20, 'x')}};
  CHECK(contains(failure("{% for i in range(100000) %}{{ big | length }}{% endfor %}", big,
                         RenderLimits{.max_time = std::chrono::milliseconds(50)}),
                 "ms to render"));
  // A limit of the caller's own.
  CHECK(contains(failure("{% for i in range(100) %}{% endfor %}", {}, RenderLimits{.max_steps = 50}), "50 steps"));
}

TEST_CASE("namespaces holding each other render and are freed", "[chat][jinja]") {
  CHECK(Template("{% set ns = namespace(x=1) %}{% set ns.me = ns %}{{ ns.me.me.me.x }}").render({}) == "1");
  CHECK(Template("{% set a = namespace() %}{% set b = namespace(a=a) %}{% set a.b = b %}{{ a.b.a.b is defined }}")
            .render({}) == "true");
}

TEST_CASE("a real chat template on a long conversation stays within the limits", "[chat][jinja]") {
  const auto llama2 = paged::ChatTemplate::load(paged::test::kModel,
                                                std::string(PAGED_SOURCE_DIR) + "/conf/chat_templates/llama2.jinja");
  REQUIRE(llama2.has_value());
  json::array messages;
  for (int i = 0; i < 4000; ++i)
    messages.push_back(
        json::object{{"role", i % 2 ? "assistant" : "user"}, {"content", std::string(200, 'a' + i % 26)}});
  const std::string text = llama2->apply(messages, true);
  CHECK(text.size() > 4000 * 200);
}

TEST_CASE("integer arithmetic past 64 bits is a TemplateError, never a trap or undefined behaviour", "[chat][jinja]") {
  // INT64_MIN % -1 and // -1 raised SIGFPE (the server died); the others were signed overflow or a cast of a double
  // outside int64 (undefined), and a literal past int64 escaped as std::out_of_range.
  const std::string min = "(-9223372036854775807 - 1)";
  for (const std::string& expr : std::vector<std::string>{min + " % -1 * 0 + " + min + " // -1", min + " // -1", "9223372036854775807 + 1",
                                  min + " - 1", "9223372036854775807 * 2", "-" + min, "10 ** 30", min + " | abs",
                                  "(10.0 ** 300) | int", "'1e300' | float | int"}) {
    INFO(expr);
    CHECK(contains(failure("{{ " + expr + " }}"), "integer"));
  }
  CHECK(contains(failure("{{ 99999999999999999999 }}"), "out of range"));
  // The results in range are the JavaScript renderer's: // floors, % takes the dividend's sign.
  CHECK(Template("{{ -7 // 2 }} {{ 7 // -2 }} {{ -7 % 2 }} {{ 7 % -2 }} {{ 7 // -1 }} {{ " + min + " % -1 }} {{ " + min +
                 " + 1 }}").render({}) == "-4 -4 -1 1 -7 0 -9223372036854775807");
}
