#include "model/kv/kv_cache_manager.h"

#include "model/hash_mix.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace paged {

namespace {

constexpr uint64_t kChainSeed = 0x70616765644b5631ULL;  // the first link of every chain key
constexpr uint64_t kGroupSeed = 0x6b7667726f757073ULL;  // mixed into the salt of a KV group's chain keys

}  // namespace

double KvMetrics::kv_waste() const {
  return reserved_slots > 0 ? static_cast<double>(reserved_slots - used_slots) / static_cast<double>(reserved_slots)
                            : 0.0;
}

KvCacheManager::KvCacheManager(KvCacheOptions options)
    : block_size_(options.block_size),
      prefix_caching_(options.enable_prefix_caching),
      windows_(options.group_windows),
      watermark_blocks_(static_cast<int>(options.watermark * options.num_device_blocks)),
      device_(options.num_device_blocks, "device"),
      cpu_(options.num_cpu_blocks, "cpu"),
      offload_(options.num_offload_blocks, options.num_cpu_blocks),
      disk_(options.num_offload_blocks > 0 ? options.num_disk_blocks : 0, options.disk_keys),
      // As many lost registrations as the memory tiers hold blocks, where a group slides (elsewhere a lost block
      // ends every prefix through it anyway).
      lost_(options.enable_prefix_caching &&
                    std::any_of(options.group_windows.begin(), options.group_windows.end(), [](int w) { return w > 0; })
                ? static_cast<size_t>(std::max(options.num_device_blocks, 0) + std::max(options.num_offload_blocks, 0))
                : 0),
      demotion_of_(std::max(options.num_offload_blocks, 0), -1),
      filled_(std::max(options.num_device_blocks, 0), 0),
      pending_(std::max(options.num_device_blocks, 0), 0) {
  if (options.block_size <= 0) throw std::invalid_argument("block_size must be positive");
  if (options.watermark < 0.0 || options.watermark >= 1.0) throw std::invalid_argument("watermark must be in [0, 1)");
  if (windows_.empty()) throw std::invalid_argument("a KV cache needs a group");
  if (std::any_of(windows_.begin(), windows_.end(), [](int w) { return w < 0; }))
    throw std::invalid_argument("a KV group's window must be >= 0");
  if (options.num_disk_blocks > 0 && options.num_offload_blocks <= 0)
    throw std::invalid_argument("the disk tier keeps what the CPU tier drops: it needs the CPU tier");
  for (uint64_t key : disk_.take_initial_deletions())
    tier_copies_.disk_writes.push_back({DiskOrder::Kind::remove, key, -1, 0, {}});
}

uint64_t KvCacheManager::next_chain(const std::vector<uint64_t>& chains, uint64_t salt,
                                    std::span<const TokenId> block_tokens) {
  return chain_hash(chains.empty() ? kChainSeed : chains.back(), chains.empty() ? salt : 0, block_tokens);
}

std::vector<uint64_t> KvCacheManager::chains_of(std::span<const TokenId> tokens, uint64_t salt, size_t n) const {
  std::vector<uint64_t> chains;
  chains.reserve(n);
  for (size_t i = 0; i < n; ++i) chains.push_back(next_chain(chains, salt, tokens.subspan(i * block_size_, block_size_)));
  return chains;
}

int KvCacheManager::computed_in(const Sequence& s, size_t index) const {
  return std::clamp(s.num_computed - static_cast<int>(index) * block_size_, 0, block_size_);
}

int KvCacheManager::held_in(const Sequence& s, size_t index) const {
  return index < s.content_ids.size() ? block_size_ : computed_in(s, index);
}

uint64_t KvCacheManager::group_salt(uint64_t salt, int group) {
  // Mixed twice: hash_mix(salt, group) alone collides across neighbouring salts (hash_mix(0, 2) == hash_mix(1, 1)).
  return group == 0 ? salt : hash_mix(hash_mix(salt, kGroupSeed), static_cast<uint64_t>(group));
}

const KvCacheManager::Sequence& KvCacheManager::group_seq(SeqId seq, int group) const {
  auto it = seqs_.find({seq, group});
  if (it == seqs_.end()) throw std::out_of_range("unknown sequence " + std::to_string(seq));
  return it->second;
}

const KvCacheManager::Sequence& KvCacheManager::device_seq(SeqId seq, int group) const {
  const Sequence& s = group_seq(seq, group);
  if (s.swapped) throw std::logic_error("sequence " + std::to_string(seq) + " is swapped out");
  return s;
}

KvCacheManager::Sequence& KvCacheManager::device_seq(SeqId seq, int group) {
  return const_cast<Sequence&>(std::as_const(*this).device_seq(seq, group));
}

bool KvCacheManager::above_watermark(int blocks_needed) const {
  return device_.num_free() - blocks_needed >= watermark_blocks_;
}

int32_t KvCacheManager::take_new(int filled) {
  EvictedContent evicted;
  int32_t block = device_.allocate(offload_.num_blocks() > 0 || lost_.capacity() > 0 ? &evicted : nullptr);
  if (evicted.content_id != 0) {
    if (offload_.num_blocks() > 0)
      demote(block, evicted);
    else
      lost_.add(evicted);
  }
  filled_[block] = filled;
  used_slots_ += filled;
  return block;
}

void KvCacheManager::demote(int32_t device_block, const EvictedContent& content) {
  EvictedContent dropped;
  bool on_host = false;
  // nullopt: every tier block is held or staged, the content is lost
  if (auto tier_block = offload_.store(content, &dropped, &on_host)) {
    if (dropped.content_id != 0) drop_from_tier(*tier_block, dropped, on_host);  // before the demotion overwrites it
    cancel_demotion(*tier_block);
    demotion_of_[*tier_block] = static_cast<int32_t>(tier_copies_.demotions.size());
    tier_copies_.demotions.emplace_back(device_block, offload_.host_block(*tier_block));
    ++offloaded_blocks_;
  } else {
    lost_.add(content);
  }
}

void KvCacheManager::cancel_demotion(int32_t tier_block) {
  int32_t& order = demotion_of_[tier_block];
  if (order >= 0) tier_copies_.demotions[order].first = -1;  // removed by take_tier_copies
  order = -1;
}

void KvCacheManager::drop_from_tier(int32_t tier_block, const EvictedContent& content, bool on_host) {
  lost_.add(content);
  if (on_host && disk_.capacity() > 0) save_to_disk(tier_block, content);
}

void KvCacheManager::save_to_disk(int32_t tier_block, const EvictedContent& content) {
  if (disk_.loading(content.chain)) return;  // its file is there, being read
  if (!disk_.contains(content.chain)) {
    tier_copies_.disk_writes.push_back(
        {DiskOrder::Kind::save, content.chain, offload_.host_block(tier_block), content.salt, content.tokens});
    ++disk_saved_blocks_;
  }
  for (uint64_t gone : disk_.add(content.chain))  // least recently used files beyond the size
    tier_copies_.disk_writes.push_back({DiskOrder::Kind::remove, gone, -1, 0, {}});
}

bool KvCacheManager::load_from_disk(std::span<const TokenId> tokens, uint64_t sequence_salt) {
  if (!prefix_caching_ || disk_.capacity() == 0 || tokens.empty()) return false;
  bool wait = false;
  for (int g = 0; g < num_groups(); ++g)
    wait = load_group_from_disk(tokens, group_salt(sequence_salt, g), windows_[g] > 0) || wait;
  return wait;
}

bool KvCacheManager::load_group_from_disk(std::span<const TokenId> tokens, uint64_t salt, bool sliding) {
  // A sliding group needs no KV of its lost blocks (those before the window): loads start after the last block a
  // memory tier holds.
  const std::vector<PrefixBlock> prefix = cached_prefix(tokens, salt, sliding);
  const size_t max_blocks = (tokens.size() - 1) / block_size_;
  if (prefix.size() >= max_blocks) return false;
  const std::vector<uint64_t> chains = chains_of(tokens, salt, max_blocks);
  uint64_t parent = 0;
  if (!prefix.empty()) {
    const PrefixBlock& last = prefix.back();
    parent = last.offloaded ? offload_.content_id(last.block) : device_.content_id(last.block);
  }
  // The prefix's tier blocks become the most recent, and the loads never take so many blocks that staging drops
  // them: the loaded blocks' parents stay findable.
  int loads_left = offload_.num_blocks() - offload_.num_held() - offload_.num_staged();
  for (const PrefixBlock& p : prefix) {
    if (!p.offloaded) continue;
    offload_.touch(p.block);
    --loads_left;
  }
  bool wait = false;
  for (size_t i = prefix.size(); i < max_blocks && loads_left > 0; ++i, --loads_left) {
    if (disk_.loading(chains[i])) return true;  // ordered for another sequence: wait for it
    disk_query_tokens_ += block_size_;
    if (!disk_.contains(chains[i])) break;
    disk_.begin_load(chains[i]);  // first: the save below may make room on disk, never by removing this file
    EvictedContent dropped;
    bool on_host = false;
    const std::optional<int32_t> staged = offload_.stage(&dropped, &on_host);  // free or cached -> staged
    if (!staged) {
      disk_.end_load(chains[i], true);  // not loaded after all: stored as before
      break;
    }
    if (dropped.content_id != 0) drop_from_tier(*staged, dropped, on_host);  // before the load overwrites it
    cancel_demotion(*staged);
    const std::span<const TokenId> block_tokens = tokens.subspan(i * block_size_, block_size_);
    const uint64_t block_salt = i == 0 ? salt : 0;
    // Lost content loaded back takes its old id, as content computed again does (register_next).
    const std::optional<uint64_t> lost_id = lost_.take({parent, block_salt, block_tokens});
    const uint64_t id = lost_id ? *lost_id : device_.issue_content_id();
    pending_loads_[chains[i]] = {
        *staged, {id, parent, block_salt, std::vector<TokenId>(block_tokens.begin(), block_tokens.end()), chains[i]}};
    tier_copies_.disk_loads.push_back({DiskOrder::Kind::load, chains[i], offload_.host_block(*staged), block_salt,
                                       std::vector<TokenId>(block_tokens.begin(), block_tokens.end())});
    parent = id;
    wait = true;
  }
  return wait;
}

void KvCacheManager::finish_load(uint64_t key, bool ok) {
  auto it = pending_loads_.find(key);
  if (it == pending_loads_.end()) throw std::logic_error("finish_load(): no load of key " + std::to_string(key));
  const PendingLoad load = std::move(it->second);
  pending_loads_.erase(it);
  disk_.end_load(key, ok);  // ok: stored again; else forgotten
  const BlockContent content = load.content.view();
  if (ok && !device_.find(content) && !offload_.find(content)) {  // one memory tier at a time
    offload_.fill(load.tier_block, content, load.content.content_id);  // staged -> cached
    disk_hit_tokens_ += block_size_;
    return;
  }
  offload_.unstage(load.tier_block);  // staged -> free
  if (!ok) tier_copies_.disk_writes.push_back({DiskOrder::Kind::remove, key, -1, 0, {}});  // a bad file: gone
}

KvCacheManager::TierCopies KvCacheManager::take_tier_copies() {
  offload_.settle();
  std::erase_if(tier_copies_.demotions, [](const BlockPair& p) { return p.first < 0; });
  std::fill(demotion_of_.begin(), demotion_of_.end(), -1);
  return std::exchange(tier_copies_, TierCopies{});
}

void KvCacheManager::take_shared(int32_t block, int filled) {
  if (device_.ref_count(block) == 0) {  // revived from the cached queue; an in-use block keeps its count
    filled_[block] = filled;
    used_slots_ += filled;
  }
  device_.retain(block);
}

void KvCacheManager::drop(int32_t block) {
  if (device_.ref_count(block) == 1) {
    used_slots_ -= filled_[block];
    filled_[block] = 0;
  }
  device_.release(block);
}

std::vector<KvCacheManager::PrefixBlock> KvCacheManager::cached_prefix(std::span<const TokenId> tokens,
                                                                       uint64_t salt, bool through_lost) const {
  std::vector<PrefixBlock> prefix;
  if (!prefix_caching_ || tokens.empty()) return prefix;
  const size_t max_blocks = (tokens.size() - 1) / block_size_;
  uint64_t parent = 0;
  for (size_t i = 0; i < max_blocks; ++i) {
    const BlockContent content{parent, i == 0 ? salt : 0, tokens.subspan(i * block_size_, block_size_)};
    if (auto block = device_.find(content)) {
      prefix.push_back({*block, false});
      parent = device_.content_id(*block);
    } else if (auto tier_block = offload_.find(content)) {
      prefix.push_back({*tier_block, true});
      parent = offload_.content_id(*tier_block);
    } else if (auto lost_id = through_lost ? lost_.find(content) : std::nullopt) {
      prefix.push_back({-1, false, *lost_id});
      parent = *lost_id;
    } else {
      break;  // the chain stops at the first miss
    }
  }
  while (!prefix.empty() && prefix.back().lost_id != 0) prefix.pop_back();
  return prefix;
}

std::vector<std::vector<KvCacheManager::PrefixBlock>> KvCacheManager::group_prefixes(std::span<const TokenId> tokens,
                                                                                     uint64_t salt) const {
  std::vector<std::vector<PrefixBlock>> prefixes;
  size_t hit = SIZE_MAX;
  for (int g = 0; g < num_groups(); ++g) {
    prefixes.push_back(cached_prefix(tokens, group_salt(salt, g), windows_[g] > 0));
    hit = std::min(hit, prefixes.back().size());
  }
  for (auto& p : prefixes) p.resize(hit);
  // A sliding group's lost blocks must lie before the blocks it takes (released_in): a hit ends before any lost block
  // it would take, which may move the first pending block and so the released ones; each round shortens it.
  const size_t pending = first_pending(prefixes);
  for (bool shortened = true; shortened;) {
    shortened = false;
    for (int g = 0; g < num_groups() && !shortened; ++g) {
      const size_t from = released_in(std::min(pending, hit), windows_[g]);
      for (size_t i = hit; i-- > from;)
        if (prefixes[g][i].lost_id != 0) {
          hit = i;
          shortened = true;
          break;
        }
    }
  }
  for (auto& p : prefixes) p.resize(hit);
  return prefixes;
}

int KvCacheManager::cached_prefix_tokens(std::span<const TokenId> tokens, uint64_t salt) const {
  return static_cast<int>(group_prefixes(tokens, salt).front().size()) * block_size_;
}

size_t KvCacheManager::first_pending(const std::vector<std::vector<PrefixBlock>>& prefixes) const {
  size_t first = prefixes.front().size();
  for (const std::vector<PrefixBlock>& prefix : prefixes)
    for (size_t i = 0; i < first; ++i)
      if (!prefix[i].offloaded && prefix[i].lost_id == 0 && pending_[prefix[i].block]) first = i;
  return first;
}

size_t KvCacheManager::released_in(size_t first_pending, int window) const {
  return static_cast<size_t>(first_window_block(static_cast<int>(first_pending) * block_size_, window, block_size_));
}

int KvCacheManager::blocks_needed(const std::vector<std::vector<PrefixBlock>>& prefixes, int num_tokens_to_hold) const {
  const size_t pending = first_pending(prefixes);
  int needed = 0;
  for (int g = 0; g < num_groups(); ++g) {
    const std::vector<PrefixBlock>& prefix = prefixes[g];
    // A device block at ref 0 is revived from the cached queue; a tier block needs a new device block.
    needed += static_cast<int>(std::count_if(prefix.begin() + released_in(pending, windows_[g]), prefix.end(),
                                             [&](const PrefixBlock& p) {
                                               return p.offloaded || device_.ref_count(p.block) == 0;
                                             }));
    needed += std::max(0, blocks_for(num_tokens_to_hold) - static_cast<int>(prefix.size()));
  }
  return needed;
}

bool KvCacheManager::can_allocate(std::span<const TokenId> tokens, int num_tokens_to_hold, uint64_t salt) const {
  return above_watermark(blocks_needed(group_prefixes(tokens, salt), num_tokens_to_hold));
}

bool KvCacheManager::could_ever_allocate(int num_tokens_to_hold, int max_chunk) const {
  return most_blocks_held(windows_, num_tokens_to_hold, block_size_, max_chunk) <=
         device_.num_blocks() - watermark_blocks_;
}

std::optional<int> KvCacheManager::allocate(SeqId seq, std::span<const TokenId> tokens, int num_tokens_to_hold,
                                            uint64_t salt) {
  if (contains(seq)) throw std::logic_error("allocate(): sequence " + std::to_string(seq) + " already exists");
  return allocate_prefixes(seq, tokens, group_prefixes(tokens, salt), num_tokens_to_hold, salt);
}

std::optional<KvCacheManager::Admission> KvCacheManager::admit(SeqId seq, std::span<const TokenId> tokens,
                                                               int num_tokens, int budget, uint64_t salt) {
  if (contains(seq)) throw std::logic_error("admit(): sequence " + std::to_string(seq) + " already exists");
  const std::vector<std::vector<PrefixBlock>> prefixes = group_prefixes(tokens, salt);
  const int cached = static_cast<int>(prefixes.front().size()) * block_size_;
  const int held = cached + std::min(num_tokens - cached, budget);
  if (!above_watermark(blocks_needed(prefixes, held))) return std::nullopt;
  const std::optional<int> hit = allocate_prefixes(seq, tokens, prefixes, held, salt);
  if (!hit) return std::nullopt;
  return Admission{*hit, held};
}

std::optional<int> KvCacheManager::allocate_prefixes(SeqId seq, std::span<const TokenId> tokens,
                                                     const std::vector<std::vector<PrefixBlock>>& prefixes,
                                                     int num_tokens_to_hold, uint64_t salt) {
  if (blocks_needed(prefixes, num_tokens_to_hold) > device_.num_free()) return std::nullopt;
  // Every group's prefix blocks first, then the new blocks: a new block's eviction never takes a prefix block.
  std::vector<Sequence> groups;
  const size_t pending = first_pending(prefixes);
  for (int g = 0; g < num_groups(); ++g)
    groups.push_back(take_prefix(prefixes[g], released_in(pending, windows_[g]), tokens, g, salt));
  for (int g = 0; g < num_groups(); ++g) take_rest(groups[g], prefixes[g], tokens, num_tokens_to_hold);
  const int hit = static_cast<int>(prefixes.front().size()) * block_size_;
  prefix_hit_tokens_ += hit;
  if (offload_.num_blocks() > 0) {
    // Each block the device missed was looked up in the tier: the promoted ones and the one the chain stopped at.
    const std::vector<PrefixBlock>& prefix = prefixes.front();
    const auto promoted = std::count_if(prefix.begin(), prefix.end(), [](const PrefixBlock& p) { return p.offloaded; });
    const size_t looked_up_max = (tokens.size() - 1) / block_size_;
    offload_query_tokens_ += int64_t{promoted + (prefix.size() < looked_up_max ? 1 : 0)} * block_size_;
    offload_hit_tokens_ += int64_t{promoted} * block_size_;
  }
  for (int g = 0; g < num_groups(); ++g) seqs_.emplace(GroupKey{seq, g}, std::move(groups[g]));
  return hit;
}

KvCacheManager::Sequence KvCacheManager::take_prefix(const std::vector<PrefixBlock>& prefix, size_t released,
                                                     std::span<const TokenId> tokens, int group, uint64_t salt) {
  Sequence s;
  s.salt = group_salt(salt, group);
  s.window = windows_[group];
  s.blocks.resize(prefix.size());
  s.content_ids.resize(prefix.size());
  s.chains = chains_of(tokens, s.salt, prefix.size());
  s.num_computed = static_cast<int>(prefix.size()) * block_size_;
  // The blocks before the window are not taken (sliding window): only their content ids, the chain's links. Cached
  // device ones become the most recently used, the first block last, so that a prefix in use stays findable.
  for (size_t i = released; i-- > 0;) {
    s.blocks[i] = kReleasedBlock;
    if (prefix[i].lost_id != 0) {
      s.content_ids[i] = prefix[i].lost_id;
    } else if (prefix[i].offloaded) {
      s.content_ids[i] = offload_.content_id(prefix[i].block);
    } else {
      s.content_ids[i] = device_.content_id(prefix[i].block);
      device_.touch(prefix[i].block);
    }
  }
  s.released = static_cast<int>(released);
  for (size_t i = released; i < prefix.size(); ++i) {
    const int32_t block = prefix[i].block;
    if (prefix[i].offloaded) {
      s.content_ids[i] = offload_.content_id(block);
      offload_.take(block);  // tier: cached -> held
      continue;
    }
    take_shared(block, block_size_);  // cached -> in use (ref 1), or in use -> ref += 1
    s.blocks[i] = block;
    s.content_ids[i] = device_.content_id(block);
  }
  return s;
}

void KvCacheManager::take_rest(Sequence& s, const std::vector<PrefixBlock>& prefix, std::span<const TokenId> tokens,
                               int num_tokens_to_hold) {
  for (size_t i = s.released; i < prefix.size(); ++i) {
    if (!prefix[i].offloaded) continue;
    s.blocks[i] = take_new(block_size_);  // free/cached -> in use (ref 1); an eviction may demote another block
    device_.adopt(s.blocks[i], {i == 0 ? 0 : s.content_ids[i - 1], i == 0 ? s.salt : 0,
                                tokens.subspan(i * block_size_, block_size_), s.chains[i]},
                  s.content_ids[i]);  // the content id moves from the tier to the device
    tier_copies_.promotions.emplace_back(offload_.host_block(prefix[i].block), s.blocks[i]);
  }
  while (static_cast<int>(s.blocks.size()) < blocks_for(num_tokens_to_hold)) s.blocks.push_back(take_new(0));
}

bool KvCacheManager::can_reserve(SeqId seq, int first_write_pos, int num_tokens_to_hold) const {
  const Reservation one{seq, first_write_pos, num_tokens_to_hold};
  return can_reserve_all(std::span(&one, 1));
}

bool KvCacheManager::can_reserve_all(std::span<const Reservation> reservations) const {
  std::unordered_map<int32_t, int32_t> refs;  // device blocks whose count an earlier reservation changes
  const auto ref = [&](int32_t b) {
    auto it = refs.find(b);
    return it != refs.end() ? it->second : device_.ref_count(b);
  };
  int free = device_.num_free();
  for (const Reservation& r : reservations) {
    const int hold = blocks_for(r.num_tokens_to_hold);
    int needed = 0;  // new blocks to grow the tables, and a copy of each shared block written
    for (int g = 0; g < num_groups(); ++g) {
      const Sequence& s = device_seq(r.seq, g);
      if (r.first_write_pos < s.num_computed) {
        throw std::invalid_argument("reserve(): first_write_pos " + std::to_string(r.first_write_pos) +
                                    " is below num_computed " + std::to_string(s.num_computed));
      }
      needed += std::max(0, hold - static_cast<int>(s.blocks.size()));
      for (int i = r.first_write_pos / block_size_; i < std::min(static_cast<int>(s.blocks.size()), hold); ++i)
        needed += ref(s.blocks[i]) > 1;
    }
    if (needed > free) return false;
    free -= needed;
    // What reserve_group leaves: each shared block written loses this writer, the window's blocks are released.
    for (int g = 0; g < num_groups(); ++g) {
      const Sequence& s = device_seq(r.seq, g);
      for (int i = r.first_write_pos / block_size_; i < std::min(static_cast<int>(s.blocks.size()), hold); ++i)
        if (const int32_t n = ref(s.blocks[i]); n > 1) refs[s.blocks[i]] = n - 1;
      const int released_end =
          std::min(first_window_block(r.first_write_pos, s.window, block_size_), s.num_computed / block_size_);
      for (int i = s.released; i < released_end; ++i) {
        const int32_t n = ref(s.blocks[i]) - 1;
        refs[s.blocks[i]] = n;
        free += n == 0;
      }
    }
  }
  return true;
}

bool KvCacheManager::reserve(SeqId seq, int first_write_pos, int num_tokens_to_hold,
                             std::vector<BlockPair>& copies) {
  if (!can_reserve(seq, first_write_pos, num_tokens_to_hold)) return false;
  for (int g = 0; g < num_groups(); ++g) reserve_group(device_seq(seq, g), first_write_pos, num_tokens_to_hold, copies);
  return true;
}

void KvCacheManager::reserve_group(Sequence& s, int first_write_pos, int num_tokens_to_hold,
                                   std::vector<BlockPair>& copies) {
  // Copy-on-write: a shared block about to be written becomes private. Only the block holding computed KV (the
  // partly filled one at num_computed) has slots to keep; later blocks in the range get a fresh block, no copy.
  const int end = std::min(static_cast<int>(s.blocks.size()), blocks_for(num_tokens_to_hold));
  for (int i = first_write_pos / block_size_; i < end; ++i) {
    int32_t shared = s.blocks[i];
    if (device_.ref_count(shared) <= 1) continue;
    int keep = computed_in(s, i);
    int32_t own = take_new(keep);     // free -> in use (ref 1)
    if (keep > 0) copies.emplace_back(shared, own);
    drop(shared);                     // in use -> ref -= 1 (stays in use: it was shared)
    s.blocks[i] = own;
  }
  while (static_cast<int>(s.blocks.size()) < blocks_for(num_tokens_to_hold)) s.blocks.push_back(take_new(0));
  release_before_window(s, first_write_pos);
}

void KvCacheManager::release_before_window(Sequence& s, int first_write_pos) {
  // Computed blocks only: a pending one (register_planned) may still be unregistered by forget_pending.
  const int end = std::min(first_window_block(first_write_pos, s.window, block_size_), s.num_computed / block_size_);
  for (; s.released < end; ++s.released) {
    drop(s.blocks[s.released]);  // ref -= 1; at 0 -> cached (registered) or free
    s.blocks[s.released] = kReleasedBlock;
  }
}

void KvCacheManager::mark_computed(SeqId seq, std::span<const TokenId> tokens, int num_computed, int tokens_offset) {
  for (int g = 0; g < num_groups(); ++g)
    mark_group_computed(seq, device_seq(seq, g), tokens, num_computed, tokens_offset);
}

void KvCacheManager::mark_group_computed(SeqId seq, Sequence& s, std::span<const TokenId> tokens, int num_computed,
                                         int tokens_offset) {
  if (num_computed < s.num_computed || num_computed > static_cast<int>(s.blocks.size()) * block_size_ ||
      static_cast<size_t>(num_computed) > tokens.size() + tokens_offset || tokens_offset % block_size_ != 0 ||
      (prefix_caching_ && tokens_offset > static_cast<int>(s.content_ids.size()) * block_size_)) {
    throw std::invalid_argument("mark_computed(): " + std::to_string(num_computed) + " tokens for sequence " +
                                std::to_string(seq) + " (computed " + std::to_string(s.num_computed) + ", table " +
                                std::to_string(s.blocks.size()) + " blocks, " + std::to_string(tokens.size()) +
                                " tokens given)");
  }
  const int first = s.num_computed / block_size_;
  s.num_computed = num_computed;
  for (int i = first; i < blocks_for(num_computed); ++i) {
    int32_t block = s.blocks[i];
    if (i < num_computed / block_size_) pending_[block] = 0;  // its writer returned
    int now = computed_in(s, i);
    if (now > filled_[block]) {
      used_slots_ += now - filled_[block];
      filled_[block] = now;
    }
  }
  if (!prefix_caching_) return;
  for (size_t i = s.content_ids.size(); i < static_cast<size_t>(num_computed / block_size_); ++i)
    register_next(s, tokens.subspan(i * block_size_ - tokens_offset, block_size_));
}

void KvCacheManager::register_next(Sequence& s, std::span<const TokenId> block_tokens) {
  const size_t i = s.content_ids.size();
  BlockContent content{i == 0 ? 0 : s.content_ids[i - 1], i == 0 ? s.salt : 0, block_tokens,
                       next_chain(s.chains, s.salt, block_tokens)};
  s.chains.push_back(content.chain);
  if (!device_.find(content)) {
    if (auto tier_block = offload_.find(content)) {
      // Computed again while the CPU tier holds it: the device's copy takes over its content id, the tier's goes.
      const uint64_t id = offload_.content_id(*tier_block);
      offload_.discard(*tier_block);                   // tier: cached -> free
      device_.adopt(s.blocks[i], content, id);         // in use -> in use (registered)
      s.content_ids.push_back(id);
      return;
    }
    if (auto id = lost_.take(content)) {
      // Lost, and computed again: it takes its old content id back, so that the cached blocks registered after it
      // (their parent) are found again.
      device_.adopt(s.blocks[i], content, *id);  // in use -> in use (registered)
      s.content_ids.push_back(*id);
      return;
    }
  }
  s.content_ids.push_back(device_.register_content(s.blocks[i], content));  // in use -> in use (registered)
}

void KvCacheManager::register_planned(SeqId seq, std::span<const TokenId> tokens, int planned_end) {
  const size_t table = device_seq(seq).blocks.size();  // the same in every group
  if (planned_end < 0 || planned_end > static_cast<int>(table) * block_size_) {
    throw std::invalid_argument("register_planned(): " + std::to_string(planned_end) + " tokens for sequence " +
                                std::to_string(seq) + " (table " + std::to_string(table) + " blocks)");
  }
  if (!prefix_caching_) return;
  const size_t full = std::min(static_cast<size_t>(planned_end), tokens.size()) / block_size_;
  for (int g = 0; g < num_groups(); ++g) {
    Sequence& s = device_seq(seq, g);
    for (size_t i = s.content_ids.size(); i < full; ++i) {
      register_next(s, tokens.subspan(i * block_size_, block_size_));
      const int32_t block = s.blocks[i];
      if (device_.content_id(block) == s.content_ids[i]) pending_[block] = 1;  // registered here, not a duplicate
      used_slots_ += block_size_ - filled_[block];  // the planned step fills it
      filled_[block] = block_size_;
    }
  }
}

void KvCacheManager::forget_pending(Sequence& s) {
  const size_t confirmed = std::min(s.content_ids.size(), static_cast<size_t>(s.num_computed / block_size_));
  for (size_t i = confirmed; i < s.content_ids.size(); ++i) {
    if (device_.content_id(s.blocks[i]) != s.content_ids[i]) continue;  // a duplicate
    device_.forget(s.blocks[i]);
    pending_[s.blocks[i]] = 0;
  }
  s.content_ids.resize(confirmed);
  s.chains.resize(confirmed);
}

void KvCacheManager::fork(SeqId parent, SeqId child) {
  device_seq(parent);
  if (contains(child)) throw std::logic_error("fork(): sequence " + std::to_string(child) + " already exists");
  for (int g = 0; g < num_groups(); ++g) {
    Sequence copy = device_seq(parent, g);
    for (size_t i = copy.released; i < copy.blocks.size(); ++i) take_shared(copy.blocks[i], 0);  // ref += 1
    seqs_.emplace(GroupKey{child, g}, std::move(copy));
  }
}

void KvCacheManager::free(SeqId seq) {
  if (!contains(seq)) return;
  for (int g = num_groups(); g-- > 0;) {
    auto it = seqs_.find({seq, g});
    Sequence& s = it->second;
    if (s.swapped) {
      for (size_t i = s.released; i < s.blocks.size(); ++i) cpu_.release(s.blocks[i]);  // in use -> free
    } else {
      forget_pending(s);
      // Last block first: the LRU head is evicted first, so a prefix outlives its tail in the cache.
      for (size_t i = s.blocks.size(); i-- > static_cast<size_t>(s.released);) drop(s.blocks[i]);  // ref -= 1
    }
    seqs_.erase(it);
  }
}

int KvCacheManager::held_blocks(SeqId seq) const {
  int held = 0;
  for (int g = 0; g < num_groups(); ++g) held += held_blocks(group_seq(seq, g));
  return held;
}

int KvCacheManager::distinct_blocks(std::span<const SeqId> seqs) const {
  std::unordered_set<int32_t> blocks;
  for (SeqId id : seqs)
    for (int g = 0; g < num_groups(); ++g) {
      const Sequence& s = group_seq(id, g);
      blocks.insert(s.blocks.begin() + s.released, s.blocks.end());
    }
  return static_cast<int>(blocks.size());
}

std::optional<std::vector<BlockPair>> KvCacheManager::swap_out(std::span<const SeqId> seqs) {
  for (SeqId id : seqs) device_seq(id);
  if (distinct_blocks(seqs) > cpu_.num_free()) return std::nullopt;
  std::unordered_map<int32_t, int32_t> copy_of;  // device block -> its CPU block
  std::vector<BlockPair> pairs;
  for (SeqId id : seqs)
    for (int g = 0; g < num_groups(); ++g) {
      Sequence& s = device_seq(id, g);
      forget_pending(s);
      for (size_t i = s.released; i < s.blocks.size(); ++i) {
        const auto [it, first] = copy_of.try_emplace(s.blocks[i], -1);
        if (first) {
          it->second = cpu_.allocate();  // cpu: free -> in use (ref 1)
          pairs.emplace_back(s.blocks[i], it->second);
        } else {
          cpu_.retain(it->second);       // ref += 1
        }
      }
      // Last block first, as free() drops them.
      for (size_t i = s.blocks.size(); i-- > static_cast<size_t>(s.released);) {
        drop(s.blocks[i]);  // device: ref -= 1
        s.blocks[i] = copy_of.at(s.blocks[i]);
      }
      s.swapped = true;
    }
  swapped_out_blocks_ += static_cast<int64_t>(pairs.size());
  return pairs;
}

bool KvCacheManager::can_swap_in(std::span<const SeqId> seqs) const {
  return std::all_of(seqs.begin(), seqs.end(), [&](SeqId id) { return is_swapped(id); }) &&
         above_watermark(distinct_blocks(seqs));
}

std::optional<std::vector<BlockPair>> KvCacheManager::swap_in(std::span<const SeqId> seqs) {
  for (SeqId id : seqs)
    if (!is_swapped(id)) throw std::logic_error("swap_in(): sequence " + std::to_string(id) + " is not swapped out");
  if (distinct_blocks(seqs) > device_.num_free()) return std::nullopt;
  std::unordered_map<int32_t, int> filled;  // CPU block -> the most computed slots a table entry holding it has
  for (SeqId id : seqs)
    for (int g = 0; g < num_groups(); ++g) {
      const Sequence& s = group_seq(id, g);
      for (size_t i = s.released; i < s.blocks.size(); ++i)
        filled[s.blocks[i]] = std::max(filled[s.blocks[i]], computed_in(s, i));
    }
  std::unordered_map<int32_t, int32_t> copy_of;  // CPU block -> its new device block
  std::vector<BlockPair> pairs;
  for (SeqId id : seqs)
    for (int g = 0; g < num_groups(); ++g) {
      Sequence& s = seqs_.at({id, g});
      for (size_t i = s.released; i < s.blocks.size(); ++i) {
        const int32_t cpu_block = s.blocks[i];
        const auto [it, first] = copy_of.try_emplace(cpu_block, -1);
        if (first) {
          it->second = take_new(filled.at(cpu_block));  // device: free -> in use (ref 1)
          pairs.emplace_back(cpu_block, it->second);
        } else {
          take_shared(it->second, 0);  // in use: ref += 1
        }
        s.blocks[i] = it->second;
        cpu_.release(cpu_block);  // cpu: ref -= 1; at 0 in use -> free
      }
      s.swapped = false;
    }
  swapped_in_blocks_ += static_cast<int64_t>(pairs.size());
  return pairs;
}

bool KvCacheManager::is_swapped(SeqId seq) const { return group_seq(seq, 0).swapped; }

const std::vector<int32_t>& KvCacheManager::block_table(SeqId seq, int group) const {
  if (group < 0 || group >= num_groups()) throw std::out_of_range("KV group " + std::to_string(group));
  return device_seq(seq, group).blocks;
}

int KvCacheManager::num_computed(SeqId seq) const { return group_seq(seq, 0).num_computed; }

KvMetrics KvCacheManager::metrics() const {
  KvMetrics m;
  m.device_total = device_.num_blocks();
  m.device_free = device_.num_free();
  m.device_cached = device_.num_cached_free();
  m.cpu_total = cpu_.num_blocks();
  m.cpu_free = cpu_.num_free();
  m.prefix_hit_tokens = prefix_hit_tokens_;
  m.offload_total = offload_.num_blocks();
  m.offload_cached = offload_.num_cached();
  m.offload_query_tokens = offload_query_tokens_;
  m.offload_hit_tokens = offload_hit_tokens_;
  m.offloaded_blocks = offloaded_blocks_;
  m.disk_total = disk_.capacity();
  m.disk_stored = disk_.size();
  m.disk_query_tokens = disk_query_tokens_;
  m.disk_hit_tokens = disk_hit_tokens_;
  m.disk_saved_blocks = disk_saved_blocks_;
  m.swapped_out_blocks = swapped_out_blocks_;
  m.swapped_in_blocks = swapped_in_blocks_;
  m.evicted_blocks = device_.num_evicted();
  m.reserved_slots = static_cast<int64_t>(device_.num_in_use()) * block_size_;
  m.used_slots = used_slots_;
  return m;
}

KvSnapshot KvCacheManager::snapshot() const {
  KvSnapshot snap;
  snap.block_size = block_size_;
  // The cell of each block that one sequence holds (a block of several is told by its ref count), per tier.
  std::vector<uint8_t> device_owner(device_.num_blocks(), kCellBusy);
  std::vector<uint8_t> swap_owner(cpu_.num_blocks(), kCellBusy);
  for (const auto& [key, s] : seqs_) {
    if (key.group == 0) snap.seqs.push_back({key.seq, s.swapped, held_blocks(key.seq), s.num_computed});
    std::vector<uint8_t>& owner = s.swapped ? swap_owner : device_owner;
    for (size_t i = s.released; i < s.blocks.size(); ++i) owner[s.blocks[i]] = seq_cell(key.seq);
  }
  std::sort(snap.seqs.begin(), snap.seqs.end(),
            [](const SeqSnapshot& a, const SeqSnapshot& b) { return a.seq < b.seq; });
  auto pool_tier = [&snap](const BlockPool& pool, const std::vector<uint8_t>& owner, const char* name) {
    TierSnapshot& tier = snap.tiers.emplace_back();
    tier.name = name;
    for (int32_t b = 0; b < pool.num_blocks(); ++b) {
      const int32_t ref = pool.ref_count(b);
      tier.push(ref == 0 ? (pool.content_id(b) != 0 ? kCellCached : kCellFree) : ref > 1 ? kCellShared : owner[b]);
    }
  };
  pool_tier(device_, device_owner, "device");
  if (cpu_.num_blocks() > 0) pool_tier(cpu_, swap_owner, "swap");
  if (offload_.num_blocks() > 0) {
    TierSnapshot& tier = snap.tiers.emplace_back();
    tier.name = "cpu";
    for (int32_t b = 0; b < offload_.num_blocks(); ++b)
      tier.push(offload_.content_id(b) != 0 ? kCellCached : offload_.in_use(b) ? kCellBusy : kCellFree);
  }
  if (disk_.capacity() > 0) {
    TierSnapshot& tier = snap.tiers.emplace_back();
    tier.name = "disk";
    tier.push(kCellCached, disk_.size());
    tier.push(kCellFree, disk_.capacity() - disk_.size());
  }
  return snap;
}

void KvCacheManager::check_invariants() const {
  device_.check_invariants();
  cpu_.check_invariants();
  offload_.check_invariants();
  disk_.check_invariants();
  auto fail = [](const std::string& what) { throw std::logic_error("kv cache: " + what); };
  if (offload_.num_blocks() > 0 && static_cast<size_t>(offload_.num_staged()) != pending_loads_.size())
    fail(std::to_string(offload_.num_staged()) + " staged CPU-tier blocks for " + std::to_string(pending_loads_.size()) +
         " pending loads");
  std::unordered_set<uint64_t> device_ids;
  for (int32_t b = 0; b < device_.num_blocks(); ++b)
    if (device_.content_id(b) != 0) device_ids.insert(device_.content_id(b));
  for (int32_t b = 0; b < offload_.num_blocks(); ++b) {
    if (offload_.content_id(b) != 0 && device_ids.contains(offload_.content_id(b)))
      fail("content id " + std::to_string(offload_.content_id(b)) + " is registered on the device and in the CPU tier");
    device_ids.insert(offload_.content_id(b));
  }
  for (const EvictedContent& lost : lost_.entries())
    if (device_ids.contains(lost.content_id))
      fail("content id " + std::to_string(lost.content_id) + " is registered in a tier and kept as lost");

  std::vector<int32_t> device_refs(device_.num_blocks(), 0);
  std::vector<int32_t> cpu_refs(cpu_.num_blocks(), 0);
  std::vector<int32_t> expected_filled(device_.num_blocks(), 0);
  std::vector<uint8_t> expected_pending(device_.num_blocks(), 0);
  for (const auto& [key, s] : seqs_) {
    const std::string who = "sequence " + std::to_string(key.seq) + " group " + std::to_string(key.group);
    auto first = seqs_.find({key.seq, 0});
    if (key.group < 0 || key.group >= num_groups() || first == seqs_.end() || s.window != windows_[key.group])
      fail(who + " is not a group of its window");
    if (s.num_computed != first->second.num_computed || s.swapped != first->second.swapped ||
        s.blocks.size() != first->second.blocks.size())
      fail(who + " differs from its group 0 in computed tokens, tier or table length");
    std::vector<int32_t>& refs = s.swapped ? cpu_refs : device_refs;
    if (s.num_computed < 0 || s.num_computed > static_cast<int>(s.blocks.size()) * block_size_) {
      fail(who + " computed " + std::to_string(s.num_computed) + " tokens beyond its table");
    }
    if (s.released < 0 || s.released > s.num_computed / block_size_ || (s.window == 0 && s.released > 0))
      fail(who + " released " + std::to_string(s.released) + " blocks");
    for (int i = 0; i < s.released; ++i)
      if (s.blocks[i] != kReleasedBlock) fail(who + " holds block " + std::to_string(i) + " counted as released");
    std::vector<int32_t> sorted(s.blocks.begin() + s.released, s.blocks.end());
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) fail(who + " holds a block twice");
    for (size_t i = s.released; i < s.blocks.size(); ++i) {
      int32_t b = s.blocks[i];
      if (b < 0 || b >= static_cast<int32_t>(refs.size())) fail(who + " holds block id " + std::to_string(b));
      ++refs[b];
      if (s.swapped) continue;
      expected_filled[b] = std::max(expected_filled[b], held_in(s, i));
      uint64_t registered = device_.content_id(b);
      bool has_content_id = i < s.content_ids.size();  // computed or pending
      if (registered != 0 && (!has_content_id || registered != s.content_ids[i])) {
        fail(who + " block " + std::to_string(b) + " is registered with content it does not hold");
      }
    }
    // Computed full blocks have content ids; pending ones may follow (register_planned).
    if (s.chains.size() != s.content_ids.size()) fail(who + " has a chain key per content id missing");
    if (!s.swapped)
      for (size_t i = std::min(s.content_ids.size(), static_cast<size_t>(s.num_computed / block_size_));
           i < s.content_ids.size(); ++i)
        if (device_.content_id(s.blocks[i]) == s.content_ids[i]) expected_pending[s.blocks[i]] = 1;
    const size_t least_ids = prefix_caching_ ? static_cast<size_t>(s.num_computed / block_size_) : 0;
    const size_t most_ids = prefix_caching_ ? s.blocks.size() : 0;
    if (s.content_ids.size() < least_ids || s.content_ids.size() > most_ids) {
      fail(who + " has " + std::to_string(s.content_ids.size()) + " content ids, expected " +
           std::to_string(least_ids) + " to " + std::to_string(most_ids));
    }
  }
  auto compare = [&](const BlockPool& pool, const std::vector<int32_t>& refs, const char* tier) {
    for (int32_t b = 0; b < pool.num_blocks(); ++b) {
      if (pool.ref_count(b) != refs[b]) {
        fail(std::string(tier) + " block " + std::to_string(b) + " has ref " + std::to_string(pool.ref_count(b)) +
             " but " + std::to_string(refs[b]) + " table references");
      }
    }
  };
  compare(device_, device_refs, "device");
  compare(cpu_, cpu_refs, "cpu");

  for (int32_t b = 0; b < device_.num_blocks(); ++b)
    if (pending_[b] != expected_pending[b]) fail("device block " + std::to_string(b) + " pending flag is wrong");
  int64_t used = 0;
  for (int32_t b = 0; b < device_.num_blocks(); ++b) {
    if (filled_[b] != expected_filled[b]) {
      fail("device block " + std::to_string(b) + " counts " + std::to_string(filled_[b]) + " used slots, tables say " +
           std::to_string(expected_filled[b]));
    }
    used += filled_[b];
  }
  if (used != used_slots_) fail("used slots " + std::to_string(used_slots_) + " != sum " + std::to_string(used));
}

}  // namespace paged
