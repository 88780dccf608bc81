// check_step and check_block_pairs (model/step_check.h): every rule, each on an otherwise good step, with the field
// the error names.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "model/speculative/ngram.h"
#include "model/step_check.h"

using namespace paged;

namespace {

const StepLimits kLimits{.vocab_size = 100,
                         .block_size = 16,
                         .num_blocks = 8,
                         .num_swap_blocks = 4,
                         .max_model_len = 64,
                         .max_num_batched_tokens = 32};

// A good step of two chunks (a prefill that samples, a decode that does not) and one copy, with what its sample
// points to. Not copyable: the sample points into it.
struct GoodStep {
  SamplingParams params;
  std::vector<TokenId> prompt{1, 5, 9}, output{7}, stop_ids{2};
  StepBatch step;

  GoodStep() {
    step.seqs.push_back({.seq = 1, .tokens = {1, 5, 9}, .start_pos = 0, .block_table = {0}, .samples = {}});
    step.seqs[0].samples.push_back({.params = &params, .seed = 3, .prompt = &prompt, .output = &output,
                                    .stop_ids = &stop_ids, .num_logprobs = 2, .num_candidates = 1});
    step.seqs.push_back({.seq = 2, .tokens = {7}, .start_pos = 20, .block_table = {1, 2}, .samples = {}});
    step.copies = {{3, 4}};
  }
  GoodStep(const GoodStep&) = delete;

  SampleSpec& sample() { return step.seqs[0].samples[0]; }
  SeqChunk& decode() { return step.seqs[1]; }
};

// The field the step fails on, or "" when it passes.
std::string failing_field(const StepBatch& step, const StepLimits& limits = kLimits,
                          HistoryCheck history = HistoryCheck::full) {
  const std::optional<FieldError> e = check_step(step, limits, history);
  return e ? e->field : "";
}

std::string failing_pair(const std::vector<BlockPair>& pairs, PairOrder order) {
  const std::optional<FieldError> e = check_block_pairs(pairs, order, kLimits.num_blocks, kLimits.num_swap_blocks);
  return e ? e->field : "";
}

}  // namespace

TEST_CASE("a good step passes the check, at every limit", "[step_check]") {
  GoodStep g;
  CHECK(failing_field(g.step).empty());
  g.decode().start_pos = 63;  // the last position of max_model_len
  g.decode().block_table = {1, 2, 3, 4};
  g.sample().num_candidates = kMaxCandidates;
  g.sample().num_logprobs = kMaxLogprobs;
  g.sample().output = nullptr;  // null histories count as empty
  g.sample().stop_ids = nullptr;
  g.step.copies = {{3, 4}, {3, 5}};  // one source, two copies
  CHECK(failing_field(g.step).empty());
  // Chunks of 3 + 1 + 1 + 27 = max_num_batched_tokens tokens.
  g.step.seqs.push_back({.seq = 3, .tokens = {4}, .start_pos = 0, .block_table = {5}, .samples = {}});
  g.step.seqs.push_back(
      {.seq = 4, .tokens = std::vector<TokenId>(27, 5), .start_pos = 0, .block_table = {5, 6}, .samples = {}});
  CHECK(failing_field(g.step).empty());
  g.step.seqs[3].tokens.push_back(5);
  CHECK(failing_field(g.step) == "seqs");
}

TEST_CASE("a step is refused for more tokens than max_num_batched_tokens or two chunks of one sequence",
          "[step_check]") {
  GoodStep g;  // 4 tokens
  g.step.seqs.push_back({.seq = 10, .tokens = std::vector<TokenId>(29, 1), .start_pos = 0, .block_table = {0, 1},
                         .samples = {}});
  const auto e = check_step(g.step, kLimits);
  REQUIRE(e);
  CHECK(e->field == "seqs");
  CHECK(e->message == "33 tokens, more than max_num_batched_tokens 32");
  g.step.seqs.back().tokens.pop_back();
  CHECK(failing_field(g.step).empty());
  g.step.seqs.back().seq = 1;
  CHECK(failing_field(g.step) == "seqs");
  CHECK(check_step(g.step, kLimits)->message == "sequence 1 has two chunks in the step");
}

TEST_CASE("a chunk is refused for no token or a token outside the vocabulary", "[step_check]") {
  GoodStep g;
  g.step.seqs[0].tokens.clear();
  CHECK(failing_field(g.step) == "seqs[0].tokens");
  for (TokenId bad : {100, -1, std::numeric_limits<TokenId>::max()}) {
    g.step.seqs[0].tokens = {1, bad, 9};
    CHECK(failing_field(g.step) == "seqs[0].tokens[1]");
  }
  g.step.seqs[0].tokens = {1, 99, 9};
  CHECK(failing_field(g.step).empty());
}

TEST_CASE("a chunk is refused for positions outside [0, max_model_len)", "[step_check]") {
  GoodStep g;
  g.decode().start_pos = -1;
  CHECK(failing_field(g.step) == "seqs[1].start_pos");
  g.decode().start_pos = 64;
  g.decode().block_table = {1, 2, 3, 4};
  CHECK(failing_field(g.step) == "seqs[1].start_pos");
  g.decode().start_pos = std::numeric_limits<int32_t>::max();  // no overflow on the way
  CHECK(failing_field(g.step) == "seqs[1].start_pos");
}

TEST_CASE("a block table must reach every position written, be no longer than max_model_len needs and hold pool "
          "blocks", "[step_check]") {
  GoodStep g;
  g.decode().block_table = {1};  // position 20 is in the second block
  CHECK(failing_field(g.step) == "seqs[1].block_table");
  g.decode().block_table = {1, 2, 3, 4, 5};  // 64 / 16 = 4 blocks at most
  CHECK(failing_field(g.step) == "seqs[1].block_table");
  for (int32_t bad : {8, -1, 9000}) {
    g.decode().block_table = {1, bad};
    const auto e = check_step(g.step, kLimits);
    REQUIRE(e);
    CHECK(e->field == "seqs[1].block_table[1]");
    CHECK(e->message == "block " + std::to_string(bad) + " is outside the device pool [0, 8)");
  }
  g.decode().block_table = {1, 2, 9000};  // a block past the positions written is checked too
  CHECK(failing_field(g.step) == "seqs[1].block_table[2]");
}

TEST_CASE("released table entries pass only before every layer's window (kv_windows), never without one",
          "[step_check]") {
  GoodStep g;
  StepLimits windowed = kLimits;
  windowed.kv_windows = {20};
  g.decode().start_pos = 40;  // queries from 40 see 21 on: block 0 (0..15) is before the window, block 1 is not
  g.decode().block_table = {kReleasedBlock, 2, 3};
  CHECK(failing_field(g.step, windowed).empty());
  CHECK(failing_field(g.step) == "seqs[1].block_table[0]");  // no window: every block is read
  g.decode().block_table = {kReleasedBlock, kReleasedBlock, 3};  // block 1 holds 21..31, inside the window
  CHECK(failing_field(g.step, windowed) == "seqs[1].block_table[1]");
  g.decode().block_table = {-2, 2, 3};  // released is -1 only
  CHECK(failing_field(g.step, windowed) == "seqs[1].block_table[0]");
  g.decode().start_pos = 36;  // queries from 36 see 17 on: still block 1
  g.decode().block_table = {kReleasedBlock, 2, 3};
  CHECK(failing_field(g.step, windowed).empty());
  g.decode().start_pos = 35;  // 16 on: block 1 from its first position
  CHECK(failing_field(g.step, windowed).empty());
  g.decode().start_pos = 34;  // 15 on: block 0 is read
  CHECK(failing_field(g.step, windowed) == "seqs[1].block_table[0]");
}

TEST_CASE("a chunk draws at most kMaxSamplesPerChunk samples", "[step_check]") {
  GoodStep g;
  const SampleSpec spec = g.sample();
  g.step.seqs[0].samples.resize(kMaxSamplesPerChunk, spec);
  CHECK(failing_field(g.step).empty());
  g.step.seqs[0].samples.push_back(spec);
  CHECK(failing_field(g.step) == "seqs[0].samples");
}

TEST_CASE("a sample is refused for parameters out of range, named by their path", "[step_check]") {
  GoodStep g;
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const auto refused = [&](auto set, const std::string& field) {
    g.params = SamplingParams{};
    set(g.params);
    CHECK(failing_field(g.step) == "seqs[0].samples[0].params." + field);
  };
  refused([&](SamplingParams& p) { p.temperature = nan; }, "temperature");
  refused([&](SamplingParams& p) { p.temperature = -inf; }, "temperature");
  refused([&](SamplingParams& p) { p.top_p = 0.0f; }, "top_p");
  refused([&](SamplingParams& p) { p.top_p = nan; }, "top_p");
  refused([&](SamplingParams& p) { p.min_p = nan; }, "min_p");
  refused([&](SamplingParams& p) { p.repetition_penalty = 0.0f; }, "repetition_penalty");  // a division by it
  refused([&](SamplingParams& p) { p.frequency_penalty = inf; }, "frequency_penalty");
  refused([&](SamplingParams& p) { p.logit_bias = {{100, 1.0f}}; }, "logit_bias");
  refused([&](SamplingParams& p) { p.logit_bias = {{5, nan}}; }, "logit_bias");
  refused([&](SamplingParams& p) { p.stop_token_ids = {-3}; }, "stop_token_ids");
  refused([&](SamplingParams& p) { p.min_tokens = -1; }, "min_tokens");
  g.params = SamplingParams{};
  g.sample().params = nullptr;
  CHECK(failing_field(g.step) == "seqs[0].samples[0].params");
}

TEST_CASE("a sample is refused for logprobs or candidates out of range", "[step_check]") {
  GoodStep g;
  for (int bad : {-1, kMaxLogprobs + 1}) {
    g.sample().num_logprobs = bad;
    CHECK(failing_field(g.step) == "seqs[0].samples[0].num_logprobs");
  }
  g.sample().num_logprobs = 0;
  for (int bad : {0, -5, kMaxCandidates + 1}) {
    g.sample().num_candidates = bad;
    CHECK(failing_field(g.step) == "seqs[0].samples[0].num_candidates");
  }
}

TEST_CASE("a sample's prompt, output and stop ids are in the vocabulary and its history within max_model_len",
          "[step_check]") {
  GoodStep g;
  g.prompt[2] = 100;
  CHECK(failing_field(g.step) == "seqs[0].samples[0].prompt[2]");
  g.prompt[2] = 9;
  g.output[0] = -1;
  CHECK(failing_field(g.step) == "seqs[0].samples[0].output[0]");
  g.output[0] = 7;
  g.stop_ids = {2, 555};
  CHECK(failing_field(g.step) == "seqs[0].samples[0].stop_ids[1]");
  g.stop_ids = {2};
  g.output.assign(62, 7);  // 3 + 62 > 64
  CHECK(failing_field(g.step) == "seqs[0].samples[0].output");
  g.output.resize(61);
  CHECK(failing_field(g.step).empty());
}

TEST_CASE("a deferred last token is not checked (the executor fills it in); a pending output id is, and counts in "
          "the history", "[step_check]") {
  GoodStep g;
  g.decode().tokens = {-1};
  CHECK(failing_field(g.step) == "seqs[1].tokens[0]");
  g.decode().last_token_deferred = true;
  CHECK(failing_field(g.step).empty());
  g.decode().tokens = {100, -1};  // only the last one is the executor's
  g.decode().start_pos = 19;
  CHECK(failing_field(g.step) == "seqs[1].tokens[0]");
  for (TokenId bad : {100, -2}) {
    g.sample().pending_output = bad;
    CHECK(failing_field(g.step) == "seqs[0].samples[0].pending_output");
  }
  g.decode().tokens = {5, -1};
  g.sample().pending_output = 99;
  CHECK(failing_field(g.step).empty());
  g.output.assign(61, 7);  // 3 + 61 + the pending one > 64
  CHECK(failing_field(g.step) == "seqs[0].samples[0].output");
}

TEST_CASE("a check of lengths only reads no history id, and still bounds the history and the rest", "[step_check]") {
  GoodStep g;
  g.prompt[2] = 100;
  g.output[0] = -1;
  g.stop_ids = {2, 555};
  CHECK(failing_field(g.step, kLimits, HistoryCheck::lengths_only).empty());
  CHECK(failing_field(g.step) == "seqs[0].samples[0].prompt[2]");
  g.output.assign(62, -1);  // 3 + 62 > 64
  CHECK(failing_field(g.step, kLimits, HistoryCheck::lengths_only) == "seqs[0].samples[0].output");
  g.output.resize(61);
  g.step.seqs[0].tokens[0] = 100;  // a chunk's tokens are read all the same
  CHECK(failing_field(g.step, kLimits, HistoryCheck::lengths_only) == "seqs[0].tokens[0]");
  g.step.seqs[0].tokens[0] = 1;
  g.params.top_p = 0.0f;  // and the parameters
  CHECK(failing_field(g.step, kLimits, HistoryCheck::lengths_only) == "seqs[0].samples[0].params.top_p");
}

TEST_CASE("check_token_ids names the first id outside the vocabulary", "[step_check]") {
  CHECK_FALSE(check_token_ids({}, 100));
  CHECK_FALSE(check_token_ids(std::vector<TokenId>{0, 99}, 100));
  const auto e = check_token_ids(std::vector<TokenId>{0, 99, 100, -1}, 100);
  REQUIRE(e);
  CHECK(e->describe() == "[2]: token 100 is outside the vocabulary [0, 100)");
}

TEST_CASE("copies stay in the device pool, write each block once and never write a block another copy reads",
          "[step_check]") {
  GoodStep g;
  const auto copies = [&](std::vector<BlockPair> pairs) {
    g.step.copies = std::move(pairs);
    return failing_field(g.step);
  };
  CHECK(copies({{8, 4}}) == "copies[0].first");
  CHECK(copies({{3, 4}, {3, -1}}) == "copies[1].second");
  CHECK(copies({{3, 4}, {5, 4}}) == "copies[0].second");  // two copies into block 4
  CHECK(copies({{3, 4}, {4, 5}}) == "copies[0].second");  // 4 is written and read: the order would matter
  CHECK(copies({{3, 3}}) == "copies[0].second");
  CHECK(copies({{3, 4}, {3, 5}, {6, 7}}).empty());
}

TEST_CASE("swap pairs: a device and a swap block on the side their order says", "[step_check]") {
  CHECK(failing_pair({{7, 3}, {0, 0}}, PairOrder::swap_out).empty());
  CHECK(failing_pair({{3, 7}, {0, 0}}, PairOrder::swap_in).empty());
  CHECK(failing_pair({{4, 0}}, PairOrder::swap_out).empty());  // device block 4 exists
  CHECK(failing_pair({{0, 4}}, PairOrder::swap_out) == "swap_out[0].second");  // swap block 4 does not
  CHECK(failing_pair({{4, 0}}, PairOrder::swap_in) == "swap_in[0].first");
  CHECK(failing_pair({{0, 8}}, PairOrder::swap_in) == "swap_in[0].second");
  CHECK(failing_pair({{-1, 0}}, PairOrder::swap_out) == "swap_out[0].first");
  CHECK(failing_pair({{1, 2}, {2, 1}}, PairOrder::swap_out).empty());  // other pools: no chain
  CHECK(failing_pair({{1, 2}, {3, 2}}, PairOrder::swap_out) == "swap_out[0].second");
  const auto e = check_block_pairs({{0, 9}}, PairOrder::swap_out, 8, 4);
  REQUIRE(e);
  CHECK(e->message == "swap block 9 is outside the CPU swap pool [0, 4)");
  CHECK(e->describe() == "swap_out[0].second: swap block 9 is outside the CPU swap pool [0, 4)");
  CHECK(check_block_pairs({{12, 0}}, PairOrder::swap_in, 8, 4)->message ==
        "swap block 12 is outside the CPU swap pool [0, 4)");
}

TEST_CASE("a worker's result must answer its step: its sampled sequences, samples, candidates and ids", "[step_check]") {
  GoodStep g;  // sequence 1 samples once (2 logprobs, 1 candidate); sequence 2 does not sample
  const auto answer = [](SeqId seq, std::vector<SampledToken> candidates) {
    StepResult r;
    r.seqs = {seq};
    r.samples = {{std::move(candidates)}};
    return r;
  };
  const auto field = [&](const StepResult& r) {
    const std::optional<FieldError> e = check_result(r, g.step, kLimits.vocab_size);
    return e ? e->field : "";
  };
  CHECK(field(answer(1, {{7, -0.1f, {{7, -0.1f}, {8, -2.0f}}}})) == "");
  CHECK(field(answer(2, {{7, -0.1f, {}}})) == "seqs[0]");           // not the sampled sequence
  CHECK(field(StepResult{}) == "seqs");                             // nothing answered
  StepResult two = answer(1, {{7, -0.1f, {}}});
  two.samples[0].push_back({{8, -0.2f, {}}});
  CHECK(field(two) == "samples[0]");                                // two samples for one asked
  CHECK(field(answer(1, {})) == "samples[0][0]");                    // no candidate
  CHECK(field(answer(1, {{7, -0.1f, {}}, {8, -0.2f, {}}})) == "samples[0][0]");  // two candidates, one asked
  CHECK(field(answer(1, {{100, -0.1f, {}}})) == "samples[0][0][0].token");
  CHECK(field(answer(1, {{-1, -0.1f, {}}})) == "samples[0][0][0].token");
  CHECK(field(answer(1, {{7, -0.1f, {{7, -0.1f}, {8, -2.0f}, {9, -3.0f}}}})) == "samples[0][0][0].top_logprobs");
  CHECK(field(answer(1, {{7, -0.1f, {{700, -0.1f}}}})) == "samples[0][0][0].top_logprobs[0]");
}

TEST_CASE("a chunk's prompt logprobs: count within its tokens, num_top within kMaxLogprobs, a next token in the "
          "vocabulary when it is read",
          "[step_check]") {
  GoodStep g;  // chunk 0 has 3 tokens
  SeqChunk& c = g.step.seqs[0];
  c.prompt_logprobs = {.count = 2, .num_top = kMaxLogprobs, .next_token = -1};  // next_token not read
  CHECK(failing_field(g.step).empty());
  c.prompt_logprobs = {.count = 3, .num_top = 0, .next_token = 99};
  CHECK(failing_field(g.step).empty());
  c.prompt_logprobs.next_token = 100;
  CHECK(failing_field(g.step) == "seqs[0].prompt_logprobs.next_token");
  c.prompt_logprobs = {.count = 4, .num_top = 0, .next_token = 1};
  CHECK(failing_field(g.step) == "seqs[0].prompt_logprobs.count");
  c.prompt_logprobs = {.count = -1, .num_top = 0, .next_token = 1};
  CHECK(failing_field(g.step) == "seqs[0].prompt_logprobs.count");
  c.prompt_logprobs = {.count = 1, .num_top = kMaxLogprobs + 1, .next_token = 1};
  CHECK(failing_field(g.step) == "seqs[0].prompt_logprobs.num_top");
}

TEST_CASE("a worker's prompt logprobs must answer the chunks that asked: sequence, position, tokens, ranks, ids",
          "[step_check]") {
  GoodStep g;  // chunk 0: tokens {1, 5, 9} from position 0 sample; chunk 1 (sequence 2) scores 1 token
  g.decode().prompt_logprobs = {.count = 1, .num_top = 1, .next_token = 8};
  const auto answer = [](std::vector<PromptLogprob> tokens, SeqId seq = 2, int32_t first_pos = 21) {
    StepResult r;
    r.seqs = {1};
    r.samples = {{{{7, -0.1f, {}}}}};
    r.prompt_logprobs = {{seq, first_pos, std::move(tokens)}};
    return r;
  };
  const auto field = [&](const StepResult& r) {
    const std::optional<FieldError> e = check_result(r, g.step, kLimits.vocab_size);
    return e ? e->field : "";
  };
  CHECK(field(answer({{8, -0.5f, 3, {{4, -0.2f}}}})) == "");
  StepResult none = answer({});
  none.prompt_logprobs.clear();
  CHECK(field(none) == "prompt_logprobs");
  CHECK(field(answer({{8, -0.5f, 3, {}}}, 1)) == "prompt_logprobs[0]");
  CHECK(field(answer({{8, -0.5f, 3, {}}}, 2, 20)) == "prompt_logprobs[0]");
  CHECK(field(answer({})) == "prompt_logprobs[0].tokens");
  CHECK(field(answer({{9, -0.5f, 3, {}}})) == "prompt_logprobs[0].tokens[0].token");  // not the token asked
  CHECK(field(answer({{8, -0.5f, 0, {}}})) == "prompt_logprobs[0].tokens[0].rank");
  CHECK(field(answer({{8, -0.5f, 101, {}}})) == "prompt_logprobs[0].tokens[0].rank");
  CHECK(field(answer({{8, -0.5f, 3, {{4, -0.2f}, {5, -0.3f}}}})) == "prompt_logprobs[0].tokens[0].top_logprobs");
  CHECK(field(answer({{8, -0.5f, 3, {{100, -0.2f}}}})) == "prompt_logprobs[0].tokens[0].top_logprobs[0]");
}

TEST_CASE("drafts: fewer than the chunk's tokens, at most kMaxSpeculativeTokens, one sample of one candidate, and a "
          "result with a sample per position verified",
          "[step_check]") {
  GoodStep g;  // chunk 0: tokens {1, 5, 9}, one sample
  g.step.seqs[0].num_drafts = 2;  // 5 and 9 are drafts: the logits of 1, 5 and 9 are sampled
  CHECK(failing_field(g.step).empty());
  for (int bad : {-1, 3, kMaxSpeculativeTokens + 1}) {
    g.step.seqs[0].num_drafts = bad;
    CHECK(failing_field(g.step) == "seqs[0].num_drafts");
  }
  g.step.seqs[0].num_drafts = 2;
  g.sample().num_candidates = 2;
  CHECK(failing_field(g.step) == "seqs[0].num_drafts");
  g.sample().num_candidates = 1;
  g.step.seqs[0].samples.push_back(g.sample());
  CHECK(failing_field(g.step) == "seqs[0].num_drafts");
  g.step.seqs[0].samples.pop_back();
  g.step.seqs[0].prompt_logprobs = {.count = 1, .num_top = 0};
  CHECK(failing_field(g.step) == "seqs[0].num_drafts");
  g.step.seqs[0].prompt_logprobs = {};
  g.step.seqs[0].last_token_deferred = true;
  CHECK(failing_field(g.step) == "seqs[0].num_drafts");
  g.step.seqs[0].last_token_deferred = false;

  const auto field = [&](size_t samples) {
    StepResult r;
    r.seqs = {1};
    r.samples.resize(1);
    for (size_t k = 0; k < samples; ++k) r.samples[0].push_back({{7, -0.1f, {}}});
    const std::optional<FieldError> e = check_result(r, g.step, kLimits.vocab_size);
    return e ? e->field : "";
  };
  CHECK(field(3) == "");
  CHECK(field(1) == "samples[0]");
  CHECK(field(4) == "samples[0]");
  // Each position's sample sees the drafts before it as generated.
  const SeqChunk& c = g.step.seqs[0];
  REQUIRE(samples_answered(c) == 3);
  for (size_t k = 0; k < 3; ++k) {
    const ChunkSample s = chunk_sample(c, k);
    CHECK(s.token == k);
    CHECK(std::vector<TokenId>(s.spec.drafted.begin(), s.spec.drafted.end()) ==
          std::vector<TokenId>(c.tokens.begin() + 1, c.tokens.begin() + 1 + static_cast<long>(k)));
    CHECK(generated_count(s.spec) == 1 + k);  // output {7}, then the drafts
  }
}
