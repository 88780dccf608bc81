// allowed_token_ids and bad_words end to end on stories260K (CPU engine): against logit_bias, an independent way to
// the same greedy choice (-100 on a token outweighs the model's logit differences), and against the unconstrained
// greedy output, which a bad word changes only where that output completed it; refusals name the field.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <sstream>

#include "actors/engine.h"
#include "model/sampling/bad_words.h"
#include "tests/test_data.h"

using namespace paged;

namespace {

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

// The end (exclusive) of the first occurrence in `ids` of any of `words`, or npos.
size_t first_completion(const std::vector<TokenId>& ids, const std::vector<std::vector<TokenId>>& words) {
  for (size_t end = 1; end <= ids.size(); ++end)
    for (const auto& w : words)
      if (w.size() <= end && std::equal(w.begin(), w.end(), ids.begin() + static_cast<std::ptrdiff_t>(end - w.size())))
        return end;
  return std::string::npos;
}

std::vector<std::string> words_of(const std::string& text) {
  std::vector<std::string> out;
  std::string w;
  for (char c : text + " ") {
    if (std::isalpha(static_cast<unsigned char>(c))) {
      w += c;
    } else if (!w.empty()) {
      out.push_back(std::exchange(w, ""));
    }
  }
  return out;
}

void require_idle(Engine& engine) {
  engine.wait_idle();
  CHECK(engine.metrics().kv_blocks_free == engine.metrics().kv_blocks_total);
  CHECK(engine.metrics().running_seqs == 0);
}

}  // namespace

TEST_CASE("allowed_token_ids: greedy equals a -100 logit_bias on every other token; samples stay in the set",
          "[engine][token_masks]") {
  Engine engine({.model_dir = test::kModel, .device = "cpu"});
  const Tokenizer& tok = engine.tokenizer();
  const int vocab = tok.vocab_size();
  const std::vector<std::vector<TokenId>> prompts{tok.encode("Once upon a time", true),
                                                  tok.encode("The little dog", true)};
  // The tokens of a short story's text: a set the model can write something with.
  std::vector<TokenId> allowed = tok.encode("Tom and his mom went to the park. They saw a big red ball and played.", false);
  std::sort(allowed.begin(), allowed.end());
  allowed.erase(std::unique(allowed.begin(), allowed.end()), allowed.end());
  const std::set<TokenId> in_set(allowed.begin(), allowed.end());

  SamplingParams masked = greedy(40);
  masked.allowed_token_ids = allowed;
  SamplingParams biased = greedy(40);
  for (TokenId id = 0; id < vocab; ++id)
    if (!in_set.count(id)) biased.logit_bias[id] = -100.0f;
  const auto by_mask = engine.generate(prompts, masked), by_bias = engine.generate(prompts, biased);
  const auto free = engine.generate(prompts, greedy(40));
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& ids = by_mask[i].outputs[0].token_ids;
    CHECK(ids == by_bias[i].outputs[0].token_ids);
    CHECK(ids != free[i].outputs[0].token_ids);  // the set changed what the model writes
    for (TokenId t : ids) CHECK(in_set.count(t));
  }
  // Sampled, several completions of one request (their shared logits row), seeded.
  SamplingParams sampled = masked;
  sampled.temperature = 1.0f;
  sampled.n = 3;
  for (uint64_t seed = 0; seed < 4; ++seed) {
    sampled.seed = seed;
    for (const RequestOutput& r : engine.generate(prompts, sampled))
      for (const CompletionOutput& c : r.outputs)
        for (TokenId t : c.token_ids) CHECK(in_set.count(t));
  }
  require_idle(engine);
}

TEST_CASE("bad_words: the greedy output changes exactly where it completed a bad word, and never completes one",
          "[engine][token_masks]") {
  Engine engine({.model_dir = test::kModel, .device = "cpu"});
  const Tokenizer& tok = engine.tokenizer();
  int changed = 0;
  for (const char* prompt : {"Once upon a time", "The little dog", "Lily and Ben", "One day, a bird"}) {
    const std::vector<TokenId> ids = tok.encode(prompt, true);
    const CompletionOutput free = engine.generate({ids}, greedy(48))[0].outputs[0];
    // Each word of the output that it completed as one of the word's spellings, in turn.
    for (const std::string& word : words_of(free.text)) {
      const std::vector<std::string> bad = {word};
      const auto spelled = bad_words_token_ids(tok, bad);
      const size_t end = first_completion(free.token_ids, spelled);
      if (end == std::string::npos) continue;
      SamplingParams p = greedy(48);
      p.bad_words = bad;
      const CompletionOutput out = engine.generate({ids}, p)[0].outputs[0];
      INFO(prompt << " | bad word '" << word << "' | " << free.text << " | " << out.text);
      CHECK(first_completion(out.token_ids, spelled) == std::string::npos);
      // Equal up to the banned token, which differs.
      REQUIRE(out.token_ids.size() >= end);
      CHECK(std::equal(out.token_ids.begin(), out.token_ids.begin() + static_cast<std::ptrdiff_t>(end - 1),
                       free.token_ids.begin()));
      CHECK(out.token_ids[end - 1] != free.token_ids[end - 1]);
      // A one-token spelling is the -100 bias on it, an independent path to the same choice.
      if (std::all_of(spelled.begin(), spelled.end(), [](const auto& w) { return w.size() == 1; })) {
        SamplingParams biased = greedy(48);
        for (const auto& w : spelled) biased.logit_bias[w[0]] = -100.0f;
        CHECK(engine.generate({ids}, biased)[0].outputs[0].token_ids == out.token_ids);
      }
      ++changed;
    }
  }
  CHECK(changed >= 8);
  require_idle(engine);
}

TEST_CASE("allowed_token_ids and bad_words that leave nothing, or are no words, are refused", "[engine][token_masks]") {
  Engine engine({.model_dir = test::kModel, .device = "cpu"});
  const Tokenizer& tok = engine.tokenizer();
  const std::vector<TokenId> prompt = tok.encode("Once upon a time", true);
  const auto refused_field = [&](const SamplingParams& p) -> std::string {
    try {
      engine.generate({prompt}, p);
    } catch (const InvalidRequest& e) {
      return e.param;
    }
    return "";
  };
  SamplingParams p = greedy(8);
  p.ignore_eos = false;
  p.allowed_token_ids = tok.eos_ids();
  CHECK(refused_field(p).empty());  // EOS alone: the request ends at once
  p.min_tokens = 2;
  CHECK(refused_field(p) == "allowed_token_ids");  // EOS is masked before two tokens
  // A word of one token, allowed alone and banned.
  const std::vector<std::string> common = {"the", "and", "was", "a"};
  const auto one_token = std::find_if(common.begin(), common.end(),
                                      [&](const std::string& w) { return tok.encode(w, false).size() == 1; });
  REQUIRE(one_token != common.end());
  p = greedy(8);
  p.allowed_token_ids = tok.encode(*one_token, false);
  p.bad_words = {*one_token};
  CHECK(refused_field(p) == "allowed_token_ids");
  p = greedy(8);
  p.bad_words = {"  "};
  CHECK(refused_field(p) == "bad_words");
  p.bad_words = {"\xc3"};
  CHECK(refused_field(p) == "bad_words");
  p = greedy(8);
  p.allowed_token_ids = {tok.vocab_size()};
  CHECK(refused_field(p) == "allowed_token_ids");
  require_idle(engine);
}
