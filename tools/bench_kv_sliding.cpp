// KV bytes per token of a sequence at a given context for Gemma 3's shapes (five sliding layers to one full), a
// model whose every layer slides (Mistral 7B v0.1) and models without sliding layers: what every layer keeping every
// block costs, what releasing a sliding layer's blocks behind its window (model/kv/kv_footprint.h) leaves, and what
// the cache manager holds (a KvCacheManager over the model's KV groups, model/kv/kv_groups.h, decoding one sequence
// to that context, one token a step: each sliding group releases the blocks before its window). bf16 KV, blocks of
// 16 tokens.
// The shapes are those of the published config.json files (layers, KV heads, head_dim, sliding_window, and
// Gemma 3's layer_types: every sixth layer full); MODEL_DIR arguments add their own config.json.
//
// Usage: bench_kv_sliding [--context N] [MODEL_DIR ...]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "model/kv/kv_cache_manager.h"
#include "model/kv/kv_footprint.h"

namespace {

using paged::ModelConfig;

constexpr int kBlock = 16;

// A shape of `layers` layers of kv_heads x head_dim, every sixth full (unless `every_layer`) and the others sliding
// by `window` (0: none).
ModelConfig shape(int layers, int kv_heads, int head_dim, int window, bool every_layer = false) {
  ModelConfig c;
  c.num_layers = layers;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  for (int l = 0; l < layers; ++l) c.sliding_windows.push_back(every_layer || (l + 1) % 6 != 0 ? window : 0);
  return c;
}

// The most device blocks a KvCacheManager holds for one sequence of `context` tokens computed one token a step
// (the prompt's first token, then decode), over the model's KV groups.
int64_t peak_blocks(const paged::KvGroups& groups, int64_t context) {
  const int64_t blocks = (context + kBlock - 1) / kBlock;
  const int pool = static_cast<int>(groups.num_groups() * (blocks + 1));
  paged::KvCacheManager kv({.block_size = kBlock, .num_device_blocks = pool,
                            .enable_prefix_caching = false, .group_windows = groups.windows, .watermark = 0.0});
  const std::vector<paged::TokenId> tokens(context, 0);
  kv.allocate(1, tokens, 1);
  kv.mark_computed(1, tokens, 1);
  std::vector<paged::BlockPair> copies;
  int64_t peak = 1;
  for (int p = 1; p < context; ++p) {
    kv.reserve(1, p, p + 1, copies);
    kv.mark_computed(1, tokens, p + 1);
    const paged::KvMetrics m = kv.metrics();
    peak = std::max(peak, m.device_total - m.device_free);
  }
  return peak;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t context = 8192;
  std::vector<std::pair<std::string, ModelConfig>> models = {
      {"gemma-3-1b (26 layers, 1 x 256, window 512)", shape(26, 1, 256, 512)},
      {"gemma-3-4b (34 layers, 4 x 256, window 1024)", shape(34, 4, 256, 1024)},
      {"gemma-3-12b (48 layers, 8 x 256, window 1024)", shape(48, 8, 256, 1024)},
      {"gemma-3-27b (62 layers, 16 x 128, window 1024)", shape(62, 16, 128, 1024)},
      {"mistral-7b-v0.1 (32 layers, 8 x 128, window 4096 on all)", shape(32, 8, 128, 4096, true)},
      {"llama-3-8b (32 layers, 8 x 128, no sliding)", shape(32, 8, 128, 0)},
      {"qwen3-8b (36 layers, 8 x 128, no sliding)", shape(36, 8, 128, 0)}};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--context") == 0 && i + 1 < argc) {
      context = std::atoll(argv[++i]);
    } else {
      try {
        models.emplace_back(argv[i], paged::load_model_config(argv[i]));
      } catch (const paged::ModelError& e) {
        std::fprintf(stderr, "bench_kv_sliding: %s\n", e.what());
        return 2;
      }
    }
  }
  if (context < 1) {
    std::fprintf(stderr, "usage: bench_kv_sliding [--context N] [MODEL_DIR ...]\n");
    return 2;
  }
  std::printf("KV bytes per token at context %lld (bf16, blocks of 16), per sequence:\n",
              static_cast<long long>(context));
  std::printf("%-58s %14s %22s %8s %18s\n", "model", "every block", "sliding: window only", "saving",
              "manager holds");
  for (const auto& [name, config] : models) {
    const paged::KvFootprint f = paged::sequence_kv_bytes(config, context, kBlock, 2);
    const double all = double(f.every_block) / context, window = double(f.window_blocks) / context;
    const paged::KvGroups groups = paged::kv_groups_of(config);
    const double block_bytes = 2.0 * groups.layers_per_block * config.num_kv_heads * config.head_dim * kBlock * 2;
    const double held = peak_blocks(groups, context) * block_bytes / context;
    std::printf("%-58s %11.1f KiB %19.1f KiB %7.2fx %14.1f KiB\n", name.c_str(), all / 1024, window / 1024,
                all / window, held / 1024);
  }
  return 0;
}
