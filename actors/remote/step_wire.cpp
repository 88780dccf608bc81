#include "actors/remote/step_wire.h"

namespace paged {

WireStep to_wire(const StepBatch& batch) {
  WireStep w;
  w.copies = batch.copies;
  w.seqs.reserve(batch.seqs.size());
  for (const SeqChunk& c : batch.seqs) {
    WireChunk& wc = w.seqs.emplace_back();
    wc.seq = c.seq;
    wc.tokens = c.tokens;
    wc.start_pos = c.start_pos;
    wc.block_table = c.block_table;
    for (const SampleSpec& s : c.samples) {
      WireSample& ws = wc.samples.emplace_back();
      const SamplingParams& p = *s.params;
      ws.temperature = p.temperature;
      ws.top_p = p.top_p;
      ws.min_p = p.min_p;
      ws.top_k = p.top_k;
      ws.min_tokens = p.min_tokens;
      ws.repetition_penalty = p.repetition_penalty;
      ws.presence_penalty = p.presence_penalty;
      ws.frequency_penalty = p.frequency_penalty;
      ws.logit_bias.assign(p.logit_bias.begin(), p.logit_bias.end());
      ws.seed = s.seed;
      if (s.prompt) ws.prompt = *s.prompt;
      if (s.output) ws.output = *s.output;
      if (s.stop_ids) ws.stop_ids = *s.stop_ids;
      ws.num_logprobs = s.num_logprobs;
      ws.num_candidates = s.num_candidates;
    }
  }
  return w;
}

StepBatch from_wire(const WireStep& wire, std::vector<SamplingParams>& params) {
  size_t total = 0;
  for (const WireChunk& c : wire.seqs) total += c.samples.size();
  params.assign(total, SamplingParams{});  // no reallocation below: the specs point into it
  StepBatch b;
  b.copies = wire.copies;
  size_t next = 0;
  for (const WireChunk& wc : wire.seqs) {
    SeqChunk& c = b.seqs.emplace_back();
    c.seq = wc.seq;
    c.tokens = wc.tokens;
    c.start_pos = wc.start_pos;
    c.block_table = wc.block_table;
    for (const WireSample& ws : wc.samples) {
      SamplingParams& p = params[next++];
      p.temperature = ws.temperature;
      p.top_p = ws.top_p;
      p.min_p = ws.min_p;
      p.top_k = ws.top_k;
      p.min_tokens = ws.min_tokens;
      p.repetition_penalty = ws.repetition_penalty;
      p.presence_penalty = ws.presence_penalty;
      p.frequency_penalty = ws.frequency_penalty;
      p.logit_bias.insert(ws.logit_bias.begin(), ws.logit_bias.end());
      SampleSpec& s = c.samples.emplace_back();
      s.params = &p;
      s.seed = ws.seed;
      s.prompt = &ws.prompt;
      s.output = &ws.output;
      s.stop_ids = &ws.stop_ids;
      s.num_logprobs = ws.num_logprobs;
      s.num_candidates = ws.num_candidates;
    }
  }
  return b;
}

}  // namespace paged
