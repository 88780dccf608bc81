// One step of beam search, pure: no CAF. The semantics are vLLM's legacy beam search (early_stopping false):
// - each live beam offers its 2w best next tokens (w = width), scored cumulative logprob + token logprob; the 2w
//   best offers over all beams (ties: beam order, then the beam's own order) are the children;
// - a child ending in a stop id (at or past min_tokens) or reaching max_tokens / the model length is finished;
//   earlier and new finished hypotheses are ranked by beam_score and the best w kept;
// - the search ends when no child runs on, or when w hypotheses are finished and the worst of them scores at least
//   the best running child; otherwise the best w running children are the next beams;
// - the result is the best n finished hypotheses by beam_score.
// The scheduler actor gathers every live beam's offers, calls beam_search_step and applies the decision (forks,
// frees, outputs).
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "model/sampling/sample.h"

namespace paged {

/// A finished hypothesis: its whole output, the last token included, each token as it was offered (its logprob and
/// the alternatives the request asked for).
struct BeamHypothesis {
  std::vector<SampledToken> tokens;
  double cumulative_logprob = 0.0;
  bool stopped = false;  // ends in a stop id (finish "stop"); else it reached the length limit ("length")
};

/// A live beam as one step sees it.
struct Beam {
  double cumulative_logprob = 0.0;
  std::span<const SampledToken> output;      // tokens generated so far; every beam of a request has as many
  std::span<const SampledToken> candidates;  // its best next tokens, best first (2w; fewer with a small vocabulary)
};

/// What bounds a request's search.
struct BeamSearchLimits {
  int width = 1;                    // beams kept
  int n = 1;                        // hypotheses returned, at most width
  int min_tokens = 0;               // a stop id ends a hypothesis only from this output length on
  int max_tokens = 16;              // output length that ends every hypothesis
  int max_model_len = 0;            // prompt + output length that ends every hypothesis
  size_t prompt_len = 0;
  std::span<const TokenId> stop_ids;
  double length_penalty = 1.0;      // beam_score's exponent of the length
};

/// A beam of the next step: the output of beam `parent` plus `token`.
struct BeamChild {
  size_t parent = 0;                // index into the step's beams
  SampledToken token;               // the offer taken
  double cumulative_logprob = 0.0;
  bool fork = false;                // false for the parent's first child, which continues the parent's sequence
};

/// The outcome of one step.
struct BeamDecision {
  bool done = false;                     // the search ends: every beam ends
  std::vector<BeamChild> children;       // not done: the next beams, best first; a parent without a child ends
  std::vector<BeamHypothesis> finished;  // not done: the best w finished so far, best first (pass them to the next
                                         // step); done: the request's result, the best n, best first
};

/// vLLM's get_beam_search_score: cumulative logprob over the sequence length to the power `length_penalty`, prompt
/// included, not counting a final stop id.
double beam_score(double cumulative_logprob, size_t prompt_len, size_t output_len, bool stopped,
                  double length_penalty = 1.0);

/// One step of a request's search once every live beam (at least one) has its offers; `finished` is the previous
/// step's BeamDecision::finished (empty at the first step).
BeamDecision beam_search_step(std::span<const Beam> beams, std::vector<BeamHypothesis> finished,
                              const BeamSearchLimits& limits);

}  // namespace paged
