// check_sampling_params (model/sampling/params_check.h): each range, the field it names and the message the API
// returns for it.
#include <catch2/catch.hpp>

#include <limits>

#include "model/sampling/params_check.h"

using namespace paged;

namespace {

// The field `p` fails on in a vocabulary of 50, or "" when it passes.
std::string failing_field(const SamplingParams& p) {
  const std::optional<FieldError> e = check_sampling_params(p, 50);
  return e ? e->field : "";
}

template <class Set>
std::string with(Set set) {
  SamplingParams p;
  set(p);
  return failing_field(p);
}

}  // namespace

TEST_CASE("the default sampling parameters and every range's edge pass", "[params_check]") {
  CHECK(failing_field(SamplingParams{}).empty());
  const SamplingParams edges{.n = kMaxCompletions, .best_of = kMaxCompletions, .max_tokens = 1, .min_tokens = 1,
                             .temperature = 100.0f, .top_p = 1.0f, .top_k = -1, .min_p = 1.0f,
                             .repetition_penalty = 10.0f, .presence_penalty = -2.0f, .frequency_penalty = 2.0f,
                             .logit_bias = {{0, -100.0f}, {49, 100.0f}}, .stop_token_ids = {0, 49},
                             .stop = {"\xc3\xa9"}, .logprobs = kMaxLogprobs,
                             .prompt_logprobs = kMaxLogprobs};
  CHECK(failing_field(edges).empty());
}

TEST_CASE("each sampling parameter out of range is named", "[params_check]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(with([](SamplingParams& p) { p.n = 0; }) == "n");
  CHECK(with([](SamplingParams& p) { p.n = kMaxCompletions + 1; }) == "n");
  CHECK(with([](SamplingParams& p) {
          p.n = 3;
          p.best_of = 2;
        }) == "best_of");
  CHECK(with([](SamplingParams& p) { p.max_tokens = 0; }) == "max_tokens");
  CHECK(with([](SamplingParams& p) { p.min_tokens = 17; }) == "min_tokens");  // above max_tokens 16
  CHECK(with([&](SamplingParams& p) { p.temperature = nan; }) == "temperature");
  CHECK(with([](SamplingParams& p) { p.temperature = 100.5f; }) == "temperature");
  CHECK(with([](SamplingParams& p) { p.top_p = 0.0f; }) == "top_p");
  CHECK(with([](SamplingParams& p) { p.top_k = -2; }) == "top_k");
  CHECK(with([](SamplingParams& p) { p.min_p = 1.5f; }) == "min_p");
  CHECK(with([](SamplingParams& p) { p.repetition_penalty = 0.0f; }) == "repetition_penalty");
  CHECK(with([&](SamplingParams& p) { p.presence_penalty = nan; }) == "presence_penalty");
  CHECK(with([](SamplingParams& p) { p.frequency_penalty = -2.5f; }) == "frequency_penalty");
  CHECK(with([](SamplingParams& p) { p.logit_bias = {{50, 1.0f}}; }) == "logit_bias");
  CHECK(with([](SamplingParams& p) { p.logit_bias = {{-1, 1.0f}}; }) == "logit_bias");
  CHECK(with([](SamplingParams& p) { p.logit_bias = {{3, 101.0f}}; }) == "logit_bias");
  CHECK(with([](SamplingParams& p) { p.stop_token_ids = {50}; }) == "stop_token_ids");
  CHECK(with([](SamplingParams& p) { p.stop = {""}; }) == "stop");
  CHECK(with([](SamplingParams& p) { p.stop = {"\xff"}; }) == "stop");
  CHECK(with([](SamplingParams& p) { p.stop = {std::string(kMaxStopBytes, 'a'), "b"}; }) == "stop");
  CHECK(with([](SamplingParams& p) { p.stop.assign(kMaxStopStrings, "b"); }).empty());  // the bounds exactly
  CHECK(with([](SamplingParams& p) { p.stop_token_ids.assign(kMaxStopTokenIds, 3); }).empty());
  CHECK(with([](SamplingParams& p) { p.stop.assign(kMaxStopStrings + 1, "b"); }) == "stop");
  CHECK(with([](SamplingParams& p) { p.stop_token_ids.assign(kMaxStopTokenIds + 1, 3); }) == "stop_token_ids");
  CHECK(with([](SamplingParams& p) { p.logprobs = kMaxLogprobs + 1; }) == "logprobs");
  CHECK(with([](SamplingParams& p) { p.prompt_logprobs = -1; }) == "prompt_logprobs");
  CHECK(with([](SamplingParams& p) { p.prompt_logprobs = kMaxLogprobs + 1; }) == "prompt_logprobs");
  CHECK(with([](SamplingParams& p) { p.use_beam_search = true; }) == "temperature");  // needs temperature 0
  CHECK(with([](SamplingParams& p) { p.length_penalty = 2.0f; }) == "length_penalty");  // without beam search
  CHECK(with([](SamplingParams& p) {
          p.use_beam_search = true;
          p.temperature = 0.0f;
          p.length_penalty = 101.0f;
        }) == "length_penalty");
  CHECK(with([](SamplingParams& p) {
          p.use_beam_search = true;
          p.temperature = 0.0f;
          p.length_penalty = -0.5f;
        }).empty());
  CHECK(with([](SamplingParams& p) { p.allowed_token_ids = {0, 49}; }).empty());
  CHECK(with([](SamplingParams& p) { p.allowed_token_ids = {3, 50}; }) == "allowed_token_ids");
  CHECK(with([](SamplingParams& p) { p.allowed_token_ids = {-1}; }) == "allowed_token_ids");
  CHECK(with([](SamplingParams& p) { p.allowed_token_ids.assign(51, 3); }) == "allowed_token_ids");
  CHECK(with([](SamplingParams& p) { p.bad_words = {" hello", "a b"}; }).empty());
  CHECK(with([](SamplingParams& p) { p.bad_words = {""}; }) == "bad_words");
  CHECK(with([](SamplingParams& p) { p.bad_words = {" \t\n"}; }) == "bad_words");
  CHECK(with([](SamplingParams& p) { p.bad_words = {"\xff"}; }) == "bad_words");
  CHECK(with([](SamplingParams& p) { p.bad_words.assign(kMaxBadWords, "b"); }).empty());
  CHECK(with([](SamplingParams& p) { p.bad_words.assign(kMaxBadWords + 1, "b"); }) == "bad_words");
  CHECK(with([](SamplingParams& p) { p.bad_words = {std::string(kMaxBadWordBytes + 1, 'a')}; }) == "bad_words");
  CHECK(with([](SamplingParams& p) { p.bad_words_token_ids = {{3, 4}, {5}}; }).empty());
  CHECK(with([](SamplingParams& p) { p.bad_words_token_ids = {{3, 50}}; }) == "bad_words");
  CHECK(with([](SamplingParams& p) { p.bad_words_token_ids = {{}}; }) == "bad_words");
  CHECK(with([](SamplingParams& p) { p.bad_words_token_ids.assign(2 * kMaxBadWords + 1, {3}); }) == "bad_words");
  CHECK(with([](SamplingParams& p) {
          p.bad_words_token_ids = {std::vector<TokenId>(2 * (kMaxBadWordBytes + 2 * kMaxBadWords) + 1, 3)};
        }) == "bad_words");
  CHECK(with([](SamplingParams& p) {
          p.allowed_token_ids = {3};
          p.structured = {.kind = StructuredOutput::Kind::regex, .spec = "a+", .field = "guided_regex"};
        }) == "guided_regex");
}

TEST_CASE("allowed_token_ids that every step would mask are refused", "[params_check]") {
  const std::vector<TokenId> stops = {2};
  SamplingParams p;
  CHECK_FALSE(check_allowed_tokens_left(p, stops));  // no list: every token
  p.allowed_token_ids = {2, 7};
  CHECK_FALSE(check_allowed_tokens_left(p, stops));
  p.bad_words_token_ids = {{7}};
  CHECK_FALSE(check_allowed_tokens_left(p, stops));  // 2 (the stop id) is left
  p.min_tokens = 1;
  const auto e = check_allowed_tokens_left(p, stops);
  REQUIRE(e);
  CHECK(e->field == "allowed_token_ids");
  p.bad_words_token_ids = {{5, 7}};  // a two-token word masks 7 only after 5, which is not allowed
  CHECK_FALSE(check_allowed_tokens_left(p, stops));
  p.bad_words_token_ids = {{2, 7}};  // after 2, which is: the output "2" leaves 7 masked, and 2 before min_tokens
  CHECK(check_allowed_tokens_left(p, stops));
  p.min_tokens = 0;
  p.allowed_token_ids = {7};
  p.bad_words_token_ids = {{7, 7}};  // "7" then nothing
  CHECK(check_allowed_tokens_left(p, stops));
  p.min_tokens = 1;
  p.bad_words_token_ids = {{7}};
  p.min_tokens = 0;
  p.allowed_token_ids = {7};
  CHECK(check_allowed_tokens_left(p, stops));
}

TEST_CASE("the messages read on their own, with the vocabulary's range where it matters", "[params_check]") {
  SamplingParams p;
  p.logit_bias = {{77, 1.0f}};
  const auto e = check_sampling_params(p, 50);
  REQUIRE(e);
  CHECK(e->message == "logit_bias key 77 is outside the vocabulary [0, 50)");
  p = SamplingParams{};
  p.n = 0;
  CHECK(check_sampling_params(p, 50)->message == "n must be in [1, 128]");
}
