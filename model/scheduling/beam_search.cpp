#include "model/scheduling/beam_search.h"

#include <algorithm>
#include <cmath>

namespace paged {

double beam_score(double cumulative_logprob, size_t prompt_len, size_t output_len, bool stopped,
                  double length_penalty) {
  const auto length = static_cast<double>(prompt_len + output_len - (stopped ? 1 : 0));
  return cumulative_logprob / (length_penalty == 1.0 ? length : std::pow(length, length_penalty));
}

BeamDecision beam_search_step(std::span<const Beam> beams, std::vector<BeamHypothesis> finished,
                              const BeamSearchLimits& limits) {
  const size_t width = static_cast<size_t>(std::max(1, limits.width));
  struct Offer {
    double cumulative_logprob;
    size_t beam;
    const SampledToken* token;
  };
  std::vector<Offer> offers;
  for (size_t b = 0; b < beams.size(); ++b)
    for (const SampledToken& t : beams[b].candidates)
      offers.push_back({beams[b].cumulative_logprob + t.logprob, b, &t});
  std::stable_sort(offers.begin(), offers.end(),
                   [](const Offer& a, const Offer& b) { return a.cumulative_logprob > b.cumulative_logprob; });
  if (offers.size() > 2 * width) offers.resize(2 * width);

  const size_t out_len = beams.front().output.size() + 1;
  const bool length_end = static_cast<int>(out_len) >= limits.max_tokens ||
                          static_cast<int>(limits.prompt_len + out_len) >= limits.max_model_len;
  const bool stop_ids_count = static_cast<int>(out_len) >= limits.min_tokens;
  std::vector<const Offer*> running;
  for (const Offer& o : offers) {
    const bool stopped =
        stop_ids_count &&
        std::find(limits.stop_ids.begin(), limits.stop_ids.end(), o.token->token) != limits.stop_ids.end();
    if (!stopped && !length_end) {
      running.push_back(&o);
      continue;
    }
    const std::span<const SampledToken> parent = beams[o.beam].output;
    BeamHypothesis& h = finished.emplace_back();
    h.tokens.assign(parent.begin(), parent.end());
    h.tokens.push_back(*o.token);
    h.cumulative_logprob = o.cumulative_logprob;
    h.stopped = stopped;
  }
  auto score = [&](const BeamHypothesis& h) {
    return beam_score(h.cumulative_logprob, limits.prompt_len, h.tokens.size(), h.stopped, limits.length_penalty);
  };
  std::stable_sort(finished.begin(), finished.end(),
                   [&](const BeamHypothesis& a, const BeamHypothesis& b) { return score(a) > score(b); });

  BeamDecision d;
  const auto best_running = [&] {
    return beam_score(running.front()->cumulative_logprob, limits.prompt_len, out_len, false, limits.length_penalty);
  };
  d.done = running.empty() || (finished.size() >= width && score(finished[width - 1]) >= best_running());
  const size_t keep = d.done ? std::min(width, static_cast<size_t>(std::max(1, limits.n))) : width;
  if (finished.size() > keep) finished.resize(keep);
  d.finished = std::move(finished);
  if (d.done) return d;

  if (running.size() > width) running.resize(width);
  std::vector<int> children_of(beams.size(), 0);
  for (const Offer* o : running)
    d.children.push_back({o->beam, *o->token, o->cumulative_logprob, children_of[o->beam]++ > 0});
  return d;
}

}  // namespace paged
