// Registrations that no memory tier holds any more, kept without their KV: the links of a prefix chain that a
// sliding-window KV group does not need the KV of. A block's prefix-cache identity is its parent's content id
// (model/kv/block_pool.h), so once a block before a sliding group's window is evicted, the blocks after it - still
// cached, and all that a query past them reads - could no longer be found. With the lost block's content id kept
// here (verified like a registered block: parent id, salt and every token), the chain walks on through it
// (KvCacheManager::cached_prefix), and content computed again takes its old id back, so that the blocks registered
// after it are found again. Pure bookkeeping: a bounded table, the oldest entry forgotten first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>

#include "model/kv/block_pool.h"

namespace paged {

class LostContent {
 public:
  /// Keeps at most `capacity` registrations (0: none, every call a no-op or a miss).
  explicit LostContent(size_t capacity) : capacity_(capacity) {}

  size_t size() const { return order_.size(); }
  size_t capacity() const { return capacity_; }
  /// Keeps `content`, a registration the last tier holding it dropped (replacing the same content under an older id),
  /// beyond capacity forgetting the oldest.
  void add(const EvictedContent& content);
  /// The content id `content` had, if kept (parent id, salt and tokens compared). Pure query.
  std::optional<uint64_t> find(const BlockContent& content) const;
  /// find(), and forgets it: the content is registered again under that id.
  std::optional<uint64_t> take(const BlockContent& content);
  /// What is kept, oldest first.
  const std::list<EvictedContent>& entries() const { return order_; }

 private:
  using Entries = std::list<EvictedContent>;  // oldest first
  Entries::const_iterator lookup(const BlockContent& content) const;
  void erase(Entries::const_iterator it);

  size_t capacity_;
  Entries order_;
  std::unordered_multimap<uint64_t, Entries::const_iterator> by_key_;  // chain_hash(parent, salt, tokens)
};

}  // namespace paged
