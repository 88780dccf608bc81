// bad_words and allowed_token_ids in the CPU sampler (model/sampling/bad_words.h, sampler.h): which tokens a bad
// word masks after which output, its spellings (vLLM's rule, on a table tokenizer that has both kinds of spelling
// and on the shared stories260K SentencePiece tokenizer), and the token mask of allowed_token_ids, alone and within
// a structured output's mask.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "model/sampling/bad_words.h"
#include "model/sampling/sampler.h"
#include "model/tokenizer/load_tokenizer.h"
#include "tests/model/sampling/same_penalties.h"
#include "tests/test_data.h"

using namespace paged;
using paged::test::check_same_penalties;

namespace {

using Ids = std::vector<TokenId>;

// A tokenizer of whole texts from a table (what encode gives each), to take each branch of the spelling rule.
struct TableTokenizer final : Tokenizer {
  std::map<std::string, Ids, std::less<>> table;
  Ids encode(std::string_view text, bool) const override {
    const auto it = table.find(text);
    return it == table.end() ? Ids{} : it->second;
  }
  std::string token_bytes(TokenId, bool) const override { return ""; }
  std::string special_token_text(TokenId) const override { return ""; }
  int32_t vocab_size() const override { return 100; }
  TokenId bos_id() const override { return -1; }
  std::vector<TokenId> eos_ids() const override { return {}; }
  TokenId token_to_id(std::string_view) const override { return -1; }
};

Ids bans(const std::vector<Ids>& words, const Ids& output, TokenId pending = -1) {
  Ids out, generated = output;
  if (pending >= 0) generated.push_back(pending);
  append_bad_word_bans(words, generated, out);
  return out;
}

}  // namespace

TEST_CASE("a bad word masks its last token when the output ends with the tokens before it", "[sampling][bad_words]") {
  const std::vector<Ids> words = {{7}, {3, 4}, {5, 6, 8}};
  CHECK(bans(words, {}) == Ids{7});                  // a one-token word always; a longer one not before its prefix
  CHECK(bans(words, {1, 3}) == Ids{7, 4});
  CHECK(bans(words, {3, 1}) == Ids{7});              // the prefix must end the output
  CHECK(bans(words, {5, 6}) == Ids{7, 8});
  CHECK(bans(words, {6}) == Ids{7});                 // a prefix cut short by the output's start bans nothing
  CHECK(bans(words, {9, 5}, 6) == Ids{7, 8});        // the pending token is the newest
  CHECK(bans(words, {5, 6}, 3) == Ids{7, 4});
  CHECK(bans(words, {}, 3) == Ids{7, 4});
}

TEST_CASE("bad words are spelled alone and after a space, vLLM's rule", "[sampling][bad_words]") {
  TableTokenizer tok;
  tok.table = {{"dog", {10}}, {" dog", {11}},            // byte-level BPE: a new first token, as many: both
               {"big cat", {20, 21}}, {" big cat", {22, 21}},
               {"Lily", {30}}, {" Lily", {31, 30}},      // the space adds a token (SentencePiece): alone only
               {"ox", {40, 41}}, {" ox", {40, 42}}};     // the same first token: alone only
  const std::vector<std::string> words = {"dog", "  big cat", "Lily", "ox"};
  CHECK(bad_words_token_ids(tok, words) == std::vector<Ids>{{10}, {11}, {20, 21}, {22, 21}, {30}, {40, 41}});
  CHECK_THROWS_AS(bad_words_token_ids(tok, std::vector<std::string>{"unknown"}), TokenizerError);  // no tokens
}

TEST_CASE("bad words of the stories260K tokenizer decode back to the word", "[sampling][bad_words]") {
  const auto tok = load_tokenizer(test::kModel);
  const std::vector<std::string> words = {"Lily", "park", " happy", "ice cream", "don't"};
  const std::vector<Ids> spelled = bad_words_token_ids(*tok, words);
  REQUIRE(spelled.size() >= words.size());
  for (const Ids& ids : spelled) {
    const std::string text = tok->decode(ids);
    const bool is_a_word = std::any_of(words.begin(), words.end(), [&](std::string w) {
      w.erase(0, w.find_first_not_of(' '));
      return text == w || text == " " + w;
    });
    CAPTURE(text);
    CHECK(is_a_word);
  }
}

TEST_CASE("allowed_token_ids: a token mask alone and within a structured output's", "[sampling]") {
  struct Evens final : TokenMaskSource {
    void fill_mask(std::span<const TokenId>, std::span<uint32_t> mask) const override {
      std::fill(mask.begin(), mask.end(), 0x55555555u);
    }
  } evens;
  const int vocab = 70;
  std::vector<uint32_t> mask(3);
  SamplingParams p;
  SampleSpec spec{.params = &p};
  CHECK_FALSE(fill_token_mask(spec, mask));  // neither: no mask
  p.allowed_token_ids = {3, 4, 69, 4};
  REQUIRE(fill_token_mask(spec, mask));
  for (int id = 0; id < 96; ++id) CHECK(((mask[id / 32] >> (id % 32)) & 1) == (id == 3 || id == 4 || id == 69));
  spec.mask_source = &evens;
  REQUIRE(fill_token_mask(spec, mask));
  for (int id = 0; id < 96; ++id) CHECK(((mask[id / 32] >> (id % 32)) & 1) == (id == 4));

  // The sampler draws only allowed tokens; greedy takes the best of them.
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  spec.mask_source = nullptr;
  p.allowed_token_ids = {2, 11, 40, 41};
  for (float temperature : {0.0f, 1.0f}) {
    p.temperature = temperature;
    for (uint64_t seed = 0; seed < 50; ++seed) {
      std::vector<float> logits(vocab);
      for (float& l : logits) l = normal(rng);
      const TokenId best = *std::max_element(p.allowed_token_ids.begin(), p.allowed_token_ids.end(),
                                             [&](TokenId a, TokenId b) { return logits[a] < logits[b]; });
      spec.seed = seed;
      const TokenId t = sample_logits(logits, spec)[0].token;
      CHECK(std::count(p.allowed_token_ids.begin(), p.allowed_token_ids.end(), t) == 1);
      if (temperature == 0.0f) CHECK(t == best);
    }
  }
}

TEST_CASE("bad words reach the sampler as masked logits, with the output's history", "[sampling][bad_words]") {
  SamplingParams p;
  p.temperature = 0.0f;
  p.bad_words_token_ids = {{5}, {1, 6}};
  const Ids output = {3, 1};
  const SampleSpec spec{.params = &p, .output = &output};
  const PenaltyOps ops = penalty_ops(spec, 10);
  CHECK(ops.masked == Ids{5, 6});
  std::vector<float> logits(10, 0.0f);
  logits[5] = 9.0f;
  logits[6] = 8.0f;
  logits[2] = 1.0f;
  CHECK(sample_logits(logits, spec)[0].token == 2);  // the best two are banned
  CHECK(std::isinf(logits[5]));
}

TEST_CASE("a verified position's drafts count as generated: penalties, bad words, min_tokens and the random stream "
          "are those of the output they would make",
          "[sampling][speculative]") {
  SamplingParams p{.min_tokens = 5, .temperature = 0.9f, .seed = 4, .repetition_penalty = 1.4f,
                   .presence_penalty = 0.3f, .frequency_penalty = 0.7f};
  p.bad_words_token_ids = {{4, 6, 8}, {9}};
  const Ids prompt = {1, 2}, stop = {0};
  const Ids output = {3, 4}, drafts = {6, 3};
  const Ids whole = {3, 4, 6, 3};  // the output the drafts would make
  const SampleSpec with_drafts{.params = &p, .seed = 4, .prompt = &prompt, .output = &output, .stop_ids = &stop,
                               .drafted = drafts};
  const SampleSpec plain{.params = &p, .seed = 4, .prompt = &prompt, .output = &whole, .stop_ids = &stop};
  CHECK(generated_count(with_drafts) == 4);
  CHECK(newest_generated(with_drafts, 3) == Ids{4, 6, 3});
  check_same_penalties(penalty_ops(with_drafts, 12), penalty_ops(plain, 12));
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> logits(12);
    for (float& l : logits) l = normal(rng);
    std::vector<float> copy = logits;
    CHECK(sample_logits(logits, with_drafts)[0].token == sample_logits(copy, plain)[0].token);
  }
}
