// One tier (device or CPU) of KV-cache blocks: ref counts, the free queues and the prefix-cache table of full blocks.
// Pure bookkeeping: no KV data lives here, only which block holds what. Not thread-safe: one owner.
//
// A block is in exactly one of three states:
//   in use      ref >= 1, referenced by block tables; may be registered in the prefix cache (then it is full, or
//               a planned step fills it: see KvCacheManager::register_planned);
//   free        ref == 0, not registered: kept in the uncached free queue (FIFO);
//   cached      ref == 0, registered: kept in the cached LRU queue, least recently freed at the head.
// Both queues are intrusive doubly-linked lists over the blocks' prev/next indices, so a cached block revived by a
// prefix hit leaves its queue in O(1). A new block comes from the uncached queue first; only when that is empty is
// the least recently freed cached block evicted (its registration dropped).
//
// Prefix-cache identity. A full block's content is (parent content id, salt, its token ids): the parent content id
// names the registered content of the previous block of the sequence (0 for the first block, whose salt carries
// cache_salt / LoRA id), and each registration gets a fresh content id that is never reused. The table is keyed by
// a 64-bit hash of that triple, but every lookup compares the stored parent id, salt and token ids, so a hash
// collision can never return a block whose content differs; and because parent ids are unique rather than hashes,
// a hit on block i means the whole prefix of i + 1 blocks matches token for token, not just block i.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/types.h"

namespace paged {

/// What a full block holds, as the prefix cache identifies it.
struct BlockContent {
  uint64_t parent = 0;                 // content id of the previous block; 0 for the first block of a sequence
  uint64_t salt = 0;                   // extra key of the first block (cache salt, LoRA id); 0 for the others
  std::span<const TokenId> tokens;     // the block's token ids (block_size of them)
  uint64_t chain = 0;                  // chain_hash of the whole prefix through this block: the disk tier's key,
                                       // stable across restarts (content ids are not); derived, never compared
};

/// One link of a chained hash over token blocks: `seed` (the previous link, or a first block's salt) and `extra`
/// mixed, then every token. The prefix table's keys and the disk tier's chain keys.
uint64_t chain_hash(uint64_t seed, uint64_t extra, std::span<const TokenId> tokens);

/// The registration a cached block lost when it was evicted: what another tier needs to keep finding it.
struct EvictedContent {
  uint64_t content_id = 0;
  uint64_t parent = 0;
  uint64_t salt = 0;
  std::vector<TokenId> tokens;
  uint64_t chain = 0;
  BlockContent view() const { return {parent, salt, tokens, chain}; }
};

class BlockPool {
 public:
  /// `name` prefixes invariant-violation messages ("device", "cpu").
  BlockPool(int32_t num_blocks, std::string name);

  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  /// Free blocks, cached ones included: how many allocate() calls can succeed.
  int32_t num_free() const { return uncached_.size + cached_.size; }
  /// Free blocks that still hold registered content (revivable by a prefix hit, evictable).
  int32_t num_cached_free() const { return cached_.size; }
  int32_t num_in_use() const { return num_blocks() - num_free(); }
  /// Cumulative number of cached blocks evicted to make room.
  int64_t num_evicted() const { return evicted_; }

  int32_t ref_count(int32_t block) const { return blocks_.at(block).ref; }
  /// Content id of a registered block, 0 if the block is not registered.
  uint64_t content_id(int32_t block) const { return blocks_.at(block).content_id; }
  /// BlockContent::chain of a registered block.
  uint64_t chain(int32_t block) const { return blocks_.at(block).chain; }
  /// A fresh content id, as register_content() issues them, for content registered later in another tier.
  uint64_t issue_content_id() { return next_content_id_++; }

  /// A block for new content. Call only if num_free() > 0. When it evicts a cached block and `evicted` is given, the
  /// lost registration is stored there (else `evicted` is left as it is).
  int32_t allocate(EvictedContent* evicted = nullptr);  // free -> in use (ref 1); or, when no uncached block is
                                                        // left: cached -> evicted -> in use (ref 1)
  /// Adds a reference to an in-use or cached block (a prefix hit or a fork).
  void retain(int32_t block);  // in use -> in use (ref += 1); cached -> in use (ref 1), O(1) revival
  /// A cached block becomes the most recently used (the LRU tail); an in-use block is left as it is.
  void touch(int32_t block);  // cached -> cached (LRU tail)
  /// Drops a reference. Call only for an in-use block.
  void release(int32_t block);  // in use -> in use (ref -= 1); at ref 0: registered -> cached (LRU tail), else -> free

  /// The registered block (in use or cached) holding exactly `content`, verified token by token. Pure query.
  std::optional<int32_t> find(const BlockContent& content) const;
  /// The content id of `content` once `block` (in use, just filled with it) holds it: the id of an already registered
  /// block with the same content if there is one (then `block` stays unregistered, a duplicate), else `block` is
  /// registered under a fresh id. Throws std::logic_error if `block` is registered with other content.
  uint64_t register_content(int32_t block, const BlockContent& content);  // in use -> in use (registered)
  /// Registers the in-use, unregistered `block` under `content_id`, issued for `content` by another tier's pool (a
  /// block moving between tiers keeps its id, so the chains of parent ids stay valid across tiers). Throws
  /// std::logic_error if the block is registered, free, or the content is registered here already.
  void adopt(int32_t block, const BlockContent& content, uint64_t content_id);  // in use -> in use (registered)
  /// Drops the registration of an in-use block whose content will not be written after all: it is no longer found,
  /// and goes to the uncached free queue at ref 0. Throws std::logic_error unless the block is in use and registered.
  void forget(int32_t block);  // in use (registered) -> in use

  /// Checks the queues, counts and prefix table against each other; throws std::logic_error naming the first
  /// violation. Ref counts against block tables are the owner's check.
  void check_invariants() const;

 private:
  struct Block {
    int32_t ref = 0;
    int32_t prev = -1;                 // free-queue neighbours while ref == 0
    int32_t next = -1;
    uint64_t content_id = 0;           // nonzero while registered
    uint64_t key = 0;                  // hash of (parent, salt, tokens) while registered
    uint64_t parent = 0;
    uint64_t salt = 0;
    uint64_t chain = 0;
    std::vector<TokenId> tokens;       // the registered content, for verification
  };
  struct Queue {
    int32_t head = -1;
    int32_t tail = -1;
    int32_t size = 0;
  };

  static uint64_t hash(const BlockContent& content);
  void push_back(Queue& q, int32_t block);
  void unlink(Queue& q, int32_t block);
  void unregister(int32_t block);
  // Registers the in-use, unregistered block under `content_id` (register_content and adopt).
  void store(int32_t block, const BlockContent& content, uint64_t content_id);
  bool matches(const Block& b, const BlockContent& content) const;

  std::string name_;
  std::vector<Block> blocks_;
  Queue uncached_;                     // free, unregistered (FIFO)
  Queue cached_;                       // free, registered (LRU: head = least recently freed)
  std::unordered_multimap<uint64_t, int32_t> by_key_;  // hash -> registered blocks (collisions share a bucket)
  uint64_t next_content_id_ = 1;
  int64_t evicted_ = 0;
};

}  // namespace paged
