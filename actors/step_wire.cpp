#include "actors/step_wire.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace paged {

namespace {

const std::vector<TokenId>& ids_or_none(const std::vector<TokenId>* ids) {
  static const std::vector<TokenId> none;
  return ids ? *ids : none;
}

bool same_ids(const std::vector<TokenId>* a, const std::vector<TokenId>* b) {
  return a == b || ids_or_none(a) == ids_or_none(b);
}

// Throws std::logic_error unless every sample of `c` reads the same context and output as its first.
void require_shared_inputs(const SeqChunk& c) {
  if (c.samples.empty()) return;
  const SampleSpec& first = c.samples.front();
  if (!first.params) throw std::logic_error("a sample of sequence " + std::to_string(c.seq) + " has no parameters");
  for (const SampleSpec& s : c.samples)
    if (!s.params || (s.params != first.params && *s.params != *first.params) || !same_ids(s.prompt, first.prompt) ||
        !same_ids(s.output, first.output) || !same_ids(s.stop_ids, first.stop_ids))
      throw std::logic_error("the samples of sequence " + std::to_string(c.seq) +
                             " differ in their parameters, prompt, output or stop ids");
}

// `now` as (keep, tail) against `held`, which becomes `now`: their common prefix kept. O(held + now).
void send_delta(std::vector<int32_t>& held, const std::vector<int32_t>& now, int32_t& keep,
                std::vector<int32_t>& tail) {
  const bool prefix = now.size() >= held.size() && std::equal(held.begin(), held.end(), now.begin());  // memcmp
  const size_t common =
      prefix ? held.size()
             : static_cast<size_t>(std::mismatch(held.begin(), held.end(), now.begin(), now.end()).first -
                                   held.begin());
  keep = static_cast<int32_t>(common);
  tail.assign(now.begin() + static_cast<std::ptrdiff_t>(common), now.end());
  held.resize(common);
  held.insert(held.end(), tail.begin(), tail.end());
}

// send_delta for output ids, which only grow (the contract at WireEncoder): O(new ids) when `held` is a prefix of
// `now` as far as its last id tells, else send_delta.
void send_output_delta(std::vector<TokenId>& held, const std::vector<TokenId>& now, int32_t& keep,
                       std::vector<TokenId>& tail) {
  const size_t n = held.size();
  if (now.size() < n || (n > 0 && held.back() != now[n - 1])) return send_delta(held, now, keep, tail);
  keep = static_cast<int32_t>(n);
  tail.assign(now.begin() + static_cast<std::ptrdiff_t>(n), now.end());
  held.insert(held.end(), tail.begin(), tail.end());
}

std::string seq_path(size_t i) { return "seqs[" + std::to_string(i) + "]"; }
std::string seq_field(size_t i, const char* member) { return seq_path(i) + "." + member; }

// The error of chunk `i`'s (keep, tail) delta of `what` ("blocks", "output ids") against the `held` entries of
// sequence `seq`, for a list of at most `most` entries; nullopt when it is good.
std::optional<FieldError> check_delta(size_t i, const char* keep_field, const char* tail_field, int32_t keep,
                                      size_t tail, size_t held, size_t most, const char* what, SeqId seq) {
  if (keep < 0) return FieldError{seq_field(i, keep_field), std::to_string(keep) + " is negative"};
  if (static_cast<size_t>(keep) > held)
    return FieldError{seq_field(i, keep_field), std::to_string(keep) + " exceeds the " + std::to_string(held) + " " +
                                                    what + " known for sequence " + std::to_string(seq)};
  if (static_cast<size_t>(keep) + tail > most)
    return FieldError{seq_field(i, tail_field), std::to_string(keep + tail) + " " + what + ", more than the " +
                                                    std::to_string(most) + " of a sequence of max_model_len tokens"};
  return std::nullopt;
}

}  // namespace

WireStep WireEncoder::encode(const StepBatch& batch) {
  for (const SeqChunk& c : batch.seqs) require_shared_inputs(c);
  WireStep w;
  w.copies = batch.copies;
  w.finished = batch.finished;
  for (SeqId id : batch.finished) sent_.erase(id);
  w.seqs.reserve(batch.seqs.size());
  for (const SeqChunk& c : batch.seqs) {
    Sent& sent = sent_[c.seq];
    WireChunk& wc = w.seqs.emplace_back();
    wc.seq = c.seq;
    wc.tokens = c.tokens;
    wc.last_token_deferred = c.last_token_deferred;
    wc.num_drafts = c.num_drafts;
    wc.lora = c.lora;
    wc.start_pos = c.start_pos;
    send_delta(sent.table, c.block_table, wc.table_keep, wc.table_tail);
    sent.group_tables.resize(c.group_tables.size());
    wc.group_keeps.resize(c.group_tables.size());
    wc.group_tails.resize(c.group_tables.size());
    for (size_t g = 0; g < c.group_tables.size(); ++g)
      send_delta(sent.group_tables[g], c.group_tables[g], wc.group_keeps[g], wc.group_tails[g]);
    wc.prompt_logprobs = c.prompt_logprobs;
    if (c.samples.empty()) continue;
    const SampleSpec& first = c.samples.front();
    if (!sent.context) {
      wc.context = WireContext{*first.params, ids_or_none(first.prompt), ids_or_none(first.stop_ids)};
      sent.context = true;
    }
    send_output_delta(sent.output, ids_or_none(first.output), wc.output_keep, wc.output_tail);
    wc.samples.reserve(c.samples.size());
    for (const SampleSpec& s : c.samples)
      wc.samples.push_back({.seed = s.seed, .num_logprobs = s.num_logprobs, .num_candidates = s.num_candidates});
  }
  return w;
}

void WireEncoder::reset() { sent_.clear(); }

namespace {

// How a list looked before a step changed it in place: its size, and the whole list when the step cut it.
struct ListBefore {
  size_t size = 0;
  std::optional<std::vector<int32_t>> whole;
};

// `held` as its first `keep` entries (keep <= its size), then `tail`; `before` learns what it was. O(tail) unless
// it cuts `held`, which is copied first (rare: a block copied on write, a swap-in, a recompute, an encoder reset).
void splice(std::vector<int32_t>& held, int32_t keep, const std::vector<int32_t>& tail, ListBefore& before) {
  before.size = held.size();
  if (static_cast<size_t>(keep) < held.size()) {
    before.whole = held;
    held.resize(static_cast<size_t>(keep));
  }
  held.insert(held.end(), tail.begin(), tail.end());
}

// `held` as it was before splice().
void restore(std::vector<int32_t>& held, ListBefore& before) {
  if (before.whole)
    held = std::move(*before.whole);
  else
    held.resize(before.size);
}

}  // namespace

struct WireDecoder::Change {
  SeqState* state = nullptr;
  ListBefore table, output;
  std::vector<ListBefore> group_tables;  // of the group tables held before the step
  size_t num_group_tables = 0;           // held before the step
  std::optional<std::shared_ptr<const WireContext>> context;  // set when the step replaced it
};

WireDecoder::WireDecoder(const StepLimits& limits, WireBounds bounds) : limits_(limits), bounds_(bounds) {}

namespace {

// What a sequence's context holds, in ids: its prompt and stop ids, and its parameters' lists and strings at 4 bytes
// an id (a structured output's schema, stop strings, bad words, ...), so that WireBounds::max_tokens bounds them
// all: a head cannot make a worker hold unbounded text through contexts.
size_t context_ids(const WireContext& c) {
  const SamplingParams& p = c.params;
  const StructuredOutput& so = p.structured;
  size_t bytes = so.spec.size() + so.field.size() + so.after.size() + (so.whitespace ? so.whitespace->size() : 0);
  for (const std::string& x : p.stop) bytes += x.size();
  for (const std::string& x : p.bad_words) bytes += x.size();
  size_t ids = c.prompt.size() + c.stop_ids.size() + p.stop_token_ids.size() + p.allowed_token_ids.size() +
               2 * p.logit_bias.size();
  for (const std::vector<TokenId>& word : p.bad_words_token_ids) ids += word.size();
  return ids + (bytes + sizeof(TokenId) - 1) / sizeof(TokenId);
}

}  // namespace

size_t WireDecoder::tokens_of(const SeqState& s) { return (s.context ? context_ids(*s.context) : 0) + s.output.size(); }

std::optional<FieldError> WireDecoder::check_chunk(size_t i, const WireChunk& wc, const SeqState* old,
                                                   size_t& tokens) const {
  const auto max_len = static_cast<size_t>(std::max(limits_.max_model_len, 0));
  const size_t max_blocks = limits_.block_size > 0 ? (max_len + limits_.block_size - 1) / limits_.block_size : 0;
  if (auto e = check_delta(i, "table_keep", "table_tail", wc.table_keep, wc.table_tail.size(),
                           old ? old->table.size() : 0, max_blocks, "blocks", wc.seq))
    return e;
  if (wc.group_keeps.size() != wc.group_tails.size() || wc.group_keeps.size() + 1 != limits_.kv_windows.size())
    return FieldError{seq_field(i, "group_keeps"), std::to_string(wc.group_keeps.size() + 1) + " block tables for a " +
                                                       "model of " + std::to_string(limits_.kv_windows.size()) +
                                                       " KV groups"};
  for (size_t g = 0; g < wc.group_keeps.size(); ++g) {
    const size_t held = old && g < old->group_tables.size() ? old->group_tables[g].size() : 0;
    if (auto e = check_delta(i, "group_keeps", "group_tails", wc.group_keeps[g], wc.group_tails[g].size(), held,
                             max_blocks, "blocks", wc.seq))
      return e;
  }
  const WireContext* context = wc.context ? &*wc.context : old ? old->context.get() : nullptr;
  size_t output = old ? old->output.size() : 0;
  if (wc.samples.empty()) {
    if (wc.context) return FieldError{seq_field(i, "context"), "a chunk without samples has no context"};
    if (wc.output_keep != 0 || !wc.output_tail.empty())
      return FieldError{seq_field(i, "output_tail"), "a chunk without samples has no output ids"};
  } else {
    if (wc.context) {
      if (wc.context->prompt.size() > max_len)
        return FieldError{seq_field(i, "context.prompt"), std::to_string(wc.context->prompt.size()) +
                                                              " ids, more than max_model_len " +
                                                              std::to_string(max_len)};
      if (auto e = check_token_ids(wc.context->prompt, limits_.vocab_size))
        return FieldError{seq_field(i, "context.prompt") + e->field, e->message};
      if (auto e = check_token_ids(wc.context->stop_ids, limits_.vocab_size))
        return FieldError{seq_field(i, "context.stop_ids") + e->field, e->message};
    } else if (!context) {
      return FieldError{seq_field(i, "samples"), "sequence " + std::to_string(wc.seq) +
                                                     " samples, but its context (parameters, prompt, stop ids) never "
                                                     "came"};
    }
    if (auto e = check_delta(i, "output_keep", "output_tail", wc.output_keep, wc.output_tail.size(), output, max_len,
                             "output ids", wc.seq))
      return e;
    if (auto e = check_token_ids(wc.output_tail, limits_.vocab_size))
      return FieldError{seq_field(i, "output_tail") + e->field, e->message};
    output = static_cast<size_t>(wc.output_keep) + wc.output_tail.size();
  }
  tokens = (context ? context_ids(*context) : 0) + output;
  return std::nullopt;
}

void WireDecoder::apply(WireChunk& wc, SeqState& state, Change& before) {
  before.state = &state;
  splice(state.table, wc.table_keep, wc.table_tail, before.table);
  before.num_group_tables = state.group_tables.size();
  state.group_tables.resize(std::max(state.group_tables.size(), wc.group_keeps.size()));
  before.group_tables.resize(wc.group_keeps.size());
  for (size_t g = 0; g < wc.group_keeps.size(); ++g)
    splice(state.group_tables[g], wc.group_keeps[g], wc.group_tails[g], before.group_tables[g]);
  before.output.size = state.output.size();
  if (wc.samples.empty()) return;
  if (wc.context) {
    before.context = std::move(state.context);
    state.context = std::make_shared<const WireContext>(std::move(*wc.context));
  }
  splice(state.output, wc.output_keep, wc.output_tail, before.output);
}

void WireDecoder::undo(Change& change) {
  SeqState& state = *change.state;
  restore(state.table, change.table);
  for (size_t g = 0; g < change.group_tables.size(); ++g) restore(state.group_tables[g], change.group_tables[g]);
  state.group_tables.resize(change.num_group_tables);
  restore(state.output, change.output);
  if (change.context) state.context = std::move(*change.context);
}

std::variant<StepBatch, FieldError> WireDecoder::decode(WireStep wire) {
  // Checked chunk by chunk, each applied in place once checked (a held sequence's change recorded, a new sequence
  // staged beside the state); a refusal puts every change back, in reverse order. Two chunks of one sequence are
  // applied one after the other, and check_step refuses them.
  std::vector<SeqId> finished = wire.finished;
  std::sort(finished.begin(), finished.end());
  finished.erase(std::unique(finished.begin(), finished.end()), finished.end());
  size_t num_seqs = seqs_.size(), num_tokens = num_tokens_;
  for (SeqId id : finished)
    if (const auto it = seqs_.find(id); it != seqs_.end()) {
      --num_seqs;
      num_tokens -= tokens_of(*it->second);
    }
  const auto held = [&](SeqId id) -> SeqState* {
    if (!finished.empty() && std::binary_search(finished.begin(), finished.end(), id)) return nullptr;
    const auto it = seqs_.find(id);
    return it == seqs_.end() ? nullptr : it->second.get();
  };
  StepBatch batch;
  batch.copies = std::move(wire.copies);
  batch.finished = std::move(wire.finished);
  batch.seqs.reserve(wire.seqs.size());
  std::vector<Change> changes;
  changes.reserve(wire.seqs.size());
  std::vector<std::pair<SeqId, std::unique_ptr<SeqState>>> fresh;
  const auto refuse = [&](FieldError e) {
    for (auto it = changes.rbegin(); it != changes.rend(); ++it) undo(*it);
    return e;
  };
  for (size_t i = 0; i < wire.seqs.size(); ++i) {
    WireChunk& wc = wire.seqs[i];
    SeqState* state = held(wc.seq);
    size_t tokens = 0;
    if (auto e = check_chunk(i, wc, state, tokens)) return refuse(std::move(*e));
    num_tokens = num_tokens - (state ? tokens_of(*state) : 0) + tokens;
    if (!state) ++num_seqs;
    if (num_seqs > bounds_.max_sequences)
      return refuse({seq_path(i), "sequence " + std::to_string(wc.seq) + " would be one more than the " +
                                      std::to_string(bounds_.max_sequences) + " sequences held at most"});
    if (num_tokens > bounds_.max_tokens)
      return refuse({seq_path(i), std::to_string(num_tokens) + " token ids would be held, more than the " +
                                      std::to_string(bounds_.max_tokens) + " held at most"});
    if (state) {
      apply(wc, *state, changes.emplace_back());
    } else {
      state = fresh.emplace_back(wc.seq, std::make_unique<SeqState>()).second.get();
      Change unused;  // a new sequence is dropped whole when the step is refused
      apply(wc, *state, unused);
    }
    SeqChunk& c = batch.seqs.emplace_back();
    c.seq = wc.seq;
    c.tokens = std::move(wc.tokens);
    c.last_token_deferred = wc.last_token_deferred;
    c.num_drafts = wc.num_drafts;
    c.lora = wc.lora;
    c.start_pos = wc.start_pos;
    c.block_table = state->table;
    c.group_tables = state->group_tables;
    c.prompt_logprobs = wc.prompt_logprobs;
    c.samples.reserve(wc.samples.size());
    for (const WireSample& s : wc.samples)
      c.samples.push_back({.params = &state->context->params, .seed = s.seed, .prompt = &state->context->prompt,
                           .output = &state->output, .stop_ids = &state->context->stop_ids,
                           .num_logprobs = s.num_logprobs, .num_candidates = s.num_candidates});
  }
  // What check_step refuses is refused before the state changes for good; the ids of every context and output
  // tail were checked above, as they came (the held ones when they came).
  if (auto e = check_step(batch, limits_, HistoryCheck::lengths_only)) return refuse(std::move(*e));
  for (SeqId id : finished) seqs_.erase(id);
  for (auto& [id, state] : fresh) seqs_.insert_or_assign(id, std::move(state));
  num_tokens_ = num_tokens;
  return batch;
}

void WireDecoder::reset() {
  seqs_.clear();
  num_tokens_ = 0;
}

// ---- the packed form --------------------------------------------------------------------------------------------

static_assert(std::endian::native == std::endian::little,
              "the packed form is little-endian and copied as the host holds it: a big-endian host must swap bytes");
static_assert(sizeof(int) == 4 && sizeof(float) == 4 && std::numeric_limits<float>::is_iec559,
              "ints travel as i32, floats as their IEEE-754 bits");

namespace {

// Bytes written, as the layout in step_wire.h says.
class Packer {
 public:
  explicit Packer(size_t expected) { bytes_.reserve(expected); }  // the bytes expected in all, to grow less

  template <class T>
  void put(T x) {
    static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>);
    char raw[sizeof(T)];
    std::memcpy(raw, &x, sizeof(T));
    bytes_.append(raw, sizeof(T));
  }
  void flag(bool x) { put<uint8_t>(x ? 1 : 0); }
  void count(size_t n) {
    if (n > std::numeric_limits<uint32_t>::max())
      throw std::length_error("a list of " + std::to_string(n) + " entries is too long to pack");
    put(static_cast<uint32_t>(n));
  }
  template <class T>
  void run(const std::vector<T>& xs) {
    static_assert(std::is_arithmetic_v<T>);
    count(xs.size());
    bytes_.append(reinterpret_cast<const char*>(xs.data()), xs.size() * sizeof(T));
  }
  void text(const std::string& s) {
    count(s.size());
    bytes_.append(s);
  }
  std::string take() { return std::move(bytes_); }

 private:
  std::string bytes_;
};

// Why bytes do not unpack; thrown by an Unpacker, caught by unpack_step and unpack_result only.
struct Malformed {
  FieldError error;
};

// Bytes read, each read bounded by the bytes left; a failing read throws Malformed, naming `field` (a string, or a
// callable that makes one: built only then).
class Unpacker {
 public:
  explicit Unpacker(std::string_view bytes) : bytes_(bytes) {}

  template <class T, class Field>
  T get(const Field& field) {
    static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>);
    if (left() < sizeof(T))
      fail(field, "the bytes end at " + std::to_string(bytes_.size()) + ", " + std::to_string(sizeof(T) - left()) +
                      " bytes short of the value at byte " + std::to_string(at_));
    T x;
    std::memcpy(&x, bytes_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return x;
  }
  template <class Field>
  bool flag(const Field& field) {
    const size_t at = at_;
    const auto b = get<uint8_t>(field);
    if (b > 1) fail(field, "byte " + std::to_string(b) + " at " + std::to_string(at) + " is no flag (0 or 1)");
    return b == 1;
  }
  // A list's count, of entries of at least `entry_bytes` bytes each: at most what the bytes left hold.
  template <class Field>
  size_t count(size_t entry_bytes, const Field& field) {
    const size_t at = at_;
    const size_t n = get<uint32_t>(field);
    if (n > left() / entry_bytes)
      fail(field, "a count of " + std::to_string(n) + " entries of " + std::to_string(entry_bytes) +
                      " bytes or more at byte " + std::to_string(at) + ", where " + std::to_string(left()) +
                      " bytes are left");
    return n;
  }
  template <class T, class Field>
  void run(std::vector<T>& xs, const Field& field) {
    static_assert(std::is_arithmetic_v<T>);
    const size_t n = count(sizeof(T), field);
    xs.resize(n);
    if (n > 0) std::memcpy(xs.data(), bytes_.data() + at_, n * sizeof(T));  // an empty list's data() may be null
    at_ += n * sizeof(T);
  }
  template <class Field>
  std::string text(const Field& field) {
    const size_t n = count(1, field);
    std::string s(bytes_.substr(at_, n));
    at_ += n;
    return s;
  }
  // Throws unless every byte was read.
  void end(const char* what) {
    if (left() > 0)
      fail("bytes", std::string("the ") + what + " ends at byte " + std::to_string(at_) + " of " +
                        std::to_string(bytes_.size()));
  }
  size_t offset() const { return at_; }

  template <class Field>
  [[noreturn]] void fail(const Field& field, std::string message) const {
    if constexpr (std::is_invocable_v<const Field&>)
      throw Malformed{{field(), std::move(message)}};
    else
      throw Malformed{{std::string(field), std::move(message)}};
  }

 private:
  size_t left() const { return bytes_.size() - at_; }

  std::string_view bytes_;
  size_t at_ = 0;
};

// Fewest bytes of a packed chunk (every list empty, no context, no prompt logprobs) and of a sample.
constexpr size_t kChunkBytes = 8 + 4 + 1 + 4 + 4 + 4 + 4 + 4 + 1 + 4 + 4 + 4 + 1;
constexpr size_t kSampleBytes = 8 + 4 + 4;
// Fewest bytes of a packed candidate (no alternatives), of a chunk's prompt logprobs (no tokens) and of a scored
// prompt token (no alternatives).
constexpr size_t kCandidateBytes = 4 + 4 + 4;
constexpr size_t kScoredChunkBytes = 8 + 4 + 4;
constexpr size_t kScoredTokenBytes = 4 + 4 + 4 + 4;

void pack_params(Packer& out, const SamplingParams& p) {
  // Does not compile once SamplingParams gains or loses a field (a size check missed one that fit the padding):
  // then pack it here, unpack it in unpack_params, set it in the round-trip test (tests/actors/test_step_pack.cpp)
  // and name it here.
  [[maybe_unused]] const auto& [n, best_of, use_beam_search, length_penalty, max_tokens, min_tokens, temperature, top_p, top_k, min_p,
                                seed, repetition_penalty, presence_penalty, frequency_penalty, logit_bias,
                                stop_token_ids, stop, allowed_token_ids, bad_words, bad_words_token_ids, ignore_eos, logprobs, prompt_logprobs,
                                skip_special_tokens, include_stop_str_in_output, structured, cache_salt, lora, priority] = p;
  out.put<int32_t>(p.n);
  out.put<int32_t>(p.best_of);
  out.flag(p.use_beam_search);
  out.put(p.length_penalty);
  out.put<int32_t>(p.max_tokens);
  out.put<int32_t>(p.min_tokens);
  out.put(p.temperature);
  out.put(p.top_p);
  out.put<int32_t>(p.top_k);
  out.put(p.min_p);
  out.flag(p.seed.has_value());
  if (p.seed) out.put<uint64_t>(*p.seed);
  out.put(p.repetition_penalty);
  out.put(p.presence_penalty);
  out.put(p.frequency_penalty);
  out.count(p.logit_bias.size());
  for (const auto& [token, bias] : p.logit_bias) {
    out.put<int32_t>(token);
    out.put(bias);
  }
  out.run(p.stop_token_ids);
  out.count(p.stop.size());
  for (const std::string& s : p.stop) out.text(s);
  out.run(p.allowed_token_ids);
  out.count(p.bad_words.size());
  for (const std::string& s : p.bad_words) out.text(s);
  out.count(p.bad_words_token_ids.size());
  for (const std::vector<TokenId>& word : p.bad_words_token_ids) out.run(word);
  out.flag(p.ignore_eos);
  out.flag(p.logprobs.has_value());
  if (p.logprobs) out.put<int32_t>(*p.logprobs);
  out.flag(p.prompt_logprobs.has_value());
  if (p.prompt_logprobs) out.put<int32_t>(*p.prompt_logprobs);
  out.flag(p.skip_special_tokens);
  out.flag(p.include_stop_str_in_output);
  out.put<int32_t>(static_cast<int32_t>(p.structured.kind));
  out.text(p.structured.spec);
  out.text(p.structured.field);
  out.text(p.structured.after);
  out.flag(p.structured.whitespace.has_value());
  if (p.structured.whitespace) out.text(*p.structured.whitespace);
  out.put<uint64_t>(p.cache_salt);
  out.put<int32_t>(p.lora);
  out.put<int32_t>(p.priority);
}

// `at(member)` names a field of the parameters (a callable that makes the name).
template <class At>
SamplingParams unpack_params(Unpacker& in, const At& at) {
  SamplingParams p;
  p.n = in.get<int32_t>(at("n"));
  p.best_of = in.get<int32_t>(at("best_of"));
  p.use_beam_search = in.flag(at("use_beam_search"));
  p.length_penalty = in.get<float>(at("length_penalty"));
  p.max_tokens = in.get<int32_t>(at("max_tokens"));
  p.min_tokens = in.get<int32_t>(at("min_tokens"));
  p.temperature = in.get<float>(at("temperature"));
  p.top_p = in.get<float>(at("top_p"));
  p.top_k = in.get<int32_t>(at("top_k"));
  p.min_p = in.get<float>(at("min_p"));
  if (in.flag(at("seed"))) p.seed = in.get<uint64_t>(at("seed"));
  p.repetition_penalty = in.get<float>(at("repetition_penalty"));
  p.presence_penalty = in.get<float>(at("presence_penalty"));
  p.frequency_penalty = in.get<float>(at("frequency_penalty"));
  const size_t biases = in.count(8, at("logit_bias"));
  for (size_t k = 0; k < biases; ++k) {
    const size_t offset = in.offset();
    const auto token = in.get<int32_t>(at("logit_bias"));
    const auto bias = in.get<float>(at("logit_bias"));
    if (!p.logit_bias.empty() && token <= p.logit_bias.rbegin()->first)
      in.fail([&] { return at("logit_bias")() + "[" + std::to_string(k) + "]"; },
              "token " + std::to_string(token) + " at byte " + std::to_string(offset) + " does not follow token " +
                  std::to_string(p.logit_bias.rbegin()->first) + " (the tokens come in ascending order, once each)");
    p.logit_bias.emplace_hint(p.logit_bias.end(), token, bias);
  }
  in.run(p.stop_token_ids, at("stop_token_ids"));
  const size_t stops = in.count(4, at("stop"));
  size_t stop_bytes = 0;
  for (size_t k = 0; k < stops; ++k) {
    const auto field = [&] { return at("stop")() + "[" + std::to_string(k) + "]"; };
    std::string& s = p.stop.emplace_back(in.text(field));
    stop_bytes += s.size();
    if (stop_bytes > kMaxStopBytes)
      in.fail(field, "the stop strings take more than the " + std::to_string(kMaxStopBytes) + " bytes allowed");
  }
  in.run(p.allowed_token_ids, at("allowed_token_ids"));
  const size_t bad_words = in.count(4, at("bad_words"));
  size_t bad_word_bytes = 0;
  for (size_t k = 0; k < bad_words; ++k) {
    const auto field = [&] { return at("bad_words")() + "[" + std::to_string(k) + "]"; };
    bad_word_bytes += p.bad_words.emplace_back(in.text(field)).size();
    if (bad_word_bytes > kMaxBadWordBytes)
      in.fail(field, "the bad words take more than the " + std::to_string(kMaxBadWordBytes) + " bytes allowed");
  }
  const size_t bad_word_ids = in.count(4, at("bad_words_token_ids"));
  for (size_t k = 0; k < bad_word_ids; ++k)
    in.run(p.bad_words_token_ids.emplace_back(),
           [&] { return at("bad_words_token_ids")() + "[" + std::to_string(k) + "]"; });
  p.ignore_eos = in.flag(at("ignore_eos"));
  if (in.flag(at("logprobs"))) p.logprobs = in.get<int32_t>(at("logprobs"));
  if (in.flag(at("prompt_logprobs"))) p.prompt_logprobs = in.get<int32_t>(at("prompt_logprobs"));
  p.skip_special_tokens = in.flag(at("skip_special_tokens"));
  p.include_stop_str_in_output = in.flag(at("include_stop_str_in_output"));
  const auto kind = in.get<int32_t>(at("structured.kind"));
  if (kind < 0 || kind > static_cast<int32_t>(StructuredOutput::Kind::structural_tag))
    in.fail(at("structured.kind"), "unknown structured output kind " + std::to_string(kind));
  p.structured.kind = static_cast<StructuredOutput::Kind>(kind);
  p.structured.spec = in.text(at("structured.spec"));
  if (!p.structured.spec.empty() &&
      (p.structured.kind == StructuredOutput::Kind::none || p.structured.kind == StructuredOutput::Kind::json_object))
    in.fail(at("structured.spec"), "a structured output of this kind has no spec");
  p.structured.field = in.text(at("structured.field"));
  p.structured.after = in.text(at("structured.after"));
  if (in.flag(at("structured.whitespace"))) p.structured.whitespace = in.text(at("structured.whitespace"));
  p.cache_salt = in.get<uint64_t>(at("cache_salt"));
  p.lora = in.get<int32_t>(at("lora"));
  p.priority = in.get<int32_t>(at("priority"));
  return p;
}

void pack_chunk(Packer& out, const WireChunk& c) {
  out.put<uint64_t>(c.seq);
  out.run(c.tokens);
  out.flag(c.last_token_deferred);
  out.put<int32_t>(c.num_drafts);
  out.put<int32_t>(c.start_pos);
  out.put<int32_t>(c.table_keep);
  out.run(c.table_tail);
  if (c.group_keeps.size() != c.group_tails.size())
    throw std::logic_error("a chunk's group tables differ in number of keeps and tails");
  out.count(c.group_keeps.size());
  for (size_t g = 0; g < c.group_keeps.size(); ++g) {
    out.put<int32_t>(c.group_keeps[g]);
    out.run(c.group_tails[g]);
  }
  out.flag(c.context.has_value());
  if (c.context) {
    pack_params(out, c.context->params);
    out.run(c.context->prompt);
    out.run(c.context->stop_ids);
  }
  out.put<int32_t>(c.output_keep);
  out.run(c.output_tail);
  out.count(c.samples.size());
  for (const WireSample& s : c.samples) {
    out.put<uint64_t>(s.seed);
    out.put<int32_t>(s.num_logprobs);
    out.put<int32_t>(s.num_candidates);
  }
  out.flag(c.prompt_logprobs.count > 0);
  if (c.prompt_logprobs.count > 0) {
    out.put<int32_t>(c.prompt_logprobs.count);
    out.put<int32_t>(c.prompt_logprobs.num_top);
    out.put<int32_t>(c.prompt_logprobs.next_token);
  }
  out.put<int32_t>(c.lora);
}

void unpack_chunk(Unpacker& in, size_t i, WireChunk& c) {
  const auto at = [i](const char* member) { return [i, member] { return seq_field(i, member); }; };
  c.seq = in.get<uint64_t>(at("seq"));
  in.run(c.tokens, at("tokens"));
  c.last_token_deferred = in.flag(at("last_token_deferred"));
  c.num_drafts = in.get<int32_t>(at("num_drafts"));
  c.start_pos = in.get<int32_t>(at("start_pos"));
  c.table_keep = in.get<int32_t>(at("table_keep"));
  in.run(c.table_tail, at("table_tail"));
  const size_t groups = in.count(8, at("group_keeps"));  // a keep and a tail's count each
  c.group_keeps.resize(groups);
  c.group_tails.resize(groups);
  for (size_t g = 0; g < groups; ++g) {
    c.group_keeps[g] = in.get<int32_t>(at("group_keeps"));
    in.run(c.group_tails[g], at("group_tails"));
  }
  if (in.flag(at("context"))) {
    const auto param = [i](const char* member) {
      return [i, member] { return seq_field(i, "context.params.") + member; };
    };
    WireContext& context = c.context.emplace();
    context.params = unpack_params(in, param);
    in.run(context.prompt, at("context.prompt"));
    in.run(context.stop_ids, at("context.stop_ids"));
  }
  c.output_keep = in.get<int32_t>(at("output_keep"));
  in.run(c.output_tail, at("output_tail"));
  c.samples.resize(in.count(kSampleBytes, at("samples")));
  for (WireSample& s : c.samples) {
    s.seed = in.get<uint64_t>(at("samples"));
    s.num_logprobs = in.get<int32_t>(at("samples"));
    s.num_candidates = in.get<int32_t>(at("samples"));
  }
  if (in.flag(at("prompt_logprobs"))) {
    c.prompt_logprobs.count = in.get<int32_t>(at("prompt_logprobs.count"));
    if (c.prompt_logprobs.count <= 0)  // the flag says there are some (pack_chunk writes none for a count of 0)
      in.fail(at("prompt_logprobs.count"),
              "prompt_logprobs count " + std::to_string(c.prompt_logprobs.count) + " after its flag (positive)");
    c.prompt_logprobs.num_top = in.get<int32_t>(at("prompt_logprobs.num_top"));
    c.prompt_logprobs.next_token = in.get<int32_t>(at("prompt_logprobs.next_token"));
  }
  c.lora = in.get<int32_t>(at("lora"));
}

}  // namespace

std::string pack_step(const WireStep& step) {
  size_t expected = 12 + 8 * (step.copies.size() + step.finished.size());
  for (const WireChunk& c : step.seqs)
    expected += kChunkBytes + 4 * (c.tokens.size() + c.table_tail.size() + c.output_tail.size()) +
                kSampleBytes * c.samples.size() + 12 + 8 * c.group_tails.size() +
                (c.context ? 128 + 4 * (c.context->prompt.size() + c.context->stop_ids.size()) : 0);
  Packer out(expected);
  out.count(step.seqs.size());
  for (const WireChunk& c : step.seqs) pack_chunk(out, c);
  out.count(step.copies.size());
  for (const auto& [src, dst] : step.copies) {
    out.put<int32_t>(src);
    out.put<int32_t>(dst);
  }
  out.run(step.finished);
  return out.take();
}

std::variant<WireStep, FieldError> unpack_step(std::string_view bytes) {
  try {
    Unpacker in(bytes);
    WireStep step;
    step.seqs.resize(in.count(kChunkBytes, "seqs"));
    for (size_t i = 0; i < step.seqs.size(); ++i) unpack_chunk(in, i, step.seqs[i]);
    step.copies.resize(in.count(8, "copies"));
    for (auto& [src, dst] : step.copies) {
      src = in.get<int32_t>("copies");
      dst = in.get<int32_t>("copies");
    }
    in.run(step.finished, "finished");
    in.end("step");
    return step;
  } catch (Malformed& m) {
    return std::move(m.error);
  }
}

std::string pack_result(const StepResult& result) {
  size_t expected = 12 + 8 * result.seqs.size();
  for (const auto& chunk : result.samples) {
    expected += 4;
    for (const auto& candidates : chunk)
      for (const SampledToken& t : candidates) expected += 4 + kCandidateBytes + 8 * t.top_logprobs.size();
  }
  for (const ChunkPromptLogprobs& chunk : result.prompt_logprobs) {
    expected += kScoredChunkBytes;
    for (const PromptLogprob& t : chunk.tokens) expected += kScoredTokenBytes + 8 * t.top_logprobs.size();
  }
  Packer out(expected + 28);
  out.run(result.seqs);
  out.count(result.samples.size());
  for (const auto& chunk : result.samples) {
    out.count(chunk.size());
    for (const auto& candidates : chunk) {
      out.count(candidates.size());
      for (const SampledToken& t : candidates) {
        out.put<int32_t>(t.token);
        out.put(t.logprob);
        out.count(t.top_logprobs.size());
        for (const auto& [token, logprob] : t.top_logprobs) {
          out.put<int32_t>(token);
          out.put(logprob);
        }
      }
    }
  }
  out.count(result.prompt_logprobs.size());
  for (const ChunkPromptLogprobs& chunk : result.prompt_logprobs) {
    out.put<uint64_t>(chunk.seq);
    out.put<int32_t>(chunk.first_pos);
    out.count(chunk.tokens.size());
    for (const PromptLogprob& t : chunk.tokens) {
      out.put<int32_t>(t.token);
      out.put(t.logprob);
      out.put<int32_t>(t.rank);
      out.count(t.top_logprobs.size());
      for (const auto& [token, logprob] : t.top_logprobs) {
        out.put<int32_t>(token);
        out.put(logprob);
      }
    }
  }
  out.put<int64_t>(result.cost.busy_us);
  out.put<int64_t>(result.cost.idle_before_us);
  out.put<int32_t>(result.cost.graphs_captured);
  out.put<int64_t>(result.cost.graph_capture_us);
  return out.take();
}

std::variant<StepResult, FieldError> unpack_result(std::string_view bytes) {
  try {
    Unpacker in(bytes);
    StepResult result;
    in.run(result.seqs, "seqs");
    result.samples.resize(in.count(4, "samples"));
    for (size_t c = 0; c < result.samples.size(); ++c) {
      const auto chunk = [c] { return "samples[" + std::to_string(c) + "]"; };
      result.samples[c].resize(in.count(4, chunk));
      for (size_t s = 0; s < result.samples[c].size(); ++s) {
        const auto sample = [&] { return chunk() + "[" + std::to_string(s) + "]"; };
        std::vector<SampledToken>& candidates = result.samples[c][s];
        candidates.resize(in.count(kCandidateBytes, sample));
        for (size_t k = 0; k < candidates.size(); ++k) {
          const auto candidate = [&](const char* member) {
            return [&, member] { return sample() + "[" + std::to_string(k) + "]." + member; };
          };
          SampledToken& t = candidates[k];
          t.token = in.get<int32_t>(candidate("token"));
          t.logprob = in.get<float>(candidate("logprob"));
          t.top_logprobs.resize(in.count(8, candidate("top_logprobs")));
          for (auto& [token, logprob] : t.top_logprobs) {
            token = in.get<int32_t>(candidate("top_logprobs"));
            logprob = in.get<float>(candidate("top_logprobs"));
          }
        }
      }
    }
    result.prompt_logprobs.resize(in.count(kScoredChunkBytes, "prompt_logprobs"));
    for (size_t c = 0; c < result.prompt_logprobs.size(); ++c) {
      const auto chunk = [c] { return "prompt_logprobs[" + std::to_string(c) + "]"; };
      ChunkPromptLogprobs& scored = result.prompt_logprobs[c];
      scored.seq = in.get<uint64_t>(chunk);
      scored.first_pos = in.get<int32_t>(chunk);
      scored.tokens.resize(in.count(kScoredTokenBytes, chunk));
      for (size_t k = 0; k < scored.tokens.size(); ++k) {
        const auto token = [&] { return chunk() + ".tokens[" + std::to_string(k) + "]"; };
        PromptLogprob& t = scored.tokens[k];
        t.token = in.get<int32_t>(token);
        t.logprob = in.get<float>(token);
        t.rank = in.get<int32_t>(token);
        t.top_logprobs.resize(in.count(8, token));
        for (auto& [id, logprob] : t.top_logprobs) {
          id = in.get<int32_t>(token);
          logprob = in.get<float>(token);
        }
      }
    }
    // The worker's device time (the head's step profile and metrics): never negative.
    const auto time = [&in](const char* field) {
      const auto v = in.get<int64_t>(field);
      if (v < 0) throw Malformed{{field, "a time of " + std::to_string(v) + " us is negative"}};
      return v;
    };
    result.cost.busy_us = time("cost.busy_us");
    result.cost.idle_before_us = time("cost.idle_before_us");
    result.cost.graphs_captured = in.get<int32_t>("cost.graphs_captured");
    if (result.cost.graphs_captured < 0) throw Malformed{{"cost.graphs_captured", "a negative count"}};
    result.cost.graph_capture_us = time("cost.graph_capture_us");
    in.end("result");
    return result;
  } catch (Malformed& m) {
    return std::move(m.error);
  }
}

}  // namespace paged
