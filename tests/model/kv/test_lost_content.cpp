// LostContent: the registrations no tier holds, kept without KV (model/kv/lost_content.h).
#include <catch2/catch.hpp>

#include "model/kv/lost_content.h"

namespace paged {
namespace {

EvictedContent lost(uint64_t id, uint64_t parent, std::vector<TokenId> tokens, uint64_t salt = 0) {
  return {id, parent, salt, std::move(tokens), 0};
}

}  // namespace

TEST_CASE("LostContent keeps verified ids, forgets the oldest beyond capacity, and gives an id back once", "[kv][lost]") {
  LostContent table(2);
  table.add(lost(7, 0, {1, 2, 3, 4}, 99));
  table.add(lost(8, 7, {5, 6, 7, 8}));
  CHECK(table.size() == 2);
  CHECK(table.find(lost(0, 0, {1, 2, 3, 4}, 99).view()) == 7u);
  CHECK(table.find(lost(0, 7, {5, 6, 7, 8}).view()) == 8u);
  // Every part of the content counts: the salt, the parent id, each token.
  CHECK_FALSE(table.find(lost(0, 0, {1, 2, 3, 4}, 98).view()));
  CHECK_FALSE(table.find(lost(0, 6, {5, 6, 7, 8}).view()));
  CHECK_FALSE(table.find(lost(0, 7, {5, 6, 7, 9}).view()));
  CHECK_FALSE(table.find(lost(0, 7, {5, 6, 7}).view()));
  // A third entry: the oldest (7) goes.
  table.add(lost(9, 8, {9, 9, 9, 9}));
  CHECK(table.size() == 2);
  CHECK_FALSE(table.find(lost(0, 0, {1, 2, 3, 4}, 99).view()));
  CHECK(table.entries().front().content_id == 8u);
  // The same content lost again under a newer id replaces the older entry.
  table.add(lost(12, 7, {5, 6, 7, 8}));
  CHECK(table.size() == 2);
  CHECK(table.find(lost(0, 7, {5, 6, 7, 8}).view()) == 12u);
  // take: the id once, then the entry is gone.
  CHECK(table.take(lost(0, 8, {9, 9, 9, 9}).view()) == 9u);
  CHECK_FALSE(table.take(lost(0, 8, {9, 9, 9, 9}).view()));
  CHECK(table.size() == 1);
  // No capacity: nothing is kept.
  LostContent none(0);
  none.add(lost(3, 0, {1}));
  CHECK(none.size() == 0);
  CHECK_FALSE(none.find(lost(0, 0, {1}).view()));
}

}  // namespace paged
