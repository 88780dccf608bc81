// The floor of an offline batch on H200s (`paged bench`'s "H200 floor"): what its weight and KV reads and its
// products cost at DESIGN.md's measured ceilings of one H200 (HBM 4.3 TB/s; bf16 GEMM 790 TFLOP/s, FP8 products
// taken at twice that), every request in flight from the start, every prompt token computed (no prefix shared).
// The prompts cost their products, causal attention and one read of the weights; decode step t (the first output
// token comes from the prompt's step) carries every request with more than t - 1 outputs and costs
// max(bytes / bandwidth, FLOP / rate): all weights (a mixture of experts: the experts a uniform routing of the step's
// tokens touches, in expectation) and every sequence's K and V (a sliding layer's window only), against the linear
// layers, the LM head and the attention products of its tokens. Steps are at least the longest output, the KV bytes
// are the same in any order, so no schedule of these requests runs much faster than this.
#pragma once

#include <utility>
#include <vector>

#include "model/loader/config.h"

namespace paged::bench {

/// One device's ceilings; tensor parallelism over n devices multiplies both (its all-reduces not counted).
struct Ceilings {
  double bytes_per_s = 4.3e12;
  double bf16_flop_per_s = 790e12;
};

/// The weights' and the KV cache's storage: bf16, or FP8 (--quantization fp8: linear weights of one byte, LM head
/// bf16; --kv-cache-dtype fp8: one byte an element and a float32 scale a token and KV head, for K and V).
struct FloorPrecision {
  bool fp8_weights = false, fp8_kv = false;
};

struct WorkloadFloor {
  double prefill_s = 0, decode_s = 0;
  int decode_steps = 0;
  double seconds() const { return prefill_s + decode_s; }
};

/// The floor of the requests given as (prompt tokens, output tokens), each at least 1 output.
WorkloadFloor workload_floor(const ModelConfig& cfg, const std::vector<std::pair<int, int>>& lengths,
                             FloorPrecision precision, Ceilings ceilings = {});

}  // namespace paged::bench
