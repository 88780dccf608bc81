#include "model/scheduling/resume.h"

#include <algorithm>

namespace paged {

ResumePoint resume_point(const SamplingParams& params, const std::vector<DeliveredCompletion>& delivered) {
  const bool buffered = params.use_beam_search || params.best_of > params.n;
  const bool any_sent = std::any_of(delivered.begin(), delivered.end(),
                                    [](const DeliveredCompletion& c) { return !c.tokens.empty(); });
  if (buffered || !any_sent) return {.restart = true, .seqs = {}};
  ResumePoint point;
  for (const DeliveredCompletion& c : delivered)
    if (!c.finished) point.seqs.push_back({c.index, c.tokens, c.cumulative_logprob});
  std::sort(point.seqs.begin(), point.seqs.end(),
            [](const ResumedSeq& a, const ResumedSeq& b) { return a.index < b.index; });
  return point;
}

}  // namespace paged
