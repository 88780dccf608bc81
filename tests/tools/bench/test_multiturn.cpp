// The multiturn dataset of `paged bench --dataset-name multiturn`: its shape, seeded ids, the prompt of each turn
// (the whole history and the new message) and its flags.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "tools/bench/datasets.h"
#include "tools/cli.h"

using namespace paged;
using namespace paged::bench;

namespace {

MultiturnOptions multiturn_of(std::vector<std::string> flags) {
  flags.insert(flags.begin(), "paged");
  std::vector<char*> argv;
  for (std::string& f : flags) argv.push_back(f.data());
  cli::Args args(static_cast<int>(argv.size()), argv.data(), 1, {});
  return multiturn_options(args);
}

}  // namespace

TEST_CASE("multiturn dataset: one system prompt, C x T messages of ids within the vocabulary, seeded", "[bench]") {
  MultiturnOptions o;
  o.conversations = 3;
  o.turns = 4;
  o.system_prompt_len = 20;
  o.message_len = 5;
  o.seed = 9;
  const MultiturnDataset d = multiturn_dataset(o, 50);
  CHECK(d.system_prompt.size() == 20);
  REQUIRE(d.messages.size() == 3);
  for (const auto& conversation : d.messages) {
    REQUIRE(conversation.size() == 4);
    for (const auto& message : conversation) {
      CHECK(message.size() == 5);
      for (TokenId id : message) CHECK((id >= 0 && id < 50));
    }
  }
  CHECK(d.messages[0][0] != d.messages[1][0]);  // conversations differ
  CHECK(multiturn_dataset(o, 50).messages == d.messages);
  o.seed = 10;
  CHECK(multiturn_dataset(o, 50).messages != d.messages);
}

TEST_CASE("a turn's prompt is the system prompt, every earlier message and reply, then its message", "[bench]") {
  MultiturnDataset d;
  d.system_prompt = {1, 2};
  d.messages = {{{10, 11}, {20}, {30, 31, 32}}, {{40}, {50}, {60}}};
  CHECK(turn_prompt(d, 0, {}) == std::vector<TokenId>{1, 2, 10, 11});
  CHECK(turn_prompt(d, 0, {{7, 7}}) == std::vector<TokenId>{1, 2, 10, 11, 7, 7, 20});
  CHECK(turn_prompt(d, 0, {{7}, {8, 9}}) == std::vector<TokenId>{1, 2, 10, 11, 7, 20, 8, 9, 30, 31, 32});
  CHECK(turn_prompt(d, 1, {{5}}) == std::vector<TokenId>{1, 2, 40, 5, 50});
  CHECK_THROWS_AS(turn_prompt(d, 1, {{5}, {5}, {5}}), std::out_of_range);
}

TEST_CASE("multiturn flags and their refusals", "[bench]") {
  const MultiturnOptions plain = multiturn_of({});
  CHECK(plain.conversations == MultiturnOptions{}.conversations);
  CHECK(plain.think_time_s == MultiturnOptions{}.think_time_s);
  const MultiturnOptions set = multiturn_of({"--num-conversations", "5", "--num-turns", "3", "--system-prompt-len",
                                             "0", "--message-len", "7", "--output-len", "9", "--think-time", "0.25",
                                             "--seed", "4"});
  CHECK((set.conversations == 5 && set.turns == 3 && set.system_prompt_len == 0 && set.message_len == 7 &&
         set.output_len == 9 && set.think_time_s == 0.25 && set.seed == 4));
  CHECK_THROWS_AS(multiturn_of({"--num-conversations", "0"}), cli::UsageError);
  CHECK_THROWS_AS(multiturn_of({"--num-turns", "0"}), cli::UsageError);
  CHECK_THROWS_AS(multiturn_of({"--message-len", "0"}), cli::UsageError);
  CHECK_THROWS_AS(multiturn_of({"--output-len", "0"}), cli::UsageError);
  CHECK_THROWS_AS(multiturn_of({"--system-prompt-len", "-1"}), cli::UsageError);
  CHECK_THROWS_AS(multiturn_of({"--think-time", "-0.5"}), cli::UsageError);
  CHECK_THROWS_AS(multiturn_of({"--seed", "-1"}), cli::UsageError);
}
