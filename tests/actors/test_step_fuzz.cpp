// Fuzzing a worker's way in: the steps of a small scheduler stand-in, encoded as deltas by a head's WireEncoder,
// mutated field by field and byte by byte (their packed bytes), go through unpack_step into one long-lived
// WireDecoder (its delta and id checks, then check_step); whatever it takes is executed on a small CPU runner over
// stories260K and must neither throw nor touch memory outside its pools, and whatever it refuses must leave it as it
// was. The results the runner returns go back packed, mutated byte by byte, through unpack_result; swap orders
// likewise. Bytes that unpack are a packing: packed again, they are the same bytes. Part of paged_tests, and built on
// its own with AddressSanitizer and UBSan (paged_fuzz_step, see CMakeLists.txt), which turn any such touch into a
// failure.
#include <catch2/catch.hpp>

#include <algorithm>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "actors/step_wire.h"
#include "model/deferred_tokens.h"
#include "model/step_check.h"
#include "tests/actors/same_step.h"
#include "tests/draw.h"
#include "model/kv/kv_groups.h"
#include "tests/test_data.h"

using namespace paged;
using namespace paged::test;

namespace {

constexpr int kMutatedSteps = 10000;  // half mutated field by field, half byte by byte
constexpr int kMutatedResults = 5000;
constexpr int kSwapOrders = 2000;

// The runner's limits: few blocks, so that random ids often fall outside, and short contexts, so that steps are cheap.
StepLimits fuzz_limits(int vocab_size) {
  return {.vocab_size = vocab_size, .block_size = 16, .num_blocks = 24, .num_swap_blocks = 8, .max_model_len = 128,
          .max_num_batched_tokens = 48};
}

// Valid sampling parameters, drawn.
SamplingParams valid_params(Draw& d, const StepLimits& limits) {
  SamplingParams p;
  p.temperature = d.pick<float>({0.0f, 0.7f, 1.3f});
  p.top_k = d.pick<int>({-1, 5});
  p.top_p = d.pick<float>({1.0f, 0.9f});
  p.min_p = d.pick<float>({0.0f, 0.05f});
  p.repetition_penalty = d.pick<float>({1.0f, 1.2f});
  p.presence_penalty = d.pick<float>({0.0f, 0.5f});
  p.frequency_penalty = d.pick<float>({0.0f, -0.3f});
  p.min_tokens = d.pick<int>({0, 3});
  if (d.coin()) p.logit_bias[d.in(0, limits.vocab_size - 1)] = 2.0f;
  if (d.coin()) p.logprobs = d.in(0, 3);
  if (d.in(0, 3) == 0) p.prompt_logprobs = d.in(0, 3);
  return p;
}

// A scheduler's steps in miniature, each valid for `limits` (check_step passes it): up to four sequences at a time,
// each with its sampling parameters, prefilled in chunks, then decoded a token a step (the test appends a random
// token for each sample); a parallel-sampling sequence draws several samples at its first token; block tables grow,
// get their last block replaced (copy-on-write) or all-new blocks (a swap-in, or a recompute from position 0);
// sequences end (the step's `finished`) and new ones come, now and then under an id that ended. Up to two copies.
class StepSource {
 public:
  explicit StepSource(const StepLimits& limits) : limits_(limits) {}

  // The next step; its SampleSpecs point into this source until the next call.
  StepBatch next(Draw& d) {
    StepBatch b;
    for (auto& s : live_)
      if (s->sampled) {
        s->output.push_back(d.in(0, limits_.vocab_size - 1));
        s->sampled = false;
      }
    for (size_t i = live_.size(); i-- > 0;)
      if (length(*live_[i]) + 2 >= limits_.max_model_len || d.in(0, 11) == 0) {
        b.finished.push_back(live_[i]->id);
        ended_.push_back(live_[i]->id);
        live_.erase(live_.begin() + static_cast<std::ptrdiff_t>(i));
      }
    while (live_.size() < 4 && (live_.empty() || d.in(0, 2) == 0)) live_.push_back(new_seq(d));
    int budget = limits_.max_num_batched_tokens;
    for (size_t i = 0; i < live_.size() && b.seqs.size() < 3 && budget > 0; ++i)
      if (i == 0 || d.in(0, 3) > 0) b.seqs.push_back(chunk_of(d, *live_[i], budget));
    for (int i = d.in(0, 2); i > 0; --i) b.copies.emplace_back(d.in(0, 19), 20 + i);  // onto blocks 20..23 only
    return b;
  }

 private:
  struct Seq {
    SeqId id = 0;
    SamplingParams params;
    std::vector<TokenId> prompt, output, stop_ids{2};
    int computed = 0;       // tokens whose K/V is cached
    int width = 1;          // samples at its first token
    bool sampled = false;   // its last chunk sampled: a token comes before the next step
    std::vector<std::vector<int32_t>> tables;  // one per KV group (limits.kv_windows)
  };

  static int length(const Seq& s) { return static_cast<int>(s.prompt.size() + s.output.size()); }

  std::unique_ptr<Seq> new_seq(Draw& d) {
    auto s = std::make_unique<Seq>();
    if (!ended_.empty() && d.in(0, 4) == 0) {
      const size_t k = d.index(ended_.size());
      s->id = ended_[k];
      ended_.erase(ended_.begin() + static_cast<std::ptrdiff_t>(k));
    } else {
      s->id = next_id_++;
    }
    s->params = valid_params(d, limits_);
    for (int i = d.in(1, 40); i > 0; --i) s->prompt.push_back(d.in(0, limits_.vocab_size - 1));
    s->width = d.in(0, 3) == 0 ? d.in(2, 3) : 1;
    s->tables.resize(limits_.kv_windows.size());
    return s;
  }

  // The next chunk of `s`, of at most `budget` tokens (taken from it), on blocks below 20.
  SeqChunk chunk_of(Draw& d, Seq& s, int& budget) {
    const auto block = [&] { return d.in(0, 19); };
    std::vector<int32_t>& one = s.tables[d.index(s.tables.size())];
    switch (d.in(0, 19)) {
      case 0:  // swapped in
        for (auto& table : s.tables)
          for (int32_t& b : table)
            if (b != kReleasedBlock) b = block();
        break;
      case 1: if (!one.empty()) one.back() = block(); break;  // copy-on-write in one group
      case 2:                                                 // recomputed
        s.computed = 0;
        for (auto& table : s.tables) table.clear();
        break;
    }
    const int remaining = length(s) - s.computed;
    const int n = std::min({remaining, budget, d.coin() ? remaining : d.in(1, remaining)});
    budget -= n;
    SeqChunk c;
    c.seq = s.id;
    std::vector<TokenId> all = s.prompt;
    all.insert(all.end(), s.output.begin(), s.output.end());
    c.tokens.assign(all.begin() + s.computed, all.begin() + s.computed + n);
    c.start_pos = s.computed;
    // Prompt logprobs as the scheduler asks them: the chunk's positions below the prompt's last.
    const int prompt_end = static_cast<int>(s.prompt.size()) - 1;
    if (s.params.prompt_logprobs && c.start_pos < prompt_end) {
      c.prompt_logprobs.count = std::min(c.start_pos + n, prompt_end) - c.start_pos;
      c.prompt_logprobs.num_top = *s.params.prompt_logprobs;
      if (c.start_pos + n <= prompt_end) c.prompt_logprobs.next_token = s.prompt[c.start_pos + n];
    }
    s.computed += n;
    // A decoding sequence's chunk may carry drafts (speculative decoding): tokens past its own, whose slots the
    // table covers and a later chunk writes again.
    int drafts = 0;
    if (s.computed == length(s) && !s.output.empty() && n == 1 && d.in(0, 2) == 0)
      drafts = std::min({d.in(1, 4), budget, limits_.max_model_len - s.computed});
    for (int k = 0; k < drafts; ++k) c.tokens.push_back(d.in(0, limits_.vocab_size - 1));
    c.num_drafts = std::max(0, drafts);
    budget -= c.num_drafts;
    // Each KV group's table grows; a sliding group's blocks before the chunk's window are released, as the cache
    // manager releases them.
    for (size_t g = 0; g < s.tables.size(); ++g) {
      std::vector<int32_t>& table = s.tables[g];
      while (static_cast<int>(table.size()) * limits_.block_size < s.computed + c.num_drafts) table.push_back(block());
      for (int b = 0; b < first_window_block(c.start_pos, limits_.kv_windows[g], limits_.block_size); ++b)
        table[b] = kReleasedBlock;
    }
    c.block_table = s.tables[0];
    c.group_tables.assign(s.tables.begin() + 1, s.tables.end());
    if (s.computed == length(s)) {
      const int samples = s.output.empty() ? s.width : 1;
      for (int k = 0; k < samples; ++k)
        c.samples.push_back({.params = &s.params, .seed = s.id * 1000 + static_cast<uint64_t>(k),
                             .prompt = &s.prompt, .output = &s.output, .stop_ids = &s.stop_ids,
                             .num_logprobs = s.params.logprobs.value_or(0),
                             .num_candidates = c.num_drafts > 0 ? 1 : d.pick<int>({1, 1, 3})});
      s.sampled = true;
    }
    return c;
  }

  StepLimits limits_;
  std::vector<std::unique_ptr<Seq>> live_;
  std::vector<SeqId> ended_;
  SeqId next_id_ = 100;
};

// A value just inside or outside some limit, or anywhere.
int32_t edge_int(Draw& d, const StepLimits& limits) {
  return d.pick<int32_t>({-1, 0, 1, 15, 16, 17, limits.vocab_size - 1, limits.vocab_size, limits.num_blocks - 1,
                          limits.num_blocks, limits.num_swap_blocks, limits.max_model_len - 1, limits.max_model_len,
                          9000, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(),
                          static_cast<int32_t>(d.bits())});
}

// `x` moved by -2 to 2, kept within int32_t (a field at an edge already stays there).
int32_t nudged(Draw& d, int32_t x) {
  return static_cast<int32_t>(std::clamp<int64_t>(int64_t{x} + d.in(-2, 2), std::numeric_limits<int32_t>::min(),
                                                  std::numeric_limits<int32_t>::max()));
}

float edge_float(Draw& d) {
  return d.pick<float>({std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity(), 0.0f, -0.0f,
                        std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                        std::numeric_limits<float>::max(), -1.0f, 0.5f, 1.0f, 2.0f, 10.5f, 100.0f, 101.0f});
}

// One random change to one field of `w` (at least one chunk).
void mutate_field(Draw& d, WireStep& w, const StepLimits& limits) {
  WireChunk& c = w.seqs[d.index(w.seqs.size())];
  const auto any_of = [&](std::vector<TokenId>& ids) {
    if (ids.empty())
      ids.push_back(edge_int(d, limits));
    else
      ids[d.index(ids.size())] = edge_int(d, limits);
  };
  WireSample* s = c.samples.empty() ? nullptr : &c.samples[d.index(c.samples.size())];
  SamplingParams* p = c.context ? &c.context->params : nullptr;
  // A KV group's table delta, for a model of several (else one that the decoder must refuse).
  const auto group = [&]() -> size_t {
    if (c.group_keeps.empty()) {
      c.group_keeps.push_back(0);
      c.group_tails.emplace_back();
    }
    return d.index(c.group_keeps.size());
  };
  switch (d.in(0, 29)) {
    case 0: any_of(c.tokens); break;
    case 1: c.start_pos = edge_int(d, limits); break;
    case 2: any_of(c.table_tail); break;
    case 3: c.table_tail.push_back(d.coin() ? edge_int(d, limits) : d.in(0, limits.num_blocks - 1)); break;
    case 4: if (!c.table_tail.empty()) c.table_tail.pop_back(); break;
    case 5: c.tokens.resize(static_cast<size_t>(d.in(0, 80)), 1); break;
    case 6: c.seq = w.seqs[0].seq; break;
    case 7: w.seqs.push_back(c); break;
    case 8:
      if (!w.copies.empty())
        (d.coin() ? w.copies[0].first : w.copies[0].second) = edge_int(d, limits);
      else
        w.copies.emplace_back(edge_int(d, limits), edge_int(d, limits));
      break;
    case 9:
      w.copies.emplace_back(d.in(0, limits.num_blocks - 1), d.in(0, limits.num_blocks - 1));  // maybe a chain or twice
      break;
    case 10:
      if (p) {
        float* fields[] = {&p->temperature, &p->top_p, &p->min_p, &p->repetition_penalty, &p->presence_penalty,
                           &p->frequency_penalty};
        *fields[d.in(0, 5)] = edge_float(d);
      }
      break;
    case 11:
      if (p) {
        int* fields[] = {&p->top_k, &p->min_tokens, &p->max_tokens, &p->n, &p->best_of};
        *fields[d.in(0, 4)] = edge_int(d, limits);
      }
      break;
    case 12:
      if (p) p->logit_bias[d.coin() ? edge_int(d, limits) : 3] = d.coin() ? edge_float(d) : 1.0f;
      break;
    case 13:
      if (s) (d.coin() ? s->num_logprobs : s->num_candidates) = d.coin() ? edge_int(d, limits) : d.in(-2, 300);
      break;
    case 14:
      if (c.context && d.coin())
        any_of(d.coin() ? c.context->prompt : c.context->stop_ids);
      else
        any_of(c.output_tail);
      break;
    case 15: c.output_tail.resize(static_cast<size_t>(d.in(0, 2 * limits.max_model_len)), 4); break;
    case 16:
      if (p) {
        p->use_beam_search = d.coin();
        p->stop.push_back(d.pick<std::string>({"", "\xff", "end"}));
        p->logprobs = d.coin() ? std::optional<int>(edge_int(d, limits)) : std::nullopt;
      }
      break;
    case 17:
      if (s) {
        const WireSample copy = *s;
        c.samples.resize(static_cast<size_t>(d.in(0, kMaxSamplesPerChunk + 2)), copy);
      }
      break;
    case 18: c.table_keep = d.coin() ? edge_int(d, limits) : nudged(d, c.table_keep); break;
    case 19: c.output_keep = d.coin() ? edge_int(d, limits) : nudged(d, c.output_keep); break;
    case 20:  // the context dropped, or sent again (maybe where it has no place)
      if (c.context)
        c.context.reset();
      else
        c.context = WireContext{.params = valid_params(d, limits), .prompt = {1, 2, 3}, .stop_ids = {2}};
      break;
    case 21: w.finished.push_back(d.coin() ? w.seqs[d.index(w.seqs.size())].seq : d.bits() % 200); break;
    case 22: c.seq = d.coin() ? static_cast<SeqId>(d.in(90, 130)) : d.bits(); break;  // another, maybe unknown
    case 23:
      if (c.samples.empty())
        c.samples.emplace_back();
      else
        c.samples.clear();
      break;
    case 24: {
      int* fields[] = {&c.prompt_logprobs.count, &c.prompt_logprobs.num_top, &c.prompt_logprobs.next_token};
      *fields[d.in(0, 2)] = d.coin() ? edge_int(d, limits) : d.in(-2, 30);
      break;
    }
    case 25: any_of(c.group_tails[group()]); break;
    case 26: {
      const size_t g = group();
      c.group_keeps[g] = d.coin() ? edge_int(d, limits) : nudged(d, c.group_keeps[g]);
      break;
    }
    case 27:  // a group's delta more or fewer
      if (d.coin() && !c.group_keeps.empty()) {
        c.group_keeps.pop_back();
        c.group_tails.pop_back();
      } else {
        c.group_keeps.push_back(d.in(0, 3));
        c.group_tails.push_back({d.in(-1, limits.num_blocks)});
      }
      break;
    case 28: c.num_drafts = d.coin() ? edge_int(d, limits) : d.in(-1, 5); break;
    case 29: c.lora = d.coin() ? edge_int(d, limits) : d.in(-1, 2); break;  // a worker takes none
  }
}

// One random change to packed bytes: bits flipped (4 in 10), a byte set to an edge value (3 in 10), the tail cut, a
// run repeated or random bytes put in (1 in 10 each: a packing of another length rarely unpacks).
void mutate_bytes(Draw& d, std::string& bytes) {
  const auto at = [&] { return d.index(bytes.size()); };
  const int kind = d.in(0, 9);
  switch (kind < 4 ? 0 : kind < 7 ? 1 : kind - 5) {
    case 0:
      for (int i = d.in(1, 4); i > 0; --i) bytes[at()] ^= static_cast<char>(1 << d.in(0, 7));
      break;
    case 1: bytes[at()] = d.pick<char>({'\0', '\x01', '\x7f', '\x80', '\xff'}); break;
    case 2: bytes.resize(at()); break;
    case 3: {
      const size_t from = at(), n = std::min<size_t>(static_cast<size_t>(d.in(1, 16)), bytes.size() - from);
      const std::string run = bytes.substr(from, n);
      bytes.insert(at(), run);
      break;
    }
    case 4:
      for (int i = d.in(1, 8); i > 0; --i) bytes.insert(at(), 1, static_cast<char>(d.bits()));
      break;
  }
}

// Counts of what the fuzzer fed where.
struct Tally {
  int undecodable = 0, refused = 0, executed = 0;
};

// What the decoder made of a step: refused (nothing changed), or taken; a taken step ran (its result) unless, as a
// worker does, the executor refused a deferred token that the step before did not sample.
struct Taken {
  bool taken = false;
  std::optional<StepResult> result;
};

// Decodes `wire` and, when the decoder takes it, fills its deferred tokens from the step before (`deferred`, as the
// worker's executor) and executes it: it must run without throwing, and return one entry per chunk that samples,
// each with the tokens asked for, all in the vocabulary.
Taken decode_and_execute(WireDecoder& decoder, DeferredTokens& deferred, const WireStep& wire, const StepLimits& limits,
                         CpuModelRunner& runner, Tally& tally) {
  auto decoded = decoder.decode(wire);
  if (std::holds_alternative<FieldError>(decoded)) {
    ++tally.refused;
    return {};
  }
  StepBatch& step = std::get<StepBatch>(decoded);
  const bool unresolved = deferred.resolve(step).has_value();
  deferred.remember({});
  if (unresolved) {
    ++tally.refused;
    return {.taken = true};
  }
  ++tally.executed;
  StepResult r;
  REQUIRE_NOTHROW(r = runner.execute(step));
  deferred.remember(r);
  size_t i = 0;
  for (const SeqChunk& c : step.seqs) {
    if (c.samples.empty()) continue;
    REQUIRE(i < r.seqs.size());
    CHECK(r.seqs[i] == c.seq);
    REQUIRE(r.samples[i].size() == samples_answered(c));
    for (size_t k = 0; k < samples_answered(c); ++k) {
      const auto& candidates = r.samples[i][k];
      const SampleSpec& spec = c.samples[c.num_drafts > 0 ? 0 : k];
      CHECK(candidates.size() == static_cast<size_t>(std::min(spec.num_candidates, limits.vocab_size)));
      for (const SampledToken& t : candidates) {
        CHECK(t.token >= 0);
        CHECK(t.token < limits.vocab_size);
        CHECK(t.top_logprobs.size() == static_cast<size_t>(spec.num_logprobs));
      }
    }
    ++i;
  }
  CHECK(i == r.seqs.size());
  size_t scored = 0;
  for (const SeqChunk& c : step.seqs) {
    if (c.prompt_logprobs.count <= 0) continue;
    REQUIRE(scored < r.prompt_logprobs.size());
    const ChunkPromptLogprobs& p = r.prompt_logprobs[scored++];
    CHECK(p.seq == c.seq);
    REQUIRE(p.tokens.size() == static_cast<size_t>(c.prompt_logprobs.count));
    for (const PromptLogprob& t : p.tokens) {
      CHECK(t.rank >= 1);
      CHECK(t.rank <= limits.vocab_size);
      CHECK(t.top_logprobs.size() == static_cast<size_t>(std::min(c.prompt_logprobs.num_top, limits.vocab_size)));
    }
  }
  CHECK(scored == r.prompt_logprobs.size());
  CHECK_FALSE(check_result(r, step, limits.vocab_size).has_value());
  return {.taken = true, .result = std::move(r)};
}

}  // namespace

TEST_CASE("mutated delta steps and swap orders: the decoder never crashes, and what it takes is safe to run",
          "[remote][fuzz]") {
  // stories260K; the same with every layer sliding over 24 positions: its steps carry released table entries
  // (kReleasedBlock) before their window, which the decoder takes only there and the runner must never read; and
  // with layers 0, 1 and 3 sliding: three KV groups, a table each (the full layers' and two sliding ones).
  const std::vector<int> windows = GENERATE(std::vector<int>{0}, std::vector<int>{24}, std::vector<int>{0, 24, 24});
  const int window = windows.back();
  INFO("KV groups " << windows.size() << ", window " << window);
  std::optional<TempDir> sliding;
  std::string model = kModel;
  if (window > 0) {
    sliding.emplace("paged_fuzz_sliding_");
    std::vector<std::string> layer_types;
    if (windows.size() > 1)
      layer_types = {"sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                     "full_attention"};
    write_sliding_stories(sliding->path(), window, layer_types);
    model = sliding->path().string();
  }
  const ModelConfig cfg = load_model_config(model);
  REQUIRE(kv_groups_of(cfg).windows == windows);
  const SafeTensors weights(model);
  StepLimits limits = fuzz_limits(cfg.vocab_size);
  limits.kv_windows = windows;
  CpuModelRunner runner(cfg, weights,
                        {.block_size = limits.block_size, .num_blocks = limits.num_blocks,
                         .num_swap_blocks = limits.num_swap_blocks});
  {  // Every slot of both pools written once, so that whatever a step reads was written.
    StepBatch fill;
    SeqChunk& c = fill.seqs.emplace_back();
    c.tokens.assign(static_cast<size_t>(limits.num_blocks * limits.block_size), 7);
    for (int b = 0; b < limits.num_blocks; ++b) c.block_table.push_back(b);
    c.group_tables.assign(windows.size() - 1, c.block_table);
    runner.execute(fill);
    std::vector<BlockPair> all;
    for (int b = 0; b < limits.num_swap_blocks; ++b) all.emplace_back(b, b);
    runner.swap_out(all);
  }

  // One head and one long-lived worker decoder. Each step of the source goes out mutated, field by field or byte by
  // byte (in turn). When the decoder refuses it, nothing may have changed: the step as sent must decode to the step
  // the source made. When it takes it, the decoder holds what the mutation made of those sequences, and the encoder
  // starts afresh, so that its next steps send every sequence whole.
  Draw d(20240611 + window + windows.size());
  StepSource source(limits);
  WireEncoder encoder;
  WireDecoder decoder(limits);
  DeferredTokens deferred;
  Tally fields, bytes;
  std::vector<std::string> results;  // packed, for the result half
  for (int i = 0; i < kMutatedSteps; ++i) {
    const StepBatch step = source.next(d);
    REQUIRE_FALSE(check_step(step, limits));
    const WireStep sent = encoder.encode(step);
    Taken taken;
    if (i % 2 == 0) {
      WireStep mutated = sent;
      for (int m = d.in(1, 3); m > 0; --m) mutate_field(d, mutated, limits);
      taken = decode_and_execute(decoder, deferred, mutated, limits, runner, fields);
    } else {
      std::string packed = pack_step(sent);
      for (int m = d.in(1, 3); m > 0 && !packed.empty(); --m) mutate_bytes(d, packed);
      auto received = unpack_step(packed);
      if (const auto* w = std::get_if<WireStep>(&received)) {
        CHECK(pack_step(*w) == packed);
        taken = decode_and_execute(decoder, deferred, *w, limits, runner, bytes);
      } else {
        ++bytes.undecodable;
      }
    }
    if (taken.taken) {
      if (taken.result && results.size() < 500) results.push_back(pack_result(*taken.result));
      encoder.reset();
      continue;
    }
    auto again = decoder.decode(sent);
    if (const auto* e = std::get_if<FieldError>(&again)) FAIL("step " << i << " as sent refused: " << e->describe());
    require_same_step(std::get<StepBatch>(again), step);
  }
  INFO("field mutations: " << fields.refused << " refused, " << fields.executed << " executed; byte mutations: "
                           << bytes.undecodable << " undecodable, " << bytes.refused << " refused, "
                           << bytes.executed << " executed; " << decoder.num_sequences() << " sequences held");
  // Each way in reaches both outcomes, often.
  CHECK(fields.refused > kMutatedSteps / 10);
  CHECK(fields.executed > kMutatedSteps / 10);
  CHECK(bytes.undecodable > kMutatedSteps / 50);
  CHECK(bytes.refused > kMutatedSteps / 50);
  CHECK(bytes.executed > kMutatedSteps / 50);

  // The results, mutated on their way back: unpack_result refuses them or unpacks what the bytes say.
  REQUIRE(results.size() > 100);
  int results_unpacked = 0;
  for (int i = 0; i < kMutatedResults; ++i) {
    std::string packed = results[d.index(results.size())];
    for (int m = d.in(1, 3); m > 0 && !packed.empty(); --m) mutate_bytes(d, packed);
    auto back = unpack_result(packed);
    if (const auto* r = std::get_if<StepResult>(&back)) {
      ++results_unpacked;
      CHECK(pack_result(*r) == packed);
    }
  }
  INFO(results_unpacked << " of " << kMutatedResults << " mutated results unpacked");
  CHECK(results_unpacked > kMutatedResults / 50);
  CHECK(kMutatedResults - results_unpacked > kMutatedResults / 10);

  int swaps_executed = 0;
  for (int i = 0; i < kSwapOrders; ++i) {
    const PairOrder order = d.coin() ? PairOrder::swap_out : PairOrder::swap_in;
    std::vector<BlockPair> pairs;
    for (int n = d.in(0, 4); n > 0; --n)
      pairs.emplace_back(d.coin() ? edge_int(d, limits) : d.in(0, 8), d.coin() ? edge_int(d, limits) : d.in(0, 8));
    if (check_block_pairs(pairs, order, limits.num_blocks, limits.num_swap_blocks)) continue;
    ++swaps_executed;
    REQUIRE_NOTHROW(order == PairOrder::swap_out ? runner.swap_out(pairs) : runner.swap_in(pairs));
  }
  CHECK(swaps_executed > kSwapOrders / 20);
}
