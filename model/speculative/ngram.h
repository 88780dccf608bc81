// Speculative decoding by n-gram lookup (vLLM's speculative method "ngram", prompt lookup decoding): a sequence's
// newest tokens are looked for earlier in its prompt and output, and the tokens that followed them there are proposed
// as drafts; one step of the model scores the sequence's newest token and every draft, and the drafts the model's own
// samples confirm are taken, with the sample after the last one (so a step yields 1 to drafts + 1 tokens). Pure: no
// CAF, no CUDA. The scheduler proposes (actors/scheduler_actor.cpp), the runners sample every position
// (SeqChunk::num_drafts), the scheduler keeps what accepted_drafts says.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/types.h"

namespace paged {

/// Most drafts one sequence proposes in a step.
inline constexpr int kMaxSpeculativeTokens = 16;

/// vLLM's speculative_config for method "ngram". num_speculative_tokens 0: off.
struct NgramSpeculation {
  int num_speculative_tokens = 0;  // drafts proposed per sequence and step, at most
  int prompt_lookup_min = 5;       // the shortest run of newest tokens looked up
  int prompt_lookup_max = 5;       // the longest
  bool enabled() const { return num_speculative_tokens > 0; }
  /// What is wrong with it ("num_speculative_tokens must be in [1, 16]"), or empty when it is good (or off).
  std::string error() const;
};

/// Positions a step samples at most (a chunk that samples is one, each draft in it one more): max_num_seqs, and with
/// speculation up to 256 more, for drafts (the CUDA runner holds a row of vocabulary logits for each: a bound on that
/// memory; at full batch there is no room for drafts, which suits it: speculation pays at low batch).
inline int max_sampled_positions(int max_num_seqs, const NgramSpeculation& speculation) {
  if (!speculation.enabled()) return max_num_seqs;
  return max_num_seqs + static_cast<int>(std::min<int64_t>(int64_t{max_num_seqs} * speculation.num_speculative_tokens,
                                                           256));
}

/// At most `max_drafts` drafts for a sequence of `tokens` (prompt, then output): the longest run of newest tokens,
/// of prompt_lookup_min to prompt_lookup_max, that occurs earlier in `tokens` (its latest occurrence there), and the
/// tokens that followed it. Empty when none occurs. O(tokens x prompt_lookup_max) at worst.
std::vector<TokenId> propose_ngram_drafts(std::span<const TokenId> tokens, const NgramSpeculation& config,
                                          int max_drafts);

/// How many of `drafts` the model confirms: `sampled` holds its sample at the position of each draft's predecessor
/// (sampled[0] after the sequence's newest token, sampled[i] after drafts[i - 1]), drafts.size() + 1 of them. Draft i
/// is accepted when every one before it was and sampled[i] equals it; the sequence takes sampled[0 .. accepted],
/// inclusive. With drafts as certain proposals this is speculative sampling's rule exactly: a draft survives with the
/// model's probability of it, and a rejected one is replaced by a sample of the model's distribution without it.
int accepted_drafts(std::span<const TokenId> drafts, std::span<const TokenId> sampled);

}  // namespace paged
