#include "actors/step_wire.h"

namespace paged {

namespace {

std::vector<TokenId> copy_of(const std::vector<TokenId>* ids) { return ids ? *ids : std::vector<TokenId>{}; }

}  // namespace

WireStep to_wire(const StepBatch& batch) {
  WireStep w;
  w.copies = batch.copies;
  for (const SeqChunk& c : batch.seqs) {
    WireChunk& wc = w.seqs.emplace_back(WireChunk{.chunk = c, .samples = {}});
    wc.chunk.samples.clear();  // pointers: the samples travel by value
    for (const SampleSpec& s : c.samples)
      wc.samples.push_back({.params = *s.params, .seed = s.seed, .prompt = copy_of(s.prompt),
                            .output = copy_of(s.output), .stop_ids = copy_of(s.stop_ids),
                            .num_logprobs = s.num_logprobs, .num_candidates = s.num_candidates});
  }
  return w;
}

StepBatch from_wire(const WireStep& wire) {
  StepBatch b;
  b.copies = wire.copies;
  for (const WireChunk& wc : wire.seqs) {
    SeqChunk& c = b.seqs.emplace_back(wc.chunk);
    for (const WireSample& ws : wc.samples)
      c.samples.push_back({.params = &ws.params, .seed = ws.seed, .prompt = &ws.prompt, .output = &ws.output,
                           .stop_ids = &ws.stop_ids, .num_logprobs = ws.num_logprobs,
                           .num_candidates = ws.num_candidates});
  }
  return b;
}

}  // namespace paged
