// Two steps in flight: the scheduler sends step N+1 before step N returned, so a sequence that samples in N and
// runs on in N+1 goes without its newest token (SeqChunk::last_token_deferred). The executor, which ran N, knows it:
// DeferredTokens keeps what the last step sampled and fills those tokens in before the runner sees N+1. Pure.
#pragma once

#include <optional>
#include <unordered_map>

#include "model/field_error.h"
#include "model/step.h"

namespace paged {

class DeferredTokens {
 public:
  /// Remembers what `result` sampled (the first candidate of each sequence's first sample), forgetting the step
  /// before: call it after every step the executor runs, failed ones included (with an empty result).
  void remember(const StepResult& result);
  /// Fills each deferred chunk of `batch`: its last token and every sample's pending_output become the token its
  /// sequence sampled in the step remembered. A deferred chunk whose sequence sampled nothing there is the error
  /// (field "seqs[i].tokens"), and then `batch` is unchanged.
  std::optional<FieldError> resolve(StepBatch& batch) const;

 private:
  std::unordered_map<SeqId, TokenId> sampled_;
};

}  // namespace paged
