// The packed form of steps and results (pack_step / unpack_step, pack_result / unpack_result in actors/step_wire.h):
// round trips of every field (every sampling parameter, extreme integers, infinities and NaN as their bits), and
// bytes refused, naming where: every truncation of a valid packing, counts beyond the bytes left (without
// allocating what they claim), bytes after the end, flags that are neither 0 nor 1, logit_bias keys out of order,
// too many bytes of stop strings.
#include <catch2/catch.hpp>

#include <bit>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <variant>
#include <vector>

#include "actors/step_wire.h"

using namespace paged;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int32_t kMinInt = std::numeric_limits<int32_t>::min(), kMaxInt = std::numeric_limits<int32_t>::max();
constexpr uint64_t kMaxU64 = std::numeric_limits<uint64_t>::max();

// Every field away from its default, the ints and floats each with a value of its own.
SamplingParams every_field_set() {
  return {.n = 3, .best_of = 5, .use_beam_search = true, .length_penalty = 0.5f, .max_tokens = 77, .min_tokens = 4, .temperature = 0.25f,
          .top_p = 0.8f, .top_k = 12, .min_p = 0.05f, .seed = uint64_t{1} << 40, .repetition_penalty = 1.1f,
          .presence_penalty = -0.5f, .frequency_penalty = 0.3f, .logit_bias = {{3, 1.5f}, {9, -2.0f}},
          .stop_token_ids = {7, 8}, .stop = {"\n\n", "The end"}, .allowed_token_ids = {4, 2, 9},
          .bad_words = {"dog", " big cat"}, .bad_words_token_ids = {{11}, {12, 13}, {}}, .ignore_eos = true, .logprobs = 6,
          .prompt_logprobs = 3, .skip_special_tokens = false, .include_stop_str_in_output = true,
          .structured = {.kind = StructuredOutput::Kind::json_schema, .spec = "{}", .field = "structured_outputs",
                         .after = "</think>", .whitespace = " ?"},
          .cache_salt = 0x0123456789abcdefULL, .lora = 5, .priority = -7};
}

// One chunk that samples, with `params` in its context.
WireChunk sampling_chunk(SeqId seq, const SamplingParams& params) {
  return {.seq = seq, .tokens = {5}, .start_pos = 0, .table_keep = 0, .table_tail = {},
          .context = WireContext{.params = params, .prompt = {1, 2}, .stop_ids = {2}}, .output_keep = 0,
          .output_tail = {}, .samples = {WireSample{.seed = 1, .num_logprobs = 0, .num_candidates = 1}}};
}

// A step with a bit of everything: extreme values (unchecked here), a chunk with every parameter set and one with
// none, a chunk without samples, copies and sequences ended.
WireStep varied_step() {
  WireStep w;
  WireChunk a = sampling_chunk(kMaxU64, every_field_set());
  a.tokens = {0, 7, kMaxInt, -3};
  a.last_token_deferred = true;
  a.num_drafts = kMinInt;
  a.lora = kMaxInt;
  a.start_pos = kMinInt;
  a.table_keep = 3;
  a.table_tail = {kMinInt, 5};
  a.group_keeps = {kMaxInt, 0, -1};  // KV groups 1..3
  a.group_tails = {{}, {7, kMinInt}, {2}};
  a.context->prompt = {1, 2, 3, kMaxInt};
  a.output_keep = -2;
  a.output_tail = {9, 10};
  a.samples = {{.seed = kMaxU64, .num_logprobs = 20, .num_candidates = 256}, {.seed = 0, .num_logprobs = -1,
                                                                              .num_candidates = 0}};
  WireChunk b = sampling_chunk(2, SamplingParams{});  // no seed, no logprobs
  b.num_drafts = 3;
  b.lora = 2;
  b.context->prompt.clear();
  b.context->stop_ids.clear();
  WireChunk c{.seq = 3, .tokens = {4, 4}, .start_pos = 16, .table_keep = 1, .table_tail = {}, .group_keeps = {},
              .group_tails = {}, .context = {},
              .output_keep = 0, .output_tail = {}, .samples = {}};
  a.prompt_logprobs = {.count = 2, .num_top = 20, .next_token = kMaxInt};
  c.prompt_logprobs = {.count = kMaxInt, .num_top = kMinInt, .next_token = -1};
  w.seqs = {a, b, c};
  w.copies = {{1, 2}, {kMinInt, kMaxInt}};
  w.finished = {0, 3, kMaxU64};
  return w;
}

// Fails the test unless `got` equals `want` in every field.
void require_same_wire(const WireStep& got, const WireStep& want) {
  CHECK(got.copies == want.copies);
  CHECK(got.finished == want.finished);
  REQUIRE(got.seqs.size() == want.seqs.size());
  for (size_t i = 0; i < want.seqs.size(); ++i) {
    INFO("chunk " << i);
    const WireChunk &g = got.seqs[i], &w = want.seqs[i];
    CHECK(g.seq == w.seq);
    CHECK(g.tokens == w.tokens);
    CHECK(g.last_token_deferred == w.last_token_deferred);
    CHECK(g.num_drafts == w.num_drafts);
    CHECK(g.lora == w.lora);
    CHECK(g.start_pos == w.start_pos);
    CHECK(g.table_keep == w.table_keep);
    CHECK(g.table_tail == w.table_tail);
    CHECK(g.group_keeps == w.group_keeps);
    CHECK(g.group_tails == w.group_tails);
    CHECK(g.output_keep == w.output_keep);
    CHECK(g.output_tail == w.output_tail);
    REQUIRE(g.context.has_value() == w.context.has_value());
    if (w.context) {
      CHECK(g.context->params == w.context->params);
      CHECK(g.context->prompt == w.context->prompt);
      CHECK(g.context->stop_ids == w.context->stop_ids);
    }
    REQUIRE(g.samples.size() == w.samples.size());
    for (size_t k = 0; k < w.samples.size(); ++k) {
      CHECK(g.samples[k].seed == w.samples[k].seed);
      CHECK(g.samples[k].num_logprobs == w.samples[k].num_logprobs);
      CHECK(g.samples[k].num_candidates == w.samples[k].num_candidates);
    }
    CHECK(g.prompt_logprobs.count == w.prompt_logprobs.count);
    CHECK(g.prompt_logprobs.num_top == w.prompt_logprobs.num_top);
    CHECK(g.prompt_logprobs.next_token == w.prompt_logprobs.next_token);
  }
}

WireStep unpacked_step(const std::string& bytes) {
  auto r = unpack_step(bytes);
  if (const auto* e = std::get_if<FieldError>(&r)) FAIL("refused: " << e->describe());
  return std::get<WireStep>(std::move(r));
}

// Why unpack_step refuses `bytes`: "field: message", or "" when it takes them.
std::string step_refusal(std::string_view bytes) {
  const auto r = unpack_step(bytes);
  const auto* e = std::get_if<FieldError>(&r);
  return e ? e->describe() : "";
}

std::string result_refusal(std::string_view bytes) {
  const auto r = unpack_result(bytes);
  const auto* e = std::get_if<FieldError>(&r);
  return e ? e->describe() : "";
}

// Little-endian bytes of `x`, written out byte by byte.
template <class T>
std::string le(T x) {
  std::string out;
  auto bits = static_cast<uint64_t>(x);
  for (size_t i = 0; i < sizeof(T); ++i, bits >>= 8) out.push_back(static_cast<char>(bits & 0xff));
  return out;
}

uint32_t bits_of(float x) { return std::bit_cast<uint32_t>(x); }

// Fails the test unless the results are equal, floats bit for bit.
void require_same_result(const StepResult& got, const StepResult& want) {
  CHECK(got.seqs == want.seqs);
  REQUIRE(got.samples.size() == want.samples.size());
  for (size_t c = 0; c < want.samples.size(); ++c) {
    REQUIRE(got.samples[c].size() == want.samples[c].size());
    for (size_t s = 0; s < want.samples[c].size(); ++s) {
      REQUIRE(got.samples[c][s].size() == want.samples[c][s].size());
      for (size_t k = 0; k < want.samples[c][s].size(); ++k) {
        INFO("samples[" << c << "][" << s << "][" << k << "]");
        const SampledToken &g = got.samples[c][s][k], &w = want.samples[c][s][k];
        CHECK(g.token == w.token);
        CHECK(bits_of(g.logprob) == bits_of(w.logprob));
        REQUIRE(g.top_logprobs.size() == w.top_logprobs.size());
        for (size_t t = 0; t < w.top_logprobs.size(); ++t) {
          CHECK(g.top_logprobs[t].first == w.top_logprobs[t].first);
          CHECK(bits_of(g.top_logprobs[t].second) == bits_of(w.top_logprobs[t].second));
        }
      }
    }
  }
  REQUIRE(got.prompt_logprobs.size() == want.prompt_logprobs.size());
  for (size_t c = 0; c < want.prompt_logprobs.size(); ++c) {
    const ChunkPromptLogprobs &g = got.prompt_logprobs[c], &w = want.prompt_logprobs[c];
    CHECK(g.seq == w.seq);
    CHECK(g.first_pos == w.first_pos);
    REQUIRE(g.tokens.size() == w.tokens.size());
    for (size_t k = 0; k < w.tokens.size(); ++k) {
      INFO("prompt_logprobs[" << c << "].tokens[" << k << "]");
      CHECK(g.tokens[k].token == w.tokens[k].token);
      CHECK(bits_of(g.tokens[k].logprob) == bits_of(w.tokens[k].logprob));
      CHECK(g.tokens[k].rank == w.tokens[k].rank);
      REQUIRE(g.tokens[k].top_logprobs.size() == w.tokens[k].top_logprobs.size());
      for (size_t t = 0; t < w.tokens[k].top_logprobs.size(); ++t) {
        CHECK(g.tokens[k].top_logprobs[t].first == w.tokens[k].top_logprobs[t].first);
        CHECK(bits_of(g.tokens[k].top_logprobs[t].second) == bits_of(w.tokens[k].top_logprobs[t].second));
      }
    }
  }
  CHECK(got.cost.busy_us == want.cost.busy_us);
  CHECK(got.cost.idle_before_us == want.cost.idle_before_us);
  CHECK(got.cost.graphs_captured == want.cost.graphs_captured);
  CHECK(got.cost.graph_capture_us == want.cost.graph_capture_us);
}

// Results of three chunks: two samples with -inf among the logprobs, none, one sample of two candidates; one more
// sequence than chunks with samples (a runner's answer need not match, and the codec does not judge); prompt
// logprobs of two chunks, extreme values among them, one without tokens.
StepResult varied_result() {
  StepResult r;
  r.seqs = {1, kMaxU64, 7, 8};
  r.samples = {{{{5, -0.25f, {{5, -0.25f}, {9, -kInf}, {kMaxInt, std::numeric_limits<float>::lowest()}}}},
                {{6, -kInf, {}}}},
               {},
               {{{0, 0.0f, {}}, {kMinInt, kInf, {{1, std::numeric_limits<float>::quiet_NaN()}}}}}};
  r.prompt_logprobs = {{kMaxU64, kMinInt, {{3, -1.5f, kMaxInt, {{3, -1.5f}, {kMinInt, -kInf}}}, {0, 0.0f, 0, {}}}},
                       {5, 1, {}}};
  r.cost = {.busy_us = 4321, .idle_before_us = int64_t{1} << 40, .graphs_captured = kMaxInt, .graph_capture_us = 0};
  return r;
}

}  // namespace

TEST_CASE("every sampling parameter survives packing, each on its own and all together", "[wire][pack]") {
  const SamplingParams d, set = every_field_set();
  // Each field of `set` is away from its default (a field added to SamplingParams must be added here too).
  CHECK(set.n != d.n);
  CHECK(set.best_of != d.best_of);
  CHECK(set.use_beam_search != d.use_beam_search);
  CHECK(set.length_penalty != d.length_penalty);
  CHECK(set.max_tokens != d.max_tokens);
  CHECK(set.min_tokens != d.min_tokens);
  CHECK(set.temperature != d.temperature);
  CHECK(set.top_p != d.top_p);
  CHECK(set.top_k != d.top_k);
  CHECK(set.min_p != d.min_p);
  CHECK(set.seed != d.seed);
  CHECK(set.repetition_penalty != d.repetition_penalty);
  CHECK(set.presence_penalty != d.presence_penalty);
  CHECK(set.frequency_penalty != d.frequency_penalty);
  CHECK(set.logit_bias != d.logit_bias);
  CHECK(set.stop_token_ids != d.stop_token_ids);
  CHECK(set.stop != d.stop);
  CHECK(set.allowed_token_ids != d.allowed_token_ids);
  CHECK(set.bad_words != d.bad_words);
  CHECK(set.bad_words_token_ids != d.bad_words_token_ids);
  CHECK(set.ignore_eos != d.ignore_eos);
  CHECK(set.logprobs != d.logprobs);
  CHECK(set.prompt_logprobs != d.prompt_logprobs);
  CHECK(set.skip_special_tokens != d.skip_special_tokens);
  CHECK(set.include_stop_str_in_output != d.include_stop_str_in_output);
  CHECK(set.structured != d.structured);
  CHECK(set.cache_salt != d.cache_salt);
  CHECK(set.lora != d.lora);
  CHECK(set.priority != d.priority);

  const auto round_trip = [](const SamplingParams& p) {
    WireStep w;
    w.seqs = {sampling_chunk(1, p)};
    const WireStep back = unpacked_step(pack_step(w));
    REQUIRE(back.seqs.size() == 1);
    REQUIRE(back.seqs[0].context);
    return back.seqs[0].context->params;
  };
  CHECK(round_trip(set) == set);
  CHECK(round_trip(d) == d);
  // Each field alone (so that two fields read into each other's place cannot hide behind equal values).
  const std::vector<std::function<void(SamplingParams&)>> one_field = {
      [&](SamplingParams& p) { p.n = set.n; },
      [&](SamplingParams& p) { p.best_of = set.best_of; },
      [&](SamplingParams& p) { p.use_beam_search = set.use_beam_search; },
      [&](SamplingParams& p) { p.length_penalty = set.length_penalty; },
      [&](SamplingParams& p) { p.max_tokens = set.max_tokens; },
      [&](SamplingParams& p) { p.min_tokens = set.min_tokens; },
      [&](SamplingParams& p) { p.temperature = set.temperature; },
      [&](SamplingParams& p) { p.top_p = set.top_p; },
      [&](SamplingParams& p) { p.top_k = set.top_k; },
      [&](SamplingParams& p) { p.min_p = set.min_p; },
      [&](SamplingParams& p) { p.seed = set.seed; },
      [&](SamplingParams& p) { p.repetition_penalty = set.repetition_penalty; },
      [&](SamplingParams& p) { p.presence_penalty = set.presence_penalty; },
      [&](SamplingParams& p) { p.frequency_penalty = set.frequency_penalty; },
      [&](SamplingParams& p) { p.logit_bias = set.logit_bias; },
      [&](SamplingParams& p) { p.stop_token_ids = set.stop_token_ids; },
      [&](SamplingParams& p) { p.stop = set.stop; },
      [&](SamplingParams& p) { p.allowed_token_ids = set.allowed_token_ids; },
      [&](SamplingParams& p) { p.bad_words = set.bad_words; },
      [&](SamplingParams& p) { p.bad_words_token_ids = set.bad_words_token_ids; },
      [&](SamplingParams& p) { p.ignore_eos = set.ignore_eos; },
      [&](SamplingParams& p) { p.logprobs = set.logprobs; },
      [&](SamplingParams& p) { p.prompt_logprobs = set.prompt_logprobs; },
      [&](SamplingParams& p) { p.skip_special_tokens = set.skip_special_tokens; },
      [&](SamplingParams& p) { p.include_stop_str_in_output = set.include_stop_str_in_output; },
      [&](SamplingParams& p) { p.structured = set.structured; },
      [&](SamplingParams& p) { p.cache_salt = set.cache_salt; },
      [&](SamplingParams& p) { p.lora = set.lora; },
      [&](SamplingParams& p) { p.priority = set.priority; },
  };
  for (size_t f = 0; f < one_field.size(); ++f) {
    INFO("field " << f);
    SamplingParams p;
    one_field[f](p);
    CHECK(p != d);
    CHECK(round_trip(p) == p);
  }
  // Floats go as their bits: NaN and the infinities too.
  SamplingParams odd;
  odd.temperature = std::numeric_limits<float>::quiet_NaN();
  odd.top_p = -kInf;
  odd.min_p = std::numeric_limits<float>::denorm_min();
  odd.logit_bias = {{kMinInt, kInf}};
  const SamplingParams back = round_trip(odd);
  CHECK(bits_of(back.temperature) == bits_of(odd.temperature));
  CHECK(bits_of(back.top_p) == bits_of(-kInf));
  CHECK(bits_of(back.min_p) == bits_of(odd.min_p));
  CHECK(back.logit_bias == odd.logit_bias);
}

TEST_CASE("a packed step unpacks to the step, every field, and nothing but a whole packing unpacks",
          "[wire][pack]") {
  const WireStep w = varied_step();
  const std::string bytes = pack_step(w);
  require_same_wire(unpacked_step(bytes), w);
  require_same_wire(unpacked_step(pack_step(WireStep{})), WireStep{});
  for (size_t n = 0; n < bytes.size(); ++n) {
    INFO("the first " << n << " of " << bytes.size() << " bytes");
    CHECK_FALSE(step_refusal(std::string_view(bytes).substr(0, n)).empty());
  }
  CHECK(step_refusal(bytes + '\0') ==
        "bytes: the step ends at byte " + std::to_string(bytes.size()) + " of " + std::to_string(bytes.size() + 1));
}

TEST_CASE("a packed result unpacks to the result, -inf and NaN logprobs as they are; nothing else does",
          "[wire][pack]") {
  const StepResult r = varied_result();
  const std::string bytes = pack_result(r);
  auto back = unpack_result(bytes);
  REQUIRE(std::holds_alternative<StepResult>(back));
  require_same_result(std::get<StepResult>(back), r);
  CHECK(std::get<StepResult>(back).samples[0][1][0].logprob == -kInf);
  for (size_t n = 0; n < bytes.size(); ++n) {
    INFO("the first " << n << " of " << bytes.size() << " bytes");
    CHECK_FALSE(result_refusal(std::string_view(bytes).substr(0, n)).empty());
  }
  CHECK(result_refusal(bytes + "xy") ==
        "bytes: the result ends at byte " + std::to_string(bytes.size()) + " of " + std::to_string(bytes.size() + 2));
  // The cost closes the result: busy, idle (8 bytes each), graphs (4), capture time (8); none may be negative.
  std::string negative = bytes;
  negative.replace(bytes.size() - 28, 8, le<int64_t>(-5));
  CHECK(result_refusal(negative) == "cost.busy_us: a time of -5 us is negative");
  negative = bytes;
  negative.replace(bytes.size() - 12, 4, le<int32_t>(-1));
  CHECK(result_refusal(negative) == "cost.graphs_captured: a negative count");
}

TEST_CASE("a count beyond the bytes left is refused before anything is allocated", "[wire][pack]") {
  // 2^32 - 1 chunks (over a TiB of WireChunks: allocating them would throw std::bad_alloc, not refuse).
  CHECK(step_refusal(le<uint32_t>(0xffffffff) + std::string(64, '\0')) ==
        "seqs: a count of 4294967295 entries of 47 bytes or more at byte 0, where 64 bytes are left");
  // One chunk whose tokens claim 3 GiB.
  const std::string huge_tokens = le<uint32_t>(1) + le<uint64_t>(9) + le<uint32_t>(0xc0000000) + std::string(40, '\0');
  CHECK(step_refusal(huge_tokens) ==
        "seqs[0].tokens: a count of 3221225472 entries of 4 bytes or more at byte 12, where 40 bytes are left");
  CHECK(result_refusal(le<uint32_t>(0xffffffff)) ==
        "seqs: a count of 4294967295 entries of 8 bytes or more at byte 0, where 0 bytes are left");
  // A result of one chunk, one sample, one candidate (token 5, logprob 0) whose alternatives claim 2^32 - 1.
  const std::string huge_alternatives = le<uint32_t>(0) + le<uint32_t>(1) + le<uint32_t>(1) + le<uint32_t>(1) +
                                        le<int32_t>(5) + le<uint32_t>(0) + le<uint32_t>(0xffffffff);
  CHECK(result_refusal(huge_alternatives) == "samples[0][0][0].top_logprobs: a count of 4294967295 entries of 8 "
                                             "bytes or more at byte 24, where 0 bytes are left");
}

TEST_CASE("a packed step is refused for a flag that is neither 0 nor 1, logit_bias keys out of order or twice, "
          "stop strings or bad words over their bounds",
          "[wire][pack]") {
  // One chunk: count (4), seq (8), tokens {5} (4 + 4), last_token_deferred (1), num_drafts (4), start_pos (4),
  // table_keep (4), table_tail {} (4), group tables {} (4): the context's flag at byte 41, then its parameters: n,
  // best_of (4 each), use_beam_search (1), length_penalty, max_tokens, min_tokens, temperature, top_p, top_k, min_p
  // (4 each), seed's flag (1; unset), repetition, presence and frequency penalties (4 each): logit_bias's count at
  // byte 42 + 50 = 92, its first token at 96, the second at 104.
  SamplingParams p;
  p.logit_bias = {{3, 1.0f}, {9, 2.0f}};
  WireStep w;
  w.seqs = {sampling_chunk(1, p)};
  const std::string bytes = pack_step(w);
  REQUIRE(bytes.substr(92, 4) == le<uint32_t>(2));
  REQUIRE(bytes.substr(96, 4) == le<int32_t>(3));
  REQUIRE(bytes.substr(104, 4) == le<int32_t>(9));

  std::string spoilt = bytes;
  spoilt[20] = 2;
  CHECK(step_refusal(spoilt) == "seqs[0].last_token_deferred: byte 2 at 20 is no flag (0 or 1)");
  spoilt = bytes;
  spoilt[41] = 2;
  CHECK(step_refusal(spoilt) == "seqs[0].context: byte 2 at 41 is no flag (0 or 1)");
  spoilt = bytes;
  spoilt.replace(96, 4, le<int32_t>(9));
  CHECK(step_refusal(spoilt) == "seqs[0].context.params.logit_bias[1]: token 9 at byte 104 does not follow token 9 "
                                "(the tokens come in ascending order, once each)");
  spoilt.replace(96, 4, le<int32_t>(10));
  CHECK(step_refusal(spoilt) == "seqs[0].context.params.logit_bias[1]: token 9 at byte 104 does not follow token 10 "
                                "(the tokens come in ascending order, once each)");

  p.logit_bias.clear();
  p.stop = {std::string(kMaxStopBytes - 1, 'a'), "b"};  // the bound exactly
  w.seqs = {sampling_chunk(1, p)};
  CHECK(unpacked_step(pack_step(w)).seqs[0].context->params.stop == p.stop);
  p.stop.back() = "bc";
  w.seqs = {sampling_chunk(1, p)};
  CHECK(step_refusal(pack_step(w)) == "seqs[0].context.params.stop[1]: the stop strings take more than the " +
                                          std::to_string(kMaxStopBytes) + " bytes allowed");

  p.stop.clear();
  p.bad_words = {std::string(kMaxBadWordBytes - 1, 'a'), "b"};  // the bound exactly
  w.seqs = {sampling_chunk(1, p)};
  CHECK(unpacked_step(pack_step(w)).seqs[0].context->params.bad_words == p.bad_words);
  p.bad_words.back() = "bc";
  w.seqs = {sampling_chunk(1, p)};
  CHECK(step_refusal(pack_step(w)) == "seqs[0].context.params.bad_words[1]: the bad words take more than the " +
                                          std::to_string(kMaxBadWordBytes) + " bytes allowed");
}
