#include "model/constraint/token_mask.h"

#include <algorithm>
#include <numeric>

namespace paged::constraint {

TokenTrie::TokenTrie(const Tokenizer& tok) : vocab_(tok.vocab_size()) {
  bytes_.resize(static_cast<size_t>(vocab_));
  for (TokenId id = 0; id < vocab_; ++id) {
    bytes_[id] = tok.token_bytes(id, false);
    if (bytes_[id].empty()) continue;
    order_.push_back(id);
    std::string first = tok.token_bytes(id, true);
    if (first != bytes_[id]) leading_.emplace_back(id, std::move(first));
  }
  std::sort(order_.begin(), order_.end(), [this](TokenId a, TokenId b) { return bytes_[a] < bytes_[b]; });
  shared_.assign(order_.size(), 0);
  for (size_t k = 1; k < order_.size(); ++k) {
    const std::string &a = bytes_[order_[k - 1]], &b = bytes_[order_[k]];
    shared_[k] = static_cast<uint32_t>(std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first - a.begin());
  }
}

void TokenTrie::fill_mask(GrammarMatcher& matcher, bool at_start, std::span<const TokenId> stop_ids,
                          std::span<uint32_t> mask) const {
  std::fill(mask.begin(), mask.end(), 0u);
  const auto allow = [&](TokenId id) { mask[id >> 5] |= 1u << (id & 31); };
  const size_t mark = matcher.mark();
  // frontiers[d]: the frontier after the first d bytes of the current token (frontiers[0]: the matcher's own).
  std::vector<GrammarMatcher::Frontier> frontiers{matcher.frontier()};
  for (size_t k = 0; k < order_.size();) {
    const std::string& b = bytes_[order_[k]];
    size_t depth = std::min<size_t>(k == 0 ? 0 : shared_[k], frontiers.size() - 1);
    frontiers.resize(depth + 1);
    while (depth < b.size() && !frontiers[depth].stacks.empty()) {
      frontiers.push_back(matcher.next(frontiers[depth], static_cast<uint8_t>(b[depth])));
      ++depth;
      if (frontiers[depth].dead()) break;
    }
    const bool alive = depth == b.size() && !frontiers[depth].dead();
    if (alive) {
      allow(order_[k]);
      ++k;
      continue;
    }
    // The first `depth` bytes of this token take no further byte (the last of them was refused, or the grammar
    // ends there): nor does any following token that shares them, since each is longer (a prefix sorts first).
    frontiers.resize(std::max<size_t>(depth, 1));
    ++k;
    while (k < order_.size() && shared_[k] >= depth) ++k;
  }
  if (at_start) {
    // Tokens whose leading form differs: their bit is that form's.
    for (const auto& [id, first] : leading_) {
      mask[id >> 5] &= ~(1u << (id & 31));
      GrammarMatcher::Frontier f = matcher.frontier();
      size_t taken = 0;
      while (taken < first.size() && !f.stacks.empty()) f = matcher.next(f, static_cast<uint8_t>(first[taken++]));
      if (!first.empty() && taken == first.size() && !f.dead()) allow(id);
    }
  }
  matcher.rollback(mark);
  if (matcher.can_stop())
    for (TokenId id : stop_ids)
      if (id >= 0 && id < vocab_) allow(id);
}

TokenConstraint::TokenConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> trie,
                                 std::vector<TokenId> stop_ids, bool at_start)
    : matcher_(std::move(grammar)), trie_(std::move(trie)), stop_ids_(std::move(stop_ids)), at_start_(at_start) {}

bool TokenConstraint::accept(TokenId id) {
  if (stopped_ || id < 0 || id >= trie_->vocab_size()) return false;
  if (std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end()) {
    if (!matcher_.can_stop()) return false;
    stopped_ = true;
    return true;
  }
  std::string_view bytes = trie_->bytes(id);
  if (at_start_)
    for (const auto& [lead, first] : trie_->leading())
      if (lead == id) bytes = first;
  if (bytes.empty() || !matcher_.accept(bytes)) return false;
  at_start_ = false;
  return true;
}

void TokenConstraint::fill_mask(std::span<uint32_t> mask) {
  if (stopped_) {
    std::fill(mask.begin(), mask.end(), 0u);
    return;
  }
  trie_->fill_mask(matcher_, at_start_, stop_ids_, mask);
}

}  // namespace paged::constraint
