#include "model/step_check.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "model/speculative/ngram.h"

namespace paged {

namespace {

// Field names are built only for the error returned: the checks of a good step allocate nothing but two sorted id
// lists.

std::optional<FieldError> bad(std::string field, std::string message) {
  return FieldError{std::move(field), std::move(message)};
}

// `e` with its field put under `prefix` ("seqs[2]" + ".tokens[0]").
std::optional<FieldError> under(const std::string& prefix, std::optional<FieldError> e) {
  e->field = prefix + e->field;
  return e;
}

std::string indexed(const std::string& field, size_t i) { return field + "[" + std::to_string(i) + "]"; }

// "[0, n)".
std::string range(int n) { return "[0, " + std::to_string(n) + ")"; }

// The first id of `ids` (null: none) outside the vocabulary, as "[i]".
std::optional<FieldError> check_ids_if_any(const std::vector<TokenId>* ids, int vocab) {
  return ids ? check_token_ids(*ids, vocab) : std::nullopt;
}

// Fields as ".num_logprobs", ".params.top_p", ...
std::optional<FieldError> check_sample(const SampleSpec& s, const StepLimits& limits, HistoryCheck history) {
  if (!s.params) return bad(".params", "a sample needs its sampling parameters");
  if (auto e = check_sampling_params(*s.params, limits.vocab_size)) return under(".params.", std::move(e));
  if (s.num_logprobs < 0 || s.num_logprobs > kMaxLogprobs)
    return bad(".num_logprobs", "num_logprobs must be in [0, " + std::to_string(kMaxLogprobs) + "]");
  if (s.num_candidates < 1 || s.num_candidates > kMaxCandidates)
    return bad(".num_candidates", "num_candidates must be in [1, " + std::to_string(kMaxCandidates) + "]");
  if (history == HistoryCheck::full) {
    if (auto e = check_ids_if_any(s.prompt, limits.vocab_size)) return under(".prompt", std::move(e));
    if (auto e = check_ids_if_any(s.output, limits.vocab_size)) return under(".output", std::move(e));
    if (auto e = check_ids_if_any(s.stop_ids, limits.vocab_size)) return under(".stop_ids", std::move(e));
  }
  if (s.pending_output < -1 || s.pending_output >= limits.vocab_size)
    return bad(".pending_output", "pending_output " + std::to_string(s.pending_output) + " is outside " +
                                      range(limits.vocab_size) + " (or -1: none)");
  const size_t length = (s.prompt ? s.prompt->size() : 0) + generated_count(s);
  if (length > static_cast<size_t>(limits.max_model_len))
    return bad(".output", "a history of " + std::to_string(length) + " tokens exceeds max_model_len " +
                              std::to_string(limits.max_model_len));
  return std::nullopt;
}

// The first entry of a group's table outside the device pool, but for released entries before the group's window.
std::optional<FieldError> check_table_entries(const std::vector<int32_t>& table, int start_pos, int num_blocks,
                                              int block_size, int window) {
  const auto first_read = static_cast<size_t>(first_window_block(start_pos, window, block_size));
  for (size_t b = 0; b < table.size(); ++b) {
    if (b < first_read && table[b] == kReleasedBlock) continue;  // before every window of the group's layers
    if (table[b] < 0 || table[b] >= num_blocks)
      return FieldError{indexed("", b), "block " + std::to_string(table[b]) + " is outside the device pool " +
                                            range(num_blocks)};
  }
  return std::nullopt;
}

}  // namespace

std::optional<FieldError> check_chunk_tables(const SeqChunk& c, std::span<const int> windows, int num_blocks,
                                             int block_size, int64_t max_blocks) {
  if (c.group_tables.size() + 1 != windows.size())
    return bad(".group_tables", std::to_string(c.group_tables.size() + 1) + " block tables for a model of " +
                                    std::to_string(windows.size()) + " KV groups");
  const int64_t end = int64_t{c.start_pos} + static_cast<int64_t>(c.tokens.size());
  const int64_t needed = (end + block_size - 1) / block_size;
  for (size_t g = 0; g < windows.size(); ++g) {
    const std::string field = g == 0 ? ".block_table" : indexed(".group_tables", g - 1);
    const std::vector<int32_t>& table = table_of(c, static_cast<int>(g));
    const auto blocks = static_cast<int64_t>(table.size());
    if (blocks < needed)
      return bad(field, std::to_string(blocks) + " blocks do not reach position " + std::to_string(end - 1) + " (" +
                            std::to_string(needed) + " needed)");
    if (max_blocks > 0 && blocks > max_blocks)
      return bad(field, std::to_string(blocks) + " blocks, more than the " + std::to_string(max_blocks) +
                            " of a sequence of max_model_len tokens");
    if (auto e = check_table_entries(table, c.start_pos, num_blocks, block_size, windows[g]))
      return under(field, std::move(e));
  }
  return std::nullopt;
}

namespace {

// Fields as ".tokens[3]", ".block_table", ...
std::optional<FieldError> check_chunk(const SeqChunk& c, const StepLimits& limits, HistoryCheck history) {
  if (c.tokens.empty()) return bad(".tokens", "a chunk computes at least one token");
  // A deferred last token is not the sender's to give: the executor fills it in from its own last samples.
  const std::span<const TokenId> given(c.tokens.data(), c.tokens.size() - (c.last_token_deferred ? 1 : 0));
  if (auto e = check_token_ids(given, limits.vocab_size)) return under(".tokens", std::move(e));
  if (c.start_pos < 0) return bad(".start_pos", "start_pos " + std::to_string(c.start_pos) + " is negative");
  const int64_t end = int64_t{c.start_pos} + static_cast<int64_t>(c.tokens.size());
  if (end > limits.max_model_len)
    return bad(".start_pos", "the chunk writes up to position " + std::to_string(end - 1) +
                                 ", beyond max_model_len " + std::to_string(limits.max_model_len));
  const int64_t most = (int64_t{limits.max_model_len} + limits.block_size - 1) / limits.block_size;
  if (auto e = check_chunk_tables(c, limits.kv_windows, limits.num_blocks, limits.block_size, most)) return e;
  if (c.samples.size() > static_cast<size_t>(kMaxSamplesPerChunk))
    return bad(".samples", std::to_string(c.samples.size()) + " samples, more than the " +
                               std::to_string(kMaxSamplesPerChunk) + " a chunk draws at most");
  for (size_t k = 0; k < c.samples.size(); ++k)
    if (auto e = check_sample(c.samples[k], limits, history)) return under(indexed(".samples", k), std::move(e));
  if (c.num_drafts != 0) {
    if (c.num_drafts < 0 || c.num_drafts > kMaxSpeculativeTokens || static_cast<size_t>(c.num_drafts) >= c.tokens.size())
      return bad(".num_drafts", std::to_string(c.num_drafts) + " drafts: in [0, " +
                                    std::to_string(kMaxSpeculativeTokens) + "] and fewer than the chunk's tokens");
    if (c.samples.size() != 1 || c.samples[0].num_candidates != 1 || c.last_token_deferred ||
        c.prompt_logprobs.count != 0)
      return bad(".num_drafts", "a chunk with drafts samples once, one candidate, with no deferred token and no "
                                "prompt logprobs");
  }
  if (c.lora < 0 || c.lora > limits.num_loras)
    return bad(".lora", "LoRA adapter " + std::to_string(c.lora) + ": the runner holds " +
                            std::to_string(limits.num_loras) + " (ids 1 to that; 0: none)");
  const PromptLogprobsSpec& scored = c.prompt_logprobs;
  if (scored.count < 0 || static_cast<size_t>(scored.count) > c.tokens.size())
    return bad(".prompt_logprobs.count", "count " + std::to_string(scored.count) + " is outside [0, " +
                                             std::to_string(c.tokens.size()) + "], the chunk's tokens");
  if (scored.num_top < 0 || scored.num_top > kMaxLogprobs)
    return bad(".prompt_logprobs.num_top", "num_top must be in [0, " + std::to_string(kMaxLogprobs) + "]");
  if (static_cast<size_t>(scored.count) == c.tokens.size() &&
      (scored.next_token < 0 || scored.next_token >= limits.vocab_size))
    return bad(".prompt_logprobs.next_token", "token " + std::to_string(scored.next_token) +
                                                  " is outside the vocabulary " + range(limits.vocab_size));
  return std::nullopt;
}

// The error of `scored`, a worker's prompt logprobs for chunk `c`, at `at` ("prompt_logprobs[i]"); nullopt when it
// answers the chunk: its sequence and first position, one entry per token scored, each the token asked, with a rank
// in [1, vocab_size] and at most num_top alternatives in the vocabulary.
std::optional<FieldError> check_prompt_logprobs(const ChunkPromptLogprobs& scored, const SeqChunk& c,
                                                const std::string& at, int vocab_size) {
  const PromptLogprobsSpec& want = c.prompt_logprobs;
  if (scored.seq != c.seq || scored.first_pos != c.start_pos + 1)
    return bad(at, "sequence " + std::to_string(scored.seq) + " from position " + std::to_string(scored.first_pos) +
                       " answered where " + std::to_string(c.seq) + " from " + std::to_string(c.start_pos + 1) +
                       " was scored");
  if (scored.tokens.size() != static_cast<size_t>(want.count))
    return bad(at + ".tokens", std::to_string(scored.tokens.size()) + " tokens answered, " +
                                   std::to_string(want.count) + " scored");
  for (size_t i = 0; i < scored.tokens.size(); ++i) {
    const PromptLogprob& t = scored.tokens[i];
    const std::string here = indexed(at + ".tokens", i);
    const TokenId asked = i + 1 < c.tokens.size() ? c.tokens[i + 1] : want.next_token;
    if (t.token != asked)
      return bad(here + ".token",
                 "token " + std::to_string(t.token) + " where " + std::to_string(asked) + " was scored");
    if (t.rank < 1 || t.rank > vocab_size)
      return bad(here + ".rank",
                 "rank " + std::to_string(t.rank) + " is outside [1, " + std::to_string(vocab_size) + "]");
    if (t.top_logprobs.size() > static_cast<size_t>(std::max(0, want.num_top)))
      return bad(here + ".top_logprobs", std::to_string(t.top_logprobs.size()) + " alternatives, " +
                                             std::to_string(want.num_top) + " asked");
    for (size_t j = 0; j < t.top_logprobs.size(); ++j)
      if (t.top_logprobs[j].first < 0 || t.top_logprobs[j].first >= vocab_size)
        return bad(indexed(here + ".top_logprobs", j),
                   "token " + std::to_string(t.top_logprobs[j].first) + " is outside the vocabulary");
  }
  return std::nullopt;
}

}  // namespace

std::optional<FieldError> check_token_ids(std::span<const TokenId> ids, int vocab_size) {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab_size)
      return bad(indexed("", i), "token " + std::to_string(ids[i]) + " is outside the vocabulary " + range(vocab_size));
  return std::nullopt;
}

std::optional<FieldError> check_block_pairs(const std::vector<BlockPair>& pairs, PairOrder order, int num_blocks,
                                            int num_swap_blocks) {
  const bool from_device = order != PairOrder::swap_in, to_device = order != PairOrder::swap_out;
  const char* list = order == PairOrder::copy_on_write ? "copies" : from_device ? "swap_out" : "swap_in";
  const auto outside = [&](int32_t block, bool device) {
    const int pool = device ? num_blocks : num_swap_blocks;
    return block < 0 || block >= pool;
  };
  const auto outside_error = [&](int32_t block, bool device, size_t i, const char* side) {
    return bad(indexed(list, i) + side, std::string(device ? "device block " : "swap block ") +
                                            std::to_string(block) + " is outside the " +
                                            (device ? "device pool " : "CPU swap pool ") +
                                            range(device ? num_blocks : num_swap_blocks));
  };
  for (size_t i = 0; i < pairs.size(); ++i) {
    if (outside(pairs[i].first, from_device)) return outside_error(pairs[i].first, from_device, i, ".first");
    if (outside(pairs[i].second, to_device)) return outside_error(pairs[i].second, to_device, i, ".second");
  }
  std::vector<int32_t> sources, destinations;
  for (const auto& [src, dst] : pairs) {
    sources.push_back(src);
    destinations.push_back(dst);
  }
  std::sort(sources.begin(), sources.end());
  std::sort(destinations.begin(), destinations.end());
  for (size_t i = 0; i < pairs.size(); ++i) {
    const int32_t dst = pairs[i].second;
    const auto [first, last] = std::equal_range(destinations.begin(), destinations.end(), dst);
    if (last - first > 1)
      return bad(indexed(list, i) + ".second", "block " + std::to_string(dst) + " is the destination of two pairs");
    if (order == PairOrder::copy_on_write && std::binary_search(sources.begin(), sources.end(), dst))
      return bad(indexed(list, i) + ".second",
                 "block " + std::to_string(dst) + " is both copied to and copied from in one step");
  }
  return std::nullopt;
}

std::optional<FieldError> check_step(const StepBatch& step, const StepLimits& limits, HistoryCheck history) {
  size_t tokens = 0;
  for (const SeqChunk& c : step.seqs) tokens += c.tokens.size();
  if (tokens > static_cast<size_t>(limits.max_num_batched_tokens))
    return bad("seqs", std::to_string(tokens) + " tokens, more than max_num_batched_tokens " +
                           std::to_string(limits.max_num_batched_tokens));
  std::vector<SeqId> ids;
  ids.reserve(step.seqs.size());
  for (const SeqChunk& c : step.seqs) ids.push_back(c.seq);
  std::sort(ids.begin(), ids.end());
  if (const auto twice = std::adjacent_find(ids.begin(), ids.end()); twice != ids.end())
    return bad("seqs", "sequence " + std::to_string(*twice) + " has two chunks in the step");
  for (size_t s = 0; s < step.seqs.size(); ++s)
    if (auto e = check_chunk(step.seqs[s], limits, history)) return under(indexed("seqs", s), std::move(e));
  return check_block_pairs(step.copies, PairOrder::copy_on_write, limits.num_blocks, limits.num_swap_blocks);
}

std::optional<FieldError> check_result(const StepResult& result, const StepBatch& step, int vocab_size) {
  std::vector<const SeqChunk*> sampled, scored;
  for (const SeqChunk& c : step.seqs) {
    if (!c.samples.empty()) sampled.push_back(&c);
    if (c.prompt_logprobs.count > 0) scored.push_back(&c);
  }
  if (result.prompt_logprobs.size() != scored.size())
    return FieldError{"prompt_logprobs", std::to_string(result.prompt_logprobs.size()) + " chunks answered, " +
                                             std::to_string(scored.size()) + " scored"};
  for (size_t i = 0; i < scored.size(); ++i)
    if (auto e = check_prompt_logprobs(result.prompt_logprobs[i], *scored[i], indexed("prompt_logprobs", i),
                                       vocab_size))
      return e;
  if (result.seqs.size() != sampled.size() || result.samples.size() != sampled.size())
    return FieldError{"seqs", std::to_string(result.seqs.size()) + " sequences answered, " +
                                  std::to_string(sampled.size()) + " sampled"};
  const auto in_vocab = [vocab_size](TokenId t) { return t >= 0 && t < vocab_size; };
  for (size_t i = 0; i < sampled.size(); ++i) {
    const SeqChunk& chunk = *sampled[i];
    const std::string at = "samples[" + std::to_string(i) + "]";
    if (result.seqs[i] != chunk.seq)
      return FieldError{"seqs[" + std::to_string(i) + "]", "sequence " + std::to_string(result.seqs[i]) +
                                                                " answered where " + std::to_string(chunk.seq) +
                                                                " was sampled"};
    if (result.samples[i].size() != samples_answered(chunk))
      return FieldError{at, std::to_string(result.samples[i].size()) + " samples answered, " +
                                std::to_string(samples_answered(chunk)) + " asked"};
    for (size_t k = 0; k < samples_answered(chunk); ++k) {
      const auto& candidates = result.samples[i][k];
      const SampleSpec& spec = chunk.samples[chunk.num_drafts > 0 ? 0 : k];
      const std::string here = at + "[" + std::to_string(k) + "]";
      if (candidates.empty() || candidates.size() > static_cast<size_t>(std::max(1, spec.num_candidates)))
        return FieldError{here, std::to_string(candidates.size()) + " candidates, at most " +
                                    std::to_string(spec.num_candidates) + " asked"};
      for (size_t c = 0; c < candidates.size(); ++c) {
        const SampledToken& t = candidates[c];
        const std::string token = here + "[" + std::to_string(c) + "]";
        if (!in_vocab(t.token))
          return FieldError{token + ".token", "token " + std::to_string(t.token) + " is outside the vocabulary"};
        if (t.top_logprobs.size() > static_cast<size_t>(std::max(0, spec.num_logprobs)))
          return FieldError{token + ".top_logprobs", std::to_string(t.top_logprobs.size()) + " alternatives, " +
                                                         std::to_string(spec.num_logprobs) + " asked"};
        for (size_t j = 0; j < t.top_logprobs.size(); ++j)
          if (!in_vocab(t.top_logprobs[j].first))
            return FieldError{token + ".top_logprobs[" + std::to_string(j) + "]",
                              "token " + std::to_string(t.top_logprobs[j].first) + " is outside the vocabulary"};
      }
    }
  }
  return std::nullopt;
}

}  // namespace paged
