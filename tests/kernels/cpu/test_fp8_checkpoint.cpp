// Pre-quantised FP8 checkpoints on the CPU runner. tools/make_fp8_checkpoints.py writes every layout (per tensor,
// static, 128 x 128 and small blocks with bf16 scales, compressed-tensors per channel / tensor / block, some layers
// left out) from float32 models, each with the float32 checkpoint of its weights dequantised in Python: loaded here,
// both give the same weights bit for bit, the same logits and the same greedy tokens. Families: stories260K (tied
// embeddings), Qwen3 (separate q/k/v, q/k norms), Phi-3 (fused qkv_proj / gate_up_proj: one scale for the fused
// tensor, the runner's parts cut from it), Qwen3-MoE (every expert's own scales, an FP8 router).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "kernels/cpu/cpu_runner.h"
#include "model/loader/config.h"
#include "model/loader/safetensors.h"
#include "model/loader/weight_map.h"
#include "tests/fp8_checkpoints.h"
#include "tests/test_data.h"

using namespace paged;

namespace {

// The checkpoints of `model` (a folder of models/ or tests/models/), written once per run into the build folder.
std::string checkpoints_of(const std::string& model_dir, const std::string& name, const std::string& layouts) {
  return test::fp8_checkpoints_once(model_dir, std::string(PAGED_BINARY_DIR) + "/fp8_checkpoints/" + name, layouts);
}

// Every tensor shard of tensor-parallel rank `rank` of `tp`.
std::vector<TensorShard> all_shards(const ModelConfig& cfg, int rank, int tp) {
  const WeightMap m = rank_weight_map(cfg, rank, tp);
  std::vector<const RankParam*> params = {&m.embed, &m.final_norm, &m.lm_head};
  for (const RankLayer& L : m.layers)
    for (const RankParam* p : {&L.attn_norm, &L.ffn_norm, &L.post_attn_norm, &L.post_ffn_norm, &L.wqkv, &L.bqkv,
                               &L.q_norm, &L.k_norm, &L.wo, &L.bo, &L.w_gate_up, &L.w_down, &L.router})
      params.push_back(p);
  std::vector<TensorShard> out;
  for (const RankParam* p : params) out.insert(out.end(), p->shards.begin(), p->shards.end());
  return out;
}

// The logits after the prompts and the greedy tokens of a CPU runner over `dir`.
struct Greedy {
  std::vector<std::vector<float>> logits;
  std::vector<std::vector<TokenId>> tokens;
};
Greedy greedy(const std::string& dir, const std::vector<std::vector<TokenId>>& prompts, bool fp8_weights = false) {
  const ModelConfig cfg = load_model_config(dir);
  const SafeTensors w(dir);
  const int per_seq = 4;  // 64 positions of 16-token blocks
  CpuModelRunner runner(cfg, w, {.block_size = 16, .num_blocks = per_seq * static_cast<int>(prompts.size()),
                                 .fp8_weights = fp8_weights});
  std::vector<std::vector<int32_t>> tables(prompts.size());
  for (size_t s = 0; s < prompts.size(); ++s)
    for (int b = 0; b < per_seq; ++b) tables[s].push_back(static_cast<int32_t>(s) * per_seq + b);
  Greedy g;
  g.tokens = test::greedy_on_runner(runner, prompts, 12, tables, &g.logits);
  return g;
}

// max |a - b| / max |b| over the rows.
double max_rel_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double diff = 0, scale = 1e-30;
  for (size_t r = 0; r < b.size(); ++r)
    for (size_t i = 0; i < b[r].size(); ++i) {
      diff = std::max(diff, std::fabs(double(a[r][i]) - b[r][i]));
      scale = std::max(scale, std::fabs(double(b[r][i])));
    }
  return diff / scale;
}

const std::vector<std::vector<TokenId>> kPrompts = {{1, 403, 29, 77, 310, 12, 9, 5},
                                                    {1, 18, 200, 211, 64, 3, 450, 33, 90, 17, 6}};

// The FP8 checkpoints of `model` in `layouts` against their dequantised twins (and the original, which FP8 moves).
void check_layouts(const std::string& model_dir, const std::string& name, const std::vector<std::string>& layouts,
                   int tp) {
  std::string list;
  for (const std::string& l : layouts) list += (list.empty() ? "" : ",") + l;
  const std::string out = checkpoints_of(model_dir, name, list);
  const Greedy original = greedy(model_dir, kPrompts);
  for (const std::string& layout : layouts) {
    INFO(name << " " << layout);
    const std::string dir = out + "/" + layout, ref = out + "/" + layout + "-ref";
    const ModelConfig cfg = load_model_config(dir), ref_cfg = load_model_config(ref);
    REQUIRE(cfg.fp8_checkpoint.enabled);
    REQUIRE_FALSE(ref_cfg.fp8_checkpoint.enabled);
    const SafeTensors w(dir), rw(ref);
    const ModelConfig layout_cfg = with_expert_layout(cfg, w);
    int fp8_tensors = 0;
    for (int rank = 0; rank < tp; ++rank)
      for (const TensorShard& s : all_shards(layout_cfg, rank, tp)) {
        INFO(s.name << " rank " << rank << " of " << tp);
        fp8_tensors += shard_tensor(w, s).dtype == DType::f8_e4m3;
        CHECK(read_shard_f32(w, s, cfg.fp8_checkpoint) == read_shard_f32(rw, s));
      }
    CHECK(fp8_tensors > 0);
    const Greedy got = greedy(dir, kPrompts), want = greedy(ref, kPrompts);
    CHECK(max_rel_diff(got.logits, want.logits) <= 1e-5);
    CHECK(got.tokens == want.tokens);
    CHECK(max_rel_diff(got.logits, original.logits) > 1e-4);  // the FP8 weights are not the original ones
  }
}

}  // namespace

TEST_CASE("FP8 checkpoints of every layout load on the CPU runner as their dequantised float32 twins",
          "[fp8ckpt][cpu]") {
  check_layouts(test::kModel, "stories260K", {std::begin(test::kFp8Layouts), std::end(test::kFp8Layouts)}, 2);
}

TEST_CASE("FP8 checkpoints of the families: separate and fused projections, q/k norms, experts and routers",
          "[fp8ckpt][cpu]") {
  const std::string models = std::string(PAGED_SOURCE_DIR) + "/tests/models/";
  for (const char* family : {"qwen3", "phi3-longrope", "qwen3-moe"}) {
    if (!std::filesystem::exists(models + family + "/model.safetensors")) {
      WARN("skipped " << family << ": tests/models/" << family << " is absent");
      continue;
    }
    check_layouts(models + family, family, {"fp8-tensor", "ct-channel", "fp8-block-small"}, 2);
  }
}

TEST_CASE("FP8 emulation on an FP8 checkpoint: its weights as the CUDA runner holds them, inputs rounded per row",
          "[fp8ckpt][cpu]") {
  const std::string out = checkpoints_of(test::kModel, "stories260K", test::all_fp8_layouts());
  for (const char* layout : test::kFp8Layouts) {
    INFO(layout);
    const std::string dir = out + "/" + layout;
    const Greedy exact = greedy(dir, kPrompts), emulated = greedy(dir, kPrompts, true);
    const double diff = max_rel_diff(emulated.logits, exact.logits);
    WARN(layout << ": FP8 emulation against the dequantised float32 logits, max relative difference " << diff);
    CHECK(diff > 0.0);   // the inputs are rounded through e4m3
    CHECK(diff < 0.1);   // but the weights are the checkpoint's
  }
}
