// The Jinja subset's string layer (JavaScript semantics over model/unicode/utf8.h: bytes that are not UTF-8 survive
// as raw bytes) and the operator chains of its parser.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "model/template/jinja.h"
#include "model/template/jinja/text.h"

using paged::jinja::Template;
namespace jinja = paged::jinja;

TEST_CASE("Jinja code points: valid UTF-8 decodes, each byte of an invalid subpart is a raw byte", "[chat][jinja]") {
  CHECK(jinja::code_points("a\xC3\xA9\xF0\x9F\x98\x80") == std::u32string{U'a', 0xE9, 0x1F600});
  const char32_t raw = jinja::kRawByte;
  // An overlong lead, a truncated three-byte character (one subpart of two bytes), a surrogate.
  CHECK(jinja::code_points("\xC0\x80") == std::u32string{raw + 0xC0, raw + 0x80});
  CHECK(jinja::code_points("\xE2\x82x") == std::u32string{raw + 0xE2, raw + 0x82, U'x'});
  CHECK(jinja::code_points("\xED\xA0\x80") == std::u32string{raw + 0xED, raw + 0xA0, raw + 0x80});
}

TEST_CASE("Jinja code points round-trip byte for byte", "[chat][jinja]") {
  for (const std::string s : {"", "plain", "\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80", "\xFF\xFE", "\xC0\x80", "a\xE2\x82",
                              "\xED\xA0\x80", "\xF5\x80\x80\x80", "\xF4\x90\x80\x80", "\x80x\xE2\x82\xAC\xE2"}) {
    INFO(s);
    CHECK(jinja::from_code_points(jinja::code_points(s)) == s);
  }
}

TEST_CASE("Jinja strings count, trim and print numbers as JavaScript does", "[chat][jinja]") {
  CHECK(jinja::js_length("a\xF0\x9F\x98\x80") == 3);  // a surrogate pair counts two
  CHECK(jinja::js_length("a\xFF") == 2);
  CHECK(jinja::trim("\xE3\x80\x80 x\xEF\xBB\xBF\n", jinja::Trim::both) == "x");  // U+3000, U+FEFF
  CHECK(jinja::trim("\xFF x ", jinja::Trim::start) == "\xFF x ");
  CHECK(jinja::js_number(0.1 + 0.2) == "0.30000000000000004");
  CHECK(jinja::js_number(1e21) == "1e+21");
  CHECK(jinja::js_number(1e-7) == "1e-7");
  CHECK(jinja::js_number(0.000001) == "0.000001");
  CHECK(jinja::js_number(-123.5) == "-123.5");
  CHECK(std::isnan(jinja::js_to_number("12x")));
  CHECK(jinja::js_to_number(" 12 ") == 12);
}

TEST_CASE("Jinja knows the control escapes JavaScript and JSON share", "[chat][jinja]") {
  CHECK(jinja::control_of_escape('n') == '\n');
  CHECK(jinja::control_of_escape('b') == '\b');
  CHECK(jinja::control_of_escape('v') == '\0');  // JavaScript only: the lexer knows it itself
  CHECK(jinja::escape_of_control('\t') == 't');
  CHECK(jinja::escape_of_control('\f') == 'f');
  CHECK(jinja::escape_of_control('\v') == '\0');  // JSON writes \u000b
  CHECK(Template("{{ '\\b\\f\\v\\'' | tojson }}").render({}) == "\"\\b\\f\\u000b'\"");
}

TEST_CASE("Jinja templates keep bytes that are not UTF-8 through slicing, length and whitespace control",
          "[chat][jinja]") {
  CHECK(Template("{{ '\xFF\xFE" "ab'[::-1] }}").render({}) == "ba\xFE\xFF");
  CHECK(Template("{{ 'a\xE2\x82' | length }}").render({}) == "3");
  CHECK(Template("a {{- 'x' -}} \xE3\x80\x80 y").render({}) == "axy");  // -}} strips JavaScript whitespace
  CHECK(Template("{{ 'x' -}}\xFFy").render({}) == "x\xFFy");
}

TEST_CASE("Jinja binary operators of one precedence group to the left", "[chat][jinja]") {
  CHECK(Template("{{ 10 - 2 - 3 }} {{ 2 * 3 // 4 }} {{ 100 // 7 % 3 }}").render({}) == "5 1 2");
  CHECK(Template("{{ false or 0 or 'x' }} {{ 1 and 2 and 3 }} {{ 'a' ~ 'b' + 'c' }}").render({}) == "x 3 abc");
}

TEST_CASE("Jinja loops over an undefined variable as over nothing, as Python's Jinja does", "[chat][jinja]") {
  // Chat templates loop over `tools` whether or not a request sends any (@huggingface/jinja would throw here).
  CHECK(Template("[{% for t in tools %}{{ t }}{% endfor %}]").render({}) == "[]");
  CHECK(Template("{% for t in tools %}x{% else %}none{% endfor %}").render({}) == "none");
}
