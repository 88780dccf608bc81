// KV groups: how a model's layers share the KV cache's blocks (vLLM's hybrid KV-cache groups). A block holds the K
// and V of `layers_per_block` layers for block_size tokens; each group of layers has a block table of its own per
// sequence, over the same positions, and the groups share the one pool. A group of sliding-window layers releases the
// blocks before its window (KvCacheManager), a group of full-attention layers keeps every block, so a model whose
// layers slide only partly (Gemma 3: five of six) holds per sequence the window's blocks of its sliding layers and
// the whole context of its full ones. Layer l keeps its K and V in slot slot_of[l] of the blocks of table
// group_of[l]; a runner's pool is [2 * layers_per_block caches][num_blocks][...]. Pure: no CAF, no CUDA.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace paged {

struct ModelConfig;

/// The most KV groups a model is split into; a model that would need more keeps one group (every block).
inline constexpr int kMaxKvGroups = 16;

struct KvGroups {
  int layers_per_block = 0;  // layer slots of a block
  std::vector<int> windows;  // per group: the window of its layers (0: they attend to every position)
  std::vector<int> group_of; // per layer: its group
  std::vector<int> slot_of;  // per layer: its slot in its group's blocks
  int num_groups() const { return static_cast<int>(windows.size()); }
  /// Groups whose layers slide (window > 0).
  int num_sliding() const;
  bool operator==(const KvGroups&) const = default;
};

/// The groups of a model whose layer l attends through a window of `layer_windows[l]` positions (0: none). Layers of
/// one window size form one group when every layer has the same (all of them in one block: slot l for layer l, the
/// single group's window is the layers' one); else each window size's layers are split, in order, into groups of
/// as many layers as the fewest of any size has (vLLM's rule: equal groups, so that one block size serves all; a
/// last group of a size may have fewer, its other slots unused). More than kMaxKvGroups groups: one group of every
/// layer, its window the largest when every layer slides, else 0 (every block kept). Throws std::invalid_argument
/// for no layers or a negative window.
KvGroups make_kv_groups(std::span<const int> layer_windows);

/// make_kv_groups of the config's layers (ModelConfig::sliding_window).
KvGroups kv_groups_of(const ModelConfig& config);

/// The most device blocks one sequence of `num_tokens` tokens holds at once in a group: all of its blocks, or, with a
/// sliding window (> 0) and chunks of at most `max_chunk` tokens (> 0), at most those of window + 3 chunks (the chunk,
/// and those of the two steps in flight that KvCacheManager::reserve's release lags behind) and two more, whatever
/// its length.
int64_t most_blocks_held(int64_t num_tokens, int block_size, int window, int max_chunk);
/// The same over groups of these windows (KvGroups::windows).
int64_t most_blocks_held(std::span<const int> windows, int64_t num_tokens, int block_size, int max_chunk);
/// The most device blocks `width` sequences forked from one prompt of `prompt_len` tokens hold together while each
/// grows to `num_tokens` (a beam search, whose every beam is resident at each step), over groups of these windows:
/// at each length, the prompt's full blocks a group still holds (a sliding group releases the first ones) are shared
/// when `share_prompt`, and the rest of what it holds (most_blocks_held) is each sequence's own.
int64_t most_blocks_held_by_forks(std::span<const int> windows, int64_t prompt_len, int64_t num_tokens, int width,
                                  int block_size, int max_chunk, bool share_prompt);
/// The most tokens a sequence may reach holding at most `blocks` device blocks over groups of these windows
/// (most_blocks_held, chunks of at most `max_chunk` tokens); INT64_MAX when every group slides and the windows fit:
/// any length.
int64_t longest_sequence(std::span<const int> windows, int64_t blocks, int block_size, int max_chunk);
/// Blocks one sequence of `num_tokens` tokens keeps once its last token is computed, over all groups: a sliding
/// group those overlapping its window (ceil(window / block_size) + 1 at most), the others all of its blocks.
int64_t blocks_kept(const KvGroups& groups, int64_t num_tokens, int block_size);

}  // namespace paged
