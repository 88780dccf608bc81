// The pure scheduling policy (plan_step) against a real KvCacheManager: admission, token budget and chunked prefill,
// max_num_seqs, preemption victims and modes (a victim whose last token is in flight is freed), resume order,
// rejection.
#include <catch2/catch.hpp>

#include <algorithm>

#include "model/kv/kv_cache_manager.h"
#include "model/scheduling/scheduler_policy.h"

using namespace paged;

namespace {

using Phase = PlanSeq::Phase;

// Distinct tokens per sequence, so that nothing is a prefix-cache hit unless a test wants one.
std::vector<TokenId> tokens_for(SeqId id, int n) {
  std::vector<TokenId> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<TokenId>(1000 * id + i));
  return t;
}

PlanSeq waiting(SeqId id, uint64_t arrival, int num_tokens) {
  PlanSeq s;
  s.id = id;
  s.arrival = arrival;
  s.phase = Phase::waiting;
  s.num_tokens = num_tokens;
  s.tokens = std::make_shared<const std::vector<TokenId>>(tokens_for(id, num_tokens));
  return s;
}

PlanSeq running(SeqId id, uint64_t arrival, int num_computed, int num_tokens) {
  PlanSeq s;
  s.id = id;
  s.arrival = arrival;
  s.phase = Phase::running;
  s.num_computed = num_computed;
  s.num_tokens = num_tokens;
  return s;
}

PlanSeq swapped(SeqId id, uint64_t arrival, int num_computed) {
  PlanSeq s = running(id, arrival, num_computed, num_computed + 1);
  s.phase = Phase::swapped;
  return s;
}

KvCacheManager make_kv(int blocks, int cpu_blocks = 0, bool prefix_caching = false) {
  return KvCacheManager(KvCacheOptions{.block_size = 4,
                                       .num_device_blocks = blocks,
                                       .num_cpu_blocks = cpu_blocks,
                                       .enable_prefix_caching = prefix_caching,
                                       .watermark = 0.0});
}

/// A sequence already on the device holding `computed` computed tokens (blocks for exactly that many).
void place(KvCacheManager& kv, SeqId id, int computed) {
  const auto t = tokens_for(id, computed);
  REQUIRE(kv.allocate(id, t, computed).has_value());
  kv.mark_computed(id, t, computed);
}

std::vector<SeqId> chunk_ids(const StepPlan& plan) {
  std::vector<SeqId> ids;
  for (const auto& c : plan.chunks) ids.push_back(c.id);
  return ids;
}

const PlannedChunk& chunk_of(const StepPlan& plan, SeqId id) {
  for (const auto& c : plan.chunks)
    if (c.id == id) return c;
  FAIL("no chunk for sequence " << id);
  throw 0;
}

PlanLimits limits(int max_seqs, int budget, PreemptionMode mode = PreemptionMode::recompute) {
  return PlanLimits{max_seqs, budget, mode};
}

}  // namespace

TEST_CASE("admission is first come first served, whatever the input order", "[policy]") {
  auto kv = make_kv(64);
  // Input order differs from arrival order; ids differ from both.
  const StepPlan plan = plan_step(kv, {waiting(7, 2, 5), waiting(3, 0, 9), waiting(5, 1, 4)}, limits(8, 100));
  CHECK(chunk_ids(plan) == std::vector<SeqId>{3, 5, 7});
  REQUIRE(plan.admitted.size() == 3);
  CHECK(plan.admitted[0] == std::pair<SeqId, int>{3, 0});
  CHECK(plan.admitted[1] == std::pair<SeqId, int>{5, 0});
  CHECK(plan.admitted[2] == std::pair<SeqId, int>{7, 0});
  for (const auto& c : plan.chunks) {
    CHECK(c.start_pos == 0);
    CHECK(c.sample);  // whole prompts: each chunk reaches the last token
    CHECK(c.block_table == kv.block_table(c.id));
  }
  CHECK(chunk_of(plan, 3).num_tokens == 9);
  CHECK(kv.block_table(3).size() == 3);
  CHECK(kv.metrics().device_free == 64 - 3 - 1 - 2);
  kv.check_invariants();
}

TEST_CASE("a step holds at most max_num_seqs sequences, also when forks made more run", "[policy]") {
  auto kv = make_kv(64);
  for (SeqId id = 1; id <= 5; ++id) place(kv, id, 6);
  const std::vector<PlanSeq> seqs = {running(4, 3, 6, 7), running(1, 0, 6, 7), running(5, 4, 6, 7),
                                     running(2, 1, 6, 7), running(3, 2, 6, 7), waiting(9, 5, 3)};
  const StepPlan plan = plan_step(kv, seqs, limits(3, 100));
  CHECK(chunk_ids(plan) == std::vector<SeqId>{1, 2, 3});  // the oldest three; no admission, no preemption
  CHECK(plan.preempted_recompute.empty());
  CHECK(plan.preempted_swap.empty());
  CHECK(plan.admitted.empty());
  CHECK(kv.contains(4));
  CHECK(kv.contains(5));
  kv.check_invariants();
}

TEST_CASE("a waiting head that does not fit blocks the requests behind it", "[policy]") {
  auto kv = make_kv(10);
  // 12 tokens (3 blocks) fit; 40 tokens (10 blocks) fit an empty pool but not the 7 blocks left; the 1-block request
  // behind it would fit, but FCFS keeps it waiting.
  const StepPlan plan = plan_step(kv, {waiting(3, 2, 4), waiting(1, 0, 12), waiting(2, 1, 40)}, limits(8, 100));
  CHECK(chunk_ids(plan) == std::vector<SeqId>{1});
  CHECK(plan.rejected.empty());
  CHECK_FALSE(kv.contains(2));
  CHECK_FALSE(kv.contains(3));
  CHECK(kv.metrics().device_free == 7);
}

TEST_CASE("the token budget: decodes of running sequences first, then prefill chunks over several steps",
          "[policy]") {
  auto kv = make_kv(64);
  place(kv, 1, 7);
  // Step 1: the running decode takes 1 token of 16, the new 40-token prompt the other 15.
  StepPlan p1 = plan_step(kv, {waiting(2, 1, 40), running(1, 0, 7, 8)}, limits(8, 16));
  REQUIRE(chunk_ids(p1) == std::vector<SeqId>{1, 2});
  CHECK(p1.chunks[0].start_pos == 7);
  CHECK(p1.chunks[0].num_tokens == 1);
  CHECK(p1.chunks[0].sample);
  CHECK(p1.chunks[1].start_pos == 0);
  CHECK(p1.chunks[1].num_tokens == 15);
  CHECK_FALSE(p1.chunks[1].sample);  // a partial prompt samples nothing
  CHECK(p1.admitted == std::vector<std::pair<SeqId, int>>{{2, 0}});
  CHECK(kv.block_table(2).size() == 4);  // blocks for the 15 tokens of this step only

  // Step 2: the prompt continues where it stopped.
  StepPlan p2 = plan_step(kv, {running(1, 0, 8, 9), running(2, 1, 15, 40)}, limits(8, 16));
  REQUIRE(chunk_ids(p2) == std::vector<SeqId>{1, 2});
  CHECK(p2.chunks[1].start_pos == 15);
  CHECK(p2.chunks[1].num_tokens == 15);
  CHECK_FALSE(p2.chunks[1].sample);
  CHECK(p2.admitted.empty());
  CHECK(kv.block_table(2).size() == 8);

  // Step 3: the last 10 tokens; this chunk samples the first output token.
  StepPlan p3 = plan_step(kv, {running(1, 0, 9, 10), running(2, 1, 30, 40)}, limits(8, 16));
  REQUIRE(chunk_ids(p3) == std::vector<SeqId>{1, 2});
  CHECK(p3.chunks[1].start_pos == 30);
  CHECK(p3.chunks[1].num_tokens == 10);
  CHECK(p3.chunks[1].sample);
  CHECK(kv.block_table(2).size() == 10);
  kv.check_invariants();
}

TEST_CASE("long_prefill_token_threshold caps each sequence's chunk, running or admitted, not the decodes",
          "[policy]") {
  auto kv = make_kv(64);
  place(kv, 1, 7);
  place(kv, 2, 10);
  PlanLimits l = limits(8, 64);
  l.long_prefill_token_threshold = 6;
  // A decode, a running prompt with 20 tokens to go, two new prompts (4 and 30 tokens): 1 + 6 + 4 + 6 of 64.
  StepPlan p = plan_step(kv, {running(1, 0, 7, 8), running(2, 1, 10, 30), waiting(3, 2, 4), waiting(4, 3, 30)}, l);
  REQUIRE(chunk_ids(p) == std::vector<SeqId>{1, 2, 3, 4});
  CHECK(p.chunks[0].num_tokens == 1);
  CHECK(p.chunks[0].sample);
  CHECK(p.chunks[1].start_pos == 10);
  CHECK(p.chunks[1].num_tokens == 6);
  CHECK_FALSE(p.chunks[1].sample);
  CHECK(p.chunks[2].num_tokens == 4);  // a prompt shorter than the threshold goes whole and samples
  CHECK(p.chunks[2].sample);
  CHECK(p.chunks[3].start_pos == 0);
  CHECK(p.chunks[3].num_tokens == 6);
  CHECK_FALSE(p.chunks[3].sample);
  CHECK(kv.block_table(4).size() == 2);  // blocks for this step's 6 tokens only
  // The budget still binds below the threshold: 5 tokens left for the last prompt after 1 + 6 + 1 of 13.
  l.max_num_batched_tokens = 13;
  StepPlan q = plan_step(kv, {running(1, 0, 8, 9), running(2, 1, 16, 30), running(3, 2, 4, 5), running(4, 3, 6, 30)},
                         l);
  REQUIRE(chunk_ids(q) == std::vector<SeqId>{1, 2, 3, 4});
  CHECK(q.chunks[1].num_tokens == 6);
  CHECK(q.chunks[3].num_tokens == 5);
  kv.check_invariants();
}

TEST_CASE("an exhausted budget leaves the newer running sequences for the next step, unpreempted", "[policy]") {
  auto kv = make_kv(64);
  place(kv, 1, 4);
  place(kv, 2, 4);
  place(kv, 3, 4);
  const StepPlan plan =
      plan_step(kv, {running(3, 2, 4, 5), running(1, 0, 4, 5), running(2, 1, 4, 5), waiting(4, 3, 3)}, limits(8, 2));
  CHECK(chunk_ids(plan) == std::vector<SeqId>{1, 2});
  CHECK(plan.preempted_recompute.empty());
  CHECK(plan.preempted_swap.empty());
  CHECK(plan.admitted.empty());  // no budget left
  CHECK(kv.contains(3));
}

TEST_CASE("max_num_seqs caps the running set, counting running sequences", "[policy]") {
  {
    auto kv = make_kv(64);
    place(kv, 1, 4);
    place(kv, 2, 4);
    const auto seqs = {running(1, 0, 4, 5), running(2, 1, 4, 5), waiting(3, 2, 4), waiting(4, 3, 4),
                       waiting(5, 4, 4)};
    const StepPlan plan = plan_step(kv, seqs, limits(3, 100));
    CHECK(chunk_ids(plan) == std::vector<SeqId>{1, 2, 3});
    CHECK(plan.admitted.size() == 1);
  }
  {
    auto kv = make_kv(64);
    const StepPlan plan = plan_step(kv, {waiting(3, 2, 4), waiting(4, 3, 4), waiting(5, 4, 4)}, limits(2, 100));
    CHECK(chunk_ids(plan) == std::vector<SeqId>{3, 4});
  }
}

TEST_CASE("preemption takes the newest running sequence first, possibly the one that needs room", "[policy]") {
  SECTION("the newest is freed so the older ones can grow; nothing is admitted in that step") {
    auto kv = make_kv(6);
    place(kv, 10, 8);  // each holds 2 full blocks and needs a third for its next token
    place(kv, 11, 8);
    place(kv, 12, 8);
    const StepPlan plan = plan_step(
        kv, {running(12, 2, 8, 9), running(10, 0, 8, 9), running(11, 1, 8, 9), waiting(13, 3, 1)}, limits(8, 100));
    CHECK(plan.preempted_recompute == std::vector<SeqId>{12});
    CHECK(plan.preempted_swap.empty());
    CHECK(chunk_ids(plan) == std::vector<SeqId>{10, 11});
    CHECK(plan.admitted.empty());
    CHECK_FALSE(kv.contains(12));
    CHECK(kv.block_table(10).size() == 3);
    kv.check_invariants();
  }
  SECTION("victims in order newest first, until the needy sequence is the newest itself") {
    auto kv = make_kv(7);
    place(kv, 1, 20);  // 5 full blocks
    place(kv, 2, 4);
    place(kv, 3, 4);
    const StepPlan plan =
        plan_step(kv, {running(1, 0, 20, 21), running(2, 1, 4, 5), running(3, 2, 4, 5)}, limits(8, 100));
    CHECK(plan.preempted_recompute == std::vector<SeqId>{3, 2});  // 3 for 1's block, then 2 has none: itself
    CHECK(chunk_ids(plan) == std::vector<SeqId>{1});
    kv.check_invariants();
  }
  SECTION("a lone sequence that cannot grow is preempted") {
    auto kv = make_kv(2);
    place(kv, 1, 8);
    const StepPlan plan = plan_step(kv, {running(1, 0, 8, 9)}, limits(8, 100));
    CHECK(plan.preempted_recompute == std::vector<SeqId>{1});
    CHECK(plan.chunks.empty());
    CHECK(kv.metrics().device_free == 2);
  }
}

TEST_CASE("swap mode swaps the victim out to the CPU pool, and recomputes when the CPU pool is full", "[policy]") {
  for (int cpu_blocks : {10, 1}) {
    INFO("CPU pool of " << cpu_blocks << " blocks");
    auto kv = make_kv(6, cpu_blocks);
    place(kv, 10, 8);
    place(kv, 11, 8);
    place(kv, 12, 8);
    const auto victim_blocks = kv.block_table(12);
    const StepPlan plan = plan_step(kv, {running(10, 0, 8, 9), running(11, 1, 8, 9), running(12, 2, 8, 9)},
                                    limits(8, 100, PreemptionMode::swap));
    CHECK(chunk_ids(plan) == std::vector<SeqId>{10, 11});
    if (cpu_blocks >= 2) {
      CHECK(plan.preempted_swap == std::vector<SeqId>{12});
      CHECK(plan.preempted_recompute.empty());
      REQUIRE(plan.swap_out.size() == 2);
      CHECK(plan.swap_out[0].first == victim_blocks[0]);
      CHECK(plan.swap_out[1].first == victim_blocks[1]);
      CHECK(kv.is_swapped(12));
      CHECK(kv.metrics().cpu_free == cpu_blocks - 2);
    } else {
      CHECK(plan.preempted_recompute == std::vector<SeqId>{12});
      CHECK(plan.swap_out.empty());
      CHECK_FALSE(kv.contains(12));
    }
    kv.check_invariants();
  }
}

TEST_CASE("swap mode frees a victim whose token in flight is its last instead of swapping it out", "[policy]") {
  // Planned while the step that samples 12's last token runs (max_tokens or the model length): 12 ends when that
  // step returns, so blocks copied to the CPU now would never come back.
  auto kv = make_kv(6, 10);
  place(kv, 10, 8);
  place(kv, 11, 8);
  place(kv, 12, 8);
  PlanSeq ending = running(12, 2, 8, 9);
  ending.last_token_in_flight = true;
  const StepPlan plan =
      plan_step(kv, {running(10, 0, 8, 9), running(11, 1, 8, 9), ending}, limits(8, 100, PreemptionMode::swap));
  CHECK(chunk_ids(plan) == std::vector<SeqId>{10, 11});
  CHECK(plan.preempted_recompute == std::vector<SeqId>{12});
  CHECK(plan.preempted_swap.empty());
  CHECK(plan.swap_out.empty());
  CHECK_FALSE(kv.contains(12));
  CHECK(kv.metrics().cpu_free == 10);
  CHECK(kv.metrics().swapped_out_blocks == 0);
  kv.check_invariants();
}

TEST_CASE("swapped sequences resume before waiting ones, oldest first", "[policy]") {
  auto kv = make_kv(8, 16);
  place(kv, 3, 8);  // 2 blocks each
  place(kv, 4, 8);
  REQUIRE(kv.swap_out(3));
  REQUIRE(kv.swap_out(4));
  place(kv, 9, 20);  // 5 blocks in use: 3 free, room to swap one of them in

  // An older waiting request (arrival 1) still waits behind the swapped ones (arrivals 3, 4).
  const auto seqs = {running(9, 0, 20, 21), swapped(4, 4, 8), waiting(1, 1, 2), swapped(3, 3, 8)};
  StepPlan plan = plan_step(kv, seqs, limits(8, 100));
  CHECK(chunk_ids(plan) == std::vector<SeqId>{9});  // takes the 6th block: 2 free
  CHECK(plan.swapping_in == std::vector<SeqId>{3});
  REQUIRE(plan.swap_in.size() == 2);
  CHECK_FALSE(kv.is_swapped(3));
  CHECK(kv.is_swapped(4));
  CHECK(plan.admitted.empty());
  CHECK_FALSE(kv.contains(1));

  // Once 9 finished, 4 comes back; the waiting request still waits for the step after.
  kv.free(9);
  plan = plan_step(kv, {running(3, 3, 8, 9), swapped(4, 4, 8), waiting(1, 1, 2)}, limits(8, 100));
  CHECK(plan.swapping_in == std::vector<SeqId>{4});
  CHECK(plan.admitted.empty());
  plan = plan_step(kv, {running(3, 3, 9, 10), running(4, 4, 8, 9), waiting(1, 1, 2)}, limits(8, 100));
  CHECK(plan.admitted == std::vector<std::pair<SeqId, int>>{{1, 0}});
  kv.check_invariants();
}

TEST_CASE("swap-in respects max_num_seqs", "[policy]") {
  auto kv = make_kv(16, 16);
  place(kv, 1, 4);
  place(kv, 2, 4);
  REQUIRE(kv.swap_out(2));
  const StepPlan plan = plan_step(kv, {running(1, 0, 4, 5), swapped(2, 1, 4)}, limits(1, 100));
  CHECK(plan.swapping_in.empty());
  CHECK(kv.is_swapped(2));
}

PlanSeq whole(PlanSeq s) {
  s.whole_request = true;
  return s;
}

TEST_CASE("a beam-search request's sequences grow together, are preempted together and come back together",
          "[policy]") {
  auto kv = make_kv(8, 16);
  place(kv, 10, 16);  // an older request: 4 blocks, a fifth for its next token
  place(kv, 1, 8);    // the beams 1, 2, 3 share 2 blocks; each needs a third of its own
  kv.fork(1, 2);
  kv.fork(1, 3);
  const auto beam = [](SeqId id) { return whole(running(id, 1, 8, 9)); };
  // 10 takes one of the two free blocks: one is left, for one beam of three. No beam grows alone; the request's
  // three go out together, their two shared blocks as two CPU blocks.
  StepPlan plan = plan_step(kv, {beam(3), running(10, 0, 16, 17), beam(1), beam(2)},
                            limits(8, 100, PreemptionMode::swap));
  CHECK(chunk_ids(plan) == std::vector<SeqId>{10});
  CHECK(plan.preempted_swap == std::vector<SeqId>{1, 2, 3});
  CHECK(plan.swap_out.size() == 2);
  CHECK(kv.metrics().cpu_free == 14);
  kv.check_invariants();

  // They come back together once they fit: two blocks, shared again.
  const auto out = [](SeqId id) { return whole(swapped(id, 1, 8)); };
  plan = plan_step(kv, {running(10, 0, 17, 18), out(2), out(1), out(3)}, limits(8, 100, PreemptionMode::swap));
  CHECK(plan.swapping_in == std::vector<SeqId>{1, 2, 3});
  CHECK(plan.swap_in.size() == 2);
  CHECK(kv.block_table(1) == kv.block_table(3));
  kv.check_invariants();

  // In recompute mode they are freed together.
  kv.free(10);
  place(kv, 10, 24);  // 6 blocks: 6 + 2 in use, none free
  plan = plan_step(kv, {running(10, 0, 24, 25), beam(1), beam(2), beam(3)}, limits(8, 100));
  CHECK(chunk_ids(plan) == std::vector<SeqId>{10});
  CHECK(plan.preempted_recompute == std::vector<SeqId>{1, 2, 3});
  kv.check_invariants();
}

TEST_CASE("when nothing can move, the newest beam-search request split between running and waiting is freed",
          "[policy]") {
  auto kv = make_kv(6);
  place(kv, 1, 12);  // request 0: beam 1 holds 3 blocks, its sibling 2 waits for 3 more
  place(kv, 5, 12);  // request 1: beam 5 the same, its sibling 6 waits
  const auto stalled = [](SeqId id, uint64_t arrival) { return whole(running(id, arrival, 12, 12)); };
  StepPlan plan = plan_step(kv, {stalled(1, 0), stalled(5, 1), waiting(2, 0, 12), waiting(6, 1, 12)}, limits(8, 100));
  CHECK(plan.chunks.empty());
  CHECK(plan.preempted_recompute == std::vector<SeqId>{5});
  CHECK_FALSE(kv.contains(5));
  // The older request's sibling is admitted next.
  plan = plan_step(kv, {stalled(1, 0), waiting(2, 0, 12), waiting(5, 1, 12), waiting(6, 1, 12)}, limits(8, 100));
  CHECK(plan.admitted == std::vector<std::pair<SeqId, int>>{{2, 0}});
  kv.check_invariants();

  // Sequences that are not a beam search's wait for blocks as before: nothing is preempted.
  auto other = make_kv(6);
  place(other, 1, 12);
  place(other, 5, 12);
  plan = plan_step(other, {running(1, 0, 12, 12), running(5, 1, 12, 12), waiting(2, 0, 12)}, limits(8, 100));
  CHECK(plan.preempted_recompute.empty());
  CHECK(plan.admitted.empty());
}

PlanSeq with_priority(PlanSeq s, int priority) {
  s.priority = priority;
  return s;
}

TEST_CASE("priorities: lower values are admitted first and preempted last; arrival decides between equals",
          "[policy]") {
  SECTION("admission") {
    auto kv = make_kv(16);
    // Room for all three prompts; max_num_seqs 2 takes the two most urgent, the earlier of the equal ones first.
    const StepPlan plan = plan_step(kv,
                                    {with_priority(waiting(1, 0, 12), 5), with_priority(waiting(2, 1, 12), -1),
                                     with_priority(waiting(3, 2, 12), 5)},
                                    limits(2, 100));
    CHECK(plan.admitted == std::vector<std::pair<SeqId, int>>{{2, 0}, {1, 0}});
  }
  SECTION("preemption takes the least urgent, though it arrived first") {
    auto kv = make_kv(6);
    place(kv, 10, 8);
    place(kv, 11, 8);
    place(kv, 12, 8);
    const StepPlan plan = plan_step(kv,
                                    {with_priority(running(10, 0, 8, 9), 3), with_priority(running(11, 1, 8, 9), 0),
                                     with_priority(running(12, 2, 8, 9), 0)},
                                    limits(8, 100));
    CHECK(plan.preempted_recompute == std::vector<SeqId>{10});
    CHECK(chunk_ids(plan) == std::vector<SeqId>{11, 12});
    kv.check_invariants();
  }
}

TEST_CASE("a request that can never fit the pool is rejected and does not block the queue", "[policy]") {
  auto kv = make_kv(4);  // 16 tokens at most
  const StepPlan plan = plan_step(kv, {waiting(1, 0, 17), waiting(2, 1, 8)}, limits(8, 100));
  CHECK(plan.rejected == std::vector<SeqId>{1});
  CHECK(chunk_ids(plan) == std::vector<SeqId>{2});
  CHECK_FALSE(kv.contains(1));
}

TEST_CASE("admission starts after the cached prefix, and the chunk covers only the tail", "[policy]") {
  auto kv = make_kv(16, 0, true);
  auto first = tokens_for(1, 10);
  REQUIRE(kv.allocate(1, first, 10));
  kv.mark_computed(1, first, 10);  // two full blocks registered
  kv.free(1);
  auto second = first;
  second.resize(8);
  second.insert(second.end(), {7, 7, 7, 7, 7});
  PlanSeq w = waiting(2, 0, 13);
  w.tokens = std::make_shared<const std::vector<TokenId>>(second);
  const StepPlan plan = plan_step(kv, {w}, limits(8, 100));
  CHECK(plan.admitted == std::vector<std::pair<SeqId, int>>{{2, 8}});
  REQUIRE(plan.chunks.size() == 1);
  CHECK(plan.chunks[0].start_pos == 8);
  CHECK(plan.chunks[0].num_tokens == 5);
  CHECK(plan.chunks[0].sample);
  CHECK(kv.metrics().prefix_hit_tokens == 8);
  kv.check_invariants();
}

namespace {

// 48 waiting sequences (ids 1..48, FCFS in id order): a common prefix of three blocks of 4 and 1 to 4 tokens each.
std::vector<PlanSeq> shared_prefix_requests(int count) {
  std::vector<PlanSeq> seqs;
  for (int i = 0; i < count; ++i) {
    PlanSeq s = waiting(i + 1, i, 0);
    std::vector<TokenId> tokens = tokens_for(99, 12);
    for (int k = 0; k <= i % 4; ++k) tokens.push_back(static_cast<TokenId>(5000 + 10 * i + k));
    s.num_tokens = static_cast<int>(tokens.size());
    s.tokens = std::make_shared<const std::vector<TokenId>>(std::move(tokens));
    seqs.push_back(std::move(s));
  }
  return seqs;
}

int planned_tokens(const StepPlan& plan) {
  int n = 0;
  for (const auto& c : plan.chunks) n += c.num_tokens;
  return n;
}

}  // namespace

TEST_CASE("48 prompts with a common prefix admitted in one step compute it once and read its blocks",
          "[policy][share]") {
  const auto seqs = shared_prefix_requests(48);
  int tails = 0;
  for (const auto& s : seqs) tails += s.num_tokens - 12;

  auto kv = make_kv(128, 0, true);
  const StepPlan plan = plan_step(kv, seqs, limits(64, 2048));
  REQUIRE(plan.chunks.size() == 48);
  const PlannedChunk& first = plan.chunks[0];
  CHECK(first.id == 1);
  CHECK(first.start_pos == 0);
  CHECK(first.num_tokens == seqs[0].num_tokens);
  for (size_t i = 1; i < plan.chunks.size(); ++i) {
    const PlannedChunk& c = plan.chunks[i];
    INFO("chunk " << i);
    CHECK(c.start_pos == 12);
    CHECK(c.num_tokens == seqs[i].num_tokens - 12);
    CHECK(std::equal(first.block_table.begin(), first.block_table.begin() + 3, c.block_table.begin()));
    CHECK(c.block_table[3] != first.block_table[3]);
    CHECK(plan.admitted[i] == std::pair<SeqId, int>{c.id, 12});
  }
  CHECK(planned_tokens(plan) == 12 + tails);
  CHECK(kv.metrics().prefix_hit_tokens == 47 * 12);
  CHECK(kv.metrics().device_free == 128 - 3 - 48);
  kv.check_invariants();
  for (const auto& s : seqs) kv.mark_computed(s.id, *s.tokens, s.num_tokens);  // the step returned
  for (const auto& s : seqs) kv.free(s.id);
  kv.check_invariants();
  CHECK(kv.metrics().device_free == 128);
  CHECK(kv.metrics().used_slots == 0);

  auto off = make_kv(256, 0, false);
  CHECK(planned_tokens(plan_step(off, seqs, limits(64, 2048))) == 48 * 12 + tails);
}

TEST_CASE("a writer that ends before its step ran: a reader of the same step computes the shared blocks, and no "
          "later request finds them", "[policy][share]") {
  const auto seqs = shared_prefix_requests(3);
  auto kv = make_kv(32, 0, true);
  StepPlan plan = plan_step(kv, seqs, limits(8, 100));
  REQUIRE(planned_tokens(plan) == 13 + 2 + 3);
  kv.free(1);  // aborted after planning, before the step was sent

  const auto kept = drop_ended_chunks(plan.chunks, {1}, 4);
  REQUIRE(kept.size() == 2);
  CHECK(kept[0].id == 2);
  CHECK(kept[0].start_pos == 0);  // it computes the prefix the dropped chunk was to compute
  CHECK(kept[0].num_tokens == 14);
  CHECK(kept[0].block_table == plan.chunks[1].block_table);
  CHECK(kept[0].sample);
  CHECK(kept[1].id == 3);
  CHECK(kept[1].start_pos == 12);  // it reads the prefix as planned
  CHECK(kept[1].num_tokens == 3);
  CHECK(drop_ended_chunks(plan.chunks, {}, 4).size() == 3);
  CHECK(drop_ended_chunks(plan.chunks, {3}, 4)[1].start_pos == 12);  // nobody read the dropped chunk's blocks

  // The next plan: the prefix blocks were never registered as computed, so a new request computes them itself.
  PlanSeq late = seqs[0];
  late.id = 4;
  late.arrival = 3;
  const StepPlan next = plan_step(kv, {late}, limits(8, 100));
  CHECK(next.admitted == std::vector<std::pair<SeqId, int>>{{4, 0}});
  kv.check_invariants();
  for (SeqId id : {2, 3, 4}) kv.free(id);
  kv.check_invariants();
  CHECK(kv.metrics().device_free == 32);
}

TEST_CASE("swapping out the readers of a planned prefix keeps it registered for its writer's step", "[policy][share]") {
  // Plan 1 admits three sharers (6 blocks: the pool). Plan 2, made while step 1 runs, swaps the two readers out so
  // that the writer can grow; the prefix stays findable (step 1 writes it), and the pool drains once all end.
  const auto seqs = shared_prefix_requests(3);
  auto kv = make_kv(6, 8, true);
  const StepPlan first = plan_step(kv, seqs, limits(8, 100));
  REQUIRE(first.chunks.size() == 3);
  REQUIRE(kv.metrics().device_free == 0);
  std::vector<PlanSeq> now;
  for (const auto& c : first.chunks) {
    const int end = c.start_pos + c.num_tokens;
    now.push_back(running(c.id, c.id - 1, end, end + 1));
  }
  now[0].num_tokens += 8;  // the writer has 8 more prompt tokens: two new blocks
  const StepPlan second = plan_step(kv, now, limits(8, 100, PreemptionMode::swap));
  CHECK(second.preempted_swap == std::vector<SeqId>{3, 2});
  CHECK(chunk_ids(second) == std::vector<SeqId>{1});
  CHECK(kv.cached_prefix_tokens(*seqs[2].tokens) == 12);
  kv.check_invariants();
  for (SeqId id : {1, 2, 3}) kv.free(id);
  kv.check_invariants();
  CHECK(kv.metrics().device_free == 6);
  CHECK(kv.metrics().cpu_free == 8);
}

namespace {

// A decoding sequence (its newest token uncomputed) that proposes `drafts` drafts.
PlanSeq drafting(SeqId id, uint64_t arrival, int computed, int drafts) {
  PlanSeq s = running(id, arrival, computed, computed + 1 + drafts);
  s.num_drafts = drafts;
  return s;
}

}  // namespace

TEST_CASE("drafts are computed with the newest token, and a chunk cut short in them still samples", "[policy]") {
  auto kv = make_kv(64);
  place(kv, 1, 6);
  place(kv, 2, 6);
  // Budget 6: sequence 1 takes its token and 3 drafts, sequence 2 its token and one of its 3 drafts.
  const StepPlan plan = plan_step(kv, {drafting(1, 0, 6, 3), drafting(2, 1, 6, 3)}, limits(8, 6));
  REQUIRE(plan.chunks.size() == 2);
  CHECK(chunk_of(plan, 1).start_pos == 6);
  CHECK(chunk_of(plan, 1).num_tokens == 4);
  CHECK(chunk_of(plan, 2).num_tokens == 2);
  CHECK(chunk_of(plan, 1).sample);
  CHECK(chunk_of(plan, 2).sample);
  CHECK(kv.block_table(1).size() == 3);  // positions 0..9
  kv.check_invariants();
}

TEST_CASE("a sequence is not preempted for drafts: they are dropped first", "[policy]") {
  // 5 blocks of 4 tokens: each sequence holds 2 (7 tokens computed), one is free. Each newest token (position 7)
  // fits its second block; its drafts (8..11) need a third. The older unit takes the free block; the newer one's
  // drafts find none and go, where without them the newer sequence would be preempted.
  auto kv = make_kv(5);
  place(kv, 1, 7);
  place(kv, 2, 7);
  const StepPlan plan = plan_step(kv, {drafting(1, 0, 7, 4), drafting(2, 1, 7, 4)}, limits(8, 100));
  CHECK(plan.preempted_recompute.empty());
  CHECK(plan.preempted_swap.empty());
  REQUIRE(plan.chunks.size() == 2);
  // Each unit is planned alone: the older one finds the free block for its drafts, the newer one drops them.
  CHECK(chunk_of(plan, 1).num_tokens == 5);
  CHECK(chunk_of(plan, 2).num_tokens == 1);
  CHECK(chunk_of(plan, 2).sample);
  kv.check_invariants();
}

TEST_CASE("drafts beyond max_sampled_positions in a step are dropped from the newest chunks", "[policy]") {
  auto kv = make_kv(64);
  for (SeqId id = 1; id <= 3; ++id) place(kv, id, 6);
  // 3 chunks with 3 drafts each sample 12 positions; 6 may be sampled: the newest lose theirs first.
  PlanLimits six = limits(8, 100);
  six.max_sampled_positions = 6;
  const StepPlan plan = plan_step(kv, {drafting(1, 0, 6, 3), drafting(2, 1, 6, 3), drafting(3, 2, 6, 3)}, six);
  REQUIRE(plan.chunks.size() == 3);
  CHECK(chunk_of(plan, 1).num_tokens == 4);
  CHECK(chunk_of(plan, 2).num_tokens == 1);
  CHECK(chunk_of(plan, 3).num_tokens == 1);
  for (const PlannedChunk& c : plan.chunks) CHECK(c.sample);
  kv.check_invariants();
}
