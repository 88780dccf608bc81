// The PEFT adapter reader alone (model/lora/lora_adapter.h), on configs built here: where each pair lands in the
// runners' fused layers, how tensor-parallel ranks split it, its scale, and what it refuses.
#include <catch2/catch.hpp>

#include "model/lora/lora_adapter.h"
#include "tests/model/lora/lora_files.h"
#include "tests/test_data.h"

using namespace paged;
using namespace paged::test;

namespace {

ModelConfig small_config(bool fused) {
  ModelConfig c;
  c.model_type = fused ? "phi3" : "llama";
  c.hidden_size = 16;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 4;
  c.intermediate_size = 24;
  c.vocab_size = 32;
  c.max_position_embeddings = 64;
  c.fused_projections = fused;
  return c;
}

// Row r of a [rows][cols] matrix.
std::vector<float> row(const std::vector<float>& m, int64_t cols, int64_t r) {
  return {m.begin() + r * cols, m.begin() + (r + 1) * cols};
}

}  // namespace

TEST_CASE("a pair adds to its rows of the fused layer; ranks keep B's rows (column-parallel) or A's columns "
          "(row-parallel)", "[lora]") {
  TempDir dir("paged_lora_pairs");
  const ModelConfig c = small_config(false);
  const std::vector<LoraSpec> specs = {{"model.layers.1.self_attn.k_proj", 8, 16, 2},
                                       {"model.layers.1.self_attn.o_proj", 16, 16, 2},
                                       {"model.layers.0.mlp.up_proj", 24, 16, 3}};
  const auto pairs = write_lora_adapter(dir.path(), specs, 6.0, false, 1, {{"alpha_pattern", {{"up_proj", 9.0}}}});
  const LoraAdapter whole = load_lora_adapter(dir.path().string(), c, 0, 1, 16);
  REQUIRE(whole.layers.size() == 2);
  CHECK(whole.max_rank == 3);
  REQUIRE(whole.layers[1].qkv.size() == 1);
  const LoraPair& k = whole.layers[1].qkv[0];
  CHECK(k.out_offset == 16);  // after the 4 query heads of 4
  CHECK(k.out_rows == 8);
  CHECK(k.scale == Approx(3.0));
  CHECK(k.a == pairs.at(specs[0].module).first);
  CHECK(k.b == pairs.at(specs[0].module).second);
  REQUIRE(whole.layers[0].gate_up.size() == 1);
  CHECK(whole.layers[0].gate_up[0].out_offset == 24);  // up after gate
  CHECK(whole.layers[0].gate_up[0].scale == Approx(3.0));  // alpha_pattern's 9 over r 3
  CHECK(whole.layers[0].qkv.empty());
  CHECK(whole.layers[1].down.empty());

  // Two ranks: rank 1 keeps the second KV head of k (B rows 4..8, at its own offset after its 2 query heads), the
  // second half of o's input columns (A's columns 8..16) with all of B, and up's rows 12..24.
  const LoraAdapter r1 = load_lora_adapter(dir.path().string(), c, 1, 2, 16);
  const LoraPair& k1 = r1.layers[1].qkv.at(0);
  CHECK(k1.out_offset == 8);
  CHECK(k1.out_rows == 4);
  CHECK(k1.a == k.a);
  CHECK(k1.b == std::vector<float>(k.b.begin() + 4 * 2, k.b.end()));
  const LoraPair& o1 = r1.layers[1].o.at(0);
  const auto& [oa, ob] = pairs.at(specs[1].module);
  CHECK(o1.b == ob);
  for (int j = 0; j < 2; ++j) CHECK(row(o1.a, 8, j) == std::vector<float>(oa.begin() + j * 16 + 8, oa.begin() + j * 16 + 16));
  const LoraPair& up1 = r1.layers[0].gate_up.at(0);
  CHECK(up1.out_offset == 12);
  CHECK(up1.b == std::vector<float>(pairs.at(specs[2].module).second.begin() + 12 * 3,
                                    pairs.at(specs[2].module).second.end()));
  // Every rank salts the prefix cache alike.
  CHECK(r1.content_hash == whole.content_hash);
}

TEST_CASE("a fused checkpoint's pair (Phi-3's qkv_proj) splits over the q, k and v rows of each rank", "[lora]") {
  TempDir dir("paged_lora_fused");
  const ModelConfig c = small_config(true);
  const auto pairs = write_lora_adapter(dir.path(), {{"model.layers.0.self_attn.qkv_proj", 32, 16, 2}}, 2.0, true, 2);
  const auto& [a, b] = pairs.at("model.layers.0.self_attn.qkv_proj");
  const LoraAdapter r0 = load_lora_adapter(dir.path().string(), c, 0, 2, 16);
  const std::vector<LoraPair>& qkv = r0.layers[0].qkv;
  REQUIRE(qkv.size() == 3);
  // Rank 0: q rows 0..8, k rows 16..20, v rows 24..28 of the fused 32, at its offsets 0, 8, 12.
  const int offsets[] = {0, 8, 12}, firsts[] = {0, 16, 24}, counts[] = {8, 4, 4};
  for (int i = 0; i < 3; ++i) {
    CHECK(qkv[i].out_offset == offsets[i]);
    CHECK(qkv[i].out_rows == counts[i]);
    CHECK(qkv[i].a == a);
    CHECK(qkv[i].b == std::vector<float>(b.begin() + firsts[i] * 2, b.begin() + (firsts[i] + counts[i]) * 2));
    CHECK(qkv[i].scale == Approx(2.0 / std::sqrt(2.0)));  // rsLoRA
  }
}

TEST_CASE("an adapter is refused naming what does not fit", "[lora]") {
  TempDir dir("paged_lora_refused");
  const ModelConfig c = small_config(false);
  const auto refused = [&](const std::string& name, const std::vector<LoraSpec>& specs, const std::string& words,
                           const boost::json::object& extra = {}) {
    write_lora_adapter(dir.path() / name, specs, 8.0, false, 3, extra);
    INFO(name);
    CHECK_THROWS_WITH(load_lora_adapter((dir.path() / name).string(), c, 0, 1, 16), Catch::Contains(words));
  };
  const LoraSpec q{"model.layers.0.self_attn.q_proj", 16, 16, 4};
  refused("rank", {{q.module, 16, 16, 32}}, "rank 32, above --max-lora-rank 16");
  refused("head", {{"lm_head", 32, 16, 4}}, "'base_model.model.lm_head.lora_A.weight' adds to no linear layer");
  refused("layer", {{"model.layers.2.self_attn.q_proj", 16, 16, 4}}, "adds to no linear layer");
  refused("dora", {q}, "DoRA", {{"use_dora", true}});
  refused("bias", {q}, "LoRA biases", {{"bias", "all"}});
  refused("conv", {q}, "fan_in_fan_out", {{"fan_in_fan_out", true}});
  refused("ia3", {q}, "peft_type must be LORA", {{"peft_type", "IA3"}});
  refused("pattern", {q}, "not a valid pattern", {{"alpha_pattern", {{"q_proj(", 1.0}}}});
  refused("empty", {}, "no LoRA pair");
  // One half of a pair.
  std::filesystem::create_directories(dir.path() / "half");
  write_safetensors(dir.path() / "half" / "adapter_model.safetensors",
                    {{"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", "F32", {4, 16},
                      f32_bytes(std::vector<float>(64, 0.5f))}});
  std::ofstream(dir.path() / "half" / "adapter_config.json") << R"({"r": 4, "lora_alpha": 8})";
  CHECK_THROWS_WITH(load_lora_adapter((dir.path() / "half").string(), c, 0, 1, 16), Catch::Contains("without its other half"));
  // A PyTorch pickle.
  std::filesystem::create_directories(dir.path() / "bin");
  std::ofstream(dir.path() / "bin" / "adapter_config.json") << R"({"r": 4})";
  std::ofstream(dir.path() / "bin" / "adapter_model.bin") << "pickle";
  CHECK_THROWS_WITH(load_lora_adapter((dir.path() / "bin").string(), c, 0, 1, 16), Catch::Contains("safe_serialization"));
}

TEST_CASE("a mixture of experts takes pairs on its attention, none on its experts", "[lora]") {
  TempDir dir("paged_lora_moe");
  ModelConfig c = small_config(false);
  c.model_type = "qwen3_moe";
  c.moe.num_experts = 4;
  c.moe.top_k = 2;
  write_lora_adapter(dir.path() / "attn", {{"model.layers.0.self_attn.o_proj", 16, 16, 2}}, 4.0, false, 5);
  const LoraAdapter attn = load_lora_adapter((dir.path() / "attn").string(), c, 0, 1, 16);
  CHECK(attn.layers[0].o.size() == 1);
  write_lora_adapter(dir.path() / "expert", {{"model.layers.0.mlp.experts.1.gate_proj", 24, 16, 2}}, 4.0, false, 6);
  CHECK_THROWS_WITH(load_lora_adapter((dir.path() / "expert").string(), c, 0, 1, 16),
                    Catch::Contains("experts.1.gate_proj.lora_A.weight' adds to no linear layer of this qwen3_moe"));
}
