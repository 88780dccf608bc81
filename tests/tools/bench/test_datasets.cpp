// The benchmark datasets: random lengths and ids, the ShareGPT-like mix, ShareGPT parsing and vLLM's pruning, and
// the dataset flags.
#include <catch2/catch.hpp>

#include <boost/json.hpp>

#include <algorithm>
#include <set>
#include <fstream>
#include <sstream>

#include "tests/test_data.h"
#include "model/tokenizer/load_tokenizer.h"
#include "tools/bench/datasets.h"
#include "tools/cli.h"

using namespace paged;
using namespace paged::bench;

namespace {

/// A text of `n` words.
std::string words(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += (i ? " w" : "w");
  return s;
}

/// A stand-in tokenizer: a BOS, then one token per word.
std::vector<TokenId> encode_words(const std::string& text) {
  std::vector<TokenId> ids{1};
  std::istringstream in(text);
  for (std::string w; in >> w;) ids.push_back(7);
  return ids;
}

DatasetOptions options_of(std::vector<std::string> flags) {
  flags.insert(flags.begin(), "paged");
  std::vector<char*> argv;
  for (std::string& f : flags) argv.push_back(f.data());
  cli::Args args(static_cast<int>(argv.size()), argv.data(), 1, {});
  return dataset_options(args, DatasetOptions{});
}

}  // namespace

TEST_CASE("random requests: exact lengths without a range, ids within the vocabulary", "[bench]") {
  const std::vector<BenchRequest> r = random_requests(50, 100, 20, 0, 512, 1);
  REQUIRE(r.size() == 50);
  for (const BenchRequest& q : r) {
    CHECK(q.prompt_len == 100);
    CHECK(q.prompt_ids.size() == 100);
    CHECK(q.output_len == 20);
    CHECK(q.prompt_text.empty());
    CHECK(std::all_of(q.prompt_ids.begin(), q.prompt_ids.end(), [](TokenId t) { return t >= 0 && t < 512; }));
  }
  CHECK(random_requests(3, 10, 5, 0, 512, 1)[0].prompt_ids == random_requests(3, 10, 5, 0, 512, 1)[0].prompt_ids);
  CHECK(random_requests(3, 10, 5, 0, 512, 1)[0].prompt_ids != random_requests(3, 10, 5, 0, 512, 2)[0].prompt_ids);
}

TEST_CASE("random requests with a range ratio: uniform in [floor(len (1 - r)), ceil(len (1 + r))]", "[bench]") {
  // 10 * 0.75 = 7.5 -> 7, 10 * 1.25 = 12.5 -> 13; output 1 * 0.5 -> at least 1, 1 * 1.5 -> 2.
  std::set<int> in, out;
  for (const BenchRequest& q : random_requests(2000, 10, 1, 0.25, 512, 3)) {
    in.insert(q.prompt_len);
    CHECK(q.prompt_ids.size() == static_cast<size_t>(q.prompt_len));
  }
  for (const BenchRequest& q : random_requests(2000, 10, 1, 0.5, 512, 3)) out.insert(q.output_len);
  CHECK(in == std::set<int>{7, 8, 9, 10, 11, 12, 13});
  CHECK(out == std::set<int>{1, 2});
}

TEST_CASE("random requests with a prefix: the same prefix ids first, then their own input_len", "[bench]") {
  const std::vector<BenchRequest> r = random_requests(20, 8, 4, 0, 512, 5, 341);
  const std::vector<BenchRequest> plain = random_requests(20, 8, 4, 0, 512, 5);
  for (const BenchRequest& q : r) {
    REQUIRE(q.prompt_ids.size() == 341 + 8);
    CHECK(q.prompt_len == 349);
    CHECK(std::equal(q.prompt_ids.begin(), q.prompt_ids.begin() + 341, r[0].prompt_ids.begin()));
  }
  CHECK(!std::equal(r[0].prompt_ids.begin() + 341, r[0].prompt_ids.end(), r[1].prompt_ids.begin() + 341));
  CHECK(plain[0].prompt_ids.size() == 8);
}

TEST_CASE("sharegpt-like requests: lognormal lengths of mean 161 in, pruned to the context", "[bench]") {
  double sum = 0;
  for (const BenchRequest& q : sharegpt_like_requests(5000, 1 << 20, 512, 5)) {
    REQUIRE((q.prompt_len >= 4 && q.prompt_len <= 1024));
    REQUIRE((q.output_len >= 1 && q.prompt_len + q.output_len <= 2048));
    sum += q.prompt_len;
  }
  CHECK(sum / 5000 == Approx(161).epsilon(0.1));  // a standard error of about 3; the clamps take a little
  for (const BenchRequest& q : sharegpt_like_requests(500, 512, 512, 5)) {
    REQUIRE((q.prompt_len >= 4 && q.prompt_len <= 256));  // total / 2
    REQUIRE(q.prompt_len + q.output_len <= 512);
    REQUIRE(q.prompt_ids.size() == static_cast<size_t>(q.prompt_len));
  }
}

TEST_CASE("sharegpt_pairs takes the first two turns of conversations of two or more", "[bench]") {
  const auto pairs = sharegpt_pairs(boost::json::parse(R"([
    {"id": "a", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"},
                                  {"from": "human", "value": "more"}]},
    {"conversations": [{"from": "human", "value": "alone"}]},
    {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "r"}]}])"));
  REQUIRE(pairs.size() == 2);
  CHECK(pairs[0] == std::pair<std::string, std::string>{"hi", "hello"});
  CHECK(pairs[1] == std::pair<std::string, std::string>{"q", "r"});
  CHECK_THROWS_AS(sharegpt_pairs(boost::json::parse(R"({"conversations": []})")), std::runtime_error);
  CHECK_THROWS_AS(sharegpt_pairs(boost::json::parse(R"([{"turns": []}])")), std::runtime_error);
  CHECK_THROWS_AS(sharegpt_pairs(boost::json::parse(R"([{"conversations": [{"value": 1}, {"value": "x"}]}])")),
                  std::runtime_error);
  CHECK_THROWS_AS(read_sharegpt_file("/nonexistent/sharegpt.json"), std::runtime_error);
}

TEST_CASE("sharegpt requests: vLLM's pruning, a seeded shuffle, oversampling up to n", "[bench]") {
  // Token counts with encode_words: words + 1.
  const std::vector<std::pair<std::string, std::string>> pairs{
      {words(5), words(4)},        // 6 + 5: kept
      {words(2), words(9)},        // prompt of 3 tokens: dropped
      {words(4), words(2)},        // reply of 3 tokens: dropped
      {words(1100), words(9)},     // prompt over 1024: dropped
      {words(1000), words(1100)},  // 1001 + 1101 over 2048: dropped
      {words(3), words(3)},        // 4 + 4: kept (the lower bounds)
      {words(1023), words(1023)},  // 1024 + 1024: kept (the upper bounds)
  };
  const std::vector<BenchRequest> two = sharegpt_requests(pairs, 2, encode_words, 4096, 9);
  REQUIRE(two.size() == 2);
  CHECK(two[0].prompt_len != two[1].prompt_len);
  const std::vector<BenchRequest> ten = sharegpt_requests(pairs, 10, encode_words, 4096, 9);
  REQUIRE(ten.size() == 10);
  std::set<int> first_three, repeats;
  for (size_t i = 0; i < ten.size(); ++i) (i < 3 ? first_three : repeats).insert(ten[i].prompt_len);
  CHECK(first_three == std::set<int>{4, 6, 1024});
  CHECK(std::includes(first_three.begin(), first_three.end(), repeats.begin(), repeats.end()));
  for (const BenchRequest& q : ten) {
    CHECK(q.prompt_ids.size() == static_cast<size_t>(q.prompt_len));
    CHECK(q.prompt_text == words(q.prompt_len - 1));
    CHECK(q.output_len == q.prompt_len - (q.prompt_len == 6 ? 1 : 0));  // 6 -> 5, 4 -> 4, 1024 -> 1024
  }
  CHECK(sharegpt_requests(pairs, 3, encode_words, 4096, 9)[0].prompt_len ==
        sharegpt_requests(pairs, 3, encode_words, 4096, 9)[0].prompt_len);
  // A context of 1500 tokens drops the 1024 + 1024 pair too.
  for (const BenchRequest& q : sharegpt_requests(pairs, 5, encode_words, 1500, 9)) CHECK(q.prompt_len != 1024);
  CHECK_THROWS_AS(sharegpt_requests({{words(1), words(1)}}, 1, encode_words, 4096, 0), std::runtime_error);
}

TEST_CASE("sharegpt requests of a file, with the model's tokenizer", "[bench]") {
  test::TempDir dir("paged_sharegpt_");
  const std::string path = (dir.path() / "sharegpt.json").string();
  std::ofstream(path) << R"([{"conversations": [{"from": "human", "value": "Once upon a time there was a girl"},
    {"from": "gpt", "value": "She liked to play in the park with her dog."}]}])";
  auto tokenizer = load_tokenizer(test::kModel);
  const auto encode = [&](const std::string& text) { return tokenizer->encode(text, true); };
  const std::vector<BenchRequest> r = sharegpt_requests(read_sharegpt_file(path), 1, encode, 512, 0);
  REQUIRE(r.size() == 1);
  CHECK(r[0].prompt_ids == encode("Once upon a time there was a girl"));
  CHECK(r[0].prompt_ids[0] == tokenizer->bos_id());
  CHECK(r[0].output_len == static_cast<int>(encode("She liked to play in the park with her dog.").size()));
}

TEST_CASE("dataset flags: names, the path, and what contradicts", "[bench]") {
  const DatasetOptions plain = options_of({});
  CHECK(plain.name == "random");
  CHECK(plain.num_prompts == DatasetOptions{}.num_prompts);
  const DatasetOptions file = options_of({"--dataset-path", "x.json", "--num-prompts", "7", "--seed", "3"});
  CHECK(file.name == "sharegpt");
  CHECK(file.path == "x.json");
  CHECK(file.num_prompts == 7);
  CHECK(file.seed == 3);
  const DatasetOptions ranged = options_of({"--dataset-name", "random", "--random-input-len", "64",
                                            "--random-output-len", "8", "--random-range-ratio", "0.5"});
  CHECK((ranged.random_input_len == 64 && ranged.random_output_len == 8 && ranged.random_range_ratio == 0.5));
  CHECK(options_of({"--dataset-name", "sharegpt-like"}).name == "sharegpt-like");
  CHECK_THROWS_AS(options_of({"--dataset-name", "sharegpt"}), cli::UsageError);
  CHECK_THROWS_AS(options_of({"--dataset-name", "random", "--dataset-path", "x.json"}), cli::UsageError);
  CHECK_THROWS_AS(options_of({"--dataset-name", "fixed"}), cli::UsageError);
  CHECK_THROWS_AS(options_of({"--random-range-ratio", "1"}), cli::UsageError);
  CHECK_THROWS_AS(options_of({"--num-prompts", "0"}), cli::UsageError);
  CHECK_THROWS_AS(options_of({"--random-input-len", "0"}), cli::UsageError);
}
