// A step by value, for an executor in another process (a `paged worker` reached through CAF's network layer): the
// sampling inputs that a SampleSpec points to (parameters, prompt and output ids, stop ids) are copied into the
// message. Every step carries each sampled sequence's whole token history, which the penalties and the seeded
// random stream need: O(context) bytes per sequence and step, small next to the step's compute.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "model/sampling/sampling_params.h"
#include "model/step.h"

namespace paged {

/// A SampleSpec by value: the SamplingParams fields a runner reads, and copies of the id lists.
struct WireSample {
  float temperature = 1.0f, top_p = 1.0f, min_p = 0.0f;
  int top_k = -1, min_tokens = 0;
  float repetition_penalty = 1.0f, presence_penalty = 0.0f, frequency_penalty = 0.0f;
  std::vector<std::pair<TokenId, float>> logit_bias;
  uint64_t seed = 0;
  std::vector<TokenId> prompt, output, stop_ids;
  int num_logprobs = 0, num_candidates = 1;
};

struct WireChunk {
  SeqId seq = 0;
  std::vector<TokenId> tokens;
  int32_t start_pos = 0;
  std::vector<int32_t> block_table;
  std::vector<WireSample> samples;
};

struct WireStep {
  std::vector<WireChunk> seqs;
  std::vector<BlockPair> copies;
};

WireStep to_wire(const StepBatch& batch);

/// The step a runner executes on the receiving side. Its SampleSpecs point into `wire` and into `params` (filled
/// here, one entry per sample): both must outlive the returned batch and stay unchanged.
StepBatch from_wire(const WireStep& wire, std::vector<SamplingParams>& params);

}  // namespace paged
