// KvCacheManager and BlockPool: deterministic tests of each method, and a seeded property test that runs random
// operations against a shadow KV cache (one value per slot, a hash of the token prefix) so that prefix hits (within
// a step too), copy-on-write and swaps are checked on the data they would move, not only on the bookkeeping.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <unordered_set>

#include "model/kv/kv_cache_manager.h"
#include "model/scheduling/scheduler_policy.h"
#include "model/step.h"
#include "tests/model/kv/iota_tokens.h"

namespace paged {
namespace {

using test::iota_tokens;

std::vector<TokenId> concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

KvCacheOptions options(int block_size, int device, int cpu, double watermark = 0.0, bool caching = true) {
  KvCacheOptions o;
  o.block_size = block_size;
  o.num_device_blocks = device;
  o.num_cpu_blocks = cpu;
  o.watermark = watermark;
  o.enable_prefix_caching = caching;
  return o;
}

// Allocates `tokens` (holding all of them) and marks them computed; returns the cached prefix tokens.
int admit(KvCacheManager& kv, SeqId id, const std::vector<TokenId>& tokens, uint64_t salt = 0) {
  auto cached = kv.allocate(id, tokens, static_cast<int>(tokens.size()), salt);
  REQUIRE(cached.has_value());
  kv.mark_computed(id, tokens, static_cast<int>(tokens.size()));
  kv.check_invariants();
  return *cached;
}

// Decodes sequence `id` from position `from` to `to`, one token a step (reserve, then mark computed), appending
// the tokens to `tokens`.
void decode(KvCacheManager& kv, SeqId id, std::vector<TokenId>& tokens, int from, int to) {
  std::vector<BlockPair> copies;
  for (int p = from; p < to; ++p) {
    tokens.push_back(p);
    REQUIRE(kv.reserve(id, p, p + 1, copies));
    kv.mark_computed(id, tokens, p + 1);
    kv.check_invariants();
  }
  CHECK(copies.empty());
}

bool same_metrics(const KvMetrics& a, const KvMetrics& b) {
  return a.device_free == b.device_free && a.device_cached == b.device_cached && a.cpu_free == b.cpu_free &&
         a.prefix_hit_tokens == b.prefix_hit_tokens && a.swapped_out_blocks == b.swapped_out_blocks &&
         a.swapped_in_blocks == b.swapped_in_blocks && a.evicted_blocks == b.evicted_blocks &&
         a.reserved_slots == b.reserved_slots && a.used_slots == b.used_slots;
}

}  // namespace

TEST_CASE("BlockPool: uncached blocks first, then LRU eviction; revival leaves the queue", "[kv]") {
  BlockPool pool(4, "test");
  std::vector<TokenId> ta{1, 2}, tb{3, 4};
  int32_t a = pool.allocate();  // free -> in use
  int32_t b = pool.allocate();
  CHECK(a == 0);
  CHECK(b == 1);
  uint64_t ida = pool.register_content(a, {0, 0, ta});
  uint64_t idb = pool.register_content(b, {ida, 0, tb});
  CHECK(ida != idb);
  CHECK(pool.register_content(pool.allocate(), {0, 0, ta}) == ida);  // duplicate content: the holder's id
  pool.release(2);
  pool.release(a);  // -> cached, LRU head
  pool.release(b);  // -> cached, tail
  pool.check_invariants();
  CHECK(pool.num_free() == 4);
  CHECK(pool.num_cached_free() == 2);
  CHECK(pool.find({0, 0, ta}) == a);
  CHECK_FALSE(pool.find({0, 0, tb}).has_value());   // same tokens, other parent
  CHECK_FALSE(pool.find({0, 7, ta}).has_value());   // other salt
  std::vector<TokenId> other{1, 3};
  CHECK_FALSE(pool.find({0, 0, other}).has_value());

  pool.retain(a);  // cached -> in use (ref 1)
  CHECK(pool.num_cached_free() == 1);
  CHECK(pool.ref_count(a) == 1);
  pool.check_invariants();
  // Two uncached blocks remain: they go before any cached block is evicted.
  CHECK(pool.allocate() == 3);
  CHECK(pool.allocate() == 2);
  CHECK(pool.num_evicted() == 0);
  CHECK(pool.allocate() == b);  // the only cached block: evicted, its registration dropped
  CHECK(pool.num_evicted() == 1);
  CHECK(pool.content_id(b) == 0);
  CHECK_FALSE(pool.find({ida, 0, tb}).has_value());
  CHECK_THROWS_AS(pool.allocate(), std::logic_error);
  pool.check_invariants();
}

TEST_CASE("allocate without a prefix hit, mark_computed and slots", "[kv]") {
  KvCacheManager kv(options(4, 10, 4));
  auto tokens = iota_tokens(10, 100);
  CHECK(kv.cached_prefix_tokens(tokens) == 0);
  REQUIRE(kv.allocate(1, tokens, 10) == 0);
  CHECK(kv.block_table(1).size() == 3);
  CHECK(kv.num_computed(1) == 0);
  KvMetrics m = kv.metrics();
  CHECK(m.device_free == 7);
  CHECK(m.reserved_slots == 12);
  CHECK(m.used_slots == 0);
  kv.mark_computed(1, tokens, 10);
  CHECK(kv.num_computed(1) == 10);
  CHECK(kv.metrics().used_slots == 10);
  CHECK(kv.metrics().kv_waste() == Approx(2.0 / 12.0));
  const auto& table = kv.block_table(1);
  CHECK(kv_slot(table, 0, 4) == table[0] * 4);
  CHECK(kv_slot(table, 9, 4) == table[2] * 4 + 1);
  CHECK_THROWS_AS(kv_slot(table, 12, 4), std::out_of_range);
  CHECK_THROWS_AS(kv.mark_computed(1, tokens, 9), std::invalid_argument);   // never decreases
  CHECK_THROWS_AS(kv.allocate(1, tokens, 10), std::logic_error);           // known id
  CHECK_THROWS_AS(kv.block_table(2), std::out_of_range);
  kv.check_invariants();
  kv.free(1);
  kv.free(1);  // unknown ids are ignored
  CHECK(kv.metrics().device_free == 10);
  CHECK(kv.metrics().device_cached == 2);  // the two full blocks stay cached
  CHECK(kv.metrics().reserved_slots == 0);
  kv.check_invariants();
}

TEST_CASE("allocate with a prefix hit reuses in-use and cached blocks", "[kv]") {
  KvCacheManager kv(options(4, 12, 4));
  auto tokens = iota_tokens(10, 100);
  admit(kv, 1, tokens);
  auto first = kv.block_table(1);

  SECTION("in use: ref += 1") {
    CHECK(kv.cached_prefix_tokens(tokens) == 8);
    CHECK(admit(kv, 2, tokens) == 8);
    CHECK(kv.block_table(2)[0] == first[0]);
    CHECK(kv.block_table(2)[1] == first[1]);
    CHECK(kv.block_table(2)[2] != first[2]);
    CHECK(kv.metrics().device_free == 12 - 4);  // 3 + 1 new
  }
  SECTION("cached: revived from the free queue") {
    kv.free(1);
    CHECK(kv.metrics().device_cached == 2);
    CHECK(kv.allocate(2, tokens, 10) == 8);
    CHECK(kv.metrics().device_cached == 0);
    CHECK(kv.metrics().evicted_blocks == 0);
    CHECK(kv.block_table(2)[0] == first[0]);
    CHECK(kv.block_table(2)[1] == first[1]);
    CHECK(kv.num_computed(2) == 8);
    CHECK(kv.metrics().used_slots == 8);
    kv.check_invariants();
  }
  CHECK(kv.metrics().prefix_hit_tokens == 8);

  // At least one token is always computed: a prompt of exactly two full blocks hits only the first.
  CHECK(kv.cached_prefix_tokens(std::span(tokens).first(8)) == 4);
  CHECK(kv.cached_prefix_tokens(std::span(tokens).first(9)) == 8);
  CHECK(kv.cached_prefix_tokens({}) == 0);
}

TEST_CASE("two sequences with the same 5-block prefix share 5 physical blocks", "[kv]") {
  const int B = 16;
  KvCacheManager kv(options(B, 64, 0));
  auto prefix = iota_tokens(5 * B, 1000);
  auto a = concat(prefix, iota_tokens(20, 5000));
  auto b = concat(prefix, iota_tokens(7, 6000));
  CHECK(admit(kv, 1, a) == 0);
  int cached = admit(kv, 2, b);
  CHECK(cached == 5 * B);
  int computed_by_second = static_cast<int>(b.size()) - cached;
  CHECK(computed_by_second == 7);
  for (int i = 0; i < 5; ++i) CHECK(kv.block_table(1)[i] == kv.block_table(2)[i]);
  CHECK(kv.block_table(1)[5] != kv.block_table(2)[5]);
  KvMetrics m = kv.metrics();
  CHECK(m.prefix_hit_tokens == 5 * B);
  CHECK(m.device_total - m.device_free == 7 + 1);  // 7 blocks for a, 1 private block for b
}

TEST_CASE("prefix reuse is a chain: it stops at the first miss and follows duplicates", "[kv]") {
  const int B = 4;
  KvCacheManager kv(options(B, 32, 0));
  auto x = iota_tokens(B, 10), y = iota_tokens(B, 20), z = iota_tokens(B, 30), w = iota_tokens(B, 40);
  admit(kv, 1, concat(concat(concat(x, y), z), {1}));
  // Block 2 equals a cached block, but its parent differs: only block 0 is reused.
  CHECK(kv.cached_prefix_tokens(concat(concat(concat(x, w), z), {1})) == B);

  // Two sequences compute the same blocks without sharing them (both allocated before either computed): the
  // second's copies stay unregistered duplicates, and its next block chains onto the registered content.
  KvCacheManager dup(options(B, 32, 0));
  auto xy = concat(x, y), xyw = concat(xy, w);
  REQUIRE(dup.allocate(1, xy, 2 * B) == 0);
  REQUIRE(dup.allocate(2, xyw, 3 * B) == 0);
  dup.mark_computed(1, xy, 2 * B);
  dup.mark_computed(2, xyw, 3 * B);
  dup.check_invariants();
  const auto first = dup.block_table(1), second = dup.block_table(2);
  dup.free(1);
  dup.free(2);
  CHECK(dup.metrics().device_cached == 3);  // x, y of sequence 1 and w of sequence 2
  REQUIRE(dup.allocate(3, concat(xyw, {1}), 3 * B + 1) == 3 * B);
  CHECK(dup.block_table(3)[0] == first[0]);
  CHECK(dup.block_table(3)[1] == first[1]);
  CHECK(dup.block_table(3)[2] == second[2]);
  dup.check_invariants();
}

TEST_CASE("eviction takes the least recently freed cached block, only when no uncached block is left", "[kv]") {
  const int B = 2;
  KvCacheManager kv(options(B, 6, 0));
  auto a = iota_tokens(2 * B, 10), b = iota_tokens(2 * B, 20);
  admit(kv, 1, a);
  admit(kv, 2, b);
  kv.free(1);  // cached queue: a1 a0
  kv.free(2);  // cached queue: a1 a0 b1 b0
  REQUIRE(kv.metrics().device_cached == 4);
  auto a_next = concat(a, {1});
  auto b_next = concat(b, {1});
  CHECK(kv.cached_prefix_tokens(a_next) == 2 * B);

  admit(kv, 3, iota_tokens(2 * B, 90));  // two uncached blocks left: no eviction
  CHECK(kv.metrics().evicted_blocks == 0);
  CHECK(kv.metrics().device_cached == 4);

  // A prefix hit on b revives b0, b1 out of the middle of the queue; the order of the rest is unchanged.
  REQUIRE(kv.allocate(4, b_next, 2 * B) == 2 * B);
  CHECK(kv.metrics().device_cached == 2);
  kv.free(4);  // cached queue: a1 a0 b1 b0

  REQUIRE(kv.allocate(5, iota_tokens(1, 70), 1) == 0);  // evicts a1, a's tail
  CHECK(kv.metrics().evicted_blocks == 1);
  CHECK(kv.cached_prefix_tokens(a_next) == B);
  CHECK(kv.cached_prefix_tokens(b_next) == 2 * B);
  REQUIRE(kv.allocate(6, iota_tokens(1, 71), 1) == 0);  // evicts a0
  CHECK(kv.cached_prefix_tokens(a_next) == 0);
  CHECK(kv.cached_prefix_tokens(b_next) == 2 * B);
  CHECK(kv.metrics().evicted_blocks == 2);
  kv.check_invariants();
}

TEST_CASE("copy-on-write: one copy per fork at the first divergent write", "[kv]") {
  const int B = 16;
  KvCacheManager kv(options(B, 32, 0));
  auto prompt = iota_tokens(2 * B + 8, 1);  // ends mid-block
  admit(kv, 1, prompt);
  for (SeqId child : {2, 3, 4}) kv.fork(1, child);
  kv.check_invariants();
  for (SeqId s : {2, 3, 4}) {
    CHECK(kv.block_table(s) == kv.block_table(1));
    CHECK(kv.num_computed(s) == 2 * B + 8);
  }
  CHECK(kv.metrics().device_total - kv.metrics().device_free == 3);
  const int32_t shared_last = kv.block_table(1)[2];

  int total_copies = 0;
  for (SeqId s : {2, 3, 4, 1}) {
    std::vector<BlockPair> copies;
    REQUIRE(kv.reserve(s, 2 * B + 8, 2 * B + 9, copies));
    if (s != 1) {
      REQUIRE(copies.size() == 1);
      CHECK(copies[0].first == shared_last);
      CHECK(copies[0].second == kv.block_table(s)[2]);
    } else {
      CHECK(copies.empty());  // the last holder writes in place
      CHECK(kv.block_table(1)[2] == shared_last);
    }
    total_copies += static_cast<int>(copies.size());
    auto next = concat(prompt, {static_cast<TokenId>(100 + s)});
    kv.mark_computed(s, next, 2 * B + 9);
    kv.check_invariants();
  }
  CHECK(total_copies == 3);  // one per fork
  for (SeqId s : {2, 3, 4}) {
    CHECK(kv.block_table(s)[0] == kv.block_table(1)[0]);  // full blocks stay shared
    CHECK(kv.block_table(s)[1] == kv.block_table(1)[1]);
  }
  std::vector<BlockPair> copies;
  REQUIRE(kv.reserve(2, 2 * B + 9, 2 * B + 10, copies));
  CHECK(copies.empty());  // no longer shared

  // A fork at a block boundary copies nothing: the next write lands in a new block.
  KvCacheManager aligned(options(B, 32, 0));
  admit(aligned, 1, iota_tokens(2 * B, 1));
  aligned.fork(1, 2);
  REQUIRE(aligned.reserve(2, 2 * B, 2 * B + 1, copies));
  CHECK(copies.empty());
  CHECK(aligned.block_table(2).size() == 3);
  aligned.check_invariants();
}

TEST_CASE("copy-on-write covers every shared block of a multi-token write", "[kv]") {
  const int B = 4;
  KvCacheManager kv(options(B, 16, 0));
  auto tokens = iota_tokens(6, 1);
  REQUIRE(kv.allocate(1, tokens, 12) == 0);  // 3 blocks, 6 tokens computed: block 1 half full, block 2 empty
  kv.mark_computed(1, tokens, 6);
  kv.fork(1, 2);
  std::vector<BlockPair> copies;
  CHECK(kv.can_reserve(2, 6, 12));
  REQUIRE(kv.reserve(2, 6, 12, copies));
  REQUIRE(copies.size() == 1);  // block 1 keeps 2 computed slots; block 2 holds nothing to copy
  CHECK(copies[0] == BlockPair{kv.block_table(1)[1], kv.block_table(2)[1]});
  CHECK(kv.block_table(2)[0] == kv.block_table(1)[0]);
  CHECK(kv.block_table(2)[2] != kv.block_table(1)[2]);
  CHECK_THROWS_AS(kv.reserve(2, 5, 12, copies), std::invalid_argument);  // below num_computed
  kv.check_invariants();
}

TEST_CASE("swap-out and swap-in round trip restores the table shape and the metrics", "[kv]") {
  const int B = 4;
  KvCacheManager kv(options(B, 16, 8));
  auto tokens = iota_tokens(10, 1);
  admit(kv, 1, tokens);
  const auto before = kv.metrics();
  const auto table = kv.block_table(1);

  auto out = kv.swap_out(1);
  REQUIRE(out.has_value());
  REQUIRE(out->size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK((*out)[i].first == table[i]);
  CHECK(kv.is_swapped(1));
  CHECK_THROWS_AS(kv.block_table(1), std::logic_error);
  KvMetrics m = kv.metrics();
  CHECK(m.device_free == 16);
  CHECK(m.device_cached == 2);  // the full blocks stay cached on the device
  CHECK(m.cpu_free == 5);
  CHECK(m.reserved_slots == 0);
  CHECK(m.swapped_out_blocks == 3);
  kv.check_invariants();

  CHECK(kv.can_swap_in(1));
  auto in = kv.swap_in(1);
  REQUIRE(in.has_value());
  REQUIRE(in->size() == 3);
  CHECK_FALSE(kv.is_swapped(1));
  for (size_t i = 0; i < 3; ++i) {
    CHECK((*in)[i].first == (*out)[i].second);  // logical block i: device -> cpu -> device
    CHECK((*in)[i].second == kv.block_table(1)[i]);
  }
  CHECK(kv.num_computed(1) == 10);
  m = kv.metrics();
  CHECK(m.reserved_slots == before.reserved_slots);
  CHECK(m.used_slots == before.used_slots);
  CHECK(m.device_free == before.device_free);
  CHECK(m.cpu_free == 8);
  CHECK(m.swapped_in_blocks == 3);
  kv.check_invariants();

  // Grows normally after swap-in.
  std::vector<BlockPair> copies;
  REQUIRE(kv.reserve(1, 10, 13, copies));
  kv.mark_computed(1, concat(tokens, {7, 8, 9}), 13);
  kv.check_invariants();
}

TEST_CASE("swap: shared blocks get a CPU copy per sequence; no room means no change", "[kv]") {
  const int B = 4;
  KvCacheManager kv(options(B, 16, 5));
  admit(kv, 1, iota_tokens(10, 1));
  kv.fork(1, 2);
  REQUIRE(kv.swap_out(1).has_value());  // 3 CPU blocks; the device blocks stay with sequence 2
  CHECK(kv.metrics().device_total - kv.metrics().device_free == 3);
  const auto before = kv.metrics();
  CHECK_FALSE(kv.swap_out(2).has_value());  // needs 3, 2 left
  CHECK(same_metrics(kv.metrics(), before));
  CHECK_FALSE(kv.is_swapped(2));
  kv.free(1);
  kv.free(2);
  kv.check_invariants();
  CHECK(kv.metrics().cpu_free == 5);
  CHECK(kv.metrics().device_free == 16);
}

TEST_CASE("swap: forks swapped together share their CPU blocks and their device blocks again once back", "[kv]") {
  const int B = 4;
  KvCacheManager kv(options(B, 16, 8));
  admit(kv, 1, iota_tokens(10, 1));  // 2 full blocks and a partial one
  kv.fork(1, 2);
  kv.fork(1, 3);
  admit(kv, 4, iota_tokens(6, 1));   // shares the first block with the three (a prefix hit)
  const std::vector<SeqId> beams{1, 2, 3};
  const auto out = kv.swap_out(beams);
  REQUIRE(out.has_value());
  CHECK(out->size() == 3);           // one copy per distinct block
  CHECK(kv.metrics().cpu_free == 5);
  CHECK(kv.metrics().device_total - kv.metrics().device_free == 2);  // sequence 4 keeps its blocks
  kv.check_invariants();
  CHECK_FALSE(kv.can_swap_in(std::vector<SeqId>{1, 4}));  // 4 is not swapped out
  REQUIRE(kv.can_swap_in(beams));
  const auto in = kv.swap_in(beams);
  REQUIRE(in.has_value());
  CHECK(in->size() == 3);
  CHECK(kv.block_table(1) == kv.block_table(2));
  CHECK(kv.block_table(1) == kv.block_table(3));
  CHECK(kv.block_table(1)[0] != kv.block_table(4)[0]);  // the swap-in's blocks are the beams' own
  CHECK(kv.metrics().device_total - kv.metrics().device_free == 5);
  CHECK(kv.metrics().cpu_free == 8);
  kv.check_invariants();
  // A fork's write copies its shared block as before the swap.
  std::vector<BlockPair> copies;
  REQUIRE(kv.reserve(2, 10, 11, copies));
  CHECK(copies == std::vector<BlockPair>{{kv.block_table(1)[2], kv.block_table(2)[2]}});
  for (SeqId id : {1, 2, 3, 4}) kv.free(id);
  kv.check_invariants();
  CHECK(kv.metrics().device_free == 16);
}

TEST_CASE("can_reserve_all counts the copies of a shared block as its writers leave it", "[kv]") {
  const int B = 4;
  for (const int spare : {2, 1}) {
    INFO(spare << " free blocks");
    KvCacheManager kv(options(B, 16, 0));
    admit(kv, 1, iota_tokens(10, 1));  // 3 blocks, the last partly filled
    kv.fork(1, 2);
    kv.fork(1, 3);
    admit(kv, 9, iota_tokens(4 * (13 - spare), 500));  // leaves `spare` blocks free
    REQUIRE(kv.metrics().device_free == spare);
    // Each writes position 10 of the shared partial block: the first two writers copy it, the last keeps it.
    const std::vector<KvCacheManager::Reservation> step{{1, 10, 11}, {2, 10, 11}, {3, 10, 11}};
    for (const auto& r : step) CHECK(kv.can_reserve(r.seq, r.first_write_pos, r.num_tokens_to_hold));
    CHECK(kv.can_reserve_all(step) == (spare == 2));
    std::vector<BlockPair> copies;
    bool all = true;
    for (const auto& r : step) all = kv.reserve(r.seq, r.first_write_pos, r.num_tokens_to_hold, copies) && all;
    CHECK(all == (spare == 2));
    kv.check_invariants();
  }
}

TEST_CASE("the salt separates prefix caches", "[kv]") {
  KvCacheManager kv(options(4, 16, 0));
  auto tokens = iota_tokens(9, 1);
  admit(kv, 1, tokens, /*salt=*/42);
  CHECK(kv.cached_prefix_tokens(tokens, 42) == 8);
  CHECK(kv.cached_prefix_tokens(tokens, 0) == 0);
  CHECK(kv.cached_prefix_tokens(tokens, 43) == 0);
  CHECK(admit(kv, 2, tokens, 0) == 0);
  CHECK(admit(kv, 3, tokens, 42) == 8);
  CHECK(kv.cached_prefix_tokens(tokens, 0) == 8);  // now cached under salt 0 too
}

TEST_CASE("prefix caching off: no hits, nothing cached", "[kv]") {
  KvCacheManager kv(options(4, 16, 0, 0.0, /*caching=*/false));
  auto tokens = iota_tokens(9, 1);
  admit(kv, 1, tokens);
  CHECK(kv.cached_prefix_tokens(tokens) == 0);
  CHECK(admit(kv, 2, tokens) == 0);
  kv.free(1);
  CHECK(kv.metrics().device_cached == 0);
  kv.check_invariants();
}

TEST_CASE("watermark: admission keeps it free, running sequences may use it", "[kv]") {
  const int B = 4;
  KvCacheManager kv(options(B, 100, 100, /*watermark=*/0.1));  // 10 blocks kept free
  auto tokens = iota_tokens(1, 1);
  CHECK(kv.can_allocate(tokens, 90 * B));
  CHECK_FALSE(kv.can_allocate(tokens, 90 * B + 1));
  CHECK(kv.could_ever_allocate(90 * B));
  CHECK_FALSE(kv.could_ever_allocate(90 * B + 1));
  REQUIRE(kv.allocate(1, tokens, 91 * B).has_value());  // allocate itself only needs the blocks
  std::vector<BlockPair> copies;
  CHECK(kv.reserve(1, 0, 100 * B, copies));             // growth may eat the watermark
  CHECK(kv.metrics().device_free == 0);
  CHECK_FALSE(kv.can_reserve(1, 0, 100 * B + 1));
  CHECK_FALSE(kv.reserve(1, 0, 100 * B + 1, copies));
  CHECK(kv.block_table(1).size() == 100);

  REQUIRE(kv.swap_out(1).has_value());
  CHECK_FALSE(kv.can_swap_in(1));  // 100 blocks would leave fewer than 10 free
  REQUIRE(kv.allocate(2, tokens, 1).has_value());
  CHECK_FALSE(kv.swap_in(1).has_value());  // 99 free: not enough, and no change
  CHECK(kv.is_swapped(1));
  kv.free(2);
  CHECK(kv.swap_in(1).has_value());  // the watermark is can_swap_in's business only
  kv.check_invariants();
}

TEST_CASE("allocation failures change nothing", "[kv]") {
  const int B = 4;
  KvCacheManager kv(options(B, 4, 0));
  auto tokens = iota_tokens(9, 1);
  admit(kv, 1, tokens);  // 3 blocks
  kv.free(1);            // 2 cached, 2 uncached
  const auto before = kv.metrics();
  CHECK_FALSE(kv.can_allocate(tokens, 5 * B));
  CHECK_FALSE(kv.allocate(2, tokens, 5 * B).has_value());  // 2 revived + 3 new > 4 free
  CHECK(same_metrics(kv.metrics(), before));
  CHECK(kv.cached_prefix_tokens(tokens) == 2 * B);
  CHECK(kv.can_allocate(tokens, 4 * B));
  REQUIRE(kv.allocate(2, tokens, 4 * B) == 2 * B);  // takes every block, the cached prefix kept
  CHECK(kv.metrics().evicted_blocks == 0);
  kv.check_invariants();
}

TEST_CASE("sliding window: reserve releases the computed blocks before the window; they stay cached", "[kv]") {
  const int B = 4, W = 6;  // a query at p sees p - 5 .. p
  KvCacheOptions o = options(B, 12, 8);
  o.group_windows = {W};
  KvCacheManager kv(o);
  const auto tokens = iota_tokens(40, 1);
  REQUIRE(kv.allocate(1, tokens, 8) == 0);  // positions 0..7: two blocks
  kv.mark_computed(1, tokens, 8);
  std::vector<BlockPair> copies;
  const int32_t first = kv.block_table(1)[0];
  // The query at 8 sees 3..8: block 0 (0..3) is still read.
  REQUIRE(kv.reserve(1, 8, 9, copies));
  CHECK(kv.block_table(1)[0] == first);
  kv.mark_computed(1, tokens, 9);
  // At 9 the window starts at 4: block 0 goes (to the cached queue, its content registered).
  const int64_t free_before = kv.metrics().device_free;
  REQUIRE(kv.reserve(1, 9, 10, copies));
  CHECK(kv.block_table(1) == std::vector<int32_t>{kReleasedBlock, kv.block_table(1)[1], kv.block_table(1)[2]});
  CHECK(kv.metrics().device_free == free_before + 1);
  CHECK(kv.metrics().device_cached == 1);
  kv.check_invariants();
  // A chunk of several tokens from 10 to 24: its first query (10) sees 5 on, so block 1 (4..7) stays.
  kv.mark_computed(1, tokens, 10);
  REQUIRE(kv.reserve(1, 10, 24, copies));
  CHECK(kv.block_table(1)[1] != kReleasedBlock);
  kv.mark_computed(1, tokens, 24);
  // Computed blocks only: planning ahead of the returned steps (first_write_pos 34, 24 computed) releases the
  // blocks before 24 / 4 = 6, not those before the window of 34 ((34 - 5) / 4 = 7).
  REQUIRE(kv.reserve(1, 34, 35, copies));
  const auto& table = kv.block_table(1);
  CHECK(std::count(table.begin(), table.end(), kReleasedBlock) == 6);
  CHECK(copies.empty());
  kv.check_invariants();
  CHECK(kv.metrics().device_total - kv.metrics().device_free == 3);  // blocks 6, 7 and 8
  // The released blocks stay in the prefix cache: a new sequence with the same start finds them.
  CHECK(kv.cached_prefix_tokens(iota_tokens(13, 1)) == 3 * B);
  // A fork shares what is held and keeps the released entries; a swap moves the held blocks only.
  kv.fork(1, 2);
  CHECK(kv.block_table(2) == kv.block_table(1));
  kv.free(1);
  const auto out = kv.swap_out(2);
  REQUIRE(out);
  CHECK(out->size() == 3);
  CHECK(kv.metrics().cpu_free == 5);
  kv.check_invariants();
  const auto in = kv.swap_in(2);
  REQUIRE(in);
  CHECK(in->size() == 3);
  CHECK(std::count(kv.block_table(2).begin(), kv.block_table(2).end(), kReleasedBlock) == 6);
  kv.check_invariants();
  kv.free(2);
  kv.check_invariants();
  CHECK(kv.metrics().device_free == kv.metrics().device_total);
  CHECK(kv.metrics().cpu_free == kv.metrics().cpu_total);
}

TEST_CASE("sliding window: a long sequence holds the window's blocks, not its length's", "[kv]") {
  const int B = 4, W = 10;
  KvCacheOptions o = options(B, 6, 0);  // 24 slots; the sequence grows to 200 tokens
  o.group_windows = {W};
  KvCacheManager kv(o);
  const auto tokens = iota_tokens(200, 1);
  REQUIRE(kv.allocate(1, tokens, 1) == 0);
  kv.mark_computed(1, tokens, 1);
  std::vector<BlockPair> copies;
  int most = 0;
  for (int p = 1; p < 200; ++p) {
    REQUIRE(kv.reserve(1, p, p + 1, copies));
    kv.mark_computed(1, tokens, p + 1);
    const auto m = kv.metrics();
    most = std::max<int>(most, static_cast<int>(m.device_total - m.device_free));
  }
  kv.check_invariants();
  CHECK(most == (W + B - 1) / B + 1);  // the blocks overlapping a window p - W + 1 .. p: ceil(W / B) + 1 at most
  KvCacheManager all(options(B, 6, 0));     // without the window the same sequence runs out at 24 tokens
  REQUIRE(all.allocate(1, tokens, 1) == 0);
  all.mark_computed(1, tokens, 1);
  int p = 1;
  while (all.reserve(1, p, p + 1, copies)) all.mark_computed(1, tokens, ++p);
  CHECK(p == 6 * B);
  // What admission asks: a sequence of any length holds window + 3 chunks' blocks and two more, at most.
  CHECK(most_blocks_held(1000, B, W, 1) == 6);
  CHECK(most_blocks_held(1000, B, 0, 1) == 250);
  CHECK(most_blocks_held(9, B, W, 64) == 3);
  CHECK(kv.could_ever_allocate(1000, 1));
  CHECK_FALSE(kv.could_ever_allocate(1000, 4));
  CHECK_FALSE(kv.could_ever_allocate(1000));
  CHECK_FALSE(all.could_ever_allocate(1000, 1));
  CHECK_THROWS_AS(KvCacheManager([] {
                    KvCacheOptions bad;
                    bad.group_windows = {-1};
                    return bad;
                  }()),
                  std::invalid_argument);
}

TEST_CASE("sliding window: admission leaves a cached prefix's blocks before the window, but not those a pending "
          "block's restart would read", "[kv]") {
  const int B = 4, W = 6;
  KvCacheOptions o = options(B, 16, 0);
  o.group_windows = {W};
  KvCacheManager kv(o);
  const auto tokens = iota_tokens(33, 1);  // 8 full blocks and a token
  admit(kv, 1, tokens);
  kv.free(1);  // 9 blocks cached (8 registered)
  const int64_t free_before = kv.metrics().device_free;
  // A hit of 8 blocks: the first query (32) sees 27 on, so blocks 0..5 are not taken.
  REQUIRE(kv.allocate(2, tokens, 33) == 8 * B);
  const auto& table = kv.block_table(2);
  CHECK(std::count(table.begin(), table.end(), kReleasedBlock) == 6);
  CHECK(kv.metrics().device_free == free_before - 3);  // blocks 6, 7 revived and one new
  kv.check_invariants();
  kv.free(2);
  // Pending blocks: sequence 3 plans blocks 4..7 (registered, not computed); sequence 4 admitted in the same step
  // hits them. If 3's chunk is dropped, 4 restarts at block 4 and reads from (16 - 5) / 4 = 2: blocks 0 and 1 only
  // may stay released.
  KvCacheManager fresh(o);
  const auto head = std::vector<TokenId>(tokens.begin(), tokens.begin() + 16);
  admit(fresh, 5, head);  // blocks 0..3 computed and registered
  REQUIRE(fresh.allocate(3, tokens, 33) == 4 * B);
  fresh.register_planned(3, tokens, 33);
  REQUIRE(fresh.allocate(4, tokens, 33) == 8 * B);
  const auto& shared = fresh.block_table(4);
  CHECK(std::count(shared.begin(), shared.end(), kReleasedBlock) == 2);
  fresh.check_invariants();
  fresh.free(3);  // the writer goes: its pending blocks are forgotten
  fresh.check_invariants();
  for (SeqId id : {4, 5}) fresh.free(id);
  fresh.check_invariants();
  CHECK(fresh.metrics().device_free == fresh.metrics().device_total);
}

TEST_CASE("KV groups: a sequence's groups are allocated, grown, released, shared, forked, swapped and freed "
          "together, each over blocks of its own",
          "[kv][groups]") {
  const int B = 4;
  KvCacheOptions o = options(B, 40, 40);
  o.group_windows = {0, 8};  // full layers; layers sliding over two blocks
  KvCacheManager kv(o);
  REQUIRE(kv.num_groups() == 2);
  const std::vector<TokenId> prompt = iota_tokens(18, 0);  // 5 blocks a group
  CHECK(kv.could_ever_allocate(18 + 60, 4));             // 20 blocks + ceil((8 + 12) / 4) + 2 = 27
  CHECK_FALSE(kv.could_ever_allocate(200, 4));           // 50 blocks for the full group alone
  REQUIRE(admit(kv, 1, prompt) == 0);
  const std::vector<int32_t> full = kv.block_table(1, 0), sliding = kv.block_table(1, 1);
  CHECK(full.size() == 5);
  CHECK(sliding.size() == 5);
  for (int32_t b : full) CHECK(std::find(sliding.begin(), sliding.end(), b) == sliding.end());
  CHECK(kv.block_table(1) == full);
  CHECK(kv.metrics().device_free == 30);

  // The prefix cache keeps each group's blocks apart: the same prompt shares the full blocks of both groups, but
  // for those before the sliding group's window of its first query (16: positions 9 on), left released.
  REQUIRE(admit(kv, 2, prompt) == 16);
  for (int i = 0; i < 4; ++i) {
    CHECK(kv.block_table(2, 0)[i] == full[i]);
    CHECK(kv.block_table(2, 1)[i] == (i < first_window_block(16, 8, B) ? kReleasedBlock : sliding[i]));
  }
  kv.free(2);

  // Decoding: the sliding group releases the blocks before its window, the full group keeps every block.
  std::vector<TokenId> tokens = prompt;
  decode(kv, 1, tokens, 18, 30);
  const std::vector<int32_t>& slid = kv.block_table(1, 1);
  CHECK(std::count(kv.block_table(1, 0).begin(), kv.block_table(1, 0).end(), kReleasedBlock) == 0);
  // The last query (29) saw 22 on: blocks 0-4 (positions 0..19) released.
  CHECK(std::count(slid.begin(), slid.end(), kReleasedBlock) == std::min(first_window_block(29, 8, B), 29 / B));
  CHECK(slid[0] == kReleasedBlock);

  // Fork: both groups shared; swap-out and in move both groups' held blocks; free returns every block.
  kv.fork(1, 3);
  CHECK(kv.block_table(3, 1) == kv.block_table(1, 1));
  const auto held = [&](SeqId id) {
    int n = 0;
    for (int g = 0; g < 2; ++g)
      for (int32_t b : kv.block_table(id, g)) n += b != kReleasedBlock;
    return n;
  };
  const int blocks = held(3);
  auto out = kv.swap_out(3);
  REQUIRE(out.has_value());
  CHECK(static_cast<int>(out->size()) == blocks);
  CHECK(kv.is_swapped(3));
  CHECK_THROWS_AS(kv.block_table(3, 1), std::logic_error);
  auto in = kv.swap_in(3);
  REQUIRE(in.has_value());
  CHECK(static_cast<int>(in->size()) == blocks);
  CHECK(held(3) == blocks);
  kv.check_invariants();
  CHECK_THROWS_AS(kv.block_table(1, 2), std::out_of_range);
  kv.free(1);
  kv.free(3);
  kv.check_invariants();
  CHECK(kv.metrics().device_free == 40);
  CHECK(kv.metrics().cpu_free == 40);
}

TEST_CASE("KV groups: a prefix hit is the shortest of the groups' hits, and admission takes no group's prefix "
          "blocks for another's new ones",
          "[kv][groups]") {
  const int B = 4;
  KvCacheOptions o = options(B, 20, 0);
  o.group_windows = {0, 8};
  KvCacheManager kv(o);
  const std::vector<TokenId> prompt = iota_tokens(17, 0);  // 4 full blocks and a token: 5 blocks a group
  REQUIRE(admit(kv, 1, prompt) == 0);
  // Decoding releases the sliding group's first blocks, which stay cached (ref 0).
  std::vector<TokenId> tokens = prompt;
  decode(kv, 1, tokens, 17, 20);
  kv.free(1);
  CHECK(kv.cached_prefix_tokens(prompt) == 16);
  // A sequence that takes all but two blocks evicts cached blocks (the LRU: the sliding group's released ones went
  // first): the hit is what both groups still hold.
  REQUIRE(admit(kv, 2, iota_tokens(30, 1000)) == 0);  // 8 blocks a group: 16 of 20
  const int hit = kv.cached_prefix_tokens(prompt);
  CHECK(hit < 16);
  const KvMetrics before = kv.metrics();
  if (kv.can_allocate(prompt, 17)) {
    REQUIRE(kv.allocate(3, prompt, 17) == hit);
    kv.check_invariants();
    for (int g = 0; g < 2; ++g) CHECK(kv.block_table(3, g).size() == 5);
  } else {
    CHECK_FALSE(kv.allocate(3, prompt, 17).has_value());
    CHECK(same_metrics(kv.metrics(), before));
  }
}

TEST_CASE("admit is cached_prefix_tokens, can_allocate and allocate with one lookup of the prefix", "[kv][groups]") {
  // Two managers through the same seeded admissions, frees and completions: one admits with admit(), the other with
  // the three calls the scheduler made before; every answer, table and metric agrees, watermark refusals included.
  const int B = 4;
  KvCacheOptions o = options(B, 48, 0, /*watermark=*/0.1);
  o.group_windows = {0, 8};
  KvCacheManager one(o), three(o);
  std::mt19937 rng(7);
  const std::vector<TokenId> base = iota_tokens(40, 0);
  std::vector<SeqId> live;
  int admitted = 0, refused = 0;
  for (SeqId id = 1; id <= 300; ++id) {
    // A prompt sharing 0-40 tokens with the others, then its own.
    std::vector<TokenId> prompt(base.begin(), base.begin() + std::uniform_int_distribution<int>(0, 40)(rng));
    prompt = concat(prompt, iota_tokens(std::uniform_int_distribution<int>(1, 20)(rng), 1000 * id));
    const int num_tokens = static_cast<int>(prompt.size()), budget = std::uniform_int_distribution<int>(1, 64)(rng);
    const auto got = one.admit(id, prompt, num_tokens, budget);
    std::optional<KvCacheManager::Admission> want;
    const int cached = three.cached_prefix_tokens(prompt);
    const int held = cached + std::min(num_tokens - cached, budget);
    if (three.can_allocate(prompt, held))
      if (const auto hit = three.allocate(id, prompt, held)) want = KvCacheManager::Admission{*hit, held};
    REQUIRE(got.has_value() == want.has_value());
    if (got) {
      CHECK(got->cached == want->cached);
      CHECK(got->held == want->held);
      for (int g = 0; g < 2; ++g) CHECK(one.block_table(id, g) == three.block_table(id, g));
      for (KvCacheManager* kv : {&one, &three}) kv->mark_computed(id, prompt, got->held);
      live.push_back(id);
      ++admitted;
    } else {
      ++refused;
    }
    CHECK(same_metrics(one.metrics(), three.metrics()));
    while (live.size() > 4 || (!live.empty() && rng() % 3 == 0)) {  // the oldest finish
      for (KvCacheManager* kv : {&one, &three}) kv->free(live.front());
      live.erase(live.begin());
    }
    one.check_invariants();
  }
  CHECK(admitted > 100);
  CHECK(refused > 10);  // the watermark refused some: both ways alike
}

TEST_CASE("BlockPool: touch makes a cached block the most recently used", "[kv]") {
  BlockPool pool(2, "test");
  std::vector<TokenId> ta{1, 2}, tb{3, 4};
  const int32_t a = pool.allocate(), b = pool.allocate();
  pool.register_content(a, {0, 0, ta});
  pool.register_content(b, {0, 0, tb});
  pool.touch(a);    // in use: nothing changes
  pool.release(a);  // LRU head
  pool.release(b);
  pool.touch(a);    // now the tail
  pool.check_invariants();
  CHECK(pool.allocate() == b);  // the head is evicted first
  CHECK(pool.find({0, 0, ta}) == a);
}

TEST_CASE("sliding window: a prefix hit keeps the cached blocks it leaves released, so a prefix in use stays "
          "findable while other requests churn the cache", "[kv][groups]") {
  const int B = 4;
  KvCacheOptions o = options(B, 16, 0);
  o.group_windows = {8};
  KvCacheManager kv(o);
  const std::vector<TokenId> prompt = iota_tokens(17, 0);  // 4 full blocks and a token
  REQUIRE(admit(kv, 1, prompt) == 0);
  kv.free(1);
  SeqId id = 2;
  for (int round = 0; round < 8; ++round) {
    INFO("round " << round);
    // The prompt again: blocks 0 and 1 lie before its first query's window (16 - 8 + 1), left released.
    CHECK(admit(kv, id, prompt) == 16);
    CHECK(kv.block_table(id)[0] == kReleasedBlock);
    kv.free(id++);
    // Another request of 10 new blocks evicts 8 of the cached ones, the least recently used first.
    REQUIRE(admit(kv, id, iota_tokens(40, 1000 + 100 * round)) == 0);
    kv.free(id++);
  }
  CHECK(kv.metrics().evicted_blocks > 0);
}

TEST_CASE("sliding window: a prefix runs through its evicted blocks before the window to the cached blocks of the "
          "window, and a lost block computed again takes its old id back", "[kv][lost]") {
  const int B = 4;
  KvCacheOptions o = options(B, 24, 0);
  o.group_windows = {8};  // every layer slides (Mistral): a query at p reads p - 7 .. p
  KvCacheManager kv(o);
  std::vector<TokenId> tokens = iota_tokens(33, 0);
  REQUIRE(admit(kv, 1, tokens) == 0);
  decode(kv, 1, tokens, 33, 36);  // the query at 35 reads 28 on: blocks 0..6 released (cached), 7 and 8 held
  kv.free(1);
  // A request of 22 blocks takes the 15 uncached ones and evicts the 7 least recently used: the released ones.
  REQUIRE(admit(kv, 2, iota_tokens(88, 1000)) == 0);
  CHECK(kv.metrics().evicted_blocks == 7);
  // The conversation goes on: its next prompt's first query (36) reads 29 on, blocks 7 and 8, both cached. Without
  // the lost blocks' ids the chain would stop at block 0 and the hit be 0.
  const std::vector<TokenId> next = concat(tokens, iota_tokens(5, 500));
  CHECK(kv.cached_prefix_tokens(next) == 36);
  kv.free(2);
  REQUIRE(admit(kv, 3, next) == 36);
  for (int i = 0; i < 7; ++i) CHECK(kv.block_table(3)[i] == kReleasedBlock);
  // A request with the conversation's first 29 tokens finds nothing it could read (a hit never ends on a lost
  // block), computes blocks 0..6 again and registers them under their old ids: the chain through them leads to
  // blocks 7..9 again (with fresh ids it would stop at 7: 28 tokens).
  REQUIRE(admit(kv, 4, std::vector<TokenId>(tokens.begin(), tokens.begin() + 29)) == 0);
  CHECK(kv.cached_prefix_tokens(next) == 40);
  kv.free(3);
  kv.free(4);
  kv.check_invariants();
  CHECK(kv.metrics().device_free == kv.metrics().device_total);
}

TEST_CASE("KV groups: a sliding group's prefix runs through its lost blocks, a full group's does not, and a lost "
          "block in a window ends the hit", "[kv][groups][lost]") {
  const int B = 4;
  KvCacheOptions o = options(B, 47, 0);
  o.group_windows = {0, 8};  // Gemma 3: full layers and sliding ones
  KvCacheManager kv(o);
  std::vector<TokenId> tokens = iota_tokens(33, 0);
  REQUIRE(admit(kv, 1, tokens) == 0);  // 9 blocks a group
  decode(kv, 1, tokens, 33, 36);       // the sliding group releases its blocks 0..6
  kv.free(1);
  // 18 blocks a group: the 29 uncached ones and the 7 least recently used, the sliding group's released blocks.
  REQUIRE(admit(kv, 2, iota_tokens(72, 1000)) == 0);
  CHECK(kv.metrics().evicted_blocks == 7);
  const std::vector<TokenId> next = concat(tokens, iota_tokens(5, 500));
  CHECK(kv.cached_prefix_tokens(next) == 36);  // the full group holds all 9 blocks, the sliding one its window's
  // Two more evictions (a block a group) take blocks the hit needs (a full group's, or of the sliding group's window):
  // the hit ends before them, and then before the lost blocks that the shorter hit's window would read.
  REQUIRE(admit(kv, 3, iota_tokens(1, 5000)) == 0);
  CHECK(kv.metrics().evicted_blocks == 9);
  const int hit = kv.cached_prefix_tokens(next);
  CHECK(hit < 36);
  kv.free(2);
  REQUIRE(kv.allocate(4, next, static_cast<int>(next.size())) == hit);
  kv.check_invariants();
  kv.free(3);
  kv.free(4);
  kv.check_invariants();
  CHECK(kv.metrics().device_free == kv.metrics().device_total);
}

TEST_CASE("48 sequences allocated in one step share the planned blocks of their common prefix", "[kv][share]") {
  const int B = 4;
  KvCacheManager kv(options(B, 64, 8));
  const auto prefix = iota_tokens(3 * B, 100);
  std::vector<std::vector<TokenId>> prompts;
  for (int i = 0; i < 48; ++i) prompts.push_back(concat(prefix, iota_tokens(1 + i % 3, 1000 + 10 * i)));
  for (SeqId id = 1; id <= 48; ++id) {  // one plan: allocations and registrations, nothing computed yet
    const auto& p = prompts[id - 1];
    const int size = static_cast<int>(p.size());
    REQUIRE(kv.allocate(id, p, size) == (id == 1 ? 0 : 3 * B));
    kv.register_planned(id, p, size);
    CHECK(kv.num_computed(id) == (id == 1 ? 0 : 3 * B));
  }
  for (SeqId id = 2; id <= 48; ++id) {
    INFO("sequence " << id);
    for (int i = 0; i < 3; ++i) CHECK(kv.block_table(id)[i] == kv.block_table(1)[i]);
    CHECK(kv.block_table(id)[3] != kv.block_table(1)[3]);
  }
  KvMetrics m = kv.metrics();
  CHECK(m.prefix_hit_tokens == 47 * 3 * B);
  CHECK(m.device_free == 64 - (3 + 48));  // the prefix once, a private tail block each
  kv.check_invariants();
  for (SeqId id = 1; id <= 48; ++id) {  // the step returned
    const auto& p = prompts[id - 1];
    kv.mark_computed(id, p, static_cast<int>(p.size()));
  }
  kv.check_invariants();
  for (SeqId id = 1; id <= 48; ++id) kv.free(id);
  kv.check_invariants();
  m = kv.metrics();
  CHECK(m.device_free == 64);
  CHECK(m.device_cached == 3);  // only the prefix blocks are full
  CHECK(m.reserved_slots == 0);
  CHECK(m.used_slots == 0);
  CHECK(kv.cached_prefix_tokens(concat(prefix, {7})) == 3 * B);
}

TEST_CASE("a planned block is found only while the step that writes it can still run", "[kv][share]") {
  const int B = 4;
  KvCacheManager kv(options(B, 32, 16));
  const auto prefix = iota_tokens(3 * B, 100);
  const auto writer = concat(prefix, {1, 2}), reader = concat(prefix, {3});
  const auto probe = concat(prefix, {9});
  REQUIRE(kv.allocate(1, writer, 14) == 0);
  kv.register_planned(1, writer, 14);
  REQUIRE(kv.allocate(2, reader, 13) == 3 * B);
  const auto shared = kv.block_table(2);
  kv.check_invariants();
  CHECK_THROWS_AS(kv.register_planned(2, reader, 17), std::invalid_argument);  // beyond its table

  SECTION("writer freed before its step reported (abort, recompute): unregistered") {
    kv.free(1);
    CHECK(kv.cached_prefix_tokens(probe) == 0);
    CHECK(kv.block_table(2) == shared);  // the reader keeps its blocks (a step computes them: drop_ended_chunks)
    kv.check_invariants();
    kv.free(2);
    CHECK(kv.metrics().device_free == 32);
    CHECK(kv.metrics().device_cached == 0);  // nothing is registered
  }
  SECTION("writer's step reported: the blocks stay cached after both end") {
    kv.mark_computed(1, writer, 14);
    kv.free(1);
    kv.free(2);
    CHECK(kv.cached_prefix_tokens(probe) == 3 * B);
    CHECK(kv.metrics().device_cached == 3);
  }
  SECTION("writer swapped out before its step reported: unregistered until swapped in") {
    REQUIRE(kv.swap_out(1));
    CHECK(kv.cached_prefix_tokens(probe) == 0);
    kv.check_invariants();
    REQUIRE(kv.swap_in(1));
    kv.mark_computed(1, writer, 14);  // a step after the swap-in reported from position 0
    CHECK(kv.cached_prefix_tokens(probe) == 3 * B);
    REQUIRE(kv.allocate(3, probe, 13) == 3 * B);
    CHECK(kv.block_table(3)[0] == kv.block_table(1)[0]);
    CHECK(kv.block_table(3)[0] != shared[0]);
    kv.check_invariants();
  }
  SECTION("a fork shares the pending ids: whichever ends first unregisters them") {
    kv.fork(1, 3);
    kv.free(3);
    CHECK(kv.cached_prefix_tokens(probe) == 0);
    kv.check_invariants();
    kv.mark_computed(1, writer, 14);
    kv.free(1);
    CHECK(kv.cached_prefix_tokens(probe) == 0);
  }
  kv.check_invariants();
  KvCacheManager off(options(B, 8, 0, 0.0, false));
  REQUIRE(off.allocate(1, writer, 14) == 0);
  off.register_planned(1, writer, 14);
  CHECK(off.cached_prefix_tokens(probe) == 0);
  off.check_invariants();
}

// ---- property test ----------------------------------------------------------------------------------------------

namespace {

// Deterministic across standard libraries (the std distributions are not).
struct Rng {
  std::mt19937_64 gen;
  explicit Rng(uint64_t seed) : gen(seed) {}
  int below(int n) { return static_cast<int>(gen() % static_cast<uint64_t>(n)); }
  bool chance(int percent) { return below(100) < percent; }
};

uint64_t kv_of(uint64_t previous, TokenId token) {
  uint64_t h = (previous ^ static_cast<uint32_t>(token)) * 0x9e3779b97f4a7c15ULL;
  return h ^ (h >> 29);
}

// A sequence as the test sees it: its tokens and, per position, the KV value the executor would have written (a
// hash of salt and every token up to there, so reusing KV of another prefix shows).
struct Model {
  std::vector<TokenId> tokens;
  std::vector<uint64_t> kv;
  uint64_t salt = 0;
  int computed = 0;
  bool swapped = false;

  void push(TokenId t) {
    kv.push_back(kv_of(kv.empty() ? salt * 0x51ed27ULL + 1 : kv.back(), t));
    tokens.push_back(t);
  }
};

class Simulation {
 public:
  static constexpr int B = 4;
  static constexpr int kMaxTokens = 72;

  // One KV group per window (KvCacheOptions::group_windows); a window > 0: the manager releases that group's blocks
  // before each sequence's window. The pools grow with the groups.
  Simulation(uint64_t seed, bool caching, std::vector<int> windows = {0})
      : rng_(seed),
        kv_(windowed(options(B, kDevice * static_cast<int>(windows.size()), kCpu * static_cast<int>(windows.size()),
                             0.05, caching),
                     windows)),
        windows_(std::move(windows)),
        device_(kDevice * windows_.size() * B),
        cpu_(kCpu * windows_.size() * B) {
    for (int t = 0; t < 4; ++t) {  // shared system prompts of 2..11 blocks
      std::vector<TokenId> p;
      for (int i = 0, n = 2 * B + rng_.below(10 * B); i < n; ++i) p.push_back(100 + rng_.below(50));
      templates_.push_back(p);
    }
  }

  int64_t performed() const { return performed_; }
  const std::map<std::string, int64_t>& counts() const { return counts_; }

  void step() {
    int op = rng_.below(100);
    bool crowded = live_.size() > 14;
    if (op < (crowded ? 8 : 22)) rng_.chance(30) ? plan_admissions() : admit();
    else if (op < 56) append();
    else if (op < 62) append_together();
    else if (op < 69) fork();
    else if (op < (crowded ? 86 : 78)) finish();
    else if (op < 91) swap_out();
    else swap_in();
    kv_.check_invariants();
    if (performed_ % 499 == 0) verify_all();
  }

  void drain() {
    verify_all();
    while (!live_.empty()) {
      kv_.free(live_.begin()->first);
      live_.erase(live_.begin());
      kv_.check_invariants();
    }
    KvMetrics m = kv_.metrics();
    CHECK(m.device_free == m.device_total);
    CHECK(m.cpu_free == m.cpu_total);
    CHECK(m.reserved_slots == 0);
    CHECK(m.used_slots == 0);
  }

 private:
  static constexpr int kDevice = 64;
  static constexpr int kCpu = 40;

  void count(const std::string& what, int64_t n = 1) { counts_[what] += n; }

  static KvCacheOptions windowed(KvCacheOptions o, std::vector<int> windows) {
    o.group_windows = std::move(windows);
    return o;
  }

  int groups() const { return static_cast<int>(windows_.size()); }
  // The sequence's table of each group.
  std::vector<std::vector<int32_t>> tables(SeqId id) const {
    std::vector<std::vector<int32_t>> t;
    for (int g = 0; g < groups(); ++g) t.push_back(kv_.block_table(id, g));
    return t;
  }

  // In every group, every computed position of a device sequence holds its own KV value, but those of blocks
  // released before the group's window of its next query (position computed), which no layer reads again.
  void verify(SeqId id) {
    const Model& m = live_.at(id);
    REQUIRE(kv_.num_computed(id) == m.computed);
    if (m.swapped) return;
    for (int g = 0; g < groups(); ++g) {
      const std::vector<int32_t>& table = kv_.block_table(id, g);
      for (int p = 0; p < m.computed; ++p) {
        if (table[p / B] == kReleasedBlock) {
          if (p / B >= first_window_block(m.computed, windows_[g], B))
            FAIL("sequence " << id << " released block " << p / B << " of group " << g << " inside its window after "
                             << performed_);
          continue;
        }
        if (device_[kv_slot(table, p, B)] != m.kv[p])
          FAIL("sequence " << id << " position " << p << " of group " << g << " holds foreign KV after " << performed_
                           << " operations");
      }
    }
  }
  void verify_all() {
    for (const auto& [id, m] : live_) verify(id);
  }

  std::vector<SeqId> pick_ids(bool swapped) {
    std::vector<SeqId> ids;
    for (const auto& [id, m] : live_) if (m.swapped == swapped) ids.push_back(id);
    return ids;
  }
  std::optional<SeqId> pick(bool swapped) {
    auto ids = pick_ids(swapped);
    if (ids.empty()) return std::nullopt;
    return ids[rng_.below(static_cast<int>(ids.size()))];
  }

  TokenId random_token() { return static_cast<TokenId>(rng_.below(3)); }  // tiny alphabet: chance duplicates

  // Executor stand-in: computes positions [from, to) of a device sequence into the shadow cache.
  void compute(SeqId id, int to) {
    Model& m = live_.at(id);
    for (int g = 0; g < groups(); ++g)
      for (int p = m.computed; p < to; ++p) device_[kv_slot(kv_.block_table(id, g), p, B)] = m.kv[p];
    kv_.mark_computed(id, m.tokens, to);
    m.computed = to;
  }

  // A new sequence: a template, a finished sequence's tokens or nothing, then random tokens.
  Model new_prompt() {
    Model m;
    m.salt = rng_.chance(20) ? 1 : 0;
    std::vector<TokenId> prompt;
    int source = rng_.below(10);
    if (source < 5) prompt = templates_[rng_.below(static_cast<int>(templates_.size()))];
    else if (source < 7 && !finished_.empty()) prompt = finished_[rng_.below(static_cast<int>(finished_.size()))];
    for (int i = 0, n = rng_.below(3 * B); i < n; ++i) prompt.push_back(random_token());
    if (prompt.empty()) prompt.push_back(random_token());
    for (TokenId t : prompt) m.push(t);
    return m;
  }

  // One step's admissions with prefix sharing within the step: up to four prompts allocated and registered as
  // planned, some of them freed (aborted) before the step ran; then the step: the kept chunks (drop_ended_chunks)
  // write their KV, and every kept sequence must hold its own KV at every position, shared ones included.
  void plan_admissions() {
    ++performed_;
    std::vector<PlannedChunk> chunks;
    for (int k = 0, n = 1 + rng_.below(4); k < n; ++k) {
      Model m = new_prompt();
      if (k > 0 && rng_.chance(50)) {  // the step's first prompt, cut, then tokens of its own: a shared prefix
        const Model& first = live_.at(chunks[0].id);
        m = Model{.salt = first.salt};
        for (int i = 0, cut = 1 + rng_.below(static_cast<int>(first.tokens.size())); i < cut; ++i)
          m.push(first.tokens[i]);
        for (int i = 0, more = rng_.below(2 * B); i < more; ++i) m.push(random_token());
      }
      const int size = static_cast<int>(m.tokens.size());
      if (!kv_.can_allocate(m.tokens, size, m.salt)) break;
      const SeqId id = next_id_++;
      const auto cached = kv_.allocate(id, m.tokens, size, m.salt);
      REQUIRE(cached.has_value());
      kv_.register_planned(id, m.tokens, size);
      if (*cached > 0) count("planned hit");
      std::vector<std::vector<int32_t>> t = tables(id);
      chunks.push_back({id, *cached, size - *cached, true, t[0], {t.begin() + 1, t.end()}});
      m.computed = *cached;
      live_.emplace(id, std::move(m));
    }
    std::unordered_set<SeqId> ended;
    for (const PlannedChunk& c : chunks)
      if (rng_.chance(25)) ended.insert(c.id);
    for (SeqId id : ended) {
      kv_.free(id);
      live_.erase(id);
      count("planned then freed");
    }
    kv_.check_invariants();
    const auto kept = drop_ended_chunks(chunks, ended, B);
    for (const PlannedChunk& c : kept) {  // all writes of the step, then the reads (verify)
      const Model& m = live_.at(c.id);
      if (c.start_pos < m.computed) count("reader computes a dropped writer's blocks");
      for (int g = 0; g < groups(); ++g) {
        const std::vector<int32_t>& table = g == 0 ? c.block_table : c.group_tables[g - 1];
        // What the chunk reads (its window on) and writes was not released, even when it restarted earlier.
        for (size_t b = first_window_block(c.start_pos, windows_[g], B); b < table.size(); ++b)
          if (table[b] == kReleasedBlock)
            FAIL("a chunk from " << c.start_pos << " reads released block " << b << " after " << performed_);
        if (!table.empty() && table[0] == kReleasedBlock) count("admitted with released blocks");
        for (int p = c.start_pos; p < c.start_pos + c.num_tokens; ++p) device_[kv_slot(table, p, B)] = m.kv[p];
      }
    }
    for (const PlannedChunk& c : kept) {
      Model& m = live_.at(c.id);
      kv_.mark_computed(c.id, m.tokens, static_cast<int>(m.tokens.size()));
      m.computed = static_cast<int>(m.tokens.size());
      verify(c.id);
    }
    count("planned step");
  }

  void admit() {
    Model m = new_prompt();
    const std::vector<TokenId> prompt = m.tokens;
    const int size = static_cast<int>(prompt.size());
    const int hold = rng_.chance(25) ? 1 + rng_.below(size) : size;  // a first prefill chunk or the whole prompt

    const SeqId id = next_id_++;
    const int expected_hit = kv_.cached_prefix_tokens(prompt, m.salt);
    const bool admissible = kv_.can_allocate(prompt, hold, m.salt);
    if (!admissible && rng_.chance(75)) return;  // the scheduler waits; sometimes try anyway
    const KvMetrics before = kv_.metrics();
    ++performed_;
    auto cached = kv_.allocate(id, prompt, hold, m.salt);
    if (!cached) {
      REQUIRE_FALSE(admissible);
      REQUIRE(same_metrics(kv_.metrics(), before));
      count("allocate failed");
      return;
    }
    REQUIRE(*cached == expected_hit);
    REQUIRE(*cached % B == 0);
    REQUIRE(*cached < size);
    m.computed = *cached;
    live_.emplace(id, std::move(m));
    verify(id);  // the reused prefix holds exactly this prompt's KV
    count("allocate");
    if (*cached > 0) count("prefix hit");
    if (kv_.metrics().evicted_blocks > before.evicted_blocks) count("allocate evicted");
    compute(id, std::min(size, std::max(hold, *cached)));
  }

  // The tokens [from, to) that the next step computes for a device sequence, new tokens appended when it has
  // computed them all; nullopt when it is done instead.
  std::optional<std::pair<int, int>> next_chunk(SeqId id) {
    Model& m = live_.at(id);
    if (m.computed == static_cast<int>(m.tokens.size())) {
      if (m.computed >= kMaxTokens) return std::nullopt;
      for (int i = 0, n = rng_.chance(90) ? 1 : 1 + rng_.below(2 * B); i < n; ++i) m.push(random_token());
    }
    const int from = m.computed;
    return std::pair{from, std::min(static_cast<int>(m.tokens.size()), from + 1 + rng_.below(2 * B))};
  }

  // reserve() for [from, to), checked against can_reserve's answer; then the chunk is computed.
  bool reserve_and_compute(SeqId id, int from, int to) {
    const Model& m = live_.at(id);
    const auto before_tables = tables(id);
    const bool possible = kv_.can_reserve(id, from, to);
    const KvMetrics before = kv_.metrics();
    std::vector<BlockPair> copies;
    if (!kv_.reserve(id, from, to, copies)) {
      REQUIRE_FALSE(possible);
      REQUIRE(copies.empty());
      REQUIRE(tables(id) == before_tables);
      REQUIRE(same_metrics(kv_.metrics(), before));
      count("reserve failed");
      return false;
    }
    REQUIRE(possible);
    const auto now_tables = tables(id);
    for (int g = 0; g < groups(); ++g) {
      const std::vector<int32_t>&table = before_tables[g], &now = now_tables[g];
      // The computed blocks wholly before the group's window of the queries from `from` on are released; the
      // others held.
      const int released = static_cast<int>(std::count(now.begin(), now.end(), kReleasedBlock));
      REQUIRE(released == std::min(first_window_block(from, windows_[g], B), m.computed / B));
      if (std::count(table.begin(), table.end(), kReleasedBlock) < released) count("release");
    }
    for (const auto& [src, dst] : copies) {  // each copy replaces a group's table entry, at the block holding `from`
      bool replaced = false;
      for (int g = 0; g < groups(); ++g)
        replaced = replaced || (static_cast<size_t>(from / B) < before_tables[g].size() &&
                                before_tables[g][from / B] == src && now_tables[g][from / B] == dst);
      REQUIRE(replaced);
      std::copy_n(device_.begin() + src * B, B, device_.begin() + dst * B);
    }
    count("append");
    count("cow copy", static_cast<int64_t>(copies.size()));
    compute(id, to);
    verify(id);
    return true;
  }

  void append() {
    auto id = pick(false);
    if (!id) return;
    const auto chunk = next_chunk(*id);
    if (!chunk) return finish_seq(*id);
    ++performed_;
    reserve_and_compute(*id, chunk->first, chunk->second);
  }

  // Several sequences' chunks of one step (a beam-search request's beams): can_reserve_all says whether every
  // reserve() in turn succeeds.
  void append_together() {
    std::vector<KvCacheManager::Reservation> step;
    for (SeqId id : pick_some(false))
      if (const auto chunk = next_chunk(id)) step.push_back({id, chunk->first, chunk->second});
    if (step.empty()) return;
    ++performed_;
    const bool possible = kv_.can_reserve_all(step);
    bool all = true;
    for (const auto& r : step) all = reserve_and_compute(r.seq, r.first_write_pos, r.num_tokens_to_hold) && all;
    REQUIRE(all == possible);
    count(possible ? "reserve together" : "reserve together failed");
  }

  void fork() {
    auto parent = pick(false);
    if (!parent) return;
    ++performed_;
    const SeqId child = next_id_++;
    kv_.fork(*parent, child);
    live_.emplace(child, live_.at(*parent));
    count("fork");
  }

  void finish() {
    if (live_.empty()) return;
    auto it = live_.begin();
    std::advance(it, rng_.below(static_cast<int>(live_.size())));
    finish_seq(it->first);
  }

  void finish_seq(SeqId id) {
    ++performed_;
    const Model& m = live_.at(id);
    if (!m.swapped) verify(id);
    std::vector<TokenId> done(m.tokens.begin(), m.tokens.begin() + m.computed);
    if (!done.empty()) {
      if (finished_.size() == 16) finished_.erase(finished_.begin());
      finished_.push_back(std::move(done));  // re-admitted later: a recompute after preemption
    }
    kv_.free(id);
    live_.erase(id);
    count("free");
  }

  // One to three distinct sequences of one tier.
  std::vector<SeqId> pick_some(bool swapped) {
    std::vector<SeqId> ids = pick_ids(swapped), some;
    for (int k = 0, n = 1 + rng_.below(3); k < n && !ids.empty(); ++k) {
      const auto it = ids.begin() + rng_.below(static_cast<int>(ids.size()));
      some.push_back(*it);
      ids.erase(it);
    }
    return some;
  }

  void swap_out() {
    const std::vector<SeqId> ids = pick_some(false);
    if (ids.empty()) return;
    size_t held = 0;  // table entries holding a block
    for (SeqId id : ids)
      for (const auto& t : tables(id)) held += t.size() - std::count(t.begin(), t.end(), kReleasedBlock);
    const KvMetrics before = kv_.metrics();
    ++performed_;
    auto pairs = kv_.swap_out(ids);
    if (!pairs) {
      REQUIRE(same_metrics(kv_.metrics(), before));
      count("swap-out failed");
      return;
    }
    for (const auto& [dev, host] : *pairs) std::copy_n(device_.begin() + dev * B, B, cpu_.begin() + host * B);
    for (SeqId id : ids) live_.at(id).swapped = true;
    count("swap-out");
    if (pairs->size() < held) count("swap-out shared");  // forks swapped together: one CPU block for a shared one
  }

  void swap_in() {
    const std::vector<SeqId> ids = pick_some(true);
    if (ids.empty()) return;
    const bool admissible = kv_.can_swap_in(ids);
    if (!admissible && rng_.chance(75)) return;
    const KvMetrics before = kv_.metrics();
    ++performed_;
    auto pairs = kv_.swap_in(ids);
    if (!pairs) {
      REQUIRE_FALSE(admissible);
      REQUIRE(same_metrics(kv_.metrics(), before));
      count("swap-in failed");
      return;
    }
    for (const auto& [host, dev] : *pairs) std::copy_n(cpu_.begin() + host * B, B, device_.begin() + dev * B);
    for (SeqId id : ids) {
      live_.at(id).swapped = false;
      verify(id);
    }
    count("swap-in");
  }

  Rng rng_;
  KvCacheManager kv_;
  std::vector<int> windows_;
  std::vector<uint64_t> device_;  // shadow KV, one value per device slot
  std::vector<uint64_t> cpu_;     // shadow KV, one value per CPU slot
  std::map<SeqId, Model> live_;
  std::vector<std::vector<TokenId>> templates_;
  std::vector<std::vector<TokenId>> finished_;
  std::map<std::string, int64_t> counts_;
  SeqId next_id_ = 1;
  int64_t performed_ = 0;
};

}  // namespace

TEST_CASE("property: 100,000 random operations keep every invariant and every sequence's KV", "[kv]") {
  const bool caching = GENERATE(true, false);
  // {9}: every layer slides over two blocks and a token; {0, 9, 6}: a group of full layers and two sliding groups.
  const std::vector<int> windows = GENERATE(std::vector<int>{0}, std::vector<int>{9}, std::vector<int>{0, 9, 6});
  const int window = *std::max_element(windows.begin(), windows.end());
  INFO("windows " << windows.size() << ", largest " << window);
  Simulation sim(caching ? 20240601 : 7 + window + static_cast<int>(windows.size()), caching, windows);
  while (sim.performed() < 100000) sim.step();
  sim.drain();
  const auto& c = sim.counts();
  auto at_least = [&](const std::string& what, int64_t n) {
    INFO(what);
    CHECK(c.count(what) == 1);
    if (c.count(what)) CHECK(c.at(what) >= n);
  };
  std::ostringstream summary;
  for (const auto& [what, n] : c) summary << what << ": " << n << "; ";
  INFO(summary.str());
  at_least("allocate", 5000);
  at_least("append", 30000);
  at_least("fork", 3000);
  at_least("cow copy", 1000);
  at_least("free", 5000);
  at_least("swap-out", 2000);
  at_least("swap-in", 1000);
  at_least("swap-out shared", 100);
  at_least("reserve together", 1000);
  at_least("reserve together failed", 20);
  at_least("planned step", 1000);
  at_least("planned then freed", 300);
  if (window > 0) at_least("release", 3000);
  if (window > 0 && caching) at_least("admitted with released blocks", 50);
  if (caching) {
    at_least("planned hit", 500);
    at_least("reader computes a dropped writer's blocks", 20);
    at_least("prefix hit", window > 0 ? 1000 : 2000);  // released blocks outlive their sequence less often
    at_least("allocate evicted", 500);
  }
}

}  // namespace paged
