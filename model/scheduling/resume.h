// Where a request moved to another replica (its replica was lost) continues, pure: no CAF. What the client was sent
// stays sent: each completion still running goes on from the tokens it has, which the new replica prefills after the
// prompt (the sampler's random stream is keyed by seed and output index, so seeded sampling continues as it would
// have). A request whose client has seen nothing yet, or that delivers everything at its end (beam search,
// best_of > n), starts over: it gives the same result.
#pragma once

#include <vector>

#include "model/sampling/sampling_params.h"
#include "model/types.h"

namespace paged {

/// What the client of a request has been sent for one of its completions.
struct DeliveredCompletion {
  int index = 0;
  std::vector<TokenId> tokens;      // every token sent so far, in order
  double cumulative_logprob = 0.0;
  bool finished = false;            // the completion ended (stop id, stop string, length)
};

/// A completion that goes on from `output`: the scheduler's sequence of completion `index`.
struct ResumedSeq {
  int index = 0;
  std::vector<TokenId> output;
  double cumulative_logprob = 0.0;
};

/// How a moved request continues: from the start, or with `seqs` (the completions not finished, in index order).
/// Neither (restart false, seqs empty): nothing is left to generate.
struct ResumePoint {
  bool restart = false;
  std::vector<ResumedSeq> seqs;
};

/// The resume point of a request with `params` whose completions delivered `delivered` (one per completion the
/// request generates; indices 0 .. width-1).
ResumePoint resume_point(const SamplingParams& params, const std::vector<DeliveredCompletion>& delivered);

}  // namespace paged
