// The weight map: checkpoint names and shapes from the config, the part of every tensor each tensor-parallel rank
// keeps (the ranks' parts tile each sharded tensor exactly once), the divisibility errors, and reading a shard.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "model/loader/weight_map.h"
#include "tests/model/loader/safetensors_file.h"
#include "tests/test_data.h"

using namespace paged;
using namespace paged::test;

namespace {

// A small Qwen2-like shape: 8 heads of 16, 4 KV heads, intermediate 96, untied, q/k/v biases.
ModelConfig small_config() {
  return ModelConfig{.model_type = "qwen2", .hidden_size = 128, .num_layers = 2, .num_heads = 8, .num_kv_heads = 4,
                     .head_dim = 16, .intermediate_size = 96, .vocab_size = 1000, .tie_word_embeddings = false,
                     .qkv_bias = true};
}

// Every parameter of the map with a label, in load order.
std::vector<std::pair<std::string, const RankParam*>> params_of(const WeightMap& m) {
  std::vector<std::pair<std::string, const RankParam*>> out{
      {"embed", &m.embed}, {"final_norm", &m.final_norm}, {"lm_head", &m.lm_head}};
  for (const RankLayer& L : m.layers)
    out.insert(out.end(), {{"attn_norm", &L.attn_norm}, {"ffn_norm", &L.ffn_norm}, {"wqkv", &L.wqkv},
                           {"bqkv", &L.bqkv}, {"q_norm", &L.q_norm}, {"k_norm", &L.k_norm}, {"wo", &L.wo},
                           {"bo", &L.bo}, {"w_gate_up", &L.w_gate_up}, {"w_down", &L.w_down}});
  return out;
}

std::string error_of(const ModelConfig& c, int rank, int size) {
  try {
    rank_weight_map(c, rank, size);
  } catch (const ModelError& e) {
    return e.what();
  }
  FAIL("rank " << rank << " of " << size << " was accepted");
  return {};
}

}  // namespace

TEST_CASE("weight map: names, shapes and fused layouts of one rank", "[loader]") {
  const WeightMap m = rank_weight_map(small_config(), 0, 1);
  CHECK(m.heads == 8);
  CHECK(m.kv_heads == 4);
  CHECK(m.intermediate == 96);
  REQUIRE(m.embed.shards.size() == 1);
  CHECK(m.embed.shards[0].name == "model.embed_tokens.weight");
  CHECK(m.embed.shards[0].shape == std::vector<int64_t>{1000, 128});
  CHECK(m.final_norm.shards[0].name == "model.norm.weight");
  CHECK(m.final_norm.shards[0].shape == std::vector<int64_t>{128});
  REQUIRE(m.lm_head.shards.size() == 1);
  CHECK(m.lm_head.shards[0].name == "lm_head.weight");
  REQUIRE(m.layers.size() == 2);

  const RankLayer& L = m.layers[1];
  CHECK(L.attn_norm.shards[0].name == "model.layers.1.input_layernorm.weight");
  CHECK(L.ffn_norm.shards[0].name == "model.layers.1.post_attention_layernorm.weight");
  // The fused QKV: q rows, then k rows, then v rows; the biases likewise.
  REQUIRE(L.wqkv.shards.size() == 3);
  CHECK(L.wqkv.shards[0].name == "model.layers.1.self_attn.q_proj.weight");
  CHECK(L.wqkv.shards[0].shape == std::vector<int64_t>{128, 128});
  CHECK(L.wqkv.shards[1].name == "model.layers.1.self_attn.k_proj.weight");
  CHECK(L.wqkv.shards[1].shape == std::vector<int64_t>{64, 128});
  CHECK(L.wqkv.shards[2].name == "model.layers.1.self_attn.v_proj.weight");
  CHECK(L.wqkv.numel() == (128 + 2 * 64) * 128);
  REQUIRE(L.bqkv.shards.size() == 3);
  CHECK(L.bqkv.shards[0].name == "model.layers.1.self_attn.q_proj.bias");
  CHECK(L.bqkv.shards[2].shape == std::vector<int64_t>{64});
  CHECK(L.bqkv.numel() == 128 + 2 * 64);
  CHECK(L.wo.shards[0].name == "model.layers.1.self_attn.o_proj.weight");
  CHECK(L.wo.shards[0].shape == std::vector<int64_t>{128, 128});
  // The fused gate/up: gate rows, then up rows.
  REQUIRE(L.w_gate_up.shards.size() == 2);
  CHECK(L.w_gate_up.shards[0].name == "model.layers.1.mlp.gate_proj.weight");
  CHECK(L.w_gate_up.shards[1].name == "model.layers.1.mlp.up_proj.weight");
  CHECK(L.w_gate_up.shards[1].shape == std::vector<int64_t>{96, 128});
  CHECK(L.w_down.shards[0].name == "model.layers.1.mlp.down_proj.weight");
  CHECK(L.w_down.shards[0].shape == std::vector<int64_t>{128, 96});
  // One rank keeps every tensor whole.
  for (const auto& [label, param] : params_of(m))
    for (const TensorShard& s : param->shards) {
      INFO(s.name);
      CHECK(s.row_begin == 0);
      CHECK(s.col_begin == 0);
      CHECK(s.rows == (s.shape.size() == 2 ? s.shape[0] : 1));
      CHECK(s.cols == s.shape.back());
    }
}

TEST_CASE("weight map: tied embeddings have no LM head, models without bias no bias", "[loader]") {
  ModelConfig c = small_config();
  c.tie_word_embeddings = true;
  c.qkv_bias = false;
  const WeightMap m = rank_weight_map(c, 0, 1);
  CHECK(m.lm_head.shards.empty());
  CHECK(m.lm_head.numel() == 0);
  for (const RankLayer& L : m.layers) CHECK(L.bqkv.shards.empty());
}

TEST_CASE("weight map: the ranks' shards tile every sharded tensor once; the rest is replicated", "[loader][tp]") {
  // Qwen2 (q/k/v biases); Qwen3 (q_norm / k_norm, o_proj bias); Phi-3 (qkv_proj and gate_up_proj fused in the
  // checkpoint): per layer 2 norms and 7 weights + 3 biases / 7 weights + 2 head norms + 4 biases / 4 weights.
  ModelConfig qwen3 = small_config();
  qwen3.model_type = "qwen3";
  qwen3.qk_norm = qwen3.o_bias = true;
  ModelConfig phi3 = small_config();
  phi3.model_type = "phi3";
  phi3.fused_projections = true;
  phi3.qkv_bias = false;
  for (const auto& [c, tensors] : {std::pair{small_config(), 3 + 2 * 12}, std::pair{qwen3, 3 + 2 * 15},
                                   std::pair{phi3, 3 + 2 * 6}})
  for (int tp : {1, 2, 4}) {
    INFO(c.model_type << ", tensor_parallel_size " << tp);
    // Per tensor: how often each element is kept over all ranks.
    std::map<std::string, std::vector<int>> kept;
    std::map<std::string, std::vector<int64_t>> shapes;
    for (int rank = 0; rank < tp; ++rank) {
      const WeightMap m = rank_weight_map(c, rank, tp);
      CHECK(m.heads == 8 / tp);
      CHECK(m.kv_heads == 4 / tp);
      CHECK(m.intermediate == 96 / tp);
      const RankLayer& L = m.layers[0];
      CHECK(L.wqkv.numel() == int64_t{m.heads + 2 * m.kv_heads} * 16 * 128);
      CHECK(L.wo.numel() == int64_t{128} * m.heads * 16);
      CHECK(L.w_gate_up.numel() == int64_t{2} * m.intermediate * 128);
      CHECK(L.w_down.numel() == int64_t{128} * m.intermediate);
      // Rank r's query heads are those of its KV heads: q rows follow the k rows' KV heads.
      const int64_t k_rows_begin = c.fused_projections ? 8 * 16 : 0;  // k's rows follow q's in a fused qkv_proj
      CHECK(L.wqkv.shards[0].row_begin == int64_t{rank} * m.heads * 16);
      CHECK(L.wqkv.shards[1].row_begin == k_rows_begin + int64_t{rank} * m.kv_heads * 16);
      CHECK(L.wo.shards[0].col_begin == L.wqkv.shards[0].row_begin);
      CHECK(L.w_down.shards[0].col_begin == L.w_gate_up.shards[0].row_begin);
      for (const auto& [label, param] : params_of(m))
        for (const TensorShard& s : param->shards) {
          const int64_t C = s.shape.back(), R = s.shape.size() == 2 ? s.shape[0] : 1;
          REQUIRE(s.row_begin + s.rows <= R);
          REQUIRE(s.col_begin + s.cols <= C);
          shapes[s.name] = s.shape;
          std::vector<int>& count = kept[s.name];
          count.resize(R * C);
          for (int64_t r = s.row_begin; r < s.row_begin + s.rows; ++r)
            for (int64_t col = s.col_begin; col < s.col_begin + s.cols; ++col) ++count[r * C + col];
        }
    }
    for (const auto& [name, count] : kept) {
      INFO(name);
      const bool replicated = name.find("norm") != std::string::npos || name == "model.embed_tokens.weight" ||
                              name == "lm_head.weight";
      const int expected = replicated ? tp : 1;  // o_proj's bias too is kept once: by rank 0
      CHECK(std::all_of(count.begin(), count.end(), [&](int n) { return n == expected; }));
    }
    CHECK(kept.size() == static_cast<size_t>(tensors));  // with the embedding, the final norm and the LM head
  }
}

TEST_CASE("weight map: a tensor_parallel_size that does not divide the model is a clear error", "[loader][tp]") {
  const ModelConfig c = small_config();
  const std::string heads = error_of(c, 0, 3);
  CHECK_THAT(heads, Catch::Contains("tensor_parallel_size 3") && Catch::Contains("attention heads (8)") &&
                        Catch::Contains("KV heads (4)"));
  CHECK_THAT(error_of(c, 0, 8), Catch::Contains("tensor_parallel_size 8") && Catch::Contains("KV heads"));
  ModelConfig odd = c;
  odd.intermediate_size = 90;
  CHECK_THAT(error_of(odd, 1, 4), Catch::Contains("tensor_parallel_size 4 does not divide intermediate_size 90"));
  CHECK_THAT(error_of(c, 2, 2), Catch::Contains("invalid tensor-parallel rank/size"));
  CHECK_THAT(error_of(c, -1, 2), Catch::Contains("invalid tensor-parallel rank/size"));
  CHECK_THAT(error_of(c, 0, 0), Catch::Contains("invalid tensor-parallel rank/size"));
}

TEST_CASE("weight map: reading a shard gives the rank's rows or columns of the checkpoint tensor", "[loader][tp]") {
  const ModelConfig c = load_model_config(kModel);  // stories260K: 8 heads of 8, 4 KV heads, intermediate 172
  const SafeTensors w(kModel);
  const WeightMap one = rank_weight_map(c, 0, 1), rank1 = rank_weight_map(c, 1, 2);
  // q_proj: rank 1 of 2 keeps rows 32..63 of [64][64].
  const std::vector<float> q = read_shard_f32(w, one.layers[3].wqkv.shards[0]);
  const std::vector<float> q1 = read_shard_f32(w, rank1.layers[3].wqkv.shards[0]);
  REQUIRE(q.size() == 64 * 64);
  REQUIRE(q1.size() == 32 * 64);
  CHECK(std::equal(q1.begin(), q1.end(), q.begin() + 32 * 64));
  // down_proj: rank 1 of 2 keeps columns 86..171 of [64][172].
  const std::vector<float> down = read_shard_f32(w, one.layers[3].w_down.shards[0]);
  const std::vector<float> down1 = read_shard_f32(w, rank1.layers[3].w_down.shards[0]);
  REQUIRE(down1.size() == 64 * 86);
  for (int r = 0; r < 64; ++r)
    for (int col = 0; col < 86; ++col) {
      if (down1[r * 86 + col] == down[r * 172 + 86 + col]) continue;
      FAIL("down_proj element (" << r << ", " << 86 + col << ") differs");
    }
  // Checkpoint tensors are checked against the config's shapes.
  ModelConfig wide = c;
  wide.intermediate_size = 200;
  const TensorShard gate = rank_weight_map(wide, 0, 1).layers[0].w_gate_up.shards[0];
  CHECK_THROWS_WITH(read_shard_f32(w, gate), Catch::Contains("mlp.gate_proj.weight") && Catch::Contains("[200, 64]"));
  // An untied config on a tied checkpoint: the LM head is missing, and the message says why it is needed.
  ModelConfig untied = c;
  untied.tie_word_embeddings = false;
  CHECK_THROWS_WITH(shard_tensor(w, rank_weight_map(untied, 0, 1).lm_head.shards[0]),
                    Catch::Contains("lm_head.weight") && Catch::Contains("tie_word_embeddings is false"));
}

TEST_CASE("weight map: experts per expert and fused, each expert sharded as a dense MLP", "[loader][tp][moe]") {
  // 4 experts of intermediate 32, hidden 128, on rank 1 of 2: columns 16..31 of every expert.
  ModelConfig c = small_config();
  c.intermediate_size = 32;
  c.moe = {.num_experts = 4, .top_k = 2};
  const int64_t E = 4, I = 32, H = 128, ir = 16;
  for (const std::string type : {"mixtral", "qwen3_moe"}) {
    c.model_type = type;
    c.moe.fused_experts = false;
    const RankLayer L = rank_weight_map(c, 1, 2).layers[1];
    const std::string moe = type == "mixtral" ? "model.layers.1.block_sparse_moe." : "model.layers.1.mlp.";
    const std::string gate = type == "mixtral" ? "w1" : "gate_proj", up = type == "mixtral" ? "w3" : "up_proj",
                      down = type == "mixtral" ? "w2" : "down_proj";
    INFO(type);
    REQUIRE(L.router.shards.size() == 1);
    CHECK(L.router.shards[0].name == moe + "gate.weight");
    CHECK(L.router.shards[0].shape == std::vector<int64_t>{E, H});
    CHECK(L.router.shards[0].rows == E);  // replicated
    REQUIRE(L.w_gate_up.shards.size() == 2 * E);
    REQUIRE(L.w_down.shards.size() == E);
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = moe + "experts." + std::to_string(e) + ".";
      const TensorShard &g = L.w_gate_up.shards[2 * e], &u = L.w_gate_up.shards[2 * e + 1], &d = L.w_down.shards[e];
      CHECK(g.name == x + gate + ".weight");
      CHECK(u.name == x + up + ".weight");
      CHECK(d.name == x + down + ".weight");
      CHECK((g.shape == std::vector<int64_t>{I, H} && g.row_begin == ir && g.rows == ir && g.cols == H));
      CHECK((u.row_begin == ir && u.rows == ir));
      CHECK((d.shape == std::vector<int64_t>{H, I} && d.col_begin == ir && d.cols == ir && d.rows == H));
    }
    CHECK(L.w_gate_up.numel() == E * 2 * ir * H);
    CHECK(L.w_down.numel() == E * H * ir);

    // transformers 5's fused experts: the same slices, as rows of [E * 2I][H] and [E * H][I].
    c.moe.fused_experts = true;
    const RankLayer F = rank_weight_map(c, 1, 2).layers[1];
    CHECK(F.router.shards[0].name == "model.layers.1.mlp.gate.weight");
    REQUIRE(F.w_gate_up.shards.size() == 2 * E);
    for (int64_t e = 0; e < E; ++e) {
      const TensorShard &g = F.w_gate_up.shards[2 * e], &u = F.w_gate_up.shards[2 * e + 1], &d = F.w_down.shards[e];
      CHECK(g.name == "model.layers.1.mlp.experts.gate_up_proj");
      CHECK(g.shape == std::vector<int64_t>{E, 2 * I, H});
      CHECK(g.row_begin == e * 2 * I + ir);
      CHECK(u.row_begin == e * 2 * I + I + ir);
      CHECK((g.rows == ir && u.rows == ir && g.cols == H));
      CHECK(d.name == "model.layers.1.mlp.experts.down_proj");
      CHECK(d.shape == std::vector<int64_t>{E, H, I});
      CHECK((d.row_begin == e * H && d.rows == H && d.col_begin == ir && d.cols == ir));
    }
  }
  // Dense models keep no router.
  CHECK(rank_weight_map(small_config(), 0, 1).layers[0].router.shards.empty());
  // The expert intermediate size must divide.
  c.intermediate_size = 30;
  CHECK_THAT(error_of(c, 0, 4), Catch::Contains("does not divide intermediate_size 30"));
}

TEST_CASE("weight map: a rank's shards of fused 3-D experts are each expert's rows and columns", "[loader][moe][tp]") {
  // mlp.experts.gate_up_proj [E=3][2I=8][H=2] and down_proj [E][H][I=4], every element its own flat index.
  const int64_t E = 3, I = 4, H = 2;
  const auto counting = [](int64_t n) {
    std::string bytes(static_cast<size_t>(n) * 4, '\0');
    for (int64_t i = 0; i < n; ++i) {
      const float v = static_cast<float>(i);
      std::memcpy(&bytes[static_cast<size_t>(i) * 4], &v, 4);
    }
    return bytes;
  };
  TempDir dir("paged_fused_experts_");
  write_safetensors(dir.path() / "model.safetensors",
                    {{"model.layers.0.mlp.experts.gate_up_proj", "F32", {E, 2 * I, H}, counting(E * 2 * I * H)},
                     {"model.layers.0.mlp.experts.down_proj", "F32", {E, H, I}, counting(E * H * I)}});
  const SafeTensors w(dir.path().string());
  ModelConfig c{.model_type = "qwen3_moe", .hidden_size = int(H), .num_layers = 1, .num_heads = 2,
                .num_kv_heads = 2, .head_dim = 2, .intermediate_size = int(I), .vocab_size = 4};
  c.moe = {.num_experts = int(E), .top_k = 2};
  c = with_expert_layout(c, w);
  REQUIRE(c.moe.fused_experts);
  // Rank 1 of 2 keeps intermediate columns 2..3 of every expert: gate rows e*8 + 2..3, up rows e*8 + 6..7.
  const RankLayer L = rank_weight_map(c, 1, 2).layers[0];
  std::vector<float> gate_up;
  for (const TensorShard& s : L.w_gate_up.shards) {
    const std::vector<float> part = read_shard_f32(w, s);
    gate_up.insert(gate_up.end(), part.begin(), part.end());
  }
  std::vector<float> want;
  for (int64_t e = 0; e < E; ++e)
    for (const int64_t row : {e * 8 + 2, e * 8 + 3, e * 8 + 6, e * 8 + 7})
      for (int64_t h = 0; h < H; ++h) want.push_back(static_cast<float>(row * H + h));
  CHECK(gate_up == want);
  // down_proj: expert e's rows e*2 .. e*2+1, columns 2..3.
  want.clear();
  std::vector<float> down;
  for (const TensorShard& s : L.w_down.shards) {
    const std::vector<float> part = read_shard_f32(w, s);
    down.insert(down.end(), part.begin(), part.end());
  }
  for (int64_t e = 0; e < E; ++e)
    for (int64_t h = 0; h < H; ++h)
      for (const int64_t i : {2, 3}) want.push_back(static_cast<float>((e * H + h) * I + i));
  CHECK(down == want);
  // A per-expert checkpoint (no fused tensor) keeps the per-expert layout.
  CHECK_FALSE(with_expert_layout(c, SafeTensors(kModel)).moe.fused_experts);
}
