#include "model/routing/router_policy.h"

#include <algorithm>
#include <iterator>
#include <stdexcept>

#include "model/hash_mix.h"

namespace paged {

int64_t request_weight(size_t prompt_tokens, int max_tokens, int width) {
  return static_cast<int64_t>(prompt_tokens) + static_cast<int64_t>(max_tokens) * width;
}

PrefixAffinity::PrefixAffinity(RoutingOptions options) : options_(options) {
  if (options_.block_size < 1) throw std::invalid_argument("prefix affinity: block_size must be >= 1");
}

std::vector<uint64_t> PrefixAffinity::chain_keys(const std::vector<TokenId>& prompt, size_t max_blocks) const {
  const size_t block_size = static_cast<size_t>(options_.block_size);
  const size_t blocks = std::min(prompt.size() / block_size, max_blocks);
  std::vector<uint64_t> keys;
  keys.reserve(blocks);
  uint64_t h = 0;  // carried across blocks: block i's key covers every token of blocks 0..i
  for (size_t b = 0; b < blocks; ++b) {
    for (size_t t = b * block_size; t < (b + 1) * block_size; ++t) h = hash_mix(h, static_cast<uint32_t>(prompt[t]));
    keys.push_back(h);
  }
  return keys;
}

std::vector<int> PrefixAffinity::matched_blocks(const std::vector<TokenId>& prompt, size_t num_replicas) const {
  std::vector<int> matched(num_replicas, 0);
  const std::vector<uint64_t> keys = chain_keys(prompt, prompt.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    auto found = holders_.find(keys[i]);
    if (found == holders_.end()) break;
    bool extended = false;  // some replica holds blocks 0..i
    for (Recency::iterator pair : found->second) {
      if (pair->replica < num_replicas && matched[pair->replica] == static_cast<int>(i)) {
        matched[pair->replica] = static_cast<int>(i) + 1;
        extended = true;
      }
    }
    if (!extended) break;
  }
  return matched;
}

void PrefixAffinity::record(size_t replica, const std::vector<TokenId>& prompt) {
  const std::vector<uint64_t> keys = chain_keys(prompt, options_.affinity_capacity_blocks);
  // Last block first, so that the first block ends most recent and eviction trims the prefix from its end.
  for (auto key = keys.rbegin(); key != keys.rend(); ++key) {
    std::vector<Recency::iterator>& pairs = holders_[*key];
    auto held = std::find_if(pairs.begin(), pairs.end(), [&](Recency::iterator p) { return p->replica == replica; });
    if (held != pairs.end()) {
      recency_.splice(recency_.begin(), recency_, *held);
    } else {
      recency_.push_front({*key, replica});
      pairs.push_back(recency_.begin());
    }
  }
  while (recency_.size() > options_.affinity_capacity_blocks) erase(std::prev(recency_.end()));
}

void PrefixAffinity::erase(Recency::iterator pair) {
  auto found = holders_.find(pair->key);
  std::vector<Recency::iterator>& pairs = found->second;
  pairs.erase(std::find(pairs.begin(), pairs.end(), pair));
  if (pairs.empty()) holders_.erase(found);
  recency_.erase(pair);
}

void PrefixAffinity::forget(size_t replica) {
  for (auto pair = recency_.begin(); pair != recency_.end();) {
    auto next = std::next(pair);
    if (pair->replica == replica) erase(pair);
    pair = next;
  }
}

size_t PrefixAffinity::size() const { return recency_.size(); }

std::optional<size_t> choose_replica(const std::vector<ReplicaLoad>& loads, const std::vector<int>& matched_blocks,
                                     const RoutingOptions& options, std::optional<size_t> exclude) {
  // a before b in load order: fewer active tokens, then more free blocks, then fewer active requests, then index.
  auto less_loaded = [&](size_t a, size_t b) {
    const ReplicaLoad& x = loads[a];
    const ReplicaLoad& y = loads[b];
    if (x.active_tokens != y.active_tokens) return x.active_tokens < y.active_tokens;
    if (x.free_blocks != y.free_blocks) return x.free_blocks > y.free_blocks;
    if (x.active_requests != y.active_requests) return x.active_requests < y.active_requests;
    return a < b;
  };
  auto matched = [&](size_t r) { return r < matched_blocks.size() ? matched_blocks[r] : 0; };
  auto candidate = [&](size_t r) { return loads[r].available && r != exclude; };

  std::optional<size_t> least;
  for (size_t r = 0; r < loads.size(); ++r)
    if (candidate(r) && (!least || less_loaded(r, *least))) least = r;
  if (!least) return std::nullopt;

  const double bound =
      options.balance_factor * static_cast<double>(loads[*least].active_tokens) + options.balance_slack_tokens;
  std::optional<size_t> affine;
  for (size_t r = 0; r < loads.size(); ++r) {
    if (!candidate(r) || matched(r) < 1 || static_cast<double>(loads[r].active_tokens) > bound) continue;
    if (!affine || matched(r) > matched(*affine) || (matched(r) == matched(*affine) && less_loaded(r, *affine)))
      affine = r;
  }
  return affine ? affine : least;
}

}  // namespace paged
