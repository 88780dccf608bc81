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
  sorted_offsets_.push_back(0);
  for (TokenId id : order_) {
    sorted_ += bytes_[id];
    sorted_offsets_.push_back(static_cast<uint32_t>(sorted_.size()));
  }
}

ConstraintAutomaton::ConstraintAutomaton(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> trie,
                                         std::vector<TokenId> stop_ids)
    : trie_(std::move(trie)), stop_ids_(std::move(stop_ids)), matcher_(std::move(grammar)) {
  frontiers_.emplace_back();  // kDead
  live_.push_back(0);
  next_.emplace_back();
  next_.back().fill(kDead);
  start_ = intern(matcher_.frontier());
}

uint32_t ConstraintAutomaton::intern(GrammarMatcher::Frontier f) {
  if (f.dead()) return kDead;
  std::sort(f.stacks.begin(), f.stacks.end());
  auto [it, inserted] = ids_.emplace(std::make_pair(f.accepts, f.stacks), static_cast<uint32_t>(frontiers_.size()));
  if (inserted) {
    live_.push_back(f.stacks.empty() ? 0 : 1);
    frontiers_.push_back(std::move(f));
    next_.emplace_back();
    next_.back().fill(kUnknown);
  }
  return it->second;
}

uint32_t ConstraintAutomaton::next(uint32_t state, uint8_t byte) {
  if (state == kDead) return kDead;
  if (const uint32_t known = next_[state][byte]; known != kUnknown) return known;
  const uint32_t to = intern(matcher_.next(frontiers_[state], byte));
  next_[state][byte] = to;  // after intern: it may have grown next_
  return to;
}

bool ConstraintAutomaton::can_stop(uint32_t state) const {
  std::lock_guard lock(mu_);
  return frontiers_[state].accepts;
}

uint32_t ConstraintAutomaton::walk(uint32_t state, std::string_view bytes) {
  std::lock_guard lock(mu_);
  return advance(state, bytes);
}

uint32_t ConstraintAutomaton::advance(uint32_t state, std::string_view bytes) {
  for (char c : bytes) {
    state = next(state, static_cast<uint8_t>(c));
    if (state == kDead) break;
  }
  return state;
}

void ConstraintAutomaton::fill_mask(uint32_t state, bool at_start, std::span<uint32_t> mask) {
  std::lock_guard lock(mu_);
  if (!at_start)
    if (auto it = masks_.find(state); it != masks_.end()) {
      std::copy(it->second.begin(), it->second.end(), mask.begin());
      return;
    }
  std::fill(mask.begin(), mask.end(), 0u);
  const auto allow = [&](TokenId id) { mask[id >> 5] |= 1u << (id & 31); };
  const std::vector<TokenId>& order = trie_->order();
  const std::vector<uint32_t>& shared = trie_->shared();
  // states[d]: the state after the first d bytes of the current token (states[0]: `state`).
  std::vector<uint32_t> states{state};
  for (size_t k = 0; k < order.size();) {
    const std::string_view b = trie_->sorted_bytes(k);
    size_t depth = std::min<size_t>(shared[k], states.size() - 1);
    states.resize(depth + 1);
    while (depth < b.size() && live_[states[depth]]) {
      states.push_back(next(states[depth], static_cast<uint8_t>(b[depth])));
      ++depth;
      if (states[depth] == kDead) break;
    }
    if (depth == b.size() && states[depth] != kDead) {
      allow(order[k]);
      ++k;
      continue;
    }
    // The first `depth` bytes of this token take no further byte (the last of them was refused, or the grammar
    // ends there): nor does any following token that shares them, since each is longer (a prefix sorts first).
    states.resize(std::max<size_t>(depth, 1));
    ++k;
    while (k < order.size() && shared[k] >= depth) ++k;
  }
  if (at_start) {
    // Tokens whose leading form differs: their bit is that form's.
    for (const auto& [id, first] : trie_->leading()) {
      mask[id >> 5] &= ~(1u << (id & 31));
      if (!first.empty() && advance(state, first) != kDead) allow(id);
    }
  }
  // A live state that takes no token (every byte it could take was cut at kMaxFrontierStacks, or no token spells
  // one) ends the sequence: the stop ids, rather than an empty mask under which a sampler writes any token.
  const bool none = std::all_of(mask.begin(), mask.end(), [](uint32_t w) { return w == 0; });
  if (frontiers_[state].accepts || none)
    for (TokenId id : stop_ids_)
      if (id >= 0 && id < trie_->vocab_size()) allow(id);
  if (at_start) return;
  masks_.emplace(state, std::vector<uint32_t>(mask.begin(), mask.end()));
  mask_order_.push_back(state);
  while (mask_order_.size() * mask.size_bytes() > kMaxCachedMaskBytes) {  // the oldest go first
    masks_.erase(mask_order_.front());
    mask_order_.pop_front();
  }
}

TokenConstraint::TokenConstraint(std::shared_ptr<ConstraintAutomaton> automaton, bool at_start, std::string after)
    : automaton_(std::move(automaton)), state_(automaton_->start()), at_start_(at_start), after_(std::move(after)) {}

bool TokenConstraint::accept(TokenId id) {
  const TokenTrie& trie = automaton_->trie();
  if (stopped_ || id < 0 || id >= trie.vocab_size()) return false;
  const std::vector<TokenId>& stops = automaton_->stop_ids();
  if (std::find(stops.begin(), stops.end(), id) != stops.end()) {
    if (after_.empty() && !automaton_->can_stop(state_)) return false;  // before the grammar, any end is one
    stopped_ = true;
    return true;
  }
  std::string_view bytes = trie.bytes(id);
  if (at_start_)
    for (const auto& [lead, first] : trie.leading())
      if (lead == id) bytes = first;
  if (!after_.empty()) {  // the grammar has not started: look for its opening text
    const std::string text = tail_ + std::string(bytes);
    at_start_ = at_start_ && bytes.empty();
    const size_t found = text.find(after_);
    if (found == std::string::npos) {
      tail_ = text.substr(text.size() - std::min(text.size(), after_.size() - 1));
      return true;
    }
    const std::string_view rest = std::string_view(text).substr(found + after_.size());
    after_.clear();
    tail_.clear();
    if (const uint32_t to = automaton_->walk(state_, rest); !rest.empty() && to != ConstraintAutomaton::kDead)
      state_ = to;
    return true;
  }
  if (bytes.empty()) return false;
  const uint32_t to = automaton_->walk(state_, bytes);
  if (to == ConstraintAutomaton::kDead) return false;
  state_ = to;
  at_start_ = false;
  return true;
}

void TokenConstraint::fill_mask(std::span<const TokenId> after, std::span<uint32_t> mask) const {
  if (!after.empty()) {
    TokenConstraint ahead(*this);
    for (TokenId id : after)
      if (!ahead.accept(id)) break;  // a draft the grammar refuses: the position's sample is not taken
    ahead.fill_mask({}, mask);
    return;
  }
  if (stopped_) {
    // Ended: a step already sent for the sequence (two in flight) samples for nothing, from the stop ids rather
    // than from a row with nothing allowed.
    std::fill(mask.begin(), mask.end(), 0u);
    for (TokenId id : automaton_->stop_ids())
      if (id >= 0 && id < vocab_size()) mask[id >> 5] |= 1u << (id & 31);
    return;
  }
  if (!after_.empty()) {  // the grammar has not started: every token, whole words then the last one's low bits
    const size_t full = static_cast<size_t>(vocab_size()) / 32;
    const int rest = vocab_size() % 32;
    std::fill(mask.begin(), mask.end(), 0u);
    std::fill(mask.begin(), mask.begin() + static_cast<std::ptrdiff_t>(full), ~0u);
    if (rest) mask[full] = (1u << rest) - 1;
    return;
  }
  automaton_->fill_mask(state_, at_start_, mask);
}

}  // namespace paged::constraint
