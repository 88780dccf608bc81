// Chunks of hand-made steps for the runner tests (CPU and CUDA alike).
#pragma once

#include <vector>

#include "model/step.h"

namespace paged::test {

/// The chunk of sequence `seq` computing tokens[from, to) at their positions, on blocks `table`.
inline SeqChunk chunk_of(SeqId seq, const std::vector<TokenId>& tokens, int from, int to, std::vector<int32_t> table) {
  SeqChunk c;
  c.seq = seq;
  c.tokens.assign(tokens.begin() + from, tokens.begin() + to);
  c.start_pos = from;
  c.block_table = std::move(table);
  return c;
}

}  // namespace paged::test
