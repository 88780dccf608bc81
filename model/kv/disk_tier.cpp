#include "model/kv/disk_tier.h"

#include <stdexcept>
#include <string>
#include <utility>

namespace paged {

DiskTier::DiskTier(int64_t capacity, const std::vector<uint64_t>& existing) : capacity_(capacity) {
  if (capacity < 0) throw std::invalid_argument("disk tier: negative capacity");
  for (uint64_t key : existing) {
    if (entries_.contains(key)) continue;
    lru_.push_back(key);
    entries_[key] = {false, std::prev(lru_.end())};
  }
  initial_deletions_ = evict_over_capacity();
}

bool DiskTier::contains(uint64_t key) const {
  auto it = entries_.find(key);
  return it != entries_.end() && !it->second.loading;
}

bool DiskTier::loading(uint64_t key) const {
  auto it = entries_.find(key);
  return it != entries_.end() && it->second.loading;
}

std::vector<uint64_t> DiskTier::evict_over_capacity() {
  std::vector<uint64_t> gone;
  while (size() > capacity_ && !lru_.empty()) {
    gone.push_back(lru_.front());
    entries_.erase(lru_.front());
    lru_.pop_front();
  }
  return gone;
}

std::vector<uint64_t> DiskTier::add(uint64_t key) {
  if (capacity_ == 0) return {key};  // nothing fits: the file goes at once
  auto it = entries_.find(key);
  if (it != entries_.end()) {
    if (it->second.loading) throw std::logic_error("disk tier: add() of a loading key");
    lru_.splice(lru_.end(), lru_, it->second.lru);  // touch
    return {};
  }
  lru_.push_back(key);
  entries_[key] = {false, std::prev(lru_.end())};
  return evict_over_capacity();
}

void DiskTier::begin_load(uint64_t key) {
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.loading) throw std::logic_error("disk tier: begin_load() of a key not stored");
  lru_.erase(it->second.lru);
  it->second.loading = true;
}

void DiskTier::end_load(uint64_t key, bool ok) {
  auto it = entries_.find(key);
  if (it == entries_.end() || !it->second.loading) throw std::logic_error("disk tier: end_load() of a key not loading");
  if (!ok) {
    entries_.erase(it);
    return;
  }
  lru_.push_back(key);
  it->second = {false, std::prev(lru_.end())};
}

void DiskTier::check_invariants() const {
  size_t stored = 0;
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    auto e = entries_.find(*it);
    if (e == entries_.end() || e->second.loading || e->second.lru != it)
      throw std::logic_error("disk tier: LRU entry " + std::to_string(*it) + " disagrees with the map");
    ++stored;
  }
  size_t loading = 0;
  for (const auto& [key, e] : entries_) loading += e.loading;
  if (stored + loading != entries_.size()) throw std::logic_error("disk tier: a stored key is not in the LRU list");
  if (static_cast<int64_t>(stored) > capacity_) throw std::logic_error("disk tier: over capacity");
}

}  // namespace paged
