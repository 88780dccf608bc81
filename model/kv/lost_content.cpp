#include "model/kv/lost_content.h"

#include <algorithm>

namespace paged {

void LostContent::add(const EvictedContent& content) {
  if (capacity_ == 0 || content.content_id == 0) return;
  // The same content under an older id (computed again, then lost again): the newer id is the one that the blocks
  // registered since name as their parent.
  if (const auto old = lookup(content.view()); old != order_.end()) erase(old);
  if (order_.size() == capacity_) erase(order_.begin());
  order_.push_back(content);
  by_key_.emplace(chain_hash(content.parent, content.salt, content.tokens), std::prev(order_.end()));
}

LostContent::Entries::const_iterator LostContent::lookup(const BlockContent& content) const {
  auto [first, last] = by_key_.equal_range(chain_hash(content.parent, content.salt, content.tokens));
  for (auto it = first; it != last; ++it) {
    const EvictedContent& e = *it->second;
    if (e.parent == content.parent && e.salt == content.salt &&
        std::equal(e.tokens.begin(), e.tokens.end(), content.tokens.begin(), content.tokens.end()))
      return it->second;
  }
  return order_.end();
}

void LostContent::erase(Entries::const_iterator it) {
  auto [first, last] = by_key_.equal_range(chain_hash(it->parent, it->salt, it->tokens));
  for (auto k = first; k != last; ++k)
    if (k->second == it) {
      by_key_.erase(k);
      break;
    }
  order_.erase(it);
}

std::optional<uint64_t> LostContent::find(const BlockContent& content) const {
  const auto it = lookup(content);
  if (it == order_.end()) return std::nullopt;
  return it->content_id;
}

std::optional<uint64_t> LostContent::take(const BlockContent& content) {
  const auto it = lookup(content);
  if (it == order_.end()) return std::nullopt;
  const uint64_t id = it->content_id;
  erase(it);
  return id;
}

}  // namespace paged
