// The prefix cache's disk tier: the index alone (LRU, capacity, loads), the block files (a round trip; truncated,
// corrupt and foreign files are misses), and the KvCacheManager's saves of what the CPU tier drops and its loads
// back into the CPU tier, with plan_step holding the waiting sequence until they are answered.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "model/kv/disk_tier.h"
#include "model/kv/kv_cache_manager.h"
#include "model/kv/kv_disk_file.h"
#include "model/scheduling/scheduler_policy.h"
#include "tests/test_data.h"

namespace paged {
namespace {

std::vector<std::byte> bytes_of(std::initializer_list<int> values) {
  std::vector<std::byte> b;
  for (int v : values) b.push_back(static_cast<std::byte>(v));
  return b;
}

}  // namespace

TEST_CASE("DiskTier: least recently used keys leave beyond the capacity; loading keys are not found", "[kv][disk]") {
  DiskTier disk(3, {1, 2, 3, 4, 5});  // found at start, oldest first: 1 and 2 do not fit
  CHECK(disk.take_initial_deletions() == std::vector<uint64_t>{1, 2});
  CHECK(disk.take_initial_deletions().empty());
  CHECK(disk.contains(3));
  CHECK_FALSE(disk.contains(1));
  CHECK(disk.add(4).empty());                        // a touch: 3 is now the least recently used
  CHECK(disk.add(6) == std::vector<uint64_t>{3});
  disk.begin_load(5);
  CHECK_FALSE(disk.contains(5));
  CHECK(disk.loading(5));
  CHECK_THROWS_AS(disk.begin_load(5), std::logic_error);
  CHECK_THROWS_AS(disk.add(5), std::logic_error);
  CHECK(disk.add(7) == std::vector<uint64_t>{4});    // the loading key is not evicted
  disk.end_load(5, true);
  CHECK(disk.contains(5));
  CHECK(disk.add(8) == std::vector<uint64_t>{6});
  disk.begin_load(7);
  disk.end_load(7, false);                           // a bad file: forgotten
  CHECK_FALSE(disk.contains(7));
  CHECK(disk.size() == 2);
  CHECK_THROWS_AS(disk.end_load(7, true), std::logic_error);
  disk.check_invariants();
}

TEST_CASE("block files: a round trip; truncated, corrupt, foreign or other-token files are misses", "[kv][disk]") {
  test::TempDir dir("paged_disk_");
  const KvDiskStore store(dir.path(), 0xabc, 0), other_model(dir.path(), 0xdef, 0), rank1(dir.path(), 0xabc, 1);
  const std::vector<TokenId> tokens{5, 6, 7, 8};
  const std::vector<std::byte> kv = bytes_of({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  REQUIRE(store.save(42, 9, tokens, kv));
  CHECK(store.path_of(42).filename() == "0000000000000abc-000000000000002a.kv");
  CHECK(rank1.path_of(42).filename() == "0000000000000abc-000000000000002a-r1.kv");
  std::vector<std::byte> out(kv.size());
  REQUIRE(store.load(42, 9, tokens, out));
  CHECK(out == kv);
  std::vector<std::byte> untouched(kv.size(), std::byte{0x55});
  CHECK_FALSE(store.load(42, 8, tokens, untouched));                               // another salt
  CHECK_FALSE(store.load(42, 9, std::vector<TokenId>{5, 6, 7, 9}, untouched));      // another token
  CHECK_FALSE(store.load(43, 9, tokens, untouched));                               // no file
  CHECK_FALSE(other_model.load(42, 9, tokens, untouched));
  CHECK_FALSE(rank1.load(42, 9, tokens, untouched));
  std::vector<std::byte> longer(kv.size() + 1);
  CHECK_FALSE(store.load(42, 9, tokens, longer));
  CHECK(untouched == std::vector<std::byte>(kv.size(), std::byte{0x55}));

  const auto size = std::filesystem::file_size(store.path_of(42));
  {  // one KV byte flipped: the checksum fails
    std::fstream f(store.path_of(42), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size) - 3);
    f.put(static_cast<char>(0x7f));
  }
  CHECK_FALSE(store.load(42, 9, tokens, out));
  REQUIRE(store.save(42, 9, tokens, kv));
  std::filesystem::resize_file(store.path_of(42), size - 1);  // truncated
  CHECK_FALSE(store.load(42, 9, tokens, out));
  store.remove(42);
  CHECK_FALSE(std::filesystem::exists(store.path_of(42)));
}

TEST_CASE("block files: the keys of one model's rank-0 files, least recently written first", "[kv][disk]") {
  test::TempDir dir("paged_disk_");
  const KvDiskStore store(dir.path(), 0xabc, 0), rank1(dir.path(), 0xabc, 1), other(dir.path(), 0xdef, 0);
  const std::vector<TokenId> tokens{1};
  const std::vector<std::byte> kv = bytes_of({1});
  for (uint64_t key : {7, 3, 9}) {
    REQUIRE(store.save(key, 0, tokens, kv));
    std::filesystem::last_write_time(store.path_of(key),
                                     std::filesystem::file_time_type::clock::now() + std::chrono::seconds(key));
  }
  REQUIRE(rank1.save(5, 0, tokens, kv));
  REQUIRE(other.save(6, 0, tokens, kv));
  std::ofstream(dir.path() / "notes.txt") << "x";
  CHECK(KvDiskStore::list_keys(dir.path(), 0xabc) == std::vector<uint64_t>{3, 7, 9});
  CHECK(KvDiskStore::list_keys(dir.path() / "missing", 0xabc).empty());
}

namespace {

KvCacheOptions disk_options(int device, int offload, int64_t disk) {
  KvCacheOptions o;
  o.block_size = 2;
  o.num_device_blocks = device;
  o.num_offload_blocks = offload;
  o.num_disk_blocks = disk;
  o.watermark = 0.0;
  return o;
}

// A prompt of one full block of 2 tokens (k, k + 1) and one more token.
std::vector<TokenId> prompt(TokenId k) { return {k, k + 1, 99}; }

// Admits `tokens` whole, computes them and frees the sequence: its full blocks are cached on the device. Returns
// the plan's tier orders.
KvCacheManager::TierCopies pass(KvCacheManager& kv, SeqId id, const std::vector<TokenId>& tokens) {
  REQUIRE(kv.allocate(id, tokens, static_cast<int>(tokens.size())).has_value());
  kv.mark_computed(id, tokens, static_cast<int>(tokens.size()));
  kv.free(id);
  kv.check_invariants();
  return kv.take_tier_copies();
}

}  // namespace

TEST_CASE("what the CPU tier drops is saved to disk and loaded back into it on a lookup", "[kv][disk]") {
  KvCacheManager kv(disk_options(2, 2, 8));
  pass(kv, 1, prompt(10));
  pass(kv, 2, prompt(20));  // 10's block demoted to the tier
  pass(kv, 3, prompt(30));  // 20's too
  const auto copies = pass(kv, 4, prompt(40));  // 30's: the tier is full and drops 10's, stored two plans ago
  REQUIRE(copies.disk_writes.size() == 1);
  const DiskOrder& save = copies.disk_writes[0];
  CHECK(save.kind == DiskOrder::Kind::save);
  CHECK(save.tokens == std::vector<TokenId>{10, 11});
  REQUIRE(copies.demotions.size() == 1);
  CHECK(copies.demotions[0].second == save.host_block);  // saved before the demotion overwrites it
  CHECK(kv.metrics().disk_saved_blocks == 1);
  CHECK(kv.cached_prefix_tokens(prompt(10)) == 0);       // not in a memory tier

  REQUIRE(kv.load_from_disk(prompt(10)));
  const auto load = kv.take_tier_copies();
  REQUIRE(load.disk_loads.size() == 1);
  CHECK(load.disk_loads[0].key == save.key);  // the same chain key, computed from the tokens again
  CHECK(load.disk_loads[0].tokens == save.tokens);
  REQUIRE(load.disk_writes.size() == 1);      // staging dropped 20's block: saved before the load overwrites it
  CHECK(load.disk_writes[0].tokens == std::vector<TokenId>{20, 21});
  CHECK(load.disk_writes[0].host_block == load.disk_loads[0].host_block);
  CHECK(kv.load_from_disk(prompt(10)));       // still loading: wait, no new order
  CHECK(kv.take_tier_copies().disk_loads.empty());
  CHECK(kv.cached_prefix_tokens(prompt(10)) == 0);
  kv.check_invariants();

  kv.finish_load(save.key, true);
  CHECK(kv.metrics().disk_hit_tokens == 2);
  CHECK(kv.cached_prefix_tokens(prompt(10)) == 2);  // in the CPU tier now
  CHECK_FALSE(kv.load_from_disk(prompt(10)));
  REQUIRE(kv.allocate(5, prompt(10), 3) == 2);      // promoted
  CHECK(kv.take_tier_copies().promotions.size() == 1);
  CHECK(kv.metrics().offload_hit_tokens == 2);
  kv.free(5);
  kv.check_invariants();
  CHECK_THROWS_AS(kv.finish_load(save.key, true), std::logic_error);
}

TEST_CASE("a load that fails is a miss and its file goes", "[kv][disk]") {
  KvCacheManager kv(disk_options(2, 2, 8));
  for (SeqId id = 1; id <= 4; ++id) pass(kv, id, prompt(static_cast<TokenId>(10 * id)));
  REQUIRE(kv.load_from_disk(prompt(10)));
  const uint64_t key = kv.take_tier_copies().disk_loads.at(0).key;
  kv.finish_load(key, false);
  const auto after = kv.take_tier_copies();
  REQUIRE(after.disk_writes.size() == 1);
  CHECK(after.disk_writes[0].kind == DiskOrder::Kind::remove);
  CHECK(after.disk_writes[0].key == key);
  CHECK(kv.cached_prefix_tokens(prompt(10)) == 0);
  CHECK_FALSE(kv.load_from_disk(prompt(10)));  // gone from the index: computed, not waited for
  CHECK(kv.metrics().disk_hit_tokens == 0);
  kv.check_invariants();
}

TEST_CASE("plan_step: a waiting sequence whose prefix is on disk waits for the load, then is promoted",
          "[kv][disk]") {
  KvCacheManager kv(disk_options(2, 2, 8));
  for (SeqId id = 1; id <= 4; ++id) pass(kv, id, prompt(static_cast<TokenId>(10 * id)));
  PlanSeq s;
  s.id = 9;
  s.tokens = std::make_shared<const std::vector<TokenId>>(prompt(10));
  s.num_tokens = 3;
  const StepPlan waiting = plan_step(kv, {s}, PlanLimits{});
  CHECK(waiting.admitted.empty());
  CHECK(waiting.chunks.empty());
  REQUIRE(waiting.disk_loads.size() == 1);
  kv.finish_load(waiting.disk_loads[0].key, true);
  const StepPlan admitted = plan_step(kv, {s}, PlanLimits{});
  REQUIRE(admitted.admitted.size() == 1);
  CHECK(admitted.admitted[0].second == 2);
  CHECK(admitted.swap_in.size() == 1);  // the promotion from the CPU tier
  REQUIRE(admitted.chunks.size() == 1);
  CHECK(admitted.chunks[0].start_pos == 2);
  kv.check_invariants();
}

TEST_CASE("the disk tier needs the CPU tier; files beyond its size at start are removed", "[kv][disk]") {
  CHECK_THROWS_AS(KvCacheManager(disk_options(2, 0, 8)), std::invalid_argument);
  KvCacheOptions o = disk_options(2, 2, 2);
  o.disk_keys = {11, 12, 13};
  KvCacheManager kv(o);
  const auto copies = kv.take_tier_copies();
  REQUIRE(copies.disk_writes.size() == 1);
  CHECK(copies.disk_writes[0].kind == DiskOrder::Kind::remove);
  CHECK(copies.disk_writes[0].key == 11);
  CHECK(kv.metrics().disk_stored == 2);
}

}  // namespace paged
