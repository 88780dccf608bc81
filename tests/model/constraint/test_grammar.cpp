// The grammar, its matcher and the GBNF reader: sentences, prefixes and refusals written out by hand; the regex
// compiler against std::regex (ECMAScript) over every short string of a small alphabet.
#include <catch2/catch.hpp>

#include <memory>
#include <regex>
#include <string>

#include "model/constraint/gbnf.h"
#include "model/constraint/matcher.h"
#include "model/constraint/regex.h"

namespace paged::constraint {

namespace {

std::shared_ptr<const Grammar> gbnf(std::string_view text) { return std::make_shared<const Grammar>(compile_gbnf(text)); }

// Whether `text` is a sentence of `g`; `prefix` tells whether it is at least a prefix of one.
bool matches(const std::shared_ptr<const Grammar>& g, std::string_view text, bool* prefix = nullptr) {
  GrammarMatcher m(g);
  const bool ok = m.accept(text);
  if (prefix) *prefix = ok;
  return ok && m.can_stop();
}

std::shared_ptr<const Grammar> regex_grammar(std::string_view pattern, RegexMatch match) {
  return std::make_shared<const Grammar>(build_grammar({{"root", compile_regex(pattern, match)}}, "root"));
}

}  // namespace

TEST_CASE("GBNF grammars accept their sentences and refuse the rest", "[constraint]") {
  const auto g = gbnf(R"(
    # a list of small numbers
    root ::= "[" ws (num ("," ws num)*)? "]"
    num  ::= [1-9] [0-9]{0,2} | "0"
    ws   ::= [ \t]*
  )");
  for (const char* ok : {"[]", "[ ]", "[0]", "[1,2]", "[10, 999]", "[5,\t0]"}) CHECK(matches(g, ok));
  for (const char* bad : {"[", "[01]", "[1000]", "[1,]", "[,1]", "[1 ,2]", "x"}) CHECK_FALSE(matches(g, bad));
  bool prefix = false;
  CHECK_FALSE(matches(g, "[12", &prefix));
  CHECK(prefix);
  CHECK_FALSE(matches(g, "[1000", &prefix));
  CHECK_FALSE(prefix);
}

TEST_CASE("GBNF: classes, negation, Unicode, repetition bounds and groups", "[constraint]") {
  const auto g = gbnf(R"(root ::= ([^"\\] | "\\" ["nt])+ "|" "é"? [α-ω]{2,3})");
  CHECK(matches(g, "ab|αβ"));
  CHECK(matches(g, "a\\n|éωωω"));
  CHECK(matches(g, "\xe2\x82\xac|ab" ) == false);   // [α-ω] is Greek only
  CHECK(matches(g, "\xe2\x82\xac|\xce\xb1\xce\xb2"));  // "€|αβ": € is a character of [^"\\]
  CHECK_FALSE(matches(g, "a|α"));
  CHECK_FALSE(matches(g, "a|αβγδ"));
  CHECK_FALSE(matches(g, "\"|αβ"));
  CHECK_FALSE(matches(g, "\\x|αβ"));
  CHECK_FALSE(matches(g, "\xce|αβ"));  // a lone lead byte is no character
}

TEST_CASE("GBNF: right recursion, nullable cycles and the empty sentence", "[constraint]") {
  const auto g = gbnf("root ::= item root | \"\"\nitem ::= \"a\" | \"\" | \"(\" root \")\"");
  for (const char* ok : {"", "a", "aaa", "()", "(a(a))a"}) CHECK(matches(g, ok));
  for (const char* bad : {"(", ")", "(a))"}) CHECK_FALSE(matches(g, bad));
}

TEST_CASE("GBNF errors name the problem", "[constraint]") {
  CHECK_THROWS_WITH(compile_gbnf("root ::= a"), Catch::Contains("'a' is used but not defined"));
  CHECK_THROWS_WITH(compile_gbnf("start ::= \"a\""), Catch::Contains("root rule 'root' is not defined"));
  CHECK_THROWS_WITH(compile_gbnf("root ::= root \"a\" | \"b\""), Catch::Contains("left-recursive"));
  CHECK_THROWS_WITH(compile_gbnf("root ::= x\nx ::= \"\" root \"b\""), Catch::Contains("left-recursive"));
  CHECK_THROWS_WITH(compile_gbnf("root ::= \"a\nroot ::= \"b\""), Catch::Contains("line"));
  CHECK_THROWS_WITH(compile_gbnf("root ::= \"a\"\nroot ::= \"b\""), Catch::Contains("defined twice"));
  CHECK_THROWS_WITH(compile_gbnf("root ::= [z-a]"), Catch::Contains("backwards"));
  CHECK_THROWS_WITH(compile_gbnf("root ::= \"a\"{3,2}"), Catch::Contains("min <= max"));
  CHECK_THROWS_WITH(compile_gbnf("root ::= \"a\"{1000001}"), Catch::Contains("too large"));
  CHECK_THROWS_WITH(compile_gbnf("root ::= " + std::string(100000, '(')), Catch::Contains("nested deeper"));
}

TEST_CASE("A failed accept leaves the matcher as it was", "[constraint]") {
  const auto g = gbnf("root ::= \"ab\" \"c\"*");
  GrammarMatcher m(g);
  CHECK(m.accept("a"));
  CHECK_FALSE(m.accept("bd"));
  CHECK(m.accept("b"));
  CHECK(m.can_stop());
  CHECK(m.can_continue());
  CHECK(m.accept("ccc"));
  CHECK_FALSE(m.accept("a"));
  CHECK(m.can_stop());
}

TEST_CASE("Regexes match exactly the strings std::regex matches", "[constraint]") {
  const std::string alphabet = "ab-01 ";
  const std::vector<std::string> patterns{
      "a", "a|b", "ab*", "(ab)+", "a?b?-", "[ab]{2}", "[^a]{1,3}", "\\d+", "\\w\\s?", "(a|b-)*1",
      "a{2,}", "[a-b0]{0,2}b", ".", "\\D\\W", "(?:a|)b", "[\\d-]+", "\\x61\\u0062", "a*?b+?", "[^\\s]0", "(?<n>a)b"};
  for (const std::string& pattern : patterns) {
    INFO(pattern);
    const auto g = regex_grammar(pattern, RegexMatch::full);
    const std::regex reference(pattern.find("(?<") == 0 ? "(a)b" : pattern, std::regex::ECMAScript);
    // Every string of up to 4 characters of the alphabet.
    std::vector<std::string> strings{""};
    for (size_t begin = 0, len = 0; len < 4; ++len) {
      const size_t end = strings.size();
      for (size_t i = begin; i < end; ++i)
        for (char c : alphabet) strings.push_back(strings[i] + c);
      begin = end;
    }
    for (const std::string& s : strings) {
      INFO("'" << s << "'");
      CHECK(matches(g, s) == std::regex_match(s, reference));
    }
  }
}

TEST_CASE("Regex search mode: unanchored ends take any characters", "[constraint]") {
  const auto contains = regex_grammar("b1", RegexMatch::search);
  const auto anchored = regex_grammar("^a|b$", RegexMatch::search);
  for (const std::string s : {"b1", "ab1", "b1 a", "", "b", "1b"}) {
    INFO(s);
    CHECK(matches(contains, s) == std::regex_search(s, std::regex("b1")));
    CHECK(matches(anchored, s) == std::regex_search(s, std::regex("^a|b$")));
  }
  CHECK(matches(regex_grammar("é.", RegexMatch::full), "éλ"));
  CHECK_FALSE(matches(regex_grammar("a.", RegexMatch::full), "a\n"));
}

TEST_CASE("Unsupported regex constructs are refused by name", "[constraint]") {
  CHECK_THROWS_WITH(compile_regex("a(?=b)", RegexMatch::full), Catch::Contains("lookaround"));
  CHECK_THROWS_WITH(compile_regex("(a)\\1", RegexMatch::full), Catch::Contains("backreferences"));
  CHECK_THROWS_WITH(compile_regex("\\bword", RegexMatch::full), Catch::Contains("word boundaries"));
  CHECK_THROWS_WITH(compile_regex("a^b", RegexMatch::full), Catch::Contains("'^'"));
  CHECK_THROWS_WITH(compile_regex("a$b", RegexMatch::full), Catch::Contains("'$'"));
  CHECK_THROWS_WITH(compile_regex("(ab", RegexMatch::full), Catch::Contains("missing ')'"));
  CHECK_THROWS_WITH(compile_regex("a**", RegexMatch::full), Catch::Contains("nothing to repeat"));
  CHECK_THROWS_WITH(compile_regex("[b-a]", RegexMatch::full), Catch::Contains("backwards"));
  CHECK_THROWS_WITH(compile_regex(std::string(100000, '(') + std::string(100000, ')'), RegexMatch::full),
                    Catch::Contains("nested deeper"));
}

}  // namespace paged::constraint

namespace paged::constraint {

TEST_CASE("An ambiguous grammar's frontier is bounded: the byte past kMaxFrontierStacks is refused", "[constraint]") {
  // After n a's the input can be on 3 * 2^n stacks (two a-alternatives and x, under each of the 2^n ways to close
  // the a's with b or c): 3 * 2^14 <= 2^16 < 3 * 2^15, so the 15th a is refused and the rest of the language stays.
  const auto g = gbnf(R"(root ::= "a" root "b" | "a" root "c" | "x")");
  GrammarMatcher m(g);
  REQUIRE(m.accept(std::string(14, 'a')));
  CHECK(m.frontier().stacks.size() == 3 * (size_t{1} << 14));
  CHECK_FALSE(m.accept("a"));
  CHECK(m.frontier().stacks.size() == 3 * (size_t{1} << 14));  // the refusal changed nothing
  CHECK(m.accept("x" + std::string(7, 'b') + std::string(7, 'c')));
  CHECK(m.can_stop());
}

TEST_CASE("A grammar whose start is on more than kMaxFrontierStacks stacks is refused", "[constraint]") {
  // r_i ::= r_(i+1) "a" | r_(i+1) "b": the start is on 2^n stacks for n such rules.
  const auto chain = [](int n) {
    std::string text = "root ::= r0\n";
    for (int i = 0; i < n; ++i)
      text += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + " \"a\" | r" + std::to_string(i + 1) + " \"b\"\n";
    return text + "r" + std::to_string(n) + " ::= \"x\"";
  };
  GrammarMatcher ok(gbnf(chain(16)));  // 2^16 stacks: at the bound
  CHECK(ok.frontier().stacks.size() == size_t{1} << 16);
  CHECK(ok.accept("xab"));
  CHECK_THROWS_WITH(GrammarMatcher(gbnf(chain(17))), Catch::Contains("too ambiguous"));
  CHECK_THROWS_WITH(GrammarMatcher(gbnf(chain(40))), Catch::Contains("too ambiguous"));
}

TEST_CASE("A grammar that matches no text is refused", "[constraint]") {
  // The rule is only itself, in tail position (not left recursion): its start reaches no byte and cannot end.
  CHECK_THROWS_WITH(GrammarMatcher(gbnf("root ::= root")), Catch::Contains("matches no text"));
  CHECK_THROWS_WITH(GrammarMatcher(gbnf("root ::= x\nx ::= root")), Catch::Contains("matches no text"));
  GrammarMatcher endless(gbnf(R"(root ::= "a" root)"));  // no sentence, but every prefix a's: its start is live
  CHECK(endless.accept("aaa"));
}

TEST_CASE("Random GBNF and regex texts compile or are refused with a GrammarError, never worse", "[constraint]") {
  std::mt19937 rng(99);
  const std::string gbnf_alphabet = "root ::= \"ab\\[]^-|()*+?{},.#\n x0123";
  const std::string regex_alphabet = "ab\\[]^-$|()*+?{},.dws:<>=!x0123";
  int compiled = 0, refused = 0;
  for (int i = 0; i < 4000; ++i) {
    const bool gbnf_text = i % 2 == 0;
    const std::string& alphabet = gbnf_text ? gbnf_alphabet : regex_alphabet;
    std::string text = gbnf_text ? "root ::= " : "";
    const size_t len = rng() % 24;
    for (size_t k = 0; k < len; ++k) text += alphabet[rng() % alphabet.size()];
    INFO("'" << text << "'");
    try {
      auto g = std::make_shared<const Grammar>(
          gbnf_text ? compile_gbnf(text) : build_grammar({{"root", compile_regex(text, RegexMatch::search)}}, "root"));
      GrammarMatcher m(g);
      for (int b = 0; b < 16; ++b) m.accept(std::string(1, alphabet[rng() % alphabet.size()]));
      ++compiled;
    } catch (const GrammarError&) {
      ++refused;
    }
  }
  CHECK(compiled > 200);
  CHECK(refused > 200);
}

}  // namespace paged::constraint
