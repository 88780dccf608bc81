// The KV-cache memory manager's bookkeeping: per-sequence block tables over a device and a CPU BlockPool, prefix
// caching of full blocks, copy-on-write forks and swap plans. Pure C++: no CAF, no CUDA, no KV data; it only says
// which block holds which tokens and returns the copy orders (src, dst) that an executor carries out.
// Not thread-safe: one owner (the memory-manager actor).
//
// Prefix-cache hits are verified token by token against the stored content of every block of the chain (see
// model/block_pool.h), so a 64-bit hash collision can never hand out wrong KV.
//
// Prefix sharing within a step (vLLM V1's rule): a full block enters the prefix cache when a step that computes it
// is planned (register_planned), not only once that step returned (mark_computed), so sequences admitted in the same
// step share the blocks of their common prefix. That is sound because a step writes the K/V of all its tokens in a
// layer before attention reads any (CPU and CUDA runners alike), and a block is findable only while the step that
// writes it runs before or with any reader: such a pending block is unregistered when its sequence is freed or
// swapped out before a step reported it computed (the scheduler makes a reader in the same step compute it when
// the writer's chunk was dropped: drop_ended_chunks in model/scheduling/scheduler_policy.h).
//
// The CPU tier (num_offload_blocks > 0, model/kv/offload_tier.h): a cached device block evicted to make room is
// demoted, stored in the tier under the same content id, with a (device block, host block) copy order; a prefix
// lookup that misses on the device tries the tier block by block, and a hit is promoted: a new device block, the
// content id moving with it, and a (host block, device block) copy order. A content id is registered in one tier
// at a time. take_tier_copies() hands the orders over; the executors must run the demotions before the promotions
// and both before the next step (the scheduler sends them with the plan's swap-outs and swap-ins).
//
// KV groups (group_windows, model/kv/kv_groups.h): a sequence has a block table per group, over the same positions,
// all taken from the one device pool; every operation on a sequence (allocate, reserve, mark_computed, fork, free,
// swap) applies to all of its groups at once, and what it needs is their sum. A group's blocks hold other layers' KV
// than another's for the same tokens, so the group's index is mixed into the prefix-cache salt, and a prefix hit is
// the shortest of the groups' hits. block_table(seq) is group 0's.
//
// Sliding windows (a group's window > 0: its layers slide): reserve() releases the group's blocks that no query of
// the sequence will read again, those wholly before first_write_pos - window + 1 that a returned step computed
// (ref -= 1, as free() does: a registered block stays in the prefix cache); their table entries become
// kReleasedBlock, always a prefix of the table. Such a group then holds about window + chunk tokens of blocks however
// long the sequence grows. allocate() does not take the cached prefix blocks before the window of its first query
// either, but only up to the window of the first pending block it shares: if that block's writer is dropped from the
// step, the new sequence's chunk restarts there (drop_ended_chunks) and reads from that window on. Swaps, forks and
// free() skip the released entries. Nor does a prefix hit need those blocks' KV: released blocks are the first that
// eviction takes, so the registrations that every tier has dropped are kept without KV (model/kv/lost_content.h), and a
// sliding group's prefix runs through them to the blocks of its window.
//
// The disk tier (num_disk_blocks > 0, model/kv/disk_tier.h) keeps what the CPU tier drops: a save order writes the
// dropped host block to the file of its chain key before anything overwrites it. A waiting sequence whose prefix
// continues on disk is not admitted: load_from_disk orders loads into CPU-tier blocks (staged), and once the
// executors answered, finish_load makes each loaded block a CPU-tier block (or, for a bad file, a miss), from which
// the next plan promotes it as any other.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "model/kv/block_pool.h"
#include "model/kv/disk_tier.h"
#include "model/kv/kv_groups.h"
#include "model/kv/kv_snapshot.h"
#include "model/kv/lost_content.h"
#include "model/kv/offload_tier.h"
#include "model/types.h"

namespace paged {

struct KvCacheOptions {
  int block_size = 16;                 // tokens per block
  int num_device_blocks = 0;
  int num_cpu_blocks = 0;              // swap space: host blocks [0, num_cpu_blocks)
  int num_offload_blocks = 0;          // CPU tier of evicted prefix blocks: host blocks after the swap space
  int64_t num_disk_blocks = 0;         // disk tier of blocks the CPU tier drops (needs the CPU tier)
  std::vector<uint64_t> disk_keys;     // the disk tier's files found at start, least recently written first
  bool enable_prefix_caching = true;
  std::vector<int> group_windows = {0};  // one per KV group (KvGroups::windows): > 0 releases the group's blocks
                                       // before the window (see above); 0 keeps every block
  double watermark = 0.01;             // fraction of device blocks kept free when admitting (allocate, swap-in)
};

struct KvMetrics {
  int64_t device_total = 0;
  int64_t device_free = 0;             // includes cached-free blocks
  int64_t device_cached = 0;           // free blocks still holding registered content
  int64_t cpu_total = 0;
  int64_t cpu_free = 0;
  int64_t prefix_hit_tokens = 0;       // cumulative: tokens allocate() found cached, in any tier
  int64_t offload_total = 0;           // CPU-tier blocks
  int64_t offload_cached = 0;          // CPU-tier blocks holding content
  int64_t offload_query_tokens = 0;    // cumulative: tokens allocate() looked up in the CPU tier (device misses)
  int64_t offload_hit_tokens = 0;      // cumulative: of those, tokens found there (promoted)
  int64_t offloaded_blocks = 0;        // cumulative: device blocks demoted to the CPU tier
  int64_t disk_total = 0;              // disk-tier capacity, blocks
  int64_t disk_stored = 0;             // disk-tier files (stored or loading)
  int64_t disk_query_tokens = 0;       // cumulative: tokens looked up on disk (memory-tier misses)
  int64_t disk_hit_tokens = 0;         // cumulative: tokens loaded from disk into the CPU tier
  int64_t disk_saved_blocks = 0;       // cumulative: CPU-tier blocks written to disk
  int64_t swapped_out_blocks = 0;      // cumulative
  int64_t swapped_in_blocks = 0;       // cumulative
  int64_t evicted_blocks = 0;          // cumulative: cached device blocks evicted to make room
  int64_t reserved_slots = 0;          // in-use device blocks * block_size (shared blocks once)
  int64_t used_slots = 0;              // slots of in-use device blocks holding computed KV or KV that a planned step
                                       // writes into a block registered for it (register_planned); shared blocks once
  /// (reserved - used) / reserved; 0 if nothing is reserved.
  double kv_waste() const;
};

class KvCacheManager {
 public:
  /// Throws std::invalid_argument for a non-positive block size, negative pool sizes, a watermark outside [0, 1), no
  /// group or a negative window.
  explicit KvCacheManager(KvCacheOptions options);

  /// Leading tokens of `tokens` whose KV sits in cached full blocks of every group: a multiple of block_size, always
  /// < tokens.size() so that at least one token is computed (0 for empty tokens or caching off). `salt` is mixed
  /// into the first block's key (cache_salt / LoRA id). Pure query.
  int cached_prefix_tokens(std::span<const TokenId> tokens, uint64_t salt = 0) const;
  /// True if allocate() with these arguments would succeed and leave the watermark free.
  bool can_allocate(std::span<const TokenId> tokens, int num_tokens_to_hold, uint64_t salt = 0) const;
  /// False if a sequence holding `num_tokens_to_hold` tokens does not fit even in an empty device pool above the
  /// watermark: it would wait forever, so the scheduler should reject it. With sliding windows, what it holds at
  /// most in chunks of at most `max_chunk` tokens (most_blocks_held).
  bool could_ever_allocate(int num_tokens_to_hold, int max_chunk = 0) const;
  /// First allocation of a new sequence: takes the cached prefix blocks (ref += 1, or revived from the cached queue),
  /// then new blocks so that the table holds max(num_tokens_to_hold, cached prefix) tokens. Returns the cached prefix
  /// tokens (they need no computation; num_computed starts there); nullopt and no change if blocks run out. Does not
  /// enforce the watermark (can_allocate does). Throws std::logic_error if the id is already known.
  std::optional<int> allocate(SeqId seq, std::span<const TokenId> tokens, int num_tokens_to_hold, uint64_t salt = 0);
  /// What admit() did: the cached prefix tokens (allocate()'s result) and the tokens the tables now hold.
  struct Admission {
    int cached = 0;
    int held = 0;
  };
  /// A waiting sequence's admission with one lookup of its prefix: cached_prefix_tokens, then can_allocate and
  /// allocate for that prefix plus min(num_tokens - cached, budget) tokens, as those three calls would do in turn.
  /// nullopt and no change when it would cross the watermark.
  std::optional<Admission> admit(SeqId seq, std::span<const TokenId> tokens, int num_tokens, int budget,
                                 uint64_t salt = 0);
  /// Grows the table to hold `num_tokens_to_hold` tokens and copy-on-writes every shared (ref > 1) block in the
  /// write range [first_write_pos, num_tokens_to_hold): each gets a new block, and the one holding first_write_pos
  /// gets a copy order (src, dst) appended to `copies` when it has slots before first_write_pos to keep. Returns
  /// false and changes nothing if blocks run out. Call with first_write_pos >= num_computed(seq), on a device seq.
  /// With a sliding window it then releases the computed blocks wholly before first_write_pos - window + 1.
  bool reserve(SeqId seq, int first_write_pos, int num_tokens_to_hold, std::vector<BlockPair>& copies);
  /// True if reserve() with these arguments would succeed.
  bool can_reserve(SeqId seq, int first_write_pos, int num_tokens_to_hold) const;
  /// One reserve() call's arguments.
  struct Reservation {
    SeqId seq = 0;
    int first_write_pos = 0;
    int num_tokens_to_hold = 0;
  };
  /// True if reserve() would succeed for each of `reservations` made in turn: a block they share is copied by each of
  /// its writers but the last one left holding it, and a sliding window's releases free blocks for the later ones.
  bool can_reserve_all(std::span<const Reservation> reservations) const;
  /// The sequence's KV now holds tokens[0, num_computed) (num_computed never decreases and fits the table): every
  /// block that became full is registered for prefix caching (when enabled and its content is not cached yet), and
  /// the used-slot accounting follows.
  /// `tokens` holds the sequence's tokens from position `tokens_offset` on (a multiple of block_size, at most the
  /// start of the first block not registered yet), so a caller can send only the tail.
  void mark_computed(SeqId seq, std::span<const TokenId> tokens, int num_computed, int tokens_offset = 0);
  /// Registers now, before their KV exists, the full blocks of tokens[0, planned_end) that the step being planned
  /// computes for the device sequence (from its first block without a content id on): a sequence allocated after
  /// this call finds them and its chunk starts after them. `tokens` holds the sequence's tokens from position 0.
  /// Such a block is pending until mark_computed covers it; free() or swap_out() before that unregisters it. Counts
  /// the blocks as used slots. No-op with caching off. Throws std::invalid_argument if the table does not reach
  /// planned_end.
  void register_planned(SeqId seq, std::span<const TokenId> tokens, int planned_end);
  /// A new sequence `child` sharing every block of the device sequence `parent` (ref += 1 each), with its computed
  /// length and salt.
  void fork(SeqId parent, SeqId child);
  /// Releases the sequence's blocks (ref -= 1; at 0 registered blocks go to the cached LRU tail, the sequence's last
  /// block first so that prefixes outlive their tails, others to the free queue), its pending blocks unregistered
  /// first (see register_planned). Unknown ids are ignored.
  void free(SeqId seq);
  /// Moves device sequences to the CPU tier together: returns (device block, cpu block) pairs for the executor to
  /// copy, one per distinct block, and releases the device blocks. A block that several of `seqs` share (forks: beams,
  /// n > 1) gets one CPU block, shared as it was; a block they share with a sequence not swapped is copied and stays
  /// on the device with it. Their pending blocks are unregistered (see register_planned). nullopt and no change if
  /// the CPU pool lacks room.
  std::optional<std::vector<BlockPair>> swap_out(std::span<const SeqId> seqs);
  std::optional<std::vector<BlockPair>> swap_out(SeqId seq) { return swap_out(std::span(&seq, 1)); }
  /// True if swap_in() would succeed and leave the watermark free.
  bool can_swap_in(std::span<const SeqId> seqs) const;
  bool can_swap_in(SeqId seq) const { return can_swap_in(std::span(&seq, 1)); }
  /// Moves swapped sequences back together: returns (cpu block, device block) pairs to copy, one per distinct CPU
  /// block, and releases their CPU blocks. The sequences that shared a CPU block share its new device block; the
  /// new blocks are not registered in the prefix cache. nullopt and no change if device blocks run out (the
  /// watermark is can_swap_in's business).
  std::optional<std::vector<BlockPair>> swap_in(std::span<const SeqId> seqs);
  std::optional<std::vector<BlockPair>> swap_in(SeqId seq) { return swap_in(std::span(&seq, 1)); }
  bool is_swapped(SeqId seq) const;
  /// True while the sequence holds blocks (on either tier).
  bool contains(SeqId seq) const { return seqs_.count({seq, 0}) != 0; }

  /// The CPU tier's copy orders since the last call, in host block ids: demotions (device -> host, to run before
  /// the next step overwrites the device blocks) and promotions (host -> device, before the next step reads them).
  /// Starts a new plan for the tier: blocks that earlier promotions took may be overwritten from now on.
  /// The disk tier's orders come with them: `disk_writes` (saves and removals, in order) run before the
  /// demotions, `disk_loads` after the promotions, and their answers go to finish_load.
  struct TierCopies {
    std::vector<BlockPair> demotions;
    std::vector<BlockPair> promotions;
    std::vector<DiskOrder> disk_writes;
    std::vector<DiskOrder> disk_loads;
  };
  TierCopies take_tier_copies();
  /// For a waiting sequence: orders loads of the blocks on disk that follow the memory tiers' cached prefix of
  /// `tokens` (as allocate() would look it up), each into a staged CPU-tier block. True if the sequence should wait:
  /// loads were ordered, or one is pending for its next block. No-op without a disk tier.
  bool load_from_disk(std::span<const TokenId> tokens, uint64_t salt = 0);
  /// The executors answered the load of `key`: `ok`, the block joins the CPU tier (unless its content reached a
  /// memory tier meanwhile); else the file is bad: a miss, removed. Throws std::logic_error for a key not loading.
  void finish_load(uint64_t key, bool ok);

  /// Device block ids of a sequence that is not swapped (kReleasedBlock for the released ones), in KV group `group`.
  /// Throws std::out_of_range / std::logic_error otherwise.
  const std::vector<int32_t>& block_table(SeqId seq, int group = 0) const;
  int num_groups() const { return static_cast<int>(windows_.size()); }
  int num_computed(SeqId seq) const;
  KvMetrics metrics() const;
  /// Every block of every tier as a cell (model/kv/kv_snapshot.h) and the sequences holding blocks: the device pool,
  /// the swap pool (when it has blocks), the CPU and disk tiers (when enabled). One pass over the blocks and the
  /// block tables. Pure query.
  KvSnapshot snapshot() const;
  int block_size() const { return block_size_; }

  /// Debug check (tests): each pool's own invariants; no content id registered in two tiers; ref counts equal block-table references per tier; no block
  /// both free and in use; free + cached + in use = total per tier; the used-slot accounting. Throws
  /// std::logic_error describing the first violation.
  void check_invariants() const;

 private:
  // One KV group of a sequence.
  struct Sequence {
    std::vector<int32_t> blocks;       // device block ids, or CPU block ids while swapped
    std::vector<uint64_t> content_ids; // content id of each registered-or-duplicate full block, a prefix of blocks;
                                       // those from num_computed / block_size on are pending (register_planned)
    std::vector<uint64_t> chains;      // BlockContent::chain of each of them
    int num_computed = 0;              // tokens whose KV a returned step wrote (the scheduler plans ahead of it)
    int released = 0;                  // blocks[0, released) are kReleasedBlock (sliding window)
    uint64_t salt = 0;                 // the sequence's salt mixed with the group
    int window = 0;                    // the group's
    bool swapped = false;
  };
  struct GroupKey {
    SeqId seq = 0;
    int group = 0;
    bool operator==(const GroupKey&) const = default;
  };
  struct GroupKeyHash {
    size_t operator()(const GroupKey& k) const {
      return std::hash<uint64_t>{}(k.seq * 31 + static_cast<uint64_t>(k.group));
    }
  };

  int blocks_for(int num_tokens) const { return (num_tokens + block_size_ - 1) / block_size_; }
  // Blocks the group holds (its table without the released entries), and all groups of a sequence.
  static int held_blocks(const Sequence& s) { return static_cast<int>(s.blocks.size()) - s.released; }
  int held_blocks(SeqId seq) const;
  // Distinct blocks the sequences' tables hold (every group; the sequences are on one tier).
  int distinct_blocks(std::span<const SeqId> seqs) const;
  // reserve() and mark_computed() of one group.
  void reserve_group(Sequence& s, int first_write_pos, int num_tokens_to_hold, std::vector<BlockPair>& copies);
  void mark_group_computed(SeqId seq, Sequence& s, std::span<const TokenId> tokens, int num_computed,
                           int tokens_offset);
  // load_from_disk() of one group, salted with it; `sliding`: the group has a window (no load of its lost blocks).
  bool load_group_from_disk(std::span<const TokenId> tokens, uint64_t salt, bool sliding);
  // The prefix-cache salt of group `group` of a sequence salted `salt`.
  static uint64_t group_salt(uint64_t salt, int group);
  // Releases the device sequence's computed blocks wholly before the window of queries from `first_write_pos` on.
  void release_before_window(Sequence& s, int first_write_pos);
  int computed_in(const Sequence& s, size_t index) const;
  // Slots of the sequence's block `index` that hold KV or that a planned step fills: full for a block with a content
  // id, else computed_in.
  int held_in(const Sequence& s, size_t index) const;
  // Unregisters the sequence's pending blocks that it registered itself and drops their content ids.
  void forget_pending(Sequence& s);
  // Registers the sequence's next full block (index content_ids.size()), holding `block_tokens`, or records the
  // content id of the block already holding that content.
  void register_next(Sequence& s, std::span<const TokenId> block_tokens);
  // A block of a cached prefix: a device block, a CPU-tier block to promote, or (lost_id != 0) a lost block, a link of
  // the chain whose KV no tier holds (a sliding group's, before the window).
  struct PrefixBlock {
    int32_t block = 0;
    bool offloaded = false;
    uint64_t lost_id = 0;  // its content id in lost_
  };
  // The cached blocks of the longest verified prefix of `tokens`, at most (tokens.size() - 1) / B of them, each
  // looked up on the device first, then in the CPU tier; with `through_lost`, then in lost_ (the prefix never ends
  // with a lost block).
  std::vector<PrefixBlock> cached_prefix(std::span<const TokenId> tokens, uint64_t salt,
                                         bool through_lost = false) const;
  // Each group's cached prefix of `tokens`, cut to one length: the longest at which every group holds every block
  // from its first unreleased one (released_in) on - all of them in a group without a window.
  std::vector<std::vector<PrefixBlock>> group_prefixes(std::span<const TokenId> tokens, uint64_t salt) const;
  // Where the groups' cached prefixes (cut to one length) have their first block still pending (register_planned)
  // in any group, or their end: a chunk of the sequence may restart there (drop_ended_chunks).
  size_t first_pending(const std::vector<std::vector<PrefixBlock>>& prefixes) const;
  // The leading blocks of a cached prefix that allocate() leaves released in a group of window `window`: those before
  // the window of `first_pending`'s block.
  size_t released_in(size_t first_pending, int window) const;
  // Device blocks allocate() would take from the free queues for all groups: cached prefix blocks to revive, CPU-tier
  // blocks to promote (but for the released ones), plus new blocks.
  int blocks_needed(const std::vector<std::vector<PrefixBlock>>& prefixes, int num_tokens_to_hold) const;
  // allocate() with the groups' prefixes already looked up.
  std::optional<int> allocate_prefixes(SeqId seq, std::span<const TokenId> tokens,
                                       const std::vector<std::vector<PrefixBlock>>& prefixes, int num_tokens_to_hold,
                                       uint64_t salt);
  // allocate()'s first part for one group: the released entries, the device prefix blocks taken (so that no new
  // block taken after can evict them) and the tier's held (so that no demotion overwrites them).
  Sequence take_prefix(const std::vector<PrefixBlock>& prefix, size_t released, std::span<const TokenId> tokens,
                       int group, uint64_t salt);
  // Its second part: the tier's blocks promoted into new device blocks, then the new blocks up to the hold.
  void take_rest(Sequence& s, const std::vector<PrefixBlock>& prefix, std::span<const TokenId> tokens,
                 int num_tokens_to_hold);
  // Stores the content a device block lost to eviction in the CPU tier, with its copy order.
  void demote(int32_t device_block, const EvictedContent& content);
  // Drops the demotion ordered into `tier_block` in the plan being made, if any: the tier gave the block again (its
  // content dropped before the copy ran; two copies may not fill one block).
  void cancel_demotion(int32_t tier_block);
  // What the CPU tier dropped from `tier_block`: kept as lost, and saved to the disk tier if its KV is `on_host`.
  void drop_from_tier(int32_t tier_block, const EvictedContent& content, bool on_host);
  // Orders the save of the content the CPU tier dropped from `tier_block` (its KV still there), and the removals
  // of the files that no longer fit.
  void save_to_disk(int32_t tier_block, const EvictedContent& content);
  // BlockContent::chain of the block after those of `chains` (a sequence's first block: salted).
  static uint64_t next_chain(const std::vector<uint64_t>& chains, uint64_t salt, std::span<const TokenId> block_tokens);
  // BlockContent::chain of the first `n` full blocks of `tokens`.
  std::vector<uint64_t> chains_of(std::span<const TokenId> tokens, uint64_t salt, size_t n) const;
  // A load ordered and not answered: the staged tier block and what it will hold.
  struct PendingLoad {
    int32_t tier_block = 0;
    EvictedContent content;
  };
  // Group `group` of the sequence, which must be known and on the device: throws std::out_of_range /
  // std::logic_error otherwise.
  const Sequence& device_seq(SeqId seq, int group = 0) const;
  Sequence& device_seq(SeqId seq, int group = 0);
  // Group `group` of a known sequence (std::out_of_range otherwise).
  const Sequence& group_seq(SeqId seq, int group) const;
  bool above_watermark(int blocks_needed) const;
  // Device-block references with used-slot accounting; `filled` = slots of the block holding computed KV.
  int32_t take_new(int filled);                  // free/cached -> in use (ref 1)
  void take_shared(int32_t block, int filled);   // in use -> ref += 1; cached -> in use (ref 1)
  void drop(int32_t block);                      // ref -= 1; at 0 -> cached or free

  int block_size_;
  bool prefix_caching_;
  std::vector<int> windows_;           // group_windows
  int watermark_blocks_;
  BlockPool device_;
  BlockPool cpu_;
  OffloadTier offload_;
  DiskTier disk_;
  LostContent lost_;                   // with a sliding group: registrations no tier holds, the chains' links
  TierCopies tier_copies_;             // orders of the plan being made (take_tier_copies)
  std::vector<int32_t> demotion_of_;   // per CPU-tier block: its demotion in tier_copies_, or -1
  std::unordered_map<uint64_t, PendingLoad> pending_loads_;  // by chain key
  std::vector<int32_t> filled_;        // per device block: computed slots while in use, else 0
  std::vector<uint8_t> pending_;       // per device block: registered by register_planned, its writer not returned
  std::unordered_map<GroupKey, Sequence, GroupKeyHash> seqs_;  // every group of every sequence
  int64_t used_slots_ = 0;
  int64_t prefix_hit_tokens_ = 0;
  int64_t swapped_out_blocks_ = 0;
  int64_t swapped_in_blocks_ = 0;
  int64_t offload_query_tokens_ = 0;
  int64_t offload_hit_tokens_ = 0;
  int64_t offloaded_blocks_ = 0;
  int64_t disk_query_tokens_ = 0;
  int64_t disk_hit_tokens_ = 0;
  int64_t disk_saved_blocks_ = 0;
};

}  // namespace paged
