// Token masks on the stories260K tokenizer against brute force (each token's bytes fed to a copy of a matcher of
// its own, which shares nothing with the automaton) along constrained random walks whose text the grammar accepts.
#include <catch2/catch.hpp>

#include <algorithm>
#include <boost/json.hpp>
#include <random>

#include "model/constraint/gbnf.h"
#include "model/constraint/json_schema.h"
#include "model/constraint/regex.h"
#include "model/constraint/sequence_constraints.h"
#include "model/constraint/token_mask.h"
#include "model/tokenizer/load_tokenizer.h"
#include "tests/test_data.h"

namespace paged::constraint {

namespace {

// Bit by bit what fill_mask should give: a token is allowed when a copy of the matcher takes its bytes (its
// leading form at the start), a stop id when the matcher can stop.
std::vector<uint32_t> brute_force_mask(const GrammarMatcher& matcher, const Tokenizer& tok, bool at_start,
                                       const std::vector<TokenId>& stop_ids) {
  std::vector<uint32_t> mask(mask_words(tok.vocab_size()), 0);
  for (TokenId id = 0; id < tok.vocab_size(); ++id) {
    const std::string bytes = tok.token_bytes(id, at_start);
    GrammarMatcher copy = matcher;
    bool allowed = !bytes.empty() && copy.accept(bytes);
    if (std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end()) allowed = matcher.can_stop();
    if (allowed) mask[id / 32] |= 1u << (id % 32);
  }
  return mask;
}

}  // namespace

TEST_CASE("Token masks equal brute force along constrained random walks (stories260K)", "[constraint]") {
  const auto tok = load_tokenizer(test::kModel);
  const auto trie = std::make_shared<const TokenTrie>(*tok);
  const std::vector<TokenId> stop_ids = tok->eos_ids();
  const std::vector<std::pair<std::string, std::shared_ptr<const Grammar>>> grammars{
      {"schema", std::make_shared<const Grammar>(compile_json_schema(boost::json::parse(R"({
         "type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
         "age": {"type": "integer", "minimum": 0, "maximum": 120},
         "tags": {"type": "array", "items": {"enum": ["a", "bc", "once upon"]}, "maxItems": 3}},
         "required": ["name", "age"]})")))},
      {"json_object", std::make_shared<const Grammar>(compile_json_object())},
      {"regex", std::make_shared<const Grammar>(
                    build_grammar({{"root", compile_regex("(Once|The) [a-z ]{1,30}\\.", RegexMatch::full)}}, "root"))},
      {"gbnf", std::make_shared<const Grammar>(compile_gbnf("root ::= (\"yes\" | \"no\" | \" maybe\") \"!\"*"))}};
  std::mt19937 rng(7);
  int masks = 0;
  for (const auto& [name, grammar] : grammars) {
    // One automaton for every walk of a grammar, as the completions of a request share one: later walks meet
    // states (and their cached masks) that earlier ones made.
    const auto automaton = std::make_shared<ConstraintAutomaton>(grammar, trie, stop_ids);
    for (bool at_start : {true, false}) {
      for (int walk = 0; walk < 4; ++walk) {
        INFO(name << " at_start " << at_start << " walk " << walk);
        TokenConstraint constraint(automaton, at_start);
        GrammarMatcher shadow(grammar);  // the text so far, fed byte by byte
        bool first = at_start;
        std::string text;
        for (int step = 0; step < 40; ++step) {
          std::vector<uint32_t> mask(mask_words(tok->vocab_size()));
          constraint.fill_mask({}, mask);
          REQUIRE(mask == brute_force_mask(shadow, *tok, first, stop_ids));
          ++masks;
          std::vector<TokenId> allowed;
          for (TokenId id = 0; id < tok->vocab_size(); ++id)
            if (mask_allows(mask, id)) allowed.push_back(id);
          REQUIRE_FALSE(allowed.empty());
          const TokenId pick = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
          REQUIRE(constraint.accept(pick));
          if (constraint.stopped()) break;
          const std::string bytes = tok->token_bytes(pick, first);
          REQUIRE(shadow.accept(bytes));
          text += bytes;
          first = false;
        }
        // A token the mask refuses is refused by accept as well, and changes nothing.
        std::vector<uint32_t> mask(mask_words(tok->vocab_size()));
        constraint.fill_mask({}, mask);
        for (TokenId id = 0; id < tok->vocab_size(); ++id)
          if (!mask_allows(mask, id)) CHECK_FALSE(constraint.accept(id));
        if (name == "schema" && constraint.stopped()) CHECK_NOTHROW(boost::json::parse(text));
      }
    }
  }
  CHECK(masks > 100);
}

}  // namespace paged::constraint

namespace paged::constraint {

TEST_CASE("A live state that takes no token ends the sequence: its mask is the stop ids", "[constraint]") {
  // No sentence ends this grammar, and after n a's the input is on 3^n stacks: the a that would pass the matcher's
  // bounds (kMaxFrontierStacks, kMaxExpansionFrames; the tenth) is cut, and b, c, d close nothing. The state before
  // it is live but takes no byte.
  const auto tok = load_tokenizer(test::kModel);
  const auto trie = std::make_shared<const TokenTrie>(*tok);
  const std::vector<TokenId> stop_ids = tok->eos_ids();
  const auto grammar =
      std::make_shared<const Grammar>(compile_gbnf(R"(root ::= "a" root "b" | "a" root "c" | "a" root "d")"));
  const auto automaton = std::make_shared<ConstraintAutomaton>(grammar, trie, stop_ids);
  TokenConstraint constraint(automaton, false);
  std::vector<TokenId> a;  // the tokens that write "a" (a piece and its byte)
  for (TokenId id = 0; id < tok->vocab_size(); ++id)
    if (trie->bytes(id) == "a") a.push_back(id);
  REQUIRE(!a.empty());
  std::vector<uint32_t> mask(mask_words(tok->vocab_size()));
  int written = 0;
  for (; written < 20; ++written) {
    constraint.fill_mask({}, mask);
    if (!mask_allows(mask, a[0])) break;
    REQUIRE(constraint.accept(a[0]));
  }
  CHECK(written >= 5);
  CHECK(written < 20);  // the walk met the dead end
  std::vector<TokenId> allowed;
  for (TokenId id = 0; id < tok->vocab_size(); ++id)
    if (mask_allows(mask, id)) allowed.push_back(id);
  std::vector<TokenId> want = stop_ids;
  std::sort(want.begin(), want.end());
  CHECK(allowed == want);
}

TEST_CASE("After its stop token a constraint allows the stop ids alone, also with the stop token pending", "[constraint]") {
  const auto tok = load_tokenizer(test::kModel);
  const auto trie = std::make_shared<const TokenTrie>(*tok);
  const std::vector<TokenId> stop_ids = tok->eos_ids();
  const auto automaton = std::make_shared<ConstraintAutomaton>(
      std::make_shared<const Grammar>(compile_gbnf(R"(root ::= "a")")), trie, stop_ids);
  TokenId a = -1;
  for (TokenId id = 0; id < tok->vocab_size() && a < 0; ++id)
    if (trie->bytes(id) == "a") a = id;
  REQUIRE(a >= 0);
  const auto allowed_of = [&](const TokenConstraint& c, TokenId pending) {
    std::vector<uint32_t> mask(mask_words(tok->vocab_size()));
    c.fill_mask(pending >= 0 ? std::span<const TokenId>(&pending, 1) : std::span<const TokenId>(), mask);
    std::vector<TokenId> allowed;
    for (TokenId id = 0; id < tok->vocab_size(); ++id)
      if (mask_allows(mask, id)) allowed.push_back(id);
    return allowed;
  };
  std::vector<TokenId> stops = stop_ids;
  std::sort(stops.begin(), stops.end());
  TokenConstraint c(automaton, false);
  REQUIRE(c.accept(a));
  CHECK(allowed_of(c, -1) == stops);            // "a" is complete: only a stop id goes on
  CHECK(allowed_of(c, stop_ids[0]) == stops);   // a step sent while the stop id was in flight
  REQUIRE(c.accept(stop_ids[0]));
  CHECK(c.stopped());
  CHECK(allowed_of(c, -1) == stops);
}

TEST_CASE("A constraint with an opening text allows every token until the output writes it, then its grammar",
          "[constraint]") {
  const auto tok = load_tokenizer(test::kModel);
  const auto trie = std::make_shared<const TokenTrie>(*tok);
  const std::vector<TokenId> stop_ids = tok->eos_ids();
  const auto automaton = std::make_shared<ConstraintAutomaton>(
      std::make_shared<const Grammar>(
          build_grammar({{"root", compile_regex("[0-9]{3}", RegexMatch::full)}}, "root")),
      trie, stop_ids);
  const auto allowed_count = [&](const TokenConstraint& c) {
    std::vector<uint32_t> mask(mask_words(tok->vocab_size()));
    c.fill_mask({}, mask);
    size_t n = 0;
    for (TokenId id = 0; id < tok->vocab_size(); ++id) n += mask_allows(mask, id);
    return n;
  };
  const auto mask_of = [&](const TokenConstraint& c) {
    std::vector<uint32_t> mask(mask_words(tok->vocab_size()));
    c.fill_mask({}, mask);
    return mask;
  };
  const TokenConstraint fresh(automaton, false);  // the grammar from its start
  TokenConstraint gated(automaton, false, "</think>");
  CHECK(allowed_count(gated) == static_cast<size_t>(tok->vocab_size()));
  // Free text, then the tag written across tokens, byte by byte where the vocabulary has no piece for it.
  for (const TokenId id : tok->encode("Once upon a time", false)) REQUIRE(gated.accept(id));
  CHECK(allowed_count(gated) == static_cast<size_t>(tok->vocab_size()));
  std::vector<TokenId> tag;
  for (const char c : std::string("</think>")) {
    TokenId byte = -1;
    for (TokenId id = 0; id < tok->vocab_size() && byte < 0; ++id)
      if (trie->bytes(id) == std::string(1, c)) byte = id;
    REQUIRE(byte >= 0);
    tag.push_back(byte);
  }
  for (size_t i = 0; i + 1 < tag.size(); ++i) {
    REQUIRE(gated.accept(tag[i]));
    CHECK(allowed_count(gated) == static_cast<size_t>(tok->vocab_size()));  // not yet
  }
  // The mask with the closing byte still in flight is already the grammar's.
  std::vector<uint32_t> pending(mask_words(tok->vocab_size()));
  gated.fill_mask(std::span<const TokenId>(&tag.back(), 1), pending);
  CHECK(pending == mask_of(fresh));
  REQUIRE(gated.accept(tag.back()));
  CHECK(mask_of(gated) == mask_of(fresh));
  CHECK(allowed_count(gated) < 100);
  // A letter is refused now, a digit taken.
  CHECK_FALSE(gated.accept(tok->encode("a", false).back()));

  // A prompt that holds the tag starts the grammar at once; one without it does not.
  ConstraintCache cache(trie);
  const StructuredOutput digits{.kind = StructuredOutput::Kind::regex, .spec = "[0-9]{3}", .field = "guided_regex",
                                .after = "</think>"};
  CHECK(mask_of(*cache.make(digits, stop_ids, "<think>\n\n</think>\n\n")) == mask_of(fresh));
  CHECK(allowed_count(*cache.make(digits, stop_ids, "Hello")) == static_cast<size_t>(tok->vocab_size()));
}

}  // namespace paged::constraint
