// The disk tier's index: which blocks have a file (by restart-stable key, model/kv/kv_disk_file.h), least recently
// written or read first, bounded in blocks. Pure bookkeeping: the files are the executors'. Not thread-safe: one
// owner (KvCacheManager).
//
// A key is stored (findable) or loading (a load was ordered and has not been answered: not found again meanwhile).
// Unlike the memory tiers the disk tier is inclusive: a file stays when its block is loaded back, so that what a
// restart finds is what was there.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>
#include <utility>
#include <vector>

#include "model/types.h"

namespace paged {

/// An order for the disk tier's files, which every executor carries out on its own rank's files
/// (model/kv/kv_disk_file.h): save a host block's KV to the key's file, remove the file, or load it into a host
/// block (verified against the salt and tokens, answered with whether it succeeded).
struct DiskOrder {
  enum class Kind : uint8_t { save, remove, load };
  Kind kind = Kind::save;
  uint64_t key = 0;              // the block's chain key (BlockContent::chain)
  int32_t host_block = -1;       // save: the block whose KV is written; load: where the file's KV goes
  uint64_t salt = 0;             // save, load: the block's salt and tokens, kept in the file and checked
  std::vector<TokenId> tokens;
};

class DiskTier {
 public:
  /// At most `capacity` blocks (0: off). `existing` are the keys of the files found at start, least recently written
  /// first; those beyond the capacity are the first deletions of add() (use take_initial_deletions()).
  DiskTier(int64_t capacity, const std::vector<uint64_t>& existing);

  int64_t capacity() const { return capacity_; }
  /// Keys stored or loading.
  int64_t size() const { return static_cast<int64_t>(entries_.size()); }
  /// True if `key` is stored (a load may be ordered). Pure query.
  bool contains(uint64_t key) const;
  /// True if a load of `key` is ordered and not answered. Pure query.
  bool loading(uint64_t key) const;
  /// A file for `key` was written (or is, before any later order): `key` becomes the most recently used. Returns the
  /// least recently used stored keys that no longer fit, to delete. No-op (but the touch) for a stored key; call only
  /// for a key that is not loading.
  std::vector<uint64_t> add(uint64_t key);  // -> stored, most recent
  /// A load of the stored `key` is ordered. Throws std::logic_error unless it is stored.
  void begin_load(uint64_t key);  // stored -> loading
  /// The load of `key` was answered: `ok`, it is stored again (most recent); else the file is bad and the key is
  /// forgotten (delete it). Throws std::logic_error unless it is loading.
  void end_load(uint64_t key, bool ok);  // loading -> stored, or -> gone
  /// The keys found at start beyond the capacity, to delete (once).
  std::vector<uint64_t> take_initial_deletions() { return std::exchange(initial_deletions_, {}); }

  /// The LRU list, the loading set and the map agree and the capacity holds; throws std::logic_error.
  void check_invariants() const;

 private:
  struct Entry {
    bool loading = false;
    std::list<uint64_t>::iterator lru;  // valid while stored
  };
  std::vector<uint64_t> evict_over_capacity();

  int64_t capacity_;
  std::list<uint64_t> lru_;  // stored keys, least recently used first
  std::unordered_map<uint64_t, Entry> entries_;
  std::vector<uint64_t> initial_deletions_;
};

}  // namespace paged
