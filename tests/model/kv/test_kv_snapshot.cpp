// KvCacheManager::snapshot and the cell runs of model/kv/kv_snapshot.h: each block's cell decoded from the runs is
// compared with what the manager's own queries say of that block (block tables, metrics), on every tier.
#include <catch2/catch.hpp>

#include <chrono>
#include <iostream>
#include <map>

#include "model/kv/kv_cache_manager.h"
#include "tests/model/kv/iota_tokens.h"

namespace paged {
namespace {

using test::iota_tokens;

// The tier's cells one per block, decoded from its runs.
std::vector<uint8_t> cells_of(const TierSnapshot& tier) {
  std::vector<uint8_t> cells;
  for (const CellRun& run : tier.runs) cells.insert(cells.end(), run.count, run.cell);
  return cells;
}

const TierSnapshot& tier_named(const KvSnapshot& snap, const std::string& name) {
  for (const TierSnapshot& t : snap.tiers)
    if (t.name == name) return t;
  FAIL("no tier " << name);
  throw std::logic_error("unreachable");
}

KvCacheOptions options(int block_size, int device, int swap) {
  KvCacheOptions o;
  o.block_size = block_size;
  o.num_device_blocks = device;
  o.num_cpu_blocks = swap;
  o.watermark = 0.0;
  return o;
}

// The runs are well formed: no empty run, no two neighbours alike, counts summing to num_blocks.
void check_runs(const TierSnapshot& tier) {
  int64_t sum = 0;
  for (size_t i = 0; i < tier.runs.size(); ++i) {
    CHECK(tier.runs[i].count > 0);
    if (i > 0) CHECK(tier.runs[i].cell != tier.runs[i - 1].cell);
    sum += tier.runs[i].count;
  }
  CHECK(sum == tier.num_blocks);
}

}  // namespace

TEST_CASE("TierSnapshot::push merges equal neighbours and skips empty runs", "[kv][snapshot]") {
  TierSnapshot t;
  t.push(kCellFree, 3);
  t.push(kCellFree);
  t.push(kCellCached, 0);
  t.push(seq_cell(7), 2);
  t.push(kCellFree);
  REQUIRE(t.runs.size() == 3);
  CHECK(t.runs[0].count == 4);
  CHECK(t.num_blocks == 7);
  CHECK(t.count(kCellFree) == 5);
  CHECK(t.in_use() == 2);
  CHECK(seq_cell(7) == seq_cell(7 + 252));  // colours repeat after 252 sequences
  CHECK(seq_cell(7) >= kCellFirstSeq);
  CHECK(seq_cell(251) == 255);
}

TEST_CASE("snapshot: each device block's cell is what the block tables and the pool say of it", "[kv][snapshot]") {
  const int B = 4;
  KvCacheManager kv(options(B, 16, 8));
  const auto a = iota_tokens(3 * B + 1, 10), c = iota_tokens(2 * B, 100), d = iota_tokens(2 * B + 1, 300);
  REQUIRE(kv.allocate(1, a, static_cast<int>(a.size())));
  kv.mark_computed(1, a, static_cast<int>(a.size()));
  kv.fork(1, 2);  // every block of 1 shared with 2
  REQUIRE(kv.allocate(3, c, static_cast<int>(c.size())));
  REQUIRE(kv.allocate(4, d, static_cast<int>(d.size())));
  kv.mark_computed(4, d, static_cast<int>(d.size()));
  const std::vector<int32_t> d_blocks = kv.block_table(4);
  kv.free(4);  // its two full blocks stay cached, its last block is free
  REQUIRE(kv.allocate(5, iota_tokens(B, 500), B));
  REQUIRE(kv.swap_out(5).has_value());
  kv.check_invariants();

  const KvSnapshot snap = kv.snapshot();
  CHECK(snap.block_size == B);
  REQUIRE(snap.tiers.size() == 2);  // device and swap: no CPU or disk tier
  const TierSnapshot& device = tier_named(snap, "device");
  check_runs(device);
  REQUIRE(device.num_blocks == 16);
  // The expectation, built from the tables and the manager's figures alone.
  std::vector<uint8_t> expected(16, kCellFree);
  for (int32_t b : kv.block_table(1)) expected[b] = kCellShared;
  for (int32_t b : kv.block_table(3)) expected[b] = seq_cell(3);
  expected[d_blocks[0]] = kCellCached;
  expected[d_blocks[1]] = kCellCached;
  CHECK(cells_of(device) == expected);
  const KvMetrics m = kv.metrics();
  CHECK(device.in_use() == m.device_total - m.device_free);
  CHECK(device.count(kCellCached) == m.device_cached);

  const TierSnapshot& swap = tier_named(snap, "swap");
  check_runs(swap);
  CHECK(swap.num_blocks == 8);
  CHECK(swap.count(seq_cell(5)) == 1);
  CHECK(swap.count(kCellFree) == 7);

  REQUIRE(snap.seqs.size() == 4);  // 1, 2, 3 on the device, 5 swapped; by id
  CHECK(snap.seqs[0].seq == 1);
  CHECK(snap.seqs[0].num_blocks == 4);
  CHECK(snap.seqs[0].num_computed == 3 * B + 1);
  CHECK(snap.seqs[1].seq == 2);
  CHECK(snap.seqs[2].seq == 3);
  CHECK(snap.seqs[2].num_computed == 0);
  CHECK(snap.seqs[3].seq == 5);
  CHECK(snap.seqs[3].swapped);
  CHECK_FALSE(snap.seqs[0].swapped);
}

TEST_CASE("snapshot: the CPU tier's cached blocks and the disk tier's files", "[kv][snapshot]") {
  const int B = 4;
  KvCacheOptions o = options(B, 4, 0);
  o.num_offload_blocks = 6;
  o.num_disk_blocks = 10;
  o.disk_keys = {11, 12, 13};  // three files found at start
  KvCacheManager kv(o);
  const auto a = iota_tokens(2 * B + 1, 10);
  REQUIRE(kv.allocate(1, a, static_cast<int>(a.size())));
  kv.mark_computed(1, a, static_cast<int>(a.size()));
  kv.free(1);  // two cached device blocks
  const auto b = iota_tokens(4 * B, 50);
  REQUIRE(kv.allocate(2, b, static_cast<int>(b.size())));  // the whole pool: a's blocks go to the CPU tier
  kv.check_invariants();

  const KvSnapshot snap = kv.snapshot();
  REQUIRE(snap.tiers.size() == 3);  // no swap space
  const TierSnapshot& device = tier_named(snap, "device");
  CHECK(device.count(seq_cell(2)) == 4);
  const TierSnapshot& cpu = tier_named(snap, "cpu");
  check_runs(cpu);
  const KvMetrics m = kv.metrics();
  CHECK(cpu.num_blocks == 6);
  CHECK(cpu.count(kCellCached) == m.offload_cached);
  CHECK(m.offload_cached == 2);
  CHECK(cpu.count(kCellFree) == 4);
  const TierSnapshot& disk = tier_named(snap, "disk");
  check_runs(disk);
  CHECK(disk.num_blocks == 10);
  CHECK(disk.count(kCellCached) == 3);
}

TEST_CASE("snapshot of 100k blocks: a few runs, and cheap", "[kv][snapshot]") {
  const int B = 16, kBlocks = 100000;
  KvCacheManager kv(options(B, kBlocks, 1000));
  // 200 sequences of 100 blocks each: 20k blocks in use, in 200 runs, the rest one free run.
  for (SeqId s = 1; s <= 200; ++s) {
    const auto tokens = iota_tokens(100 * B, static_cast<TokenId>(s * 100000));
    REQUIRE(kv.allocate(s, tokens, static_cast<int>(tokens.size())));
  }
  const auto start = std::chrono::steady_clock::now();
  const KvSnapshot snap = kv.snapshot();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const TierSnapshot& device = tier_named(snap, "device");
  check_runs(device);
  CHECK(device.runs.size() == 201);
  CHECK(device.in_use() == 20000);
  CHECK(snap.seqs.size() == 200);
  std::cout << "kv snapshot of " << kBlocks << " blocks, 200 sequences: " << ms << " ms\n";
  CHECK(ms < 200.0);  // well under the dashboard's push interval even on a loaded machine
}

}  // namespace paged
