// KV bytes per token of a sequence at a given context for Gemma 3's shapes (five sliding layers to one full) against
// models without sliding layers: what every layer keeping every block costs today, and what releasing a sliding
// layer's blocks behind its window (model/kv/kv_footprint.h) would leave. bf16 KV, blocks of 16 tokens.
// The shapes are those of the published config.json files (layers, KV heads, head_dim, sliding_window, and
// Gemma 3's layer_types: every sixth layer full); MODEL_DIR arguments add their own config.json.
//
// Usage: bench_kv_sliding [--context N] [MODEL_DIR ...]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "model/kv/kv_footprint.h"

namespace {

using paged::ModelConfig;

// A shape of `layers` layers of kv_heads x head_dim, every sixth full and the others sliding by `window` (0: none).
ModelConfig shape(int layers, int kv_heads, int head_dim, int window) {
  ModelConfig c;
  c.num_layers = layers;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  for (int l = 0; l < layers; ++l) c.sliding_windows.push_back((l + 1) % 6 != 0 ? window : 0);
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t context = 8192;
  std::vector<std::pair<std::string, ModelConfig>> models = {
      {"gemma-3-1b (26 layers, 1 x 256, window 512)", shape(26, 1, 256, 512)},
      {"gemma-3-4b (34 layers, 4 x 256, window 1024)", shape(34, 4, 256, 1024)},
      {"gemma-3-12b (48 layers, 8 x 256, window 1024)", shape(48, 8, 256, 1024)},
      {"gemma-3-27b (62 layers, 16 x 128, window 1024)", shape(62, 16, 128, 1024)},
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
  std::printf("%-50s %14s %22s %8s\n", "model", "every block", "sliding: window only", "saving");
  for (const auto& [name, config] : models) {
    const paged::KvFootprint f = paged::sequence_kv_bytes(config, context, 16, 2);
    const double all = double(f.every_block) / context, window = double(f.window_blocks) / context;
    std::printf("%-50s %11.1f KiB %19.1f KiB %7.2fx\n", name.c_str(), all / 1024, window / 1024, all / window);
  }
  return 0;
}
