#include "model/deferred_tokens.h"

#include <string>

namespace paged {

void DeferredTokens::remember(const StepResult& result) {
  sampled_.clear();
  for (size_t i = 0; i < result.seqs.size() && i < result.samples.size(); ++i)
    if (!result.samples[i].empty() && !result.samples[i][0].empty())
      sampled_[result.seqs[i]] = result.samples[i][0][0].token;
}

std::optional<FieldError> DeferredTokens::resolve(StepBatch& batch) const {
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const SeqChunk& c = batch.seqs[i];
    if (c.last_token_deferred && (c.tokens.empty() || !sampled_.contains(c.seq)))
      return FieldError{"seqs[" + std::to_string(i) + "].tokens",
                        "a deferred token of sequence " + std::to_string(c.seq) +
                            ", which sampled nothing in the step before"};
  }
  for (SeqChunk& c : batch.seqs) {
    if (!c.last_token_deferred) continue;
    const TokenId token = sampled_.at(c.seq);
    c.tokens.back() = token;
    for (SampleSpec& spec : c.samples) spec.pending_output = token;
  }
  return std::nullopt;
}

}  // namespace paged
