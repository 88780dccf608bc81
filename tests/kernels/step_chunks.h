// Chunks of hand-made steps for the runner tests (CPU and CUDA alike).
#pragma once

#include <vector>

#include "model/kv/kv_groups.h"
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

/// A table of `per_group` blocks for each KV group of `groups`, the groups' blocks interleaved in the pool (block b of
/// group g is b * groups + groups - 1 - g), so that a layer reading another group's table reads other KV: a pool of
/// per_group * groups blocks.
inline std::vector<std::vector<int32_t>> group_tables_for(const KvGroups& groups, int per_group) {
  const int G = groups.num_groups();
  std::vector<std::vector<int32_t>> tables(G, std::vector<int32_t>(per_group));
  for (int g = 0; g < G; ++g)
    for (int b = 0; b < per_group; ++b) tables[g][b] = b * G + G - 1 - g;
  return tables;
}

/// `c` reading `tables` (group_tables_for): the first as its block_table, the others as its group_tables. With
/// `release`, each sliding group's entries before its window of c.start_pos are kReleasedBlock in `tables` (they
/// stay so for the later chunks), as the cache manager releases them.
inline SeqChunk with_tables(SeqChunk c, std::vector<std::vector<int32_t>>& tables, const KvGroups& groups,
                            int block_size, bool release) {
  if (release)
    for (int g = 0; g < groups.num_groups(); ++g)
      for (int b = 0; b < first_window_block(c.start_pos, groups.windows[g], block_size); ++b)
        tables[g][b] = kReleasedBlock;
  c.block_table = tables[0];
  c.group_tables.assign(tables.begin() + 1, tables.end());
  return c;
}

/// The chunk of sequence `seq` computing tokens[from, to) and sampling its last position, on the sequence's own
/// blocks of a pool where every sequence has `per_seq` blocks in each of `groups` KV groups: block b of group g is
/// (seq * per_seq + b) * groups + g (a pool of sequences * per_seq * groups blocks).
inline SeqChunk own_blocks_chunk(SeqId seq, const std::vector<TokenId>& tokens, int from, int to, int per_seq,
                                 int groups) {
  const auto table = [&](int g) {
    std::vector<int32_t> t(per_seq);
    for (int b = 0; b < per_seq; ++b) t[b] = (static_cast<int>(seq) * per_seq + b) * groups + g;
    return t;
  };
  SeqChunk c = chunk_of(seq, tokens, from, to, table(0));
  for (int g = 1; g < groups; ++g) c.group_tables.push_back(table(g));
  c.samples.push_back({});
  return c;
}

}  // namespace paged::test
