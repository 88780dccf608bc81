// The pure routing policy of a head over several replicas: request_weight, choose_replica (least loaded and its
// tie-breaks, unavailable and excluded replicas, prefix affinity against the balance rule) and PrefixAffinity (full
// blocks only, chained keys, LRU eviction at capacity, forget).
#include <catch2/catch.hpp>

#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <vector>

#include "model/routing/router_policy.h"

using namespace paged;

namespace {

/// An available replica with the given load.
ReplicaLoad load(int64_t active_tokens, int64_t free_blocks = 100, int64_t active_requests = 1) {
  ReplicaLoad l;
  l.available = true;
  l.active_tokens = active_tokens;
  l.free_blocks = free_blocks;
  l.total_blocks = 100;
  l.active_requests = active_requests;
  return l;
}

ReplicaLoad unavailable() {
  ReplicaLoad l = load(0, 1000, 0);
  l.available = false;
  return l;
}

/// Token ids of one block, distinct per `tag`.
std::vector<TokenId> block(int tag, int block_size) {
  std::vector<TokenId> t;
  for (int i = 0; i < block_size; ++i) t.push_back(static_cast<TokenId>(tag * 1000 + i));
  return t;
}

/// The blocks of `tags` one after another, then `tail` more tokens of a partial block.
std::vector<TokenId> prompt(std::initializer_list<int> tags, int block_size, int tail = 0) {
  std::vector<TokenId> p;
  for (int tag : tags) {
    std::vector<TokenId> b = block(tag, block_size);
    p.insert(p.end(), b.begin(), b.end());
  }
  for (int i = 0; i < tail; ++i) p.push_back(static_cast<TokenId>(900000 + i));
  return p;
}

RoutingOptions options_with(int block_size, size_t capacity = 1 << 16) {
  RoutingOptions o;
  o.block_size = block_size;
  o.affinity_capacity_blocks = capacity;
  return o;
}

}  // namespace

TEST_CASE("request_weight is the prompt plus max_tokens for each completion", "[router]") {
  CHECK(request_weight(100, 50, 1) == 150);
  CHECK(request_weight(100, 50, 3) == 250);
  CHECK(request_weight(0, 7, 4) == 28);
  CHECK(request_weight(3'000'000'000ULL, 1'000'000, 4) == 3'004'000'000LL);  // no int overflow
}

TEST_CASE("without affinity the least loaded replica is chosen, ties broken in order", "[router]") {
  const RoutingOptions o;
  SECTION("fewest active tokens, whatever the other fields") {
    CHECK(choose_replica({load(500, 1000, 0), load(200, 1, 9), load(300)}, {}, o) == 1u);
  }
  SECTION("equal tokens: more free blocks") {
    CHECK(choose_replica({load(200, 10, 1), load(200, 50, 5), load(200, 20, 0)}, {}, o) == 1u);
  }
  SECTION("equal tokens and free blocks: fewer active requests") {
    CHECK(choose_replica({load(200, 50, 4), load(200, 50, 2), load(200, 50, 3)}, {}, o) == 1u);
  }
  SECTION("all equal: lowest index") {
    CHECK(choose_replica({load(900), load(200), load(200), load(200)}, {}, o) == 1u);
  }
}

TEST_CASE("unavailable and excluded replicas are never chosen; nullopt when none is left", "[router]") {
  const RoutingOptions o;
  // Replica 0 is the least loaded and holds the longest prefix, but is unavailable.
  CHECK(choose_replica({unavailable(), load(300), load(100)}, {5, 0, 0}, o) == 2u);
  // Replica 2 is the least loaded and holds the prefix, but the request comes from it.
  CHECK(choose_replica({load(300), load(200), load(100)}, {0, 0, 4}, o, 2) == 1u);
  CHECK(choose_replica({}, {}, o) == std::nullopt);
  CHECK(choose_replica({unavailable(), unavailable()}, {1, 1}, o) == std::nullopt);
  CHECK(choose_replica({unavailable(), load(0)}, {}, o, 1) == std::nullopt);
}

TEST_CASE("a request sharing a 3-block prefix goes to the replica that got it, even slightly more loaded", "[router]") {
  const RoutingOptions o = options_with(4);
  PrefixAffinity affinity(o);
  affinity.record(1, prompt({1, 2, 3}, 4));
  affinity.record(2, prompt({7}, 4));

  const std::vector<TokenId> request = prompt({1, 2, 3, 9}, 4, 2);  // the 3 blocks, a new one, a partial one
  const std::vector<int> matched = affinity.matched_blocks(request, 3);
  CHECK(matched == std::vector<int>{0, 3, 0});
  CHECK(choose_replica({load(1000), load(1200), load(1100)}, matched, o) == 1u);
}

TEST_CASE("the balance rule sends the request elsewhere when the affine replica is overloaded", "[router]") {
  RoutingOptions o;
  o.balance_factor = 1.5;
  o.balance_slack_tokens = 4096;
  // The least loaded has 1000 active tokens: the bound is 1.5 * 1000 + 4096 = 5596.
  const std::vector<int> matched = {0, 3, 0};
  CHECK(choose_replica({load(1000), load(5596), load(2000)}, matched, o) == 1u);  // at the bound: still affine
  CHECK(choose_replica({load(1000), load(5597), load(2000)}, matched, o) == 0u);  // past it: least loaded

  SECTION("the longest match within the bound wins; an overloaded longer match yields to a shorter one") {
    CHECK(choose_replica({load(1000), load(3000), load(2000)}, {0, 2, 3}, o) == 2u);
    CHECK(choose_replica({load(1000), load(3000), load(9000)}, {0, 2, 3}, o) == 1u);
  }
  SECTION("equal matches: the less loaded of them") {
    CHECK(choose_replica({load(1000), load(3000), load(2000)}, {0, 2, 2}, o) == 2u);
  }
  SECTION("without a match of at least one block, the least loaded") {
    CHECK(choose_replica({load(1000), load(1100)}, {0, 0}, o) == 0u);
  }
}

TEST_CASE("prefix affinity counts full blocks only", "[router]") {
  PrefixAffinity affinity(options_with(4));
  affinity.record(0, prompt({1, 2}, 4, 3));      // 2 full blocks and 3 tokens
  affinity.record(1, std::vector<TokenId>{5, 6, 7});  // less than one block
  CHECK(affinity.size() == 2u);
  // The same 2 blocks and the same 3 tokens: the partial block does not match.
  CHECK(affinity.matched_blocks(prompt({1, 2}, 4, 3), 2) == std::vector<int>{2, 0});
  CHECK(affinity.matched_blocks(std::vector<TokenId>{5, 6, 7}, 2) == std::vector<int>{0, 0});
  // A prompt ending inside block 2 matches block 1 only.
  std::vector<TokenId> short_prompt = prompt({1, 2}, 4);
  short_prompt.pop_back();
  CHECK(affinity.matched_blocks(short_prompt, 2) == std::vector<int>{1, 0});
}

TEST_CASE("prefix keys are chains: a block matches only after the same blocks before it", "[router]") {
  PrefixAffinity affinity(options_with(4));
  affinity.record(0, prompt({1, 2, 3}, 4));
  CHECK(affinity.matched_blocks(prompt({8, 2, 3}, 4), 1) == std::vector<int>{0});  // same blocks 2, 3 after another 1
  CHECK(affinity.matched_blocks(prompt({1, 8, 3}, 4), 1) == std::vector<int>{1});  // same block 3 after another 2
  CHECK(affinity.matched_blocks(prompt({1, 2, 3}, 4), 1) == std::vector<int>{3});
  // Token order within a block counts.
  affinity.record(0, std::vector<TokenId>{1, 2, 3, 4});
  CHECK(affinity.matched_blocks(std::vector<TokenId>{2, 1, 3, 4}, 1) == std::vector<int>{0});
}

TEST_CASE("one prefix sent to several replicas matches each; replicas past num_replicas are left out", "[router]") {
  PrefixAffinity affinity(options_with(4));
  affinity.record(0, prompt({1, 2, 3}, 4));
  affinity.record(2, prompt({1, 2}, 4));
  affinity.record(3, prompt({1, 2, 3}, 4));
  CHECK(affinity.size() == 8u);  // (block, replica) pairs
  affinity.record(0, prompt({1, 2, 3}, 4));  // again: refreshed, not added
  CHECK(affinity.size() == 8u);
  CHECK(affinity.matched_blocks(prompt({1, 2, 3, 4}, 4), 4) == std::vector<int>{3, 0, 2, 3});
  CHECK(affinity.matched_blocks(prompt({1, 2, 3}, 4), 3) == std::vector<int>{3, 0, 2});
}

TEST_CASE("at capacity the least recently recorded blocks are forgotten first; record refreshes", "[router]") {
  PrefixAffinity affinity(options_with(2, 4));
  affinity.record(0, prompt({1, 2}, 2));
  affinity.record(1, prompt({3, 4}, 2));
  CHECK(affinity.size() == 4u);

  SECTION("the oldest prompt goes first") {
    affinity.record(2, prompt({5, 6}, 2));
    CHECK(affinity.size() == 4u);
    CHECK(affinity.matched_blocks(prompt({1, 2}, 2), 3) == std::vector<int>{0, 0, 0});
    CHECK(affinity.matched_blocks(prompt({3, 4}, 2), 3) == std::vector<int>{0, 2, 0});
    CHECK(affinity.matched_blocks(prompt({5, 6}, 2), 3) == std::vector<int>{0, 0, 2});
  }
  SECTION("recording again refreshes: the other prompt goes instead") {
    affinity.record(0, prompt({1, 2}, 2));
    affinity.record(2, prompt({5, 6}, 2));
    CHECK(affinity.matched_blocks(prompt({1, 2}, 2), 3) == std::vector<int>{2, 0, 0});
    CHECK(affinity.matched_blocks(prompt({3, 4}, 2), 3) == std::vector<int>{0, 0, 0});
  }
  SECTION("a prefix is trimmed from its end: its first block outlives its last") {
    affinity.record(2, prompt({5}, 2));
    CHECK(affinity.matched_blocks(prompt({1, 2}, 2), 3) == std::vector<int>{1, 0, 0});
    CHECK(affinity.matched_blocks(prompt({3, 4}, 2), 3) == std::vector<int>{0, 2, 0});
  }
  SECTION("a prompt longer than the capacity keeps its first blocks") {
    affinity.record(2, prompt({5, 6, 7, 8, 9, 10}, 2));
    CHECK(affinity.size() == 4u);
    CHECK(affinity.matched_blocks(prompt({5, 6, 7, 8, 9, 10}, 2), 3) == std::vector<int>{0, 0, 4});
    CHECK(affinity.matched_blocks(prompt({3, 4}, 2), 3) == std::vector<int>{0, 0, 0});
  }
}

TEST_CASE("forget drops every prefix of one replica and nothing of the others", "[router]") {
  PrefixAffinity affinity(options_with(4));
  affinity.record(0, prompt({1, 2}, 4));
  affinity.record(0, prompt({5, 6, 7}, 4));
  affinity.record(1, prompt({1, 2}, 4));
  CHECK(affinity.size() == 7u);
  affinity.forget(0);
  CHECK(affinity.size() == 2u);
  CHECK(affinity.matched_blocks(prompt({1, 2}, 4), 2) == std::vector<int>{0, 2});
  CHECK(affinity.matched_blocks(prompt({5, 6, 7}, 4), 2) == std::vector<int>{0, 0});
  affinity.forget(1);
  CHECK(affinity.size() == 0u);
  // A rejoined replica is learnt afresh.
  affinity.record(0, prompt({5}, 4));
  CHECK(affinity.matched_blocks(prompt({5, 6}, 4), 2) == std::vector<int>{1, 0});
}

TEST_CASE("prefix affinity rejects a block size below 1", "[router]") {
  CHECK_THROWS_AS(PrefixAffinity(options_with(0)), std::invalid_argument);
}
