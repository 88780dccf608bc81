// Engine runs shared by the engine tests that compare two configurations on the real stories260K model (CPU
// executor): requests of every sampling kind, and every completion of a set of requests submitted at once.
#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>

#include "actors/engine.h"
#include "tests/test_data.h"

namespace paged::test {

struct Completion {
  std::vector<TokenId> tokens;
  std::vector<float> logprobs;
  std::string text, finish;
};

/// Prompts from the golden cases, each with parameters of its own: greedy, seeded sampling with the cuts, every
/// penalty, min_tokens against EOS, two completions, a stop string, logprobs, a regex and a JSON schema.
inline std::vector<std::pair<std::vector<TokenId>, SamplingParams>> varied_requests() {
  std::vector<std::vector<TokenId>> prompts;
  const boost::json::value golden = read_json(kGolden);
  for (const auto& tc : golden.at("cases").as_array()) prompts.push_back(ids_of(tc.at("prompt_ids")));
  REQUIRE(prompts.size() >= 4);
  std::vector<SamplingParams> kinds;
  kinds.push_back({.max_tokens = 40, .temperature = 0.0f});
  kinds.push_back({.max_tokens = 40, .temperature = 0.9f, .top_p = 0.9f, .top_k = 40, .seed = 7});
  kinds.push_back({.max_tokens = 40, .temperature = 1.0f, .min_p = 0.05f, .seed = 11, .repetition_penalty = 1.3f,
                   .presence_penalty = 0.5f, .frequency_penalty = 0.4f});
  kinds.push_back({.max_tokens = 40, .min_tokens = 30, .temperature = 0.0f, .frequency_penalty = 1.0f});
  kinds.push_back({.n = 2, .max_tokens = 30, .temperature = 1.0f, .seed = 3});
  kinds.push_back({.max_tokens = 60, .temperature = 0.0f, .stop = {"."}});
  kinds.push_back({.max_tokens = 25, .temperature = 0.7f, .seed = 5, .logprobs = 3});
  // Structured outputs: each step's mask takes the token still in flight first.
  SamplingParams regex{.max_tokens = 40, .temperature = 1.0f, .seed = 13};
  regex.structured = {StructuredOutput::Kind::regex, "(Once|The) [a-z ]{10,30}\\.", "guided_regex"};
  kinds.push_back(regex);
  SamplingParams schema{.max_tokens = 50, .temperature = 1.0f, .seed = 17};
  schema.structured = {StructuredOutput::Kind::json_schema,
                       R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                          "age": {"type": "integer"}}, "required": ["name", "age"]})",
                       "response_format"};
  kinds.push_back(schema);
  std::vector<std::pair<std::vector<TokenId>, SamplingParams>> out;
  for (int round = 0; round < 3; ++round)
    for (size_t k = 0; k < kinds.size(); ++k) {
      SamplingParams p = kinds[k];
      if (p.seed) *p.seed += round;
      out.emplace_back(prompts[(k + round) % prompts.size()], p);
    }
  return out;
}

/// Every completion of every request, submitted at once: [request][completion index].
inline std::vector<std::vector<Completion>> run_all(Engine& engine,
                                             const std::vector<std::pair<std::vector<TokenId>, SamplingParams>>& reqs) {
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::map<int, Completion>> got;
    size_t done = 0;
    std::vector<std::string> errors;
  };
  auto sh = std::make_shared<Shared>();
  sh->got.resize(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i)
    engine.submit(reqs[i].first, reqs[i].second, [sh, i](RequestEvent ev) {
      std::lock_guard lock(sh->mu);
      for (const auto& d : ev.deltas) {
        Completion& c = sh->got[i][d.index];
        c.tokens.insert(c.tokens.end(), d.token_ids.begin(), d.token_ids.end());
        for (const auto& lp : d.logprobs) c.logprobs.push_back(lp.logprob);
        c.text += d.text;
        if (d.finish_reason) c.finish = *d.finish_reason;
      }
      if (ev.error) sh->errors.push_back(*ev.error);
      sh->done += ev.done;
      sh->cv.notify_all();
    });
  std::unique_lock lock(sh->mu);
  REQUIRE(sh->cv.wait_for(lock, std::chrono::seconds(120), [&] { return sh->done == reqs.size(); }));
  REQUIRE(sh->errors.empty());
  std::vector<std::vector<Completion>> out;
  for (auto& m : sh->got) {
    out.emplace_back();
    for (auto& [index, c] : m) out.back().push_back(std::move(c));
  }
  return out;
}

/// Checks that `got` has `want`'s completions: tokens, text and finish equal, logprobs equal or, with a margin,
/// within it.
inline void check_same_completions(const std::vector<std::vector<Completion>>& got,
                                   const std::vector<std::vector<Completion>>& want, double logprob_margin = 0.0) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("request " << i);
    REQUIRE(got[i].size() == want[i].size());
    for (size_t k = 0; k < want[i].size(); ++k) {
      CHECK(got[i][k].tokens == want[i][k].tokens);
      CHECK(got[i][k].text == want[i][k].text);
      CHECK(got[i][k].finish == want[i][k].finish);
      REQUIRE(got[i][k].logprobs.size() == want[i][k].logprobs.size());
      for (size_t t = 0; t < want[i][k].logprobs.size(); ++t) {
        if (logprob_margin == 0.0)
          CHECK(got[i][k].logprobs[t] == want[i][k].logprobs[t]);
        else
          CHECK(got[i][k].logprobs[t] == Approx(want[i][k].logprobs[t]).margin(logprob_margin));
      }
    }
  }
}

}  // namespace paged::test
