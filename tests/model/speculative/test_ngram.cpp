// N-gram speculation (model/speculative/ngram.h): what is proposed from a sequence's own tokens, and which drafts a
// step's samples accept.
#include <catch2/catch.hpp>

#include <random>

#include "model/speculative/ngram.h"

using namespace paged;

namespace {

using Ids = std::vector<TokenId>;

NgramSpeculation lookup(int min_n, int max_n, int k = 4) {
  return {.num_speculative_tokens = k, .prompt_lookup_min = min_n, .prompt_lookup_max = max_n};
}

}  // namespace

TEST_CASE("n-gram drafts continue the latest earlier occurrence of the longest newest run", "[speculative]") {
  // The newest tokens 2 3 occur at 1..2 and 6..7; the latest wins: 9 then 2 3 (the run itself may follow).
  CHECK(propose_ngram_drafts(Ids{1, 2, 3, 4, 5, 2, 3, 9, 2, 3}, lookup(1, 2), 3) == Ids{9, 2, 3});
  // A longer run beats a later shorter one: 1 2 3 occurs at 0..2; only 2 3 (and 3) occur later.
  CHECK(propose_ngram_drafts(Ids{1, 2, 3, 7, 8, 4, 2, 3, 6, 1, 2, 3}, lookup(1, 3), 2) == Ids{7, 8});
  // The drafts stop at the end of the sequence and at max_drafts.
  CHECK(propose_ngram_drafts(Ids{5, 6, 7, 5, 6}, lookup(2, 2), 8) == Ids{7, 5, 6});
  CHECK(propose_ngram_drafts(Ids{5, 6, 7, 5, 6}, lookup(2, 2), 1) == Ids{7});
  // A repeated token proposes itself again.
  CHECK(propose_ngram_drafts(Ids{4, 4, 4, 4}, lookup(1, 3), 4) == Ids{4});
}

TEST_CASE("n-gram drafts need a run of at least prompt_lookup_min tokens", "[speculative]") {
  CHECK(propose_ngram_drafts(Ids{1, 2, 3, 4}, lookup(1, 4), 4).empty());  // no token recurs
  CHECK(propose_ngram_drafts(Ids{1, 2, 3, 9, 3}, lookup(2, 4), 4).empty());  // only the last token recurs
  CHECK(propose_ngram_drafts(Ids{1, 2, 3, 9, 3}, lookup(1, 4), 4) == Ids{9, 3});
  CHECK(propose_ngram_drafts(Ids{}, lookup(1, 4), 4).empty());
  CHECK(propose_ngram_drafts(Ids{7}, lookup(1, 4), 4).empty());
  CHECK(propose_ngram_drafts(Ids{7, 7}, lookup(1, 4), 0).empty());
}

TEST_CASE("n-gram drafts agree with a brute-force search on random sequences", "[speculative]") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const int n = std::uniform_int_distribution<int>(0, 40)(rng), vocab = std::uniform_int_distribution<int>(2, 6)(rng);
    Ids t(n);
    for (TokenId& id : t) id = std::uniform_int_distribution<int>(0, vocab - 1)(rng);
    const int min_n = std::uniform_int_distribution<int>(1, 3)(rng);
    const NgramSpeculation c = lookup(min_n, min_n + std::uniform_int_distribution<int>(0, 3)(rng));
    // Brute force: for each length from the longest, every earlier end from the latest.
    Ids expected;
    for (int len = std::min(c.prompt_lookup_max, n - 1); len >= c.prompt_lookup_min && expected.empty(); --len)
      for (int end = n - 2; end >= len - 1; --end)
        if (std::equal(t.begin() + end - len + 1, t.begin() + end + 1, t.end() - len)) {
          expected.assign(t.begin() + end + 1, t.begin() + std::min(n, end + 1 + 3));
          break;
        }
    INFO("trial " << trial);
    CHECK(propose_ngram_drafts(t, c, 3) == expected);
  }
}

TEST_CASE("drafts are accepted up to the first sample that differs", "[speculative]") {
  CHECK(accepted_drafts(Ids{4, 5, 6}, Ids{4, 5, 6, 7}) == 3);  // all, and the sample after the last is the bonus
  CHECK(accepted_drafts(Ids{4, 5, 6}, Ids{4, 9, 6, 7}) == 1);  // a later match after a miss does not count
  CHECK(accepted_drafts(Ids{4, 5, 6}, Ids{3, 5, 6, 7}) == 0);
  CHECK(accepted_drafts(Ids{}, Ids{3}) == 0);
  CHECK_THROWS_AS(accepted_drafts(Ids{4, 5}, Ids{4, 5}), std::invalid_argument);
}

TEST_CASE("a speculative configuration names what is wrong with it", "[speculative]") {
  CHECK(NgramSpeculation{}.error().empty());  // off
  CHECK(lookup(1, 4).error().empty());
  CHECK(lookup(3, 2).error().find("prompt_lookup_max") != std::string::npos);
  CHECK(lookup(0, 2).error().find("prompt_lookup_min") != std::string::npos);
  CHECK(lookup(1, 2, 17).error().find("num_speculative_tokens") != std::string::npos);
  CHECK(lookup(1, 2, -1).error().find("num_speculative_tokens") != std::string::npos);
}
