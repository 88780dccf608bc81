#include "model/kv/kv_groups.h"

#include <algorithm>
#include <limits>
#include <map>
#include <stdexcept>

#include "model/loader/config.h"

namespace paged {

int KvGroups::num_sliding() const {
  return static_cast<int>(std::count_if(windows.begin(), windows.end(), [](int w) { return w > 0; }));
}

KvGroups make_kv_groups(std::span<const int> layer_windows) {
  if (layer_windows.empty()) throw std::invalid_argument("KV groups of a model without layers");
  std::map<int, std::vector<int>> by_window;  // window -> its layers, in order
  for (size_t l = 0; l < layer_windows.size(); ++l) {
    if (layer_windows[l] < 0) throw std::invalid_argument("negative sliding window");
    by_window[layer_windows[l]].push_back(static_cast<int>(l));
  }
  const int layers = static_cast<int>(layer_windows.size());
  KvGroups g;
  g.group_of.assign(layers, 0);
  g.slot_of.assign(layers, 0);
  size_t fewest = layer_windows.size();
  size_t groups = 0;
  for (const auto& [window, members] : by_window) fewest = std::min(fewest, members.size());
  for (const auto& [window, members] : by_window) groups += (members.size() + fewest - 1) / fewest;
  if (by_window.size() == 1 || groups > static_cast<size_t>(kMaxKvGroups)) {
    // One group: every layer's K and V in every block, released before the window only when every layer slides.
    g.layers_per_block = layers;
    g.windows = {by_window.contains(0) ? 0 : by_window.rbegin()->first};
    for (int l = 0; l < layers; ++l) g.slot_of[l] = l;
    return g;
  }
  g.layers_per_block = static_cast<int>(fewest);
  for (const auto& [window, members] : by_window) {
    for (size_t i = 0; i < members.size(); ++i) {
      if (i % fewest == 0) g.windows.push_back(window);
      g.group_of[members[i]] = g.num_groups() - 1;
      g.slot_of[members[i]] = static_cast<int>(i % fewest);
    }
  }
  return g;
}

KvGroups kv_groups_of(const ModelConfig& config) {
  std::vector<int> windows(std::max(config.num_layers, 0));
  for (int l = 0; l < config.num_layers; ++l) windows[l] = config.sliding_window(l);
  return make_kv_groups(windows);
}

int64_t most_blocks_held(int64_t num_tokens, int block_size, int window, int max_chunk) {
  const int64_t all = (num_tokens + block_size - 1) / block_size;
  if (window <= 0 || max_chunk <= 0) return all;
  return std::min(all, (int64_t{window} + 3 * int64_t{max_chunk} + block_size - 1) / block_size + 2);
}

int64_t most_blocks_held(std::span<const int> windows, int64_t num_tokens, int block_size, int max_chunk) {
  int64_t blocks = 0;
  for (int w : windows) blocks += most_blocks_held(num_tokens, block_size, w, max_chunk);
  return blocks;
}

int64_t most_blocks_held_by_forks(std::span<const int> windows, int64_t prompt_len, int64_t num_tokens, int width,
                                  int block_size, int max_chunk, bool share_prompt) {
  const int64_t prompt_blocks = share_prompt ? prompt_len / block_size : 0;  // full ones: a fork shares them
  int64_t most = 0;
  // What a group holds depends on the length through its block count only.
  for (int64_t b = (prompt_len + block_size - 1) / block_size; b <= (num_tokens + block_size - 1) / block_size; ++b) {
    int64_t blocks = 0;
    for (int w : windows) {
      const int64_t held = most_blocks_held(b * block_size, block_size, w, max_chunk);
      const int64_t shared = std::max<int64_t>(0, prompt_blocks - (b - held));  // the first b - held are released
      blocks += shared + width * (held - shared);
    }
    most = std::max(most, blocks);
  }
  return most;
}

int64_t longest_sequence(std::span<const int> windows, int64_t blocks, int block_size, int max_chunk) {
  const auto fits = [&](int64_t n) { return most_blocks_held(windows, n, block_size, max_chunk) <= blocks; };
  int64_t lo = 0, hi = int64_t{1} << 40;  // fits(lo); past hi, what a sliding group holds no longer grows
  if (fits(hi)) return std::numeric_limits<int64_t>::max();
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return fits(lo) ? lo : 0;
}

int64_t blocks_kept(const KvGroups& groups, int64_t num_tokens, int block_size) {
  const int64_t all = (num_tokens + block_size - 1) / block_size;
  int64_t blocks = 0;
  for (int w : groups.windows) blocks += w > 0 ? std::min<int64_t>(all, (w + block_size - 1) / block_size + 1) : all;
  return blocks;
}

}  // namespace paged
