// The prefix cache's CPU tier: OffloadTier alone (store, LRU drop, take, discard, settle), the KvCacheManager's
// demotions and promotions with their copy orders, plan_step carrying them, and a seeded property test that applies
// every copy order to a shadow device and host KV so that a promoted prefix is checked on the data it brings back.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>

#include "model/kv/kv_cache_manager.h"
#include "model/kv/offload_tier.h"
#include "model/scheduling/scheduler_policy.h"
#include "model/step.h"
#include "model/step_check.h"
#include "tests/model/kv/iota_tokens.h"

namespace paged {
namespace {

using test::iota_tokens;

KvCacheOptions tier_options(int block_size, int device, int swap, int offload) {
  KvCacheOptions o;
  o.block_size = block_size;
  o.num_device_blocks = device;
  o.num_cpu_blocks = swap;
  o.num_offload_blocks = offload;
  o.watermark = 0.0;
  return o;
}

EvictedContent content(uint64_t id, uint64_t parent, std::vector<TokenId> tokens) {
  return {id, parent, 0, std::move(tokens)};
}

// Allocates `tokens` (holding all of them) and marks them computed; returns the cached prefix tokens.
int admit(KvCacheManager& kv, SeqId id, const std::vector<TokenId>& tokens) {
  auto cached = kv.allocate(id, tokens, static_cast<int>(tokens.size()));
  REQUIRE(cached.has_value());
  kv.mark_computed(id, tokens, static_cast<int>(tokens.size()));
  kv.check_invariants();
  return *cached;
}

}  // namespace

TEST_CASE("OffloadTier: stores into free blocks, then drops the least recently stored", "[kv][tier]") {
  OffloadTier tier(2, 10);
  CHECK(tier.host_block(1) == 11);
  const auto x = content(5, 0, {1, 2}), y = content(6, 5, {3, 4}), z = content(7, 0, {9, 9});
  const auto bx = tier.store(x), by = tier.store(y);
  REQUIRE(bx.has_value());
  REQUIRE(by.has_value());
  CHECK(*bx != *by);
  CHECK(tier.find(x.view()) == bx);
  CHECK(tier.content_id(*by) == 6);
  CHECK_FALSE(tier.find({0, 0, y.tokens}).has_value());  // the same tokens under another parent
  CHECK_THROWS_AS(tier.store(x), std::logic_error);       // already here
  EvictedContent dropped;
  tier.settle();                            // a new plan: x's and y's demotion copies were sent
  const auto bz = tier.store(z, &dropped);  // full: x, the least recently stored, goes
  CHECK(bz == bx);
  CHECK(dropped.content_id == 5);
  CHECK(dropped.tokens == x.tokens);
  CHECK_FALSE(tier.find(x.view()).has_value());
  CHECK(tier.find(y.view()) == by);
  CHECK(tier.num_dropped() == 1);
  CHECK(tier.num_cached() == 2);
  // A block stored by the plan being made has no KV in host memory yet: dropped, it is reported, not on the host.
  EvictedContent reported;
  bool on_host = false;
  CHECK(tier.store(x, &reported, &on_host) == by);  // drops y, stored before the last settle
  CHECK(reported.content_id == 6);
  CHECK(on_host);
  EvictedContent unsent;
  CHECK(tier.store(content(8, 0, {7, 7}), &unsent, &on_host) == bz);  // drops z, stored in this plan
  CHECK(unsent.content_id == 7);
  CHECK_FALSE(on_host);
  CHECK_FALSE(tier.find(z.view()).has_value());
  tier.check_invariants();
}

TEST_CASE("OffloadTier: a taken block is held until settle, a discarded one is free at once", "[kv][tier]") {
  OffloadTier tier(2, 0);
  const auto x = content(5, 0, {1, 2}), y = content(6, 0, {3, 4}), z = content(7, 0, {5, 6});
  const int32_t bx = *tier.store(x), by = *tier.store(y);
  tier.take(bx);  // a promotion reads it with this plan
  CHECK_FALSE(tier.find(x.view()).has_value());
  CHECK(tier.num_held() == 1);
  CHECK_THROWS_AS(tier.take(bx), std::logic_error);
  tier.check_invariants();
  // The one block left to store into is y's (dropped): the held block is never overwritten.
  CHECK(tier.store(z) == by);
  tier.take(by);
  CHECK_FALSE(tier.store(x).has_value());  // every block held: nothing stored
  tier.settle();
  CHECK(tier.num_held() == 0);
  CHECK(tier.store(x).has_value());
  const int32_t bz = *tier.store(z);
  tier.discard(bz);  // computed again on the device
  CHECK_FALSE(tier.find(z.view()).has_value());
  CHECK(tier.num_cached() == 1);
  CHECK_THROWS_AS(tier.discard(bz), std::logic_error);
  tier.check_invariants();
  CHECK_THROWS_AS(OffloadTier(-1, 0), std::invalid_argument);
}

TEST_CASE("an evicted cached block is demoted and a prefix hit promotes it back, with copy orders", "[kv][tier]") {
  const int B = 4, kSwap = 3;
  KvCacheManager kv(tier_options(B, 4, kSwap, 8));
  const auto a = iota_tokens(2 * B + 1, 10);  // two full blocks and one token
  admit(kv, 1, a);
  const std::vector<int32_t> a_blocks = kv.block_table(1);
  kv.free(1);
  REQUIRE(kv.metrics().device_cached == 2);
  CHECK(kv.take_tier_copies().demotions.empty());

  admit(kv, 2, iota_tokens(4 * B, 50));  // the whole pool: a's two cached blocks are evicted
  KvMetrics m = kv.metrics();
  CHECK(m.evicted_blocks == 2);
  CHECK(m.offloaded_blocks == 2);
  CHECK(m.offload_cached == 2);
  auto copies = kv.take_tier_copies();
  REQUIRE(copies.demotions.size() == 2);
  CHECK(copies.promotions.empty());
  std::map<int32_t, int32_t> host_of;  // device block of a -> its host block
  for (const auto& [device, host] : copies.demotions) {
    CHECK(std::find(a_blocks.begin(), a_blocks.begin() + 2, device) != a_blocks.begin() + 2);
    CHECK(host >= kSwap);  // the tier's part of the host pool, after the swap space
    CHECK(host < kSwap + 8);
    host_of[device] = host;
  }
  CHECK(kv.cached_prefix_tokens(a) == 2 * B);  // found in the tier
  kv.free(2);

  REQUIRE(kv.allocate(3, a, static_cast<int>(a.size())) == 2 * B);
  kv.check_invariants();
  m = kv.metrics();
  CHECK(m.offload_hit_tokens == 2 * B);
  CHECK(m.offload_query_tokens == B + B + 2 * B);  // the first block each of the earlier prompts missed, then a's
  CHECK(m.prefix_hit_tokens == 2 * B);
  copies = kv.take_tier_copies();
  REQUIRE(copies.promotions.size() == 2);
  for (int i = 0; i < 2; ++i) {  // block i of a comes back from the host block it was demoted to, into the table
    CHECK(copies.promotions[i].first == host_of.at(a_blocks[i]));
    CHECK(copies.promotions[i].second == kv.block_table(3)[i]);
  }
  // The promoted blocks are on the device now (found there, not in the tier), and their evicted ones in the tier.
  CHECK(kv.metrics().offload_cached == 3);
  kv.free(3);
  REQUIRE(kv.allocate(4, a, static_cast<int>(a.size())) == 2 * B);
  CHECK(kv.metrics().offload_hit_tokens == 2 * B);
  CHECK(kv.take_tier_copies().promotions.empty());
  kv.check_invariants();
}

TEST_CASE("content computed again on the device leaves the CPU tier: one index at a time", "[kv][tier]") {
  const int B = 2;
  KvCacheManager kv(tier_options(B, 2, 0, 4));
  const auto a = iota_tokens(2 * B, 10);
  admit(kv, 1, a);
  kv.free(1);
  admit(kv, 2, iota_tokens(2 * B, 40));  // a's blocks go to the tier
  REQUIRE(kv.metrics().offload_cached == 2);
  kv.free(2);
  // A prompt of exactly a: its last block is computed (at least one token is), the first promoted.
  REQUIRE(admit(kv, 3, a) == B);
  CHECK(kv.metrics().offload_hit_tokens == B);
  // a's second block was computed on the device: the tier's copy is gone, the device's found instead.
  CHECK(kv.metrics().offload_cached == 2);  // the two blocks of the prompt of 40 evicted for sequence 3
  kv.free(3);
  CHECK(kv.cached_prefix_tokens(iota_tokens(2 * B + 1, 10)) == 2 * B);
  kv.check_invariants();
}

TEST_CASE("a promotion's tier block is not overwritten by a demotion of the same plan", "[kv][tier]") {
  const int B = 2;
  KvCacheManager kv(tier_options(B, 2, 0, 1));
  const auto a = iota_tokens(B + 1, 10);
  admit(kv, 1, a);
  kv.free(1);
  admit(kv, 2, iota_tokens(2 * B, 40));  // evicts a's block into the tier's only block
  REQUIRE(kv.take_tier_copies().demotions.size() == 1);
  kv.free(2);  // two cached blocks of 40
  REQUIRE(kv.allocate(3, a, B + 1) == B);  // promotion; its new device block evicts a block of 40
  const auto copies = kv.take_tier_copies();
  CHECK(copies.promotions.size() == 1);
  CHECK(copies.demotions.empty());  // the tier's block is held: the evicted content is lost, not written over it
  CHECK(kv.metrics().offloaded_blocks == 1);
  kv.check_invariants();
}

TEST_CASE("a plan that demotes more blocks than the tier holds orders one copy into each tier block", "[kv][tier]") {
  const int B = 2;
  KvCacheManager kv(tier_options(B, 8, 0, 2));
  admit(kv, 1, iota_tokens(8 * B, 10));
  kv.free(1);  // eight cached blocks
  kv.take_tier_copies();
  admit(kv, 2, iota_tokens(8 * B, 100));  // evicts all eight into a tier of two: the last two stored stay
  const auto copies = kv.take_tier_copies();
  CHECK(copies.demotions.size() == 2);
  CHECK_FALSE(check_block_pairs(copies.demotions, PairOrder::swap_out, 8, 2));
  CHECK(kv.metrics().offloaded_blocks == 8);
  kv.check_invariants();
  // free() put the last block first in the LRU queue, so the tier keeps sequence 1's first two blocks: a hit.
  CHECK(kv.cached_prefix_tokens(iota_tokens(8 * B + 1, 10)) == 2 * B);
}

TEST_CASE("swapped-out sequences keep their host blocks while the tier fills", "[kv][tier]") {
  const int B = 2, kSwap = 2;
  KvCacheManager kv(tier_options(B, 4, kSwap, 2));
  admit(kv, 1, iota_tokens(2 * B, 10));
  const auto swapped = kv.swap_out(1);
  REQUIRE(swapped.has_value());
  for (const auto& [device, host] : *swapped) CHECK(host < kSwap);
  for (int round = 0; round < 4; ++round) {  // cached blocks evicted again and again into the tier
    admit(kv, 10 + round, iota_tokens(4 * B, 100 + 20 * round));
    kv.free(10 + round);
    for (const auto& [device, host] : kv.take_tier_copies().demotions) CHECK(host >= kSwap);
  }
  CHECK(kv.metrics().offloaded_blocks >= 4);
  CHECK(kv.metrics().cpu_free == 0);
  const auto back = kv.swap_in(1);
  REQUIRE(back.has_value());
  for (size_t i = 0; i < back->size(); ++i) CHECK((*back)[i].first == (*swapped)[i].second);
  kv.check_invariants();
}

TEST_CASE("plan_step sends demotions with the swap-outs and promotions with the swap-ins, and runs the reader",
          "[kv][tier]") {
  const int B = 4;
  KvCacheManager kv(tier_options(B, 4, 0, 4));
  const auto a = iota_tokens(2 * B + 1, 10);
  admit(kv, 1, a);
  kv.free(1);
  admit(kv, 2, iota_tokens(4 * B, 50));
  kv.take_tier_copies();
  kv.free(2);

  PlanSeq s;
  s.id = 3;
  s.num_tokens = static_cast<int>(a.size());
  s.tokens = std::make_shared<const std::vector<TokenId>>(a);
  const StepPlan plan = plan_step(kv, {s}, PlanLimits{});
  REQUIRE(plan.admitted.size() == 1);
  CHECK(plan.admitted[0].second == 2 * B);
  CHECK(plan.swap_in.size() == 2);       // the promotions
  // Its three blocks evict three blocks of 50, demoted into the two tier blocks the promotions leave: the third
  // takes the first's block again, whose copy is dropped (one copy into each block).
  CHECK(plan.swap_out.size() == 2);
  CHECK_FALSE(check_block_pairs(plan.swap_out, PairOrder::swap_out, 4, 4));
  CHECK(plan.swapping_in.empty());       // the executors copy before the step: the reader runs in this step
  REQUIRE(plan.chunks.size() == 1);
  CHECK(plan.chunks[0].start_pos == 2 * B);
  CHECK(plan.chunks[0].num_tokens == 1);
  kv.check_invariants();
}

// ---- property test ----------------------------------------------------------------------------------------------

namespace {

struct Rng {
  std::mt19937_64 gen;
  explicit Rng(uint64_t seed) : gen(seed) {}
  int below(int n) { return static_cast<int>(gen() % static_cast<uint64_t>(n)); }
  bool chance(int percent) { return below(100) < percent; }
};

// A sequence as the test sees it: its tokens and, per position, the KV value an executor would write there (a hash
// of the token prefix, so KV of another prefix shows).
struct Model {
  std::vector<TokenId> tokens;
  std::vector<uint64_t> kv;
  int computed = 0;
  bool swapped = false;

  void push(TokenId t) {
    const uint64_t h = ((kv.empty() ? 1 : kv.back()) ^ static_cast<uint32_t>(t)) * 0x9e3779b97f4a7c15ULL;
    kv.push_back(h ^ (h >> 29));
    tokens.push_back(t);
  }
};

// Random admissions, appends, frees and swaps over a small device pool with a CPU tier (and, when asked, a disk
// tier); after each operation its orders are applied to the shadow KV in the executors' order (disk writes,
// swap-outs and demotions, swap-ins and promotions, disk loads, answered at once, some failing as corrupt files
// do), then the step's writes.
class TierSimulation {
 public:
  static constexpr int B = 4;
  static constexpr int kDevice = 24, kSwap = 12, kOffload = 20;

  TierSimulation(uint64_t seed, bool disk)
      : rng_(seed), kv_(with_disk(tier_options(B, kDevice, kSwap, kOffload), disk)), device_(kDevice * B),
        host_((kSwap + kOffload) * B) {
    for (int t = 0; t < 6; ++t) {  // conversations' histories of 2..9 blocks
      std::vector<TokenId> p;
      for (int i = 0, n = 2 * B + rng_.below(8 * B); i < n; ++i) p.push_back(100 + rng_.below(50));
      histories_.push_back(p);
    }
  }

  int64_t performed() const { return performed_; }
  const std::map<std::string, int64_t>& counts() const { return counts_; }

  void step() {
    const int op = rng_.below(100);
    if (op < 30) admit();
    else if (op < 65) append();
    else if (op < 88) finish();
    else if (op < 94) swap_out();
    else swap_in();
    kv_.check_invariants();
    if (performed_ % 211 == 0) verify_all();
  }

  void drain() {
    verify_all();
    while (!live_.empty()) {
      kv_.free(live_.begin()->first);
      live_.erase(live_.begin());
    }
    kv_.check_invariants();
    const KvMetrics m = kv_.metrics();
    CHECK(m.device_free == m.device_total);
    CHECK(m.cpu_free == m.cpu_total);
  }

 private:
  void count(const std::string& what, int64_t n = 1) { counts_[what] += n; }
  static KvCacheOptions with_disk(KvCacheOptions o, bool disk) {
    o.num_disk_blocks = disk ? 40 : 0;
    return o;
  }

  void copy_blocks(std::vector<uint64_t>& to, const std::vector<uint64_t>& from, const std::vector<BlockPair>& pairs,
                   bool device_to_host) {
    for (const auto& [src, dst] : pairs) {
      REQUIRE(src >= 0);
      REQUIRE(dst >= 0);
      REQUIRE((device_to_host ? dst : src) < kSwap + kOffload);
      REQUIRE((device_to_host ? src : dst) < kDevice);
      std::copy_n(from.begin() + src * B, B, to.begin() + dst * B);
    }
  }
  // The executors' order: swap-outs, demotions, swap-ins, promotions.
  void run_copies(const std::vector<BlockPair>& swap_out, const std::vector<BlockPair>& swap_in) {
    const KvCacheManager::TierCopies tier = kv_.take_tier_copies();
    for (const DiskOrder& o : tier.disk_writes) {
      if (o.kind == DiskOrder::Kind::remove) {
        disk_files_.erase(o.key);
        continue;
      }
      REQUIRE(o.kind == DiskOrder::Kind::save);
      disk_files_[o.key] = {o.tokens, std::vector<uint64_t>(host_.begin() + o.host_block * B,
                                                            host_.begin() + (o.host_block + 1) * B)};
      count("disk save");
    }
    // What the executors check before copying (check_block_pairs): each list with its tier orders, no destination
    // twice.
    const auto joined = [](std::vector<BlockPair> a, const std::vector<BlockPair>& b) {
      a.insert(a.end(), b.begin(), b.end());
      return a;
    };
    const auto bad_out = check_block_pairs(joined(swap_out, tier.demotions), PairOrder::swap_out, kDevice,
                                           kSwap + kOffload);
    const auto bad_in = check_block_pairs(joined(swap_in, tier.promotions), PairOrder::swap_in, kDevice,
                                          kSwap + kOffload);
    if (bad_out || bad_in)
      FAIL("copy orders after " << performed_ << " operations: " << (bad_out ? *bad_out : *bad_in).describe());
    copy_blocks(host_, device_, swap_out, true);
    copy_blocks(host_, device_, tier.demotions, true);
    copy_blocks(device_, host_, swap_in, false);
    copy_blocks(device_, host_, tier.promotions, false);
    count("demotion", static_cast<int64_t>(tier.demotions.size()));
    count("promotion", static_cast<int64_t>(tier.promotions.size()));
    for (const DiskOrder& o : tier.disk_loads) {  // the executors' answers, then the memory manager's finish_load
      auto file = disk_files_.find(o.key);
      const bool ok = file != disk_files_.end() && file->second.first == o.tokens && !rng_.chance(5);
      if (ok) std::copy(file->second.second.begin(), file->second.second.end(), host_.begin() + o.host_block * B);
      kv_.finish_load(o.key, ok);
      count(ok ? "disk load" : "disk load failed");
    }
  }

  void verify(SeqId id) {
    const Model& m = live_.at(id);
    REQUIRE(kv_.num_computed(id) == m.computed);
    if (m.swapped) return;
    for (int p = 0; p < m.computed; ++p)
      if (device_[kv_slot(kv_.block_table(id), p, B)] != m.kv[p])
        FAIL("sequence " << id << " position " << p << " holds foreign KV after " << performed_ << " operations");
  }
  void verify_all() {
    for (const auto& [id, m] : live_) verify(id);
  }

  std::optional<SeqId> pick(bool swapped) {
    std::vector<SeqId> ids;
    for (const auto& [id, m] : live_)
      if (m.swapped == swapped) ids.push_back(id);
    if (ids.empty()) return std::nullopt;
    return ids[rng_.below(static_cast<int>(ids.size()))];
  }

  void compute(SeqId id, int to) {
    Model& m = live_.at(id);
    for (int p = m.computed; p < to; ++p) device_[kv_slot(kv_.block_table(id), p, B)] = m.kv[p];
    kv_.mark_computed(id, m.tokens, to);
    m.computed = to;
  }

  // A conversation returns: its history (grown by earlier turns), cut or whole, and a new message.
  void admit() {
    if (live_.size() > 8) return;
    std::vector<TokenId>& history = histories_[rng_.below(static_cast<int>(histories_.size()))];
    Model m;
    const int keep = rng_.chance(80) ? static_cast<int>(history.size()) : rng_.below(static_cast<int>(history.size()));
    for (int i = 0; i < keep; ++i) m.push(history[i]);
    for (int i = 0, n = 1 + rng_.below(2 * B); i < n; ++i) m.push(static_cast<TokenId>(rng_.below(4)));
    const int size = static_cast<int>(m.tokens.size());
    if (size > 18 * B) return;
    if (kv_.load_from_disk(m.tokens)) {  // it waits: the loads are answered, and it comes back later
      ++performed_;
      run_copies({}, {});
      count("waited for disk");
      return;
    }
    const int expected = kv_.cached_prefix_tokens(m.tokens);
    if (!kv_.can_allocate(m.tokens, size)) return;
    ++performed_;
    const int64_t promoted_before = kv_.metrics().offload_hit_tokens;
    const SeqId id = next_id_++;
    const auto cached = kv_.allocate(id, m.tokens, size);
    REQUIRE(cached == expected);
    m.computed = *cached;
    live_.emplace(id, m);
    run_copies({}, {});
    verify(id);  // the prefix, promoted blocks included, holds exactly this prompt's KV
    if (kv_.metrics().offload_hit_tokens > promoted_before) count("admitted with a promoted prefix");
    compute(id, size);
    if (rng_.chance(50)) history = m.tokens;  // the next turn of this conversation sends it all
    count("admit");
  }

  void append() {
    auto id = pick(false);
    if (!id) return;
    Model& m = live_.at(*id);
    if (m.computed >= 20 * B) return;
    for (int i = 0, n = 1 + rng_.below(B); i < n; ++i) m.push(static_cast<TokenId>(rng_.below(4)));
    const int to = static_cast<int>(m.tokens.size());
    std::vector<BlockPair> copies;
    ++performed_;
    if (!kv_.reserve(*id, m.computed, to, copies)) {
      m.tokens.resize(m.computed);
      m.kv.resize(m.computed);
      run_copies({}, {});
      count("reserve failed");
      return;
    }
    run_copies({}, {});
    compute(*id, to);
    verify(*id);
    count("append");
  }

  void finish() {
    if (live_.empty()) return;
    auto it = live_.begin();
    std::advance(it, rng_.below(static_cast<int>(live_.size())));
    ++performed_;
    if (!it->second.swapped) verify(it->first);
    kv_.free(it->first);
    live_.erase(it);
    count("free");
  }

  void swap_out() {
    auto id = pick(false);
    if (!id) return;
    ++performed_;
    auto pairs = kv_.swap_out(*id);
    if (!pairs) return;
    for (const auto& [device, host] : *pairs) REQUIRE(host < kSwap);  // never the tier's blocks
    run_copies(*pairs, {});
    live_.at(*id).swapped = true;
    count("swap-out");
  }

  void swap_in() {
    auto id = pick(true);
    if (!id || !kv_.can_swap_in(*id)) return;
    ++performed_;
    auto pairs = kv_.swap_in(*id);
    REQUIRE(pairs.has_value());
    run_copies({}, *pairs);
    live_.at(*id).swapped = false;
    verify(*id);
    count("swap-in");
  }

  Rng rng_;
  KvCacheManager kv_;
  std::vector<uint64_t> device_;  // shadow KV, one value per device slot
  std::vector<uint64_t> host_;    // shadow KV, one value per host slot: swap space, then the tier
  std::map<SeqId, Model> live_;
  std::vector<std::vector<TokenId>> histories_;
  std::map<std::string, int64_t> counts_;
  std::map<uint64_t, std::pair<std::vector<TokenId>, std::vector<uint64_t>>> disk_files_;  // key -> tokens, KV
  SeqId next_id_ = 1;
  int64_t performed_ = 0;
};

}  // namespace

TEST_CASE("property: 100,000 random operations with a CPU tier keep every invariant and every sequence's KV",
          "[kv][tier]") {
  const bool disk = GENERATE(false, true);
  INFO((disk ? "with" : "without") << " a disk tier");
  TierSimulation sim(disk ? 20261202 : 20261201, disk);
  while (sim.performed() < 100000) sim.step();
  sim.drain();
  const auto& c = sim.counts();
  std::ostringstream summary;
  for (const auto& [what, n] : c) summary << what << ": " << n << "; ";
  INFO(summary.str());
  const auto at_least = [&](const std::string& what, int64_t n) {
    INFO(what);
    REQUIRE(c.count(what) == 1);
    CHECK(c.at(what) >= n);
  };
  at_least("admit", 5000);
  at_least("append", 10000);
  at_least("demotion", 5000);
  at_least("promotion", 2000);
  at_least("admitted with a promoted prefix", 1000);
  at_least("swap-out", 500);
  at_least("swap-in", 300);
  if (disk) {
    at_least("disk save", 2000);
    at_least("disk load", 1000);
    at_least("disk load failed", 30);
    at_least("waited for disk", 500);
  }
}

}  // namespace paged
