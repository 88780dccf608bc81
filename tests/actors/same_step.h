// A step as a worker decoded it against the step the head sent, field by field, with the values behind the
// SampleSpecs' pointers (tests/actors/test_step_wire.cpp, test_step_fuzz.cpp).
#pragma once

#include <catch2/catch.hpp>

#include <vector>

#include "model/step.h"

namespace paged::test {

/// The ids behind a SampleSpec's pointer, a null one as none.
inline std::vector<TokenId> ids_behind(const std::vector<TokenId>* ids) {
  return ids ? *ids : std::vector<TokenId>{};
}

/// Fails the test unless `got` equals `want` in every field: chunks (sequence, tokens, start_pos, block table,
/// samples: parameters, seed, prompt, output and stop ids, num_logprobs, num_candidates; prompt logprobs), copies
/// and finished.
inline void require_same_step(const StepBatch& got, const StepBatch& want) {
  CHECK(got.copies == want.copies);
  CHECK(got.finished == want.finished);
  REQUIRE(got.seqs.size() == want.seqs.size());
  for (size_t i = 0; i < want.seqs.size(); ++i) {
    INFO("chunk " << i);
    const SeqChunk &g = got.seqs[i], &w = want.seqs[i];
    CHECK(g.seq == w.seq);
    CHECK(g.tokens == w.tokens);
    CHECK(g.start_pos == w.start_pos);
    CHECK(g.block_table == w.block_table);
    CHECK(g.group_tables == w.group_tables);
    REQUIRE(g.samples.size() == w.samples.size());
    for (size_t k = 0; k < w.samples.size(); ++k) {
      INFO("sample " << k);
      const SampleSpec &gs = g.samples[k], &ws = w.samples[k];
      REQUIRE(gs.params);
      CHECK(*gs.params == *ws.params);
      CHECK(gs.seed == ws.seed);
      CHECK(ids_behind(gs.prompt) == ids_behind(ws.prompt));
      CHECK(ids_behind(gs.output) == ids_behind(ws.output));
      CHECK(ids_behind(gs.stop_ids) == ids_behind(ws.stop_ids));
      CHECK(gs.num_logprobs == ws.num_logprobs);
      CHECK(gs.num_candidates == ws.num_candidates);
    }
    CHECK(g.prompt_logprobs.count == w.prompt_logprobs.count);
    CHECK(g.prompt_logprobs.num_top == w.prompt_logprobs.num_top);
    CHECK(g.prompt_logprobs.next_token == w.prompt_logprobs.next_token);
  }
}

}  // namespace paged::test
