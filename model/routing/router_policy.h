// The routing policy of a head serving several replicas of a model, pure: no CAF. Each replica is one worker process
// with its own KV cache; the router actor sends each new request to one replica, chosen by choose_replica from the
// replicas' loads and from PrefixAffinity, its memory of which replica recently received which prompt prefixes (a
// request sent where its prefix went before can reuse that replica's prefix cache).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

#include "model/types.h"

namespace paged {

/// What the router knows of one replica when it picks one.
struct ReplicaLoad {
  bool available = false;       // serving (connected, its scheduler up); an unavailable replica is never chosen
  int64_t active_requests = 0;  // requests routed there and not finished
  int64_t active_tokens = 0;    // their weight: sum of request_weight of those requests
  int64_t free_blocks = 0;      // free KV blocks of its device pool (the replica's memory manager gauge)
  int64_t total_blocks = 0;     // KV blocks of its device pool
};

/// The work a request brings: prompt_tokens + max_tokens * width (width: completions generated, >= 1; max_tokens >= 0).
int64_t request_weight(size_t prompt_tokens, int max_tokens, int width);

struct RoutingOptions {
  int block_size = 16;  // tokens per prefix block, the replicas' KV block size (>= 1)
  // The balance rule: the replica with the prefix may take the request unless its active_tokens exceed
  // balance_factor * (least-loaded replica's active_tokens) + balance_slack_tokens.
  double balance_factor = 1.5;
  int64_t balance_slack_tokens = 4096;
  size_t affinity_capacity_blocks = 1 << 16;  // (prefix block, replica) pairs remembered in total (LRU), per router
};

/// Remembers which replica recently received which prompt prefixes (approximate: what the router sent, not what the
/// replicas' caches hold; a replica that is lost or rejoins is forgotten with forget(replica)). A prefix is a chain of
/// full blocks of block_size token ids, keyed by a 64-bit chained hash (block i's key covers blocks 0..i). What is
/// remembered is (block key, replica) pairs, at most affinity_capacity_blocks of them, least recently recorded
/// evicted first; record() makes a prompt's first block its most recent and its last block its least recent, so
/// eviction trims prefixes from their ends and a remembered block's predecessors are remembered too.
class PrefixAffinity {
 public:
  explicit PrefixAffinity(RoutingOptions options);

  /// Per replica (index < num_replicas), how many leading full blocks of `prompt` it was recently sent; O(prompt
  /// blocks x replicas holding each block), independent of how much is remembered.
  std::vector<int> matched_blocks(const std::vector<TokenId>& prompt, size_t num_replicas) const;
  /// Records that `prompt` was sent to `replica` (its full blocks; refreshes their recency), evicting the least
  /// recently recorded pairs beyond capacity.
  void record(size_t replica, const std::vector<TokenId>& prompt);
  /// Forgets every prefix of `replica`; O(pairs remembered).
  void forget(size_t replica);
  /// (block key, replica) pairs remembered.
  size_t size() const;

 private:
  /// One (block key, replica) pair, a node of the recency list.
  struct RememberedBlock {
    uint64_t key = 0;
    size_t replica = 0;
  };
  using Recency = std::list<RememberedBlock>;  // most recently recorded first

  /// The chained keys of the leading full blocks of `prompt`, at most max_blocks of them.
  std::vector<uint64_t> chain_keys(const std::vector<TokenId>& prompt, size_t max_blocks) const;
  /// Removes one pair: from its key's holders (the key goes once none is left) and from the recency list.
  void erase(Recency::iterator pair);

  RoutingOptions options_;
  Recency recency_;
  std::unordered_map<uint64_t, std::vector<Recency::iterator>> holders_;  // block key -> its pairs (one per replica)
};

/// Picks the replica for a request among the available replicas other than `exclude` (the replica a moved request
/// comes from); nullopt when there is none. The least loaded is the lowest active_tokens, ties: more free blocks, then
/// fewer active requests, then lowest index. A replica within the balance rule (RoutingOptions) with a matched prefix
/// of >= 1 block is preferred, the longest match first (ties: the less loaded, same order); else the least loaded.
/// matched_blocks is indexed like loads (entries past its end count as 0), as PrefixAffinity::matched_blocks gives.
std::optional<size_t> choose_replica(const std::vector<ReplicaLoad>& loads, const std::vector<int>& matched_blocks,
                                     const RoutingOptions& options, std::optional<size_t> exclude = std::nullopt);

}  // namespace paged
