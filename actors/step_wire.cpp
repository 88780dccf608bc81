#include "actors/step_wire.h"

#include <algorithm>
#include <stdexcept>
#include <string>

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

// `now` as (keep, tail) against `held`, which becomes `now`.
void send_delta(std::vector<int32_t>& held, const std::vector<int32_t>& now, int32_t& keep,
                std::vector<int32_t>& tail) {
  const size_t common = static_cast<size_t>(
      std::mismatch(held.begin(), held.end(), now.begin(), now.end()).first - held.begin());
  keep = static_cast<int32_t>(common);
  tail.assign(now.begin() + static_cast<std::ptrdiff_t>(common), now.end());
  held.resize(common);
  held.insert(held.end(), tail.begin(), tail.end());
}

// The first `keep` entries of `held` (null: none), then `tail`; keep <= held's size.
std::vector<int32_t> spliced(const std::vector<int32_t>* held, int32_t keep, const std::vector<int32_t>& tail) {
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(keep) + tail.size());
  if (held) out.assign(held->begin(), held->begin() + keep);
  out.insert(out.end(), tail.begin(), tail.end());
  return out;
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
    wc.start_pos = c.start_pos;
    send_delta(sent.table, c.block_table, wc.table_keep, wc.table_tail);
    if (c.samples.empty()) continue;
    const SampleSpec& first = c.samples.front();
    if (!sent.context) {
      wc.context = WireContext{*first.params, ids_or_none(first.prompt), ids_or_none(first.stop_ids)};
      sent.context = true;
    }
    send_delta(sent.output, ids_or_none(first.output), wc.output_keep, wc.output_tail);
    wc.samples.reserve(c.samples.size());
    for (const SampleSpec& s : c.samples)
      wc.samples.push_back({.seed = s.seed, .num_logprobs = s.num_logprobs, .num_candidates = s.num_candidates});
  }
  return w;
}

void WireEncoder::reset() { sent_.clear(); }

WireDecoder::WireDecoder(const StepLimits& limits, WireBounds bounds) : limits_(limits), bounds_(bounds) {}

size_t WireDecoder::tokens_of(const SeqState& s) {
  return (s.context ? s.context->prompt.size() + s.context->stop_ids.size() : 0) + (s.output ? s.output->size() : 0);
}

std::variant<WireDecoder::SeqState, FieldError> WireDecoder::next_state(size_t i, const WireChunk& wc,
                                                                        const SeqState* old) const {
  const auto max_len = static_cast<size_t>(std::max(limits_.max_model_len, 0));
  const size_t max_blocks = limits_.block_size > 0 ? (max_len + limits_.block_size - 1) / limits_.block_size : 0;
  if (auto e = check_delta(i, "table_keep", "table_tail", wc.table_keep, wc.table_tail.size(),
                           old ? old->table.size() : 0, max_blocks, "blocks", wc.seq))
    return *e;
  SeqState next{.table = spliced(old ? &old->table : nullptr, wc.table_keep, wc.table_tail),
                .context = old ? old->context : nullptr,
                .output = old ? old->output : nullptr};
  if (wc.samples.empty()) {
    if (wc.context) return FieldError{seq_field(i, "context"), "a chunk without samples has no context"};
    if (wc.output_keep != 0 || !wc.output_tail.empty())
      return FieldError{seq_field(i, "output_tail"), "a chunk without samples has no output ids"};
    return next;
  }
  if (wc.context) {
    if (wc.context->prompt.size() > max_len)
      return FieldError{seq_field(i, "context.prompt"), std::to_string(wc.context->prompt.size()) +
                                                            " ids, more than max_model_len " +
                                                            std::to_string(max_len)};
    next.context = std::make_shared<const WireContext>(*wc.context);
  } else if (!next.context) {
    return FieldError{seq_field(i, "samples"), "sequence " + std::to_string(wc.seq) +
                                                   " samples, but its context (parameters, prompt, stop ids) never "
                                                   "came"};
  }
  if (auto e = check_delta(i, "output_keep", "output_tail", wc.output_keep, wc.output_tail.size(),
                           next.output ? next.output->size() : 0, max_len, "output ids", wc.seq))
    return *e;
  next.output = std::make_shared<const std::vector<TokenId>>(spliced(next.output.get(), wc.output_keep,
                                                                     wc.output_tail));
  return next;
}

std::variant<StepBatch, FieldError> WireDecoder::decode(const WireStep& wire) {
  // Stage: what the step makes of each of its sequences, beside the state, which changes only once all is checked.
  std::vector<SeqId> finished = wire.finished;
  std::sort(finished.begin(), finished.end());
  finished.erase(std::unique(finished.begin(), finished.end()), finished.end());
  size_t num_seqs = seqs_.size(), num_tokens = num_tokens_;
  for (SeqId id : finished)
    if (const auto it = seqs_.find(id); it != seqs_.end()) {
      --num_seqs;
      num_tokens -= tokens_of(it->second);
    }
  const auto held = [&](SeqId id) -> const SeqState* {
    if (std::binary_search(finished.begin(), finished.end(), id)) return nullptr;
    const auto it = seqs_.find(id);
    return it == seqs_.end() ? nullptr : &it->second;
  };
  {
    std::vector<SeqId> ids;
    ids.reserve(wire.seqs.size());
    for (const WireChunk& wc : wire.seqs) ids.push_back(wc.seq);
    std::sort(ids.begin(), ids.end());
    if (const auto twice = std::adjacent_find(ids.begin(), ids.end()); twice != ids.end())
      return FieldError{"seqs", "sequence " + std::to_string(*twice) + " has two chunks in the step"};
  }
  StepBatch batch;
  batch.copies = wire.copies;
  batch.finished = wire.finished;
  batch.seqs.reserve(wire.seqs.size());
  std::vector<std::pair<SeqId, SeqState>> staged;
  staged.reserve(wire.seqs.size());
  for (size_t i = 0; i < wire.seqs.size(); ++i) {
    const WireChunk& wc = wire.seqs[i];
    const SeqState* old = held(wc.seq);
    auto next = next_state(i, wc, old);
    if (const auto* e = std::get_if<FieldError>(&next)) return *e;
    SeqState& state = std::get<SeqState>(next);
    num_tokens = num_tokens - (old ? tokens_of(*old) : 0) + tokens_of(state);
    if (!old) ++num_seqs;
    if (num_seqs > bounds_.max_sequences)
      return FieldError{seq_path(i), "sequence " + std::to_string(wc.seq) + " would be one more than the " +
                                         std::to_string(bounds_.max_sequences) + " sequences held at most"};
    if (num_tokens > bounds_.max_tokens)
      return FieldError{seq_path(i), std::to_string(num_tokens) + " token ids would be held, more than the " +
                                         std::to_string(bounds_.max_tokens) + " held at most"};
    SeqChunk& c = batch.seqs.emplace_back();
    c.seq = wc.seq;
    c.tokens = wc.tokens;
    c.start_pos = wc.start_pos;
    c.block_table = state.table;
    c.samples.reserve(wc.samples.size());
    for (const WireSample& s : wc.samples)
      c.samples.push_back({.params = &state.context->params, .seed = s.seed, .prompt = &state.context->prompt,
                           .output = state.output.get(), .stop_ids = &state.context->stop_ids,
                           .num_logprobs = s.num_logprobs, .num_candidates = s.num_candidates});
    staged.emplace_back(wc.seq, std::move(state));
  }
  // Validate: what check_step refuses is refused before the state changes.
  if (auto e = check_step(batch, limits_)) return *e;
  // Commit: the SampleSpecs point into the staged contexts and outputs, which the state takes over.
  for (SeqId id : finished) seqs_.erase(id);
  for (auto& [id, state] : staged) seqs_.insert_or_assign(id, std::move(state));
  num_tokens_ = num_tokens;
  return batch;
}

void WireDecoder::reset() {
  seqs_.clear();
  num_tokens_ = 0;
}

}  // namespace paged
