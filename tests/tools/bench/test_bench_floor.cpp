// workload_floor against sums worked out by hand for a tiny model: hidden 8, one layer, 2 heads and 1 KV head of 8,
// intermediate 16, vocab 32. Per layer: q, k, v, o 8 * 8 * (2 * 2 + 2 * 1) = 384 parameters, gate/up/down 384; a
// token's linear FLOP 2 * (384 + 384) = 1536; the LM head 2 * 32 * 8 = 512 FLOP a sampled token and 512 bytes
// (bf16); a (query, key) pair 4 * 8 * 2 = 64 FLOP; a token's K and V 2 * 8 * 2 = 32 bytes (FP8: 2 * (8 + 4) = 24).
// Ceilings of 1 byte/s and 1 FLOP/s make every time the larger of the two counts.
#include <catch2/catch.hpp>

#include "tools/bench/bench_floor.h"

using namespace paged;
using namespace paged::bench;

namespace {

ModelConfig tiny() {
  ModelConfig c;
  c.hidden_size = 8;
  c.num_layers = 1;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 8;
  c.intermediate_size = 16;
  c.vocab_size = 32;
  return c;
}

constexpr Ceilings kUnit{.bytes_per_s = 1, .bf16_flop_per_s = 1};

}  // namespace

TEST_CASE("workload_floor: prompts, then decode steps bound by reads or by products", "[bench]") {
  // (3 in, 1 out) ends with its prompt's step; (2 in, 3 out) decodes outputs 2 and 3 over 3 and 4 keys.
  const std::vector<std::pair<int, int>> lengths{{3, 1}, {2, 3}};
  // Prompts: 5 tokens * 1536 + 2 heads * 512 + (6 + 3 causal pairs) * 64 = 9280 FLOP (reads: 1536 + 512).
  // Step 2: reads 1536 + 512 + 3 * 32 = 2144 bytes, products 1536 + 512 + 3 * 64 = 2240 FLOP; step 3: 2176 / 2304.
  WorkloadFloor f = workload_floor(tiny(), lengths, {}, kUnit);
  CHECK(f.prefill_s == Approx(9280));
  CHECK(f.decode_steps == 2);
  CHECK(f.decode_s == Approx(2240 + 2304));
  CHECK(f.seconds() == Approx(9280 + 4544));
  // Half the bandwidth: the decode steps are bound by their reads (2 * 2144, 2 * 2176), the prompts still by FLOP.
  f = workload_floor(tiny(), lengths, {}, {.bytes_per_s = 0.5, .bf16_flop_per_s = 1});
  CHECK(f.prefill_s == Approx(9280));
  CHECK(f.decode_s == Approx(4288 + 4352));
  // Two devices (ceilings doubled): half of every time.
  f = workload_floor(tiny(), lengths, {}, {.bytes_per_s = 2, .bf16_flop_per_s = 2});
  CHECK(f.seconds() == Approx((9280 + 4544) / 2.0));
}

TEST_CASE("workload_floor: FP8 weights and KV halve the linear layers' bytes and double their rate", "[bench]") {
  const std::vector<std::pair<int, int>> lengths{{3, 1}, {2, 3}};
  // Prompts: 7680 / 2 + 1024 + 576 = 5440. Step 2: reads 768 + 512 + 3 * 24 = 1352, products 768 + 512 + 192 = 1472;
  // step 3: 1376 / 1536.
  const WorkloadFloor f = workload_floor(tiny(), lengths, {.fp8_weights = true, .fp8_kv = true}, kUnit);
  CHECK(f.prefill_s == Approx(5440));
  CHECK(f.decode_s == Approx(1472 + 1536));
}

TEST_CASE("workload_floor: a sliding layer reads and attends to its window only", "[bench]") {
  ModelConfig c = tiny();
  c.sliding_windows = {2};
  // Prompts: pairs 1 + 2 + 2 = 5 and 1 + 2 = 3: 7680 + 1024 + 8 * 64 = 9216. Steps 2 and 3 see 2 keys: reads
  // 1536 + 512 + 64 = 2112, products 1536 + 512 + 128 = 2176.
  const WorkloadFloor f = workload_floor(c, {{3, 1}, {2, 3}}, {}, kUnit);
  CHECK(f.prefill_s == Approx(9216));
  CHECK(f.decode_s == Approx(2 * 2176));
}

TEST_CASE("workload_floor: a mixture of experts reads the experts its tokens touch", "[bench]") {
  ModelConfig c = tiny();
  c.moe.num_experts = 4;
  c.moe.top_k = 2;
  // A token: 384 + 2 * 384 + 4 * 8 (router) = 1184 parameters, 2368 FLOP. One token touches 4 * (1 - 1/2) = 2
  // experts: (384 + 2 * 384) * 2 + 2 * 4 * 8 = 2368 bytes; two touch 4 * (1 - 1/4) = 3: (384 + 3 * 384) * 2 + 64 = 3136.
  // One sequence's step 2 (3 keys): reads 2368 + 512 + 96 = 2976, products 2368 + 512 + 192 = 3072.
  CHECK(workload_floor(c, {{2, 2}}, {}, kUnit).decode_s == Approx(3072));
  CHECK(workload_floor(c, {{2, 2}}, {}, {.bytes_per_s = 0.5, .bf16_flop_per_s = 1}).decode_s == Approx(2 * 2976));
  // Two sequences: reads 3136 + 512 + 2 * 96 = 3840 at half the bandwidth, against 2 * (2368 + 512) + 384 = 6144.
  CHECK(workload_floor(c, {{2, 2}, {2, 2}}, {}, {.bytes_per_s = 0.5, .bf16_flop_per_s = 1}).decode_s ==
        Approx(2 * 3840));
}
