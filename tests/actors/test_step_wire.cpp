// The wire form of a step (actors/step_wire.h): a head's WireEncoder and a worker's WireDecoder, through the packed
// form (pack_step, unpack_step), over a run of steps as a scheduler makes them (chunked prefill, decode steps, parallel
// sampling, copy-on-write of a fork's last block, a swap-in and a recompute onto new blocks, sequences ended and new
// ones), each decoded step equal to the one sent; what a decode step costs in bytes; the encoder's output deltas when
// an output does not grow; what a decoder refuses, and that a refused step changes nothing.
#include <catch2/catch.hpp>

#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

#include "actors/step_wire.h"
#include "tests/actors/same_step.h"

using namespace paged;
using namespace paged::test;

namespace {

// The worker's limits here: a vocabulary of 1000, blocks of 16 tokens, contexts of up to 2048.
const StepLimits kLimits{.vocab_size = 1000, .block_size = 16, .num_blocks = 256, .num_swap_blocks = 16,
                         .max_model_len = 2048, .max_num_batched_tokens = 256};

// A sequence's sampling inputs, as the scheduler holds them.
struct Sequence {
  SeqId id = 0;
  SamplingParams params;
  std::vector<TokenId> prompt, output, stop_ids{2};
};

// `n` samples of `s`, seeded seed, seed + 1, ..., reading its inputs.
std::vector<SampleSpec> samples_of(const Sequence& s, int n = 1, uint64_t seed = 1, int num_logprobs = 0) {
  std::vector<SampleSpec> out;
  for (int k = 0; k < n; ++k)
    out.push_back({.params = &s.params, .seed = seed + static_cast<uint64_t>(k), .prompt = &s.prompt,
                   .output = &s.output, .stop_ids = &s.stop_ids, .num_logprobs = num_logprobs, .num_candidates = 1});
  return out;
}

// A chunk of `s` computing `tokens` from `start` with `table`, drawing `samples`.
SeqChunk chunk_of(const Sequence& s, std::vector<TokenId> tokens, int32_t start, std::vector<int32_t> table,
                  std::vector<SampleSpec> samples = {}) {
  return {.seq = s.id, .tokens = std::move(tokens), .start_pos = start, .block_table = std::move(table),
          .samples = std::move(samples)};
}

// `n` ids counting up from `first`.
std::vector<TokenId> run_of(int first, int n) {
  std::vector<TokenId> ids(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = first + i;
  return ids;
}

// Positions [from, to) of `s`'s tokens (prompt, then output).
std::vector<TokenId> tokens_of(const Sequence& s, int from, int to) {
  std::vector<TokenId> all = s.prompt;
  all.insert(all.end(), s.output.begin(), s.output.end());
  return {all.begin() + from, all.begin() + to};
}

// `w` as a worker receives it: packed, then unpacked.
WireStep through_bytes(const WireStep& w) {
  auto r = unpack_step(pack_step(w));
  if (const auto* e = std::get_if<FieldError>(&r)) FAIL("unpack refused: " << e->describe());
  return std::get<WireStep>(std::move(r));
}

// The step `d` decodes from `w`; fails the test when it refuses it.
StepBatch decoded(WireDecoder& d, const WireStep& w) {
  auto r = d.decode(w);
  if (const auto* e = std::get_if<FieldError>(&r)) FAIL("refused: " << e->describe());
  return std::get<StepBatch>(std::move(r));
}

// Why `d` refuses `w`: "field: message", or "" when it decodes it.
std::string refusal(WireDecoder& d, const WireStep& w) {
  auto r = d.decode(w);
  const auto* e = std::get_if<FieldError>(&r);
  return e ? e->describe() : "";
}

// One chunk of sequence `seq` computing token 1 at `start` with `table` as (keep, tail), drawing `samples` samples.
WireChunk raw_chunk(SeqId seq, int32_t start, int32_t table_keep, std::vector<int32_t> table_tail, int samples = 0) {
  WireChunk c{.seq = seq, .tokens = {1}, .start_pos = start, .table_keep = table_keep,
              .table_tail = std::move(table_tail)};
  c.samples.resize(static_cast<size_t>(samples));
  return c;
}

}  // namespace

TEST_CASE("a run of steps decodes to the steps sent, each carrying only what changed", "[wire]") {
  WireEncoder encoder;
  WireDecoder decoder(kLimits);
  // Encodes `b`, decodes what the worker receives and compares it with `b`; the wire step, to look at.
  const auto send = [&](const StepBatch& b) {
    const WireStep w = through_bytes(encoder.encode(b));
    require_same_step(decoded(decoder, w), b);
    return w;
  };
  Sequence a{.id = 1, .prompt = run_of(100, 20)};
  a.params.temperature = 0.8f;
  a.params.top_p = 0.9f;
  a.params.repetition_penalty = 1.1f;
  a.params.logit_bias = {{5, 1.5f}};
  a.params.seed = 7;
  Sequence b{.id = 2, .prompt = run_of(300, 6), .stop_ids = {2, 17}};
  b.params.temperature = 0.0f;
  b.params.logprobs = 3;
  Sequence c{.id = 3, .prompt = run_of(500, 9)};
  c.params.n = 3;
  c.params.seed = 42;

  // 1: a's prompt in part (no sample), b's whole prompt, sampling.
  StepBatch s1;
  s1.seqs = {chunk_of(a, tokens_of(a, 0, 12), 0, {3}), chunk_of(b, b.prompt, 0, {7}, samples_of(b, 1, 9, 3))};
  WireStep w = send(s1);
  CHECK(w.seqs[0].table_keep == 0);
  CHECK(w.seqs[0].table_tail == std::vector<int32_t>{3});
  CHECK_FALSE(w.seqs[0].context);
  REQUIRE(w.seqs[1].context);
  CHECK(w.seqs[1].context->prompt == b.prompt);
  CHECK(w.seqs[1].context->stop_ids == b.stop_ids);

  // 2: the rest of a's prompt on a new block, sampling; b's first decode step.
  b.output = {55};
  StepBatch s2;
  s2.seqs = {chunk_of(a, tokens_of(a, 12, 20), 12, {3, 4}, samples_of(a)),
             chunk_of(b, {55}, 6, {7}, samples_of(b, 1, 9, 3))};
  w = send(s2);
  CHECK(w.seqs[0].table_keep == 1);
  CHECK(w.seqs[0].table_tail == std::vector<int32_t>{4});
  CHECK(w.seqs[0].context);  // a samples for the first time
  CHECK_FALSE(w.seqs[1].context);
  CHECK(w.seqs[1].table_keep == 1);
  CHECK(w.seqs[1].table_tail.empty());
  CHECK(w.seqs[1].output_keep == 0);
  CHECK(w.seqs[1].output_tail == std::vector<TokenId>{55});

  // 3: decode steps of a and b; c's prompt with three samples (parallel sampling), each with its own copy of the
  // stop ids, as the scheduler gives them.
  a.output = {60};
  b.output.push_back(56);
  std::vector<std::vector<TokenId>> c_stops(3, c.stop_ids);
  std::vector<SampleSpec> c_samples = samples_of(c, 3, 42);
  for (size_t k = 0; k < 3; ++k) c_samples[k].stop_ids = &c_stops[k];
  StepBatch s3;
  s3.seqs = {chunk_of(a, {60}, 20, {3, 4}, samples_of(a)), chunk_of(b, {56}, 7, {7}, samples_of(b, 1, 9, 3)),
             chunk_of(c, c.prompt, 0, {10}, c_samples)};
  w = send(s3);
  CHECK_FALSE(w.seqs[0].context);
  CHECK(w.seqs[1].output_keep == 1);
  CHECK(w.seqs[1].output_tail == std::vector<TokenId>{56});
  CHECK(w.seqs[2].context);
  CHECK(w.seqs[2].samples.size() == 3);

  // 4: a's last block copied on write to a new one; c's completions forked into sequences 4 and 5, each writing
  // its first own token into a copy of the shared block.
  a.output.push_back(61);
  b.output.push_back(57);
  c.output = {72};
  Sequence f4 = c, f5 = c;
  f4.id = 4;
  f4.output = {70};
  f5.id = 5;
  f5.output = {71};
  StepBatch s4;
  s4.copies = {{4, 9}, {10, 11}, {10, 12}};
  s4.seqs = {chunk_of(a, {61}, 21, {3, 9}, samples_of(a)), chunk_of(b, {57}, 8, {7}, samples_of(b, 1, 9, 3)),
             chunk_of(c, {72}, 9, {10}, samples_of(c, 1, 42)), chunk_of(f4, {70}, 9, {11}, samples_of(f4, 1, 43)),
             chunk_of(f5, {71}, 9, {12}, samples_of(f5, 1, 44))};
  w = send(s4);
  CHECK(w.seqs[0].table_keep == 1);
  CHECK(w.seqs[0].table_tail == std::vector<int32_t>{9});
  CHECK(w.seqs[3].table_keep == 0);
  CHECK(w.seqs[3].context);  // a new sequence on the worker
  CHECK(w.seqs[3].output_tail == std::vector<TokenId>{70});

  // 5: b swapped in onto an all-new block.
  a.output.push_back(62);
  b.output.push_back(58);
  StepBatch s5;
  s5.seqs = {chunk_of(a, {62}, 22, {3, 9}, samples_of(a)), chunk_of(b, {58}, 9, {20}, samples_of(b, 1, 9, 3))};
  w = send(s5);
  CHECK(w.seqs[0].table_keep == 2);
  CHECK(w.seqs[0].table_tail.empty());
  CHECK(w.seqs[0].output_keep == 2);
  CHECK(w.seqs[0].output_tail == std::vector<TokenId>{62});
  CHECK(w.seqs[1].table_keep == 0);
  CHECK(w.seqs[1].table_tail == std::vector<int32_t>{20});

  // 6: b and fork 5 ended; a new sequence d.
  a.output.push_back(63);
  Sequence d{.id = 6, .prompt = run_of(700, 30)};
  StepBatch s6;
  s6.finished = {2, 5};
  s6.seqs = {chunk_of(a, {63}, 23, {3, 9}, samples_of(a)), chunk_of(d, d.prompt, 0, {40, 41}, samples_of(d))};
  w = send(s6);
  CHECK(w.finished == std::vector<SeqId>{2, 5});
  CHECK(w.seqs[1].context);
  CHECK(decoder.num_sequences() == 4);  // a, c, fork 4, d

  // 7: a recomputed onto all-new blocks; id 2 again, for a new sequence (its old state is gone on both sides).
  a.output.push_back(64);
  c.output.push_back(73);
  Sequence e{.id = 2, .prompt = run_of(800, 5)};
  e.params.top_k = 4;
  const int a_len = static_cast<int>(a.prompt.size() + a.output.size());
  StepBatch s7;
  s7.seqs = {chunk_of(a, tokens_of(a, 0, a_len), 0, {30, 31}, samples_of(a)),
             chunk_of(c, {73}, 10, {10}, samples_of(c, 1, 42)), chunk_of(e, e.prompt, 0, {50}, samples_of(e))};
  w = send(s7);
  CHECK(w.seqs[0].table_keep == 0);
  CHECK(w.seqs[0].table_tail == std::vector<int32_t>{30, 31});
  CHECK_FALSE(w.seqs[0].context);
  CHECK(w.seqs[0].output_keep == 4);
  CHECK(w.seqs[0].output_tail == std::vector<TokenId>{64});
  REQUIRE(w.seqs[2].context);
  CHECK(w.seqs[2].context->prompt == e.prompt);
  CHECK(w.seqs[2].context->params == e.params);
  CHECK(decoder.num_sequences() == 5);
  const size_t held = a.prompt.size() + a.output.size() + c.prompt.size() + c.output.size() + f4.prompt.size() +
                      f4.output.size() + d.prompt.size() + e.prompt.size() + 5 * 1 +  // one stop id each
                      2 * a.params.logit_bias.size();  // a's bias: a token and a value each
  CHECK(decoder.num_tokens() == held);

  // The encoder forgets: its next step goes whole and decodes on a decoder that holds the old state.
  encoder.reset();
  a.output.push_back(65);
  StepBatch s8;
  s8.seqs = {chunk_of(a, {65}, a_len, {30, 31}, samples_of(a))};
  w = send(s8);
  CHECK(w.seqs[0].table_keep == 0);
  CHECK(w.seqs[0].table_tail == std::vector<int32_t>{30, 31});
  CHECK(w.seqs[0].context);
  CHECK(w.seqs[0].output_tail == a.output);

  // The decoder forgets: a delta against what it held is refused.
  decoder.reset();
  CHECK(decoder.num_sequences() == 0);
  CHECK(decoder.num_tokens() == 0);
  a.output.push_back(66);
  StepBatch s9;
  s9.seqs = {chunk_of(a, {66}, a_len + 1, {30, 31}, samples_of(a))};
  CHECK(refusal(decoder, encoder.encode(s9)) == "seqs[0].table_keep: 2 exceeds the 0 blocks known for sequence 1");
}

TEST_CASE("a decode step costs the same bytes whatever the sequence's history", "[wire]") {
  // Bytes of (the first step of a sequence whose history is `history` tokens, its next decode step).
  const auto step_bytes = [](int history) {
    WireEncoder encoder;
    WireDecoder decoder(kLimits);
    Sequence s{.id = 9, .prompt = run_of(10, history / 2), .output = run_of(500, history - history / 2)};
    s.params.temperature = 0.7f;
    s.params.repetition_penalty = 1.2f;
    std::vector<int32_t> table = run_of(0, (history + kLimits.block_size - 1) / kLimits.block_size);
    StepBatch first;
    first.seqs = {chunk_of(s, {s.output.back()}, history - 1, table, samples_of(s))};
    const WireStep w1 = encoder.encode(first);
    require_same_step(decoded(decoder, through_bytes(w1)), first);
    s.output.push_back(77);  // position `history`: no new block for 10 or 1000
    StepBatch next;
    next.seqs = {chunk_of(s, {77}, history, table, samples_of(s))};
    const WireStep w2 = encoder.encode(next);
    require_same_step(decoded(decoder, through_bytes(w2)), next);
    return std::pair{pack_step(w1).size(), pack_step(w2).size()};
  };
  const auto [short_first, short_decode] = step_bytes(10);
  const auto [long_first, long_decode] = step_bytes(1000);
  const size_t whole_history = (1000 + 1) * sizeof(TokenId);  // what the ids alone took with every step
  INFO("history 10: first step " << short_first << " B, decode step " << short_decode << " B; history 1000: first "
                                 << long_first << " B, decode step " << long_decode << " B; whole history "
                                 << whole_history << " B");
  CHECK(long_decode <= short_decode);
  CHECK(long_decode * 20 < whole_history);
  CHECK(long_first > whole_history / 2);  // the first step carries the prompt (half the history) once
}

TEST_CASE("a decoder refuses what does not follow from what it holds, naming the field", "[wire]") {
  WireDecoder decoder(kLimits);
  WireEncoder encoder;
  Sequence s{.id = 7, .prompt = run_of(100, 40)};
  StepBatch prefill;
  prefill.seqs = {chunk_of(s, s.prompt, 0, {1, 2, 3}, samples_of(s))};
  decoded(decoder, encoder.encode(prefill));
  const size_t tokens = decoder.num_tokens();

  WireStep w;
  w.seqs = {raw_chunk(99, 0, 0, {1}, 1)};
  CHECK(refusal(decoder, w) ==
        "seqs[0].samples: sequence 99 samples, but its context (parameters, prompt, stop ids) never came");
  w.seqs = {raw_chunk(7, 40, 9, {})};
  CHECK(refusal(decoder, w) == "seqs[0].table_keep: 9 exceeds the 3 blocks known for sequence 7");
  w.seqs = {raw_chunk(7, 40, -1, {4})};
  CHECK(refusal(decoder, w) == "seqs[0].table_keep: -1 is negative");
  w.seqs = {raw_chunk(7, 40, 3, run_of(0, 126))};
  CHECK(refusal(decoder, w) ==
        "seqs[0].table_tail: 129 blocks, more than the 128 of a sequence of max_model_len tokens");
  w.seqs = {raw_chunk(7, 40, 3, {}, 1)};
  w.seqs[0].output_keep = 2;
  CHECK(refusal(decoder, w) == "seqs[0].output_keep: 2 exceeds the 0 output ids known for sequence 7");
  w.seqs = {raw_chunk(7, 40, 3, {})};
  w.seqs[0].output_tail = {5};
  CHECK(refusal(decoder, w) == "seqs[0].output_tail: a chunk without samples has no output ids");
  w.seqs[0].output_tail.clear();
  w.seqs[0].context = WireContext{};
  CHECK(refusal(decoder, w) == "seqs[0].context: a chunk without samples has no context");
  w.seqs = {raw_chunk(7, 40, 3, {}), raw_chunk(7, 41, 3, {})};
  CHECK(refusal(decoder, w) == "seqs: sequence 7 has two chunks in the step");
  // What check_step refuses in the decoded step: a token outside the vocabulary, a table that does not reach.
  w.seqs = {raw_chunk(7, 40, 3, {})};
  w.seqs[0].tokens = {1000};
  CHECK(refusal(decoder, w) == "seqs[0].tokens[0]: token 1000 is outside the vocabulary [0, 1000)");
  w.seqs = {raw_chunk(7, 48, 3, {})};
  CHECK(refusal(decoder, w).rfind("seqs[0].block_table: 3 blocks do not reach position 48", 0) == 0);
  w.seqs = {raw_chunk(7, 40, 3, {}, 1)};
  w.seqs[0].context = WireContext{.params = {}, .prompt = run_of(100, 40), .stop_ids = {}};
  w.seqs[0].context->params.top_p = 0.0f;
  CHECK(refusal(decoder, w).rfind("seqs[0].samples[0].params.top_p", 0) == 0);
  // The ids of a context and of an output tail, checked as they come.
  w.seqs = {raw_chunk(7, 40, 3, {}, 1)};
  w.seqs[0].output_tail = {5, 1000};
  CHECK(refusal(decoder, w) == "seqs[0].output_tail[1]: token 1000 is outside the vocabulary [0, 1000)");
  w.seqs[0].output_tail.clear();
  w.seqs[0].context = WireContext{.params = {}, .prompt = {1, -1}, .stop_ids = {}};
  CHECK(refusal(decoder, w) == "seqs[0].context.prompt[1]: token -1 is outside the vocabulary [0, 1000)");
  w.seqs[0].context = WireContext{.params = {}, .prompt = {1}, .stop_ids = {2, 1000}};
  CHECK(refusal(decoder, w) == "seqs[0].context.stop_ids[1]: token 1000 is outside the vocabulary [0, 1000)");
  CHECK(decoder.num_sequences() == 1);
  CHECK(decoder.num_tokens() == tokens);

  // A sequence ended is forgotten: its id needs its context again, in the same step as in a later one.
  w.seqs = {raw_chunk(7, 40, 3, {})};
  w.finished = {7};
  CHECK(refusal(decoder, w) == "seqs[0].table_keep: 3 exceeds the 0 blocks known for sequence 7");
  w.seqs.clear();
  w.finished = {7, 7, 12345};  // twice, and an id never seen: fine
  CHECK(refusal(decoder, w).empty());
  CHECK(decoder.num_sequences() == 0);
  CHECK(decoder.num_tokens() == 0);
  w.finished.clear();
  w.seqs = {raw_chunk(7, 0, 0, {1}, 1)};
  CHECK(refusal(decoder, w) ==
        "seqs[0].samples: sequence 7 samples, but its context (parameters, prompt, stop ids) never came");
}

TEST_CASE("a decoder holds a bounded state, and a step it refuses changes none of it", "[wire]") {
  SECTION("bounds on sequences and token ids") {
    WireDecoder decoder(kLimits, {.max_sequences = 2, .max_tokens = 50});
    WireStep w;
    w.seqs = {raw_chunk(1, 0, 0, {1}), raw_chunk(2, 0, 0, {1})};
    CHECK(refusal(decoder, w).empty());
    w.seqs = {raw_chunk(3, 0, 0, {1})};
    CHECK(refusal(decoder, w) == "seqs[0]: sequence 3 would be one more than the 2 sequences held at most");
    w.finished = {2};  // room for one
    CHECK(refusal(decoder, w).empty());
    w.finished.clear();
    w.seqs = {raw_chunk(1, 0, 1, {}, 1)};
    w.seqs[0].context = WireContext{.params = {}, .prompt = run_of(10, 45), .stop_ids = {2}};
    CHECK(refusal(decoder, w).empty());
    CHECK(decoder.num_tokens() == 46);
    w.seqs = {raw_chunk(3, 0, 1, {}, 1)};
    w.seqs[0].context = WireContext{.params = {}, .prompt = run_of(10, 5), .stop_ids = {}};
    CHECK(refusal(decoder, w) == "seqs[0]: 51 token ids would be held, more than the 50 held at most");
    w.seqs[0].context->prompt.pop_back();
    CHECK(refusal(decoder, w).empty());
    CHECK(decoder.num_tokens() == 50);
  }
  SECTION("a context's strings and lists count against the bound too, at 4 bytes an id") {
    WireDecoder decoder(kLimits, {.max_sequences = 8, .max_tokens = 50});
    WireStep w;
    w.seqs = {raw_chunk(1, 0, 0, {1}, 1)};
    SamplingParams fat;
    fat.structured = {StructuredOutput::Kind::regex, std::string(160, 'a'), "guided_regex"};  // 40 + 3 ids' worth
    fat.stop = {"abcd"};                                                                       // 1
    fat.stop_token_ids = {3, 4};                                                               // 2
    w.seqs[0].context = WireContext{.params = fat, .prompt = run_of(10, 4), .stop_ids = {}};
    CHECK(refusal(decoder, w).empty());
    CHECK(decoder.num_tokens() == 50);
    w.seqs = {raw_chunk(2, 0, 0, {2}, 1)};
    w.seqs[0].context = WireContext{.params = {}, .prompt = {5}, .stop_ids = {}};
    CHECK(refusal(decoder, w) == "seqs[0]: 51 token ids would be held, more than the 50 held at most");
  }
  SECTION("a refused step, whatever refused it, is as if it never came") {
    // The same steps to two decoders; bad ones in between to one of them.
    WireEncoder encoder;
    WireDecoder hit(kLimits), clean(kLimits);
    Sequence a{.id = 1, .prompt = run_of(100, 20)}, b{.id = 2, .prompt = run_of(200, 8)};
    StepBatch s1;
    s1.seqs = {chunk_of(a, a.prompt, 0, {1, 2}, samples_of(a)), chunk_of(b, b.prompt, 0, {3}, samples_of(b))};
    const WireStep w1 = encoder.encode(s1);
    require_same_step(decoded(hit, w1), s1);
    require_same_step(decoded(clean, w1), s1);
    a.output = {7};
    b.output = {8};
    StepBatch s2;  // a's last block copied on write, b on to a new block
    s2.copies = {{2, 5}};
    s2.seqs = {chunk_of(a, {7}, 20, {1, 5}, samples_of(a)), chunk_of(b, {8}, 8, {3}, samples_of(b))};
    const WireStep w2 = encoder.encode(s2);
    const auto spoilt = [](const WireStep& good, const std::function<void(WireStep&)>& spoil) {
      WireStep w = good;
      spoil(w);
      return w;
    };
    // Each bad step is found bad only after some of it was applied: a later chunk, the check of the whole step.
    const std::vector<std::function<void(WireStep&)>> spoils = {
        [](WireStep& w) { w.seqs[1].tokens = {5000}; },
        [](WireStep& w) { w.seqs.push_back(raw_chunk(3, 0, 0, {4}, 1)); },
        [](WireStep& w) { w.finished = {2}; },  // b's delta then follows from nothing
        [](WireStep& w) {
          w.seqs[0].output_tail = {9, 9};
          w.seqs[1].output_keep = 5;
        },
        [](WireStep& w) { w.copies.push_back({5, 6}); },  // block 5 both copied to and from
        [](WireStep& w) { w.seqs[1].output_tail = {8, 1000}; },  // an id outside the vocabulary, after a's chunk
    };
    for (const auto& spoil : spoils) CHECK_FALSE(refusal(hit, spoilt(w2, spoil)).empty());
    require_same_step(decoded(hit, w2), s2);
    require_same_step(decoded(clean, w2), s2);
    CHECK(hit.num_sequences() == clean.num_sequences());
    CHECK(hit.num_tokens() == clean.num_tokens());

    a.output.push_back(17);
    b.output.push_back(18);
    StepBatch s3;
    s3.seqs = {chunk_of(a, {17}, 21, {1, 5}, samples_of(a)), chunk_of(b, {18}, 9, {3}, samples_of(b))};
    const WireStep w3 = encoder.encode(s3);
    // Bad steps that first cut what is held (an output or a table rewritten), send a context again, or apply one
    // sequence's chunk twice.
    const std::vector<std::function<void(WireStep&)>> cuts = {
        [](WireStep& w) {
          w.seqs[0].output_keep = 0;
          w.seqs[0].output_tail = {3, 3};
          w.seqs[1].tokens = {5000};
        },
        [](WireStep& w) {
          w.seqs[0].table_keep = 0;
          w.seqs[0].table_tail = {6, 7};
          w.seqs[0].context = WireContext{.params = {}, .prompt = {4, 4}, .stop_ids = {}};
          w.copies.push_back({5, 5});
        },
        [](WireStep& w) { w.seqs.push_back(w.seqs[0]); },
    };
    for (const auto& cut : cuts) CHECK_FALSE(refusal(hit, spoilt(w3, cut)).empty());
    require_same_step(decoded(hit, w3), s3);
    require_same_step(decoded(clean, w3), s3);
    CHECK(hit.num_tokens() == clean.num_tokens());
  }
}

TEST_CASE("an encoder sends an output's new ids, and compares it whole when it did not grow", "[wire]") {
  WireEncoder encoder;
  WireDecoder decoder(kLimits);
  Sequence s{.id = 4, .prompt = run_of(100, 3), .output = {7, 8, 9}};
  // The next step of `s` as the worker decodes it, which must be the step; the output's (keep, tail) sent.
  const auto send = [&] {
    StepBatch b;
    const int32_t start = static_cast<int32_t>(s.prompt.size() + s.output.size()) - 1;
    b.seqs = {chunk_of(s, {s.output.back()}, start, {1}, samples_of(s))};
    const WireStep w = encoder.encode(b);
    require_same_step(decoded(decoder, through_bytes(w)), b);
    return std::pair{w.seqs[0].output_keep, w.seqs[0].output_tail};
  };
  CHECK(send() == std::pair{0, std::vector<TokenId>{7, 8, 9}});
  s.output.push_back(10);
  CHECK(send() == std::pair{3, std::vector<TokenId>{10}});
  CHECK(send() == std::pair{4, std::vector<TokenId>{}});
  // Outputs that did not grow (against the contract): the last id held is not where it was, or the output is
  // shorter; the whole output is compared, and the common prefix kept.
  s.output = {7, 20, 30, 40, 50};
  CHECK(send() == std::pair{1, std::vector<TokenId>{20, 30, 40, 50}});
  s.output = {7, 20};
  CHECK(send() == std::pair{2, std::vector<TokenId>{}});
}

TEST_CASE("an encoder refuses the samples of a chunk that read different inputs, remembering nothing", "[wire]") {
  WireEncoder encoder;
  Sequence a{.id = 1, .prompt = run_of(100, 4)}, b{.id = 2, .prompt = run_of(200, 4)};
  Sequence b_other = b;
  b_other.params.temperature = 0.5f;
  StepBatch bad;
  bad.seqs = {chunk_of(a, a.prompt, 0, {1}, samples_of(a)), chunk_of(b, b.prompt, 0, {2}, samples_of(b))};
  bad.seqs[1].samples.push_back(samples_of(b_other)[0]);
  CHECK_THROWS_AS(encoder.encode(bad), std::logic_error);
  bad.seqs[1].samples.back() = samples_of(b)[0];
  b_other = b;
  b_other.output = {3};
  bad.seqs[1].samples.back().output = &b_other.output;
  CHECK_THROWS_AS(encoder.encode(bad), std::logic_error);
  StepBatch good;
  good.seqs = {chunk_of(a, a.prompt, 0, {1}, samples_of(a))};
  const WireStep w = encoder.encode(good);
  CHECK(w.seqs[0].context);  // nothing of the refused steps was remembered
  CHECK(w.seqs[0].table_keep == 0);
}

TEST_CASE("a model of several KV groups: each group's table travels as its own delta, is checked against the held "
          "one, and a refused step puts every table back",
          "[wire]") {
  StepLimits limits = kLimits;
  limits.kv_windows = {0, 32, 32};  // a full group, two sliding ones
  WireDecoder decoder(limits);
  WireEncoder encoder;
  Sequence s{.id = 7, .prompt = run_of(100, 60)};
  StepBatch prefill;
  prefill.seqs = {chunk_of(s, s.prompt, 0, {1, 2, 3, 4}, samples_of(s))};
  prefill.seqs[0].group_tables = {{5, 6, 7, 8}, {9, 10, 11, 12}};
  const WireStep first = encoder.encode(prefill);
  REQUIRE(first.seqs[0].group_tails == std::vector<std::vector<int32_t>>{{5, 6, 7, 8}, {9, 10, 11, 12}});
  require_same_step(decoded(decoder, through_bytes(first)), prefill);

  // The first decode step's queries (position 60) see 29 on: the sliding groups' block 0 is released.
  s.output = {11};
  StepBatch decode;
  decode.seqs = {chunk_of(s, {11}, 60, {1, 2, 3, 4}, samples_of(s))};
  decode.seqs[0].group_tables = {{kReleasedBlock, 6, 7, 8}, {kReleasedBlock, 10, 11, 12}};
  const WireStep second = encoder.encode(decode);
  CHECK(second.seqs[0].table_keep == 4);
  CHECK(second.seqs[0].group_keeps == std::vector<int32_t>{0, 0});  // the first entry changed in place
  require_same_step(decoded(decoder, through_bytes(second)), decode);

  WireStep w = second;
  w.seqs[0].group_keeps = {9, 0};
  CHECK(refusal(decoder, w) == "seqs[0].group_keeps: 9 exceeds the 4 blocks known for sequence 7");
  w.seqs[0].group_keeps = {0};
  w.seqs[0].group_tails = {{}};
  CHECK(refusal(decoder, w) == "seqs[0].group_keeps: 2 block tables for a model of 3 KV groups");
  // From position 20 every block is inside the window: group 2's released entry is refused (by check_step), after
  // group 1's table changed.
  w = second;
  w.seqs[0].start_pos = 20;
  w.seqs[0].group_tails = {{20, 6, 7, 8}, {kReleasedBlock, 10, 11, 12}};
  CHECK(refusal(decoder, w).starts_with("seqs[0].group_tables[1][0]: block -1 is outside the device pool"));
  // Nothing of the refused steps stayed: the next step's deltas apply to the tables of the second step.
  s.output = {11, 12};
  StepBatch next;
  next.seqs = {chunk_of(s, {12}, 61, {1, 2, 3, 4}, samples_of(s))};
  next.seqs[0].group_tables = {{kReleasedBlock, 6, 7, 8}, {kReleasedBlock, 10, 11, 12}};
  const WireStep third = encoder.encode(next);
  CHECK(third.seqs[0].group_keeps == std::vector<int32_t>{4, 4});
  require_same_step(decoded(decoder, through_bytes(third)), next);
}
