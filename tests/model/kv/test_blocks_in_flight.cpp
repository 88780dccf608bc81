// BlocksInFlight: which device blocks copies may still be using, and whether a step touches one
// (model/kv/blocks_in_flight.h).
#include <catch2/catch.hpp>

#include "model/kv/blocks_in_flight.h"

namespace paged {
namespace {

SeqChunk chunk(std::vector<int32_t> table, std::vector<std::vector<int32_t>> group_tables = {}) {
  SeqChunk c;
  c.tokens = {1};
  c.block_table = std::move(table);
  c.group_tables = std::move(group_tables);
  return c;
}

}  // namespace

TEST_CASE("BlocksInFlight: a step touches a marked block through any table or copy, until cleared", "[kv][swap]") {
  BlocksInFlight blocks(16);
  StepBatch step;
  step.seqs = {chunk({0, 1, 2}), chunk({3, -1, 4}, {{5, 6}})};
  step.copies = {{7, 8}};
  CHECK(blocks.empty());
  CHECK_FALSE(blocks.touched_by(step));

  blocks.add(9);
  blocks.add(15);
  CHECK_FALSE(blocks.empty());
  CHECK_FALSE(blocks.touched_by(step));  // the step runs beside copies of blocks it does not use

  for (const int32_t b : {2, 4, 6, 7, 8}) {  // a table's last entry, past a released one, a group's, a copy's ends
    BlocksInFlight one(16);
    one.add(b);
    CHECK(one.touched_by(step));
  }

  blocks.add(6);
  blocks.add(6);  // twice: once
  CHECK(blocks.touched_by(step));
  blocks.clear();
  CHECK(blocks.empty());
  CHECK_FALSE(blocks.touched_by(step));
  blocks.add(6);  // marked again after a clear
  CHECK(blocks.touched_by(step));

  CHECK_THROWS_AS(blocks.add(16), std::out_of_range);
  CHECK_THROWS_AS(blocks.add(-1), std::out_of_range);
}

}  // namespace paged
