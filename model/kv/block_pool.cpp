#include "model/kv/block_pool.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "model/hash_mix.h"

namespace paged {

BlockPool::BlockPool(int32_t num_blocks, std::string name)
    : name_(std::move(name)),
      blocks_(num_blocks >= 0 ? num_blocks : throw std::invalid_argument(name_ + " pool: negative block count")) {
  for (int32_t b = 0; b < num_blocks; ++b) push_back(uncached_, b);
}

uint64_t chain_hash(uint64_t seed, uint64_t extra, std::span<const TokenId> tokens) {
  uint64_t h = hash_mix(seed, extra);
  for (TokenId t : tokens) h = hash_mix(h, static_cast<uint32_t>(t));
  return h;
}

uint64_t BlockPool::hash(const BlockContent& content) { return chain_hash(content.parent, content.salt, content.tokens); }

void BlockPool::push_back(Queue& q, int32_t block) {
  Block& b = blocks_[block];
  b.prev = q.tail;
  b.next = -1;
  if (q.tail >= 0) blocks_[q.tail].next = block; else q.head = block;
  q.tail = block;
  ++q.size;
}

void BlockPool::unlink(Queue& q, int32_t block) {
  Block& b = blocks_[block];
  if (b.prev >= 0) blocks_[b.prev].next = b.next; else q.head = b.next;
  if (b.next >= 0) blocks_[b.next].prev = b.prev; else q.tail = b.prev;
  b.prev = b.next = -1;
  --q.size;
}

void BlockPool::unregister(int32_t block) {
  Block& b = blocks_[block];
  auto [first, last] = by_key_.equal_range(b.key);
  for (auto it = first; it != last; ++it) {
    if (it->second == block) {
      by_key_.erase(it);
      break;
    }
  }
  b.content_id = b.key = b.parent = b.salt = b.chain = 0;
  b.tokens.clear();
}

int32_t BlockPool::allocate(EvictedContent* evicted) {
  if (num_free() == 0) throw std::logic_error(name_ + " pool: allocate() with no free block");
  int32_t block;
  if (uncached_.size > 0) {
    block = uncached_.head;
    unlink(uncached_, block);
  } else {
    block = cached_.head;
    unlink(cached_, block);
    if (evicted) {
      Block& b = blocks_[block];
      *evicted = {b.content_id, b.parent, b.salt, std::move(b.tokens), b.chain};
    }
    unregister(block);
    ++evicted_;
  }
  blocks_[block].ref = 1;
  return block;
}

void BlockPool::retain(int32_t block) {
  Block& b = blocks_.at(block);
  if (b.ref == 0) {
    if (b.content_id == 0) throw std::logic_error(name_ + " pool: retain() of a free uncached block");
    unlink(cached_, block);
  }
  ++b.ref;
}

void BlockPool::release(int32_t block) {
  Block& b = blocks_.at(block);
  if (b.ref <= 0) throw std::logic_error(name_ + " pool: release() of a free block " + std::to_string(block));
  if (--b.ref == 0) push_back(b.content_id != 0 ? cached_ : uncached_, block);
}

void BlockPool::touch(int32_t block) {
  if (blocks_.at(block).ref != 0 || blocks_[block].content_id == 0) return;
  unlink(cached_, block);
  push_back(cached_, block);
}

bool BlockPool::matches(const Block& b, const BlockContent& content) const {
  return b.parent == content.parent && b.salt == content.salt &&
         std::equal(b.tokens.begin(), b.tokens.end(), content.tokens.begin(), content.tokens.end());
}

std::optional<int32_t> BlockPool::find(const BlockContent& content) const {
  auto [first, last] = by_key_.equal_range(hash(content));
  for (auto it = first; it != last; ++it) {
    if (matches(blocks_[it->second], content)) return it->second;
  }
  return std::nullopt;
}

uint64_t BlockPool::register_content(int32_t block, const BlockContent& content) {
  if (auto holder = find(content)) return blocks_[*holder].content_id;
  store(block, content, next_content_id_);
  return next_content_id_++;
}

void BlockPool::adopt(int32_t block, const BlockContent& content, uint64_t content_id) {
  if (content_id == 0) throw std::logic_error(name_ + " pool: adopt() of content id 0");
  if (find(content)) throw std::logic_error(name_ + " pool: adopt() of content registered here already");
  store(block, content, content_id);
  next_content_id_ = std::max(next_content_id_, content_id + 1);
}

void BlockPool::store(int32_t block, const BlockContent& content, uint64_t content_id) {
  Block& b = blocks_.at(block);
  if (b.ref == 0) throw std::logic_error(name_ + " pool: registration of a free block");
  if (b.content_id != 0) {
    throw std::logic_error(name_ + " pool: block " + std::to_string(block) + " is registered with other content");
  }
  b.content_id = content_id;
  b.key = hash(content);
  b.parent = content.parent;
  b.salt = content.salt;
  b.chain = content.chain;
  b.tokens.assign(content.tokens.begin(), content.tokens.end());
  by_key_.emplace(b.key, block);
}

void BlockPool::forget(int32_t block) {
  const Block& b = blocks_.at(block);
  if (b.ref == 0 || b.content_id == 0) {
    throw std::logic_error(name_ + " pool: forget() of block " + std::to_string(block) +
                           ", which is not in use and registered");
  }
  unregister(block);
}

void BlockPool::check_invariants() const {
  auto fail = [&](const std::string& what) { throw std::logic_error(name_ + " pool: " + what); };
  std::vector<char> queued(blocks_.size(), 0);
  auto walk = [&](const Queue& q, bool registered, const char* label) {
    int32_t count = 0;
    int32_t prev = -1;
    for (int32_t b = q.head; b >= 0; b = blocks_[b].next) {
      const Block& blk = blocks_[b];
      if (queued[b]) fail("block " + std::to_string(b) + " appears twice in the free queues");
      queued[b] = 1;
      if (blk.ref != 0) fail("block " + std::to_string(b) + " is in the " + label + " queue with ref " +
                             std::to_string(blk.ref));
      if ((blk.content_id != 0) != registered) {
        fail("block " + std::to_string(b) + " is in the " + label + " queue but registered=" +
             std::to_string(blk.content_id != 0));
      }
      if (blk.prev != prev) fail("broken prev link at block " + std::to_string(b));
      prev = b;
      if (++count > num_blocks()) fail(std::string("cycle in the ") + label + " queue");
    }
    if (prev != q.tail) fail(std::string("tail of the ") + label + " queue is wrong");
    if (count != q.size) fail(std::string(label) + " queue holds " + std::to_string(count) + " blocks, counted " +
                              std::to_string(q.size));
  };
  walk(uncached_, false, "free");
  walk(cached_, true, "cached");

  int32_t in_use = 0;
  size_t registered = 0;
  for (int32_t b = 0; b < num_blocks(); ++b) {
    const Block& blk = blocks_[b];
    if (blk.ref < 0) fail("block " + std::to_string(b) + " has negative ref");
    if (blk.ref > 0) ++in_use;
    if (blk.ref == 0 && !queued[b]) fail("free block " + std::to_string(b) + " is in no queue");
    if (blk.content_id == 0) continue;
    ++registered;
    if (blk.content_id >= next_content_id_) fail("block " + std::to_string(b) + " has an unissued content id");
    if (hash({blk.parent, blk.salt, blk.tokens}) != blk.key) fail("block " + std::to_string(b) + " has a stale key");
    auto [first, last] = by_key_.equal_range(blk.key);
    if (std::count_if(first, last, [&](const auto& kv) { return kv.second == b; }) != 1) {
      fail("registered block " + std::to_string(b) + " is not in the prefix table exactly once");
    }
  }
  if (registered != by_key_.size()) fail("prefix table holds entries of unregistered blocks");
  if (in_use + uncached_.size + cached_.size != num_blocks()) {
    fail("in use " + std::to_string(in_use) + " + free " + std::to_string(uncached_.size) + " + cached " +
         std::to_string(cached_.size) + " != total " + std::to_string(num_blocks()));
  }
}

}  // namespace paged
