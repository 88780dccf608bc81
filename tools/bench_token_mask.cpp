// What structured outputs cost on the host: the trie's construction for a tokenizer, a grammar's compilation and
// one token mask per step (TokenConstraint::fill_mask) along constrained random walks, for a nested JSON schema, a
// schema of string formats, any JSON object and a regex. Prints the median and 90th percentile microseconds per mask, with the allowed tokens, and
// what the masks of one step of all walks (in lockstep, as the sequences of a batch) take together.
//
// Usage: bench_token_mask MODEL_DIR [walks=8] [steps=60]   (MODEL_DIR: a folder with tokenizer.json or .model)
#include <algorithm>
#include <boost/json.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>

#include "model/constraint/json_schema.h"
#include "model/constraint/regex.h"
#include "model/constraint/token_mask.h"
#include "model/tokenizer/load_tokenizer.h"

namespace {

using namespace paged;
using namespace paged::constraint;
using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); }

constexpr const char* kNestedSchema = R"({"type": "object", "properties": {
  "id": {"type": "integer", "minimum": 0, "maximum": 100000},
  "name": {"type": "string", "maxLength": 40},
  "address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"},
              "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["city"]},
  "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 8},
  "scores": {"type": "array", "items": {"type": "number"}},
  "status": {"enum": ["active", "inactive", "banned"]},
  "friends": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"},
              "age": {"type": "integer"}}, "required": ["name"]}}},
  "required": ["id", "name", "address", "status"]})";

// A schema as pydantic writes one for a record with string formats, a tuple and bounded numbers.
constexpr const char* kFormatsSchema = R"({"type": "object", "properties": {
  "born": {"type": "string", "format": "date-time"}, "site": {"type": "string", "format": "uri", "maxLength": 2083},
  "email": {"type": "string", "format": "email"}, "id": {"type": "string", "format": "uuid"},
  "ip": {"anyOf": [{"type": "string", "format": "ipv6"}, {"type": "null"}]},
  "price": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000},
  "size": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string", "maxLength": 8}], "minItems": 2}},
  "required": ["born", "site", "email", "id", "ip", "price", "size"]})";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_token_mask MODEL_DIR [walks=8] [steps=60]\n");
    return 2;
  }
  const int walks = argc > 2 ? std::atoi(argv[2]) : 8, steps = argc > 3 ? std::atoi(argv[3]) : 60;
  const auto tok = load_tokenizer(argv[1]);
  auto t0 = Clock::now();
  const auto trie = std::make_shared<const TokenTrie>(*tok);
  std::printf("vocab %d: trie built in %.1f ms\n", tok->vocab_size(), us_since(t0) / 1000);
  const std::vector<std::pair<const char*, std::function<Grammar()>>> cases{
      {"nested schema", [] { return compile_json_schema(boost::json::parse(kNestedSchema)); }},
      {"formats schema", [] { return compile_json_schema(boost::json::parse(kFormatsSchema)); }},
      {"json_object", [] { return compile_json_object(); }},
      {"regex", [] { return build_grammar({{"root", compile_regex("[A-Z][a-z]{2,9}( [a-z]{1,9}){3,12}\\.", RegexMatch::full)}}, "root"); }}};
  std::mt19937 rng(1);
  for (const auto& [name, make] : cases) {
    t0 = Clock::now();
    const auto grammar = std::make_shared<const Grammar>(make());
    const double compile_us = us_since(t0);
    // One automaton for all walks, as the completions of one request share theirs.
    const auto automaton = std::make_shared<ConstraintAutomaton>(grammar, trie, tok->eos_ids());
    // The walks advance in lockstep, as the sequences of one batch do: a step fills one mask of each live walk.
    std::vector<double> times, step_ms;
    double allowed_total = 0;
    std::vector<TokenConstraint> live(walks, TokenConstraint(automaton, false));
    std::vector<uint32_t> mask(mask_words(tok->vocab_size()));
    for (int s = 0; s < steps; ++s) {
      double step_us = 0;
      for (TokenConstraint& c : live) {
        if (c.stopped()) continue;
        t0 = Clock::now();
        c.fill_mask({}, mask);
        times.push_back(us_since(t0));
        step_us += times.back();
        std::vector<TokenId> allowed;
        for (TokenId id = 0; id < tok->vocab_size(); ++id)
          if (mask_allows(mask, id)) allowed.push_back(id);
        allowed_total += static_cast<double>(allowed.size());
        if (!allowed.empty()) c.accept(allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)]);
      }
      if (step_us > 0) step_ms.push_back(step_us / 1000);
    }
    std::sort(times.begin(), times.end());
    std::sort(step_ms.begin(), step_ms.end());
    std::printf("%-14s compile %.2f ms; %zu masks: median %.0f us, p90 %.0f us, max %.0f us; %.0f tokens allowed on average\n",
                name, compile_us / 1000, times.size(), times[times.size() / 2], times[times.size() * 9 / 10],
                times.back(), allowed_total / static_cast<double>(times.size()));
    std::printf("%-14s a step's masks of %d walks: median %.2f ms, p90 %.2f ms, max %.2f ms, all %zu steps %.1f ms\n", "",
                walks, step_ms[step_ms.size() / 2], step_ms[step_ms.size() * 9 / 10], step_ms.back(), step_ms.size(),
                std::accumulate(step_ms.begin(), step_ms.end(), 0.0));
  }
  return 0;
}
