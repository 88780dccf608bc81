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

/// A SampleSpec by value: the parameters themselves and copies of the id lists.
struct WireSample {
  SamplingParams params;
  uint64_t seed = 0;
  std::vector<TokenId> prompt, output, stop_ids;
  int num_logprobs = 0, num_candidates = 1;
};

/// A SeqChunk by value: its samples travel in `samples`, the chunk's own are empty.
struct WireChunk {
  SeqChunk chunk;
  std::vector<WireSample> samples;
};

struct WireStep {
  std::vector<WireChunk> seqs;
  std::vector<BlockPair> copies;
};

/// The batch by value: what its SampleSpecs point to is copied in.
WireStep to_wire(const StepBatch& batch);

/// The step a runner executes on the receiving side. Its SampleSpecs point into `wire`, which must outlive the
/// returned batch and stay unchanged.
StepBatch from_wire(const WireStep& wire);

}  // namespace paged
