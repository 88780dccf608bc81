#include "model/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>

#include "model/sampling/bad_words.h"

namespace paged {

double random_uniform(uint64_t seed, uint64_t index) {
  uint64_t z = seed + (index + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * (1.0 / 9007199254740992.0);
}

void log_softmax(std::span<const float> logits, std::vector<float>& out) {
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - mx);
  const double lse = mx + std::log(sum);
  out.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<float>(logits[i] - lse);
}

namespace {

// Descending by value, ties by lower id: the order every choice of the sampler is made in.
template <class Values>
auto by_value(const Values& v) {
  return [&v](TokenId a, TokenId b) { return v[a] > v[b] || (v[a] == v[b] && a < b); };
}

// The ids of the `k` largest of `values` (k clamped to their number), in by_value order.
template <class Values>
std::vector<TokenId> top_ids(const Values& values, int k) {
  std::vector<TokenId> ids(values.size());
  std::iota(ids.begin(), ids.end(), 0);
  k = std::clamp<int>(k, 0, static_cast<int>(ids.size()));
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), by_value(values));
  ids.resize(static_cast<size_t>(k));
  return ids;
}

// The `k` largest of `logprobs` as (id, value), in by_value order.
std::vector<std::pair<TokenId, float>> top_logprobs(const std::vector<float>& logprobs, int k) {
  std::vector<std::pair<TokenId, float>> out;
  for (TokenId id : top_ids(logprobs, k)) out.emplace_back(id, logprobs[id]);
  return out;
}

}  // namespace

PromptLogprob score_token(std::span<const float> logits, TokenId token, int num_top) {
  std::vector<float> lp;
  log_softmax(logits, lp);
  const float mine = logits[static_cast<size_t>(token)];
  const auto rank = std::count_if(logits.begin(), logits.end(), [mine](float x) { return x >= mine; });
  PromptLogprob scored{token, lp[token], static_cast<int32_t>(rank), {}};
  // Ranked and ordered by the logits themselves: the same order as the logprobs', without their rounding.
  for (TokenId id : top_ids(logits, num_top)) scored.top_logprobs.emplace_back(id, lp[id]);
  return scored;
}

PenaltyOps penalty_ops(const SampleSpec& spec, int vocab) {
  const SamplingParams& p = *spec.params;
  const auto in_vocab = [vocab](TokenId id) { return id >= 0 && id < vocab; };
  PenaltyOps ops;
  for (const auto& [id, bias] : p.logit_bias)
    if (in_vocab(id)) ops.bias.emplace_back(id, bias);
  if (spec.stop_ids && static_cast<int>(generated_count(spec)) < p.min_tokens)
    for (TokenId id : *spec.stop_ids)
      if (in_vocab(id)) ops.masked.push_back(id);
  if (!p.bad_words_token_ids.empty()) {
    const size_t before = ops.masked.size();
    size_t longest = 0;
    for (const std::vector<TokenId>& word : p.bad_words_token_ids) longest = std::max(longest, word.size());
    append_bad_word_bans(p.bad_words_token_ids, newest_generated(spec, longest > 0 ? longest - 1 : 0), ops.masked);
    ops.masked.erase(std::remove_if(ops.masked.begin() + static_cast<std::ptrdiff_t>(before), ops.masked.end(),
                                    [&](TokenId id) { return !in_vocab(id); }),
                     ops.masked.end());
  }
  if (p.repetition_penalty != 1.0f) {
    ops.repetition = p.repetition_penalty;
    std::vector<bool> seen(static_cast<size_t>(vocab), false);
    const auto see = [&](TokenId id) {
      if (in_vocab(id) && !seen[id]) {
        seen[id] = true;
        ops.repeated.push_back(id);
      }
    };
    if (spec.prompt)
      for (TokenId id : *spec.prompt) see(id);
    for_each_generated(spec, see);
  }
  if ((p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) && generated_count(spec) > 0) {
    std::unordered_map<TokenId, int> counts;
    for_each_generated(spec, [&](TokenId id) { ++counts[id]; });
    for (const auto& [id, c] : counts)
      if (in_vocab(id)) ops.subtract.emplace_back(id, p.frequency_penalty * c + p.presence_penalty);
  }
  return ops;
}

void apply_penalty_ops(std::span<float> logits, const PenaltyOps& ops) {
  for (const auto& [id, bias] : ops.bias) logits[id] += bias;
  for (TokenId id : ops.masked) logits[id] = -std::numeric_limits<float>::infinity();
  for (TokenId id : ops.repeated)
    logits[id] = logits[id] > 0 ? logits[id] / ops.repetition : logits[id] * ops.repetition;
  for (const auto& [id, value] : ops.subtract) logits[id] -= value;
}

void apply_penalties(std::span<float> logits, const SampleSpec& spec) {
  apply_penalty_ops(logits, penalty_ops(spec, static_cast<int>(logits.size())));
}

bool fill_token_mask(const SampleSpec& spec, std::span<uint32_t> mask) {
  const std::vector<TokenId>& allowed = spec.params->allowed_token_ids;
  if (!spec.mask_source && allowed.empty()) return false;
  if (spec.mask_source) {
    std::vector<TokenId> after;
    if (spec.pending_output >= 0) after.push_back(spec.pending_output);
    after.insert(after.end(), spec.drafted.begin(), spec.drafted.end());
    spec.mask_source->fill_mask(after, mask);
  } else {
    std::fill(mask.begin(), mask.end(), ~uint32_t{0});
  }
  if (!allowed.empty()) {
    std::vector<uint32_t> listed(mask.size(), 0);
    for (TokenId id : allowed)
      if (id >= 0 && static_cast<size_t>(id) < 32 * mask.size()) listed[id >> 5] |= uint32_t{1} << (id & 31);
    for (size_t w = 0; w < mask.size(); ++w) mask[w] &= listed[w];
  }
  return true;
}

void apply_token_mask(std::span<float> logits, std::span<const uint32_t> allowed) {
  for (size_t i = 0; i < logits.size(); ++i)
    if (!((allowed[i >> 5] >> (i & 31)) & 1)) logits[i] = -std::numeric_limits<float>::infinity();
}

std::vector<SampledToken> sample_logits(std::span<float> logits, const SampleSpec& spec) {
  const SamplingParams& p = *spec.params;
  apply_penalties(logits, spec);
  if (std::vector<uint32_t> allowed((logits.size() + 31) / 32); fill_token_mask(spec, allowed))
    apply_token_mask(logits, allowed);
  std::vector<float> lp;
  log_softmax(logits, lp);
  const auto vocab = static_cast<TokenId>(logits.size());
  auto with_top = [&](TokenId id) { return SampledToken{id, lp[id], top_logprobs(lp, spec.num_logprobs)}; };

  if (spec.num_candidates > 1) {
    std::vector<SampledToken> out;
    for (TokenId id : top_ids(lp, spec.num_candidates)) out.push_back(with_top(id));
    return out;
  }
  if (p.greedy()) {
    TokenId best = 0;
    for (TokenId i = 1; i < vocab; ++i)
      if (logits[i] > logits[best]) best = i;
    return {with_top(best)};
  }

  // Probabilities at temperature T, sorted descending; then the top-k, top-p and min-p cuts.
  std::vector<float> probs(vocab);
  {
    const float inv_t = 1.0f / p.temperature;
    const float mx = *std::max_element(logits.begin(), logits.end());
    double sum = 0.0;
    for (TokenId i = 0; i < vocab; ++i) sum += probs[i] = static_cast<float>(std::exp((logits[i] - mx) * inv_t));
    for (auto& x : probs) x = static_cast<float>(x / sum);
  }
  std::vector<TokenId> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), by_value(probs));
  size_t keep = order.size();
  if (p.top_k > 0) keep = std::min<size_t>(keep, p.top_k);
  if (p.top_p < 1.0f) {
    double cum = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      cum += probs[order[i]];
      if (cum >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0f) {
    const float threshold = p.min_p * probs[order[0]];
    size_t i = 1;
    while (i < keep && probs[order[i]] >= threshold) ++i;
    keep = i;
  }
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) total += probs[order[i]];
  const size_t index = generated_count(spec);
  const double target = random_uniform(spec.seed, index) * total;
  double cum = 0.0;
  TokenId chosen = order[keep - 1];
  for (size_t i = 0; i < keep; ++i) {
    cum += probs[order[i]];
    if (target < cum) {
      chosen = order[i];
      break;
    }
  }
  return {with_top(chosen)};
}

}  // namespace paged
