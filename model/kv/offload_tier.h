// The CPU tier of the prefix cache: host blocks holding full device blocks that were evicted while cached, findable
// by the same content identity as on the device (model/kv/block_pool.h), least recently stored evicted first.
// Pure bookkeeping over a BlockPool: no KV data lives here. Not thread-safe: one owner (KvCacheManager).
//
// A tier block is in one of three states:
//   cached   registered, ref 0, in the pool's LRU queue: a demotion stored it (the device -> host copy is ordered
//            before the step that overwrites the device block);
//   held     unregistered, ref 1: a promotion took it (its host -> device copy is sent with the plan being made),
//            so no demotion of the same plan may overwrite it; settle() frees it when the next plan starts;
//   staged   unregistered, ref 1: a load from the disk tier fills it; fill() makes it cached, unstage() free;
//   free     unregistered, ref 0.
// Its blocks are the executors' host blocks [first_host_block, first_host_block + num_blocks): the tier has its own
// part of the host pool, after the swap space, so a swapped-out sequence never loses a block to it.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "model/kv/block_pool.h"

namespace paged {

class OffloadTier {
 public:
  /// Throws std::invalid_argument for a negative size or first host block.
  OffloadTier(int32_t num_blocks, int32_t first_host_block);

  int32_t num_blocks() const { return pool_.num_blocks(); }
  /// Blocks holding content (findable).
  int32_t num_cached() const { return pool_.num_cached_free(); }
  /// Blocks taken by promotions of the plan being made (freed by settle()).
  int32_t num_held() const { return static_cast<int32_t>(held_.size()); }
  /// Blocks staged for loads from the disk tier.
  int32_t num_staged() const { return static_cast<int32_t>(staged_.size()); }
  /// The executors' host block id of tier block `block`.
  int32_t host_block(int32_t block) const { return first_host_block_ + block; }
  /// True for a held or staged block.
  bool in_use(int32_t block) const { return pool_.ref_count(block) > 0; }
  /// Content id of a cached tier block, 0 for another.
  uint64_t content_id(int32_t block) const { return pool_.content_id(block); }

  /// The cached tier block holding exactly `content`, verified token by token. Pure query.
  std::optional<int32_t> find(const BlockContent& content) const { return pool_.find(content); }
  /// Stores evicted device content under its content id in a free tier block, or else in the least recently stored
  /// one, whose content is then dropped: written to `dropped` when given, and `*on_host` (when given) says whether
  /// its KV reached host memory in an earlier plan (stored before the last settle(), or filled), so that it can be
  /// saved before this plan's copies overwrite it (else its copy was never sent). nullopt and no change when every
  /// block is held or staged (or the tier has none). Throws std::logic_error if the content is here already.
  std::optional<int32_t> store(const EvictedContent& content, EvictedContent* dropped = nullptr,
                               bool* on_host = nullptr);
  // free -> cached (LRU tail); or cached (LRU head) -> dropped -> cached (LRU tail)
  /// A block for a load from the disk tier, taken as store() takes one (`dropped` and `on_host` likewise). nullopt
  /// when every block is held or staged.
  std::optional<int32_t> stage(EvictedContent* dropped = nullptr, bool* on_host = nullptr);  // free or cached -> staged
  /// The load into a staged block succeeded: it holds `content` under `content_id`, the most recently stored.
  void fill(int32_t block, const BlockContent& content, uint64_t content_id);  // staged -> cached (LRU tail)
  /// The load into a staged block failed.
  void unstage(int32_t block);  // staged -> free
  /// The cached block becomes the most recently stored. Throws std::logic_error unless it is cached.
  void touch(int32_t block);  // cached -> cached (LRU tail)
  /// A promotion: the cached block leaves the index and is held until settle(). Throws std::logic_error unless it
  /// is cached.
  void take(int32_t block);  // cached -> held
  /// The device computed the same content again (it is registered there now): the block leaves the index and is
  /// free at once. Throws std::logic_error unless it is cached.
  void discard(int32_t block);  // cached -> free
  /// A new plan begins: the blocks that earlier plans' promotions took are free (their copies were sent before).
  void settle();  // held -> free

  /// Cumulative number of cached blocks dropped to store others.
  int64_t num_dropped() const { return pool_.num_evicted(); }
  /// The pool's invariants, and every held or staged block in use exactly once and unregistered; throws
  /// std::logic_error.
  void check_invariants() const;

 private:
  BlockPool pool_;
  int32_t first_host_block_;
  // A block for new content, its dropped content reported as store() says.
  std::optional<int32_t> take_block(EvictedContent* dropped, bool* on_host);

  std::vector<int32_t> held_;
  std::vector<int32_t> staged_;
  std::vector<char> fresh_;  // per block: stored since the last settle() (its demotion copy is not sent yet)
};

}  // namespace paged
