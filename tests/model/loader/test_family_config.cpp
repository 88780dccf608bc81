// Config fields of the Qwen3, sliding-window (Mistral, Qwen2, Qwen3, Phi-3), Phi-3 LongRoPE and Gemma 3 families,
// written as transformers 5 writes them (rope_parameters, dtype, layer_types), and the one clear line for what is
// unsupported.
#include <catch2/catch.hpp>

#include <boost/json.hpp>
#include <cmath>
#include <fstream>

#include "model/loader/config.h"
#include "model/kv/kv_groups.h"
#include "tests/test_data.h"

using namespace paged;
using namespace paged::test;
namespace json = boost::json;

namespace {

// A small config of `model_type` with the fields every family has; `edit` adds or changes the rest.
json::object base_config(const std::string& model_type) {
  const std::string arch = model_type == "qwen3"         ? "Qwen3ForCausalLM"
                           : model_type == "qwen2"       ? "Qwen2ForCausalLM"
                           : model_type == "phi3"        ? "Phi3ForCausalLM"
                           : model_type == "gemma3_text" ? "Gemma3ForCausalLM"
                           : model_type == "mixtral"     ? "MixtralForCausalLM"
                           : model_type == "qwen3_moe"   ? "Qwen3MoeForCausalLM"
                                                         : "MistralForCausalLM";
  return json::object{{"model_type", model_type}, {"architectures", json::array{arch}}, {"hidden_size", 64},
                      {"num_hidden_layers", 4}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
                      {"intermediate_size", 128}, {"vocab_size", 512}, {"max_position_embeddings", 256},
                      {"rms_norm_eps", 1e-6}, {"hidden_act", "silu"}};
}

// The config loaded from a folder holding `config` as config.json.
ModelConfig load(const json::object& config) {
  TempDir dir("paged_family_");
  std::ofstream(dir.path() / "config.json") << json::serialize(config);
  return load_model_config(dir.path().string());
}

// The ModelError's message of loading `config` (the test fails when it loads).
std::string error_of(const json::object& config) {
  try {
    load(config);
  } catch (const ModelError& e) {
    return e.what();
  }
  FAIL("the config was accepted: " << json::serialize(config));
  return {};
}

}  // namespace

TEST_CASE("family config: Qwen3 as transformers 5 writes it", "[loader][families]") {
  json::object c = base_config("qwen3");
  c["head_dim"] = 32;  // not hidden / heads (16)
  c["dtype"] = "bfloat16";
  c["rope_parameters"] = json::object{{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  c["use_sliding_window"] = false;
  c["sliding_window"] = nullptr;
  c["max_window_layers"] = 28;
  c["layer_types"] = json::array{"full_attention", "full_attention", "full_attention", "full_attention"};
  c["attention_bias"] = false;
  c["tie_word_embeddings"] = true;
  const ModelConfig m = load(c);
  CHECK(m.model_type == "qwen3");
  CHECK(m.qk_norm);
  CHECK(m.head_dim == 32);
  CHECK(m.rotary_dim == 32);
  CHECK(m.rope_theta == 1000000.0);
  CHECK(m.torch_dtype == "bfloat16");
  CHECK_FALSE(m.qkv_bias);
  CHECK_FALSE(m.o_bias);
  CHECK(m.tie_word_embeddings);
  CHECK_FALSE(m.has_sliding_window());
  CHECK(m.sliding_windows == std::vector<int>(4, 0));
  // attention_bias = true gives q/k/v and o_proj their biases.
  c["attention_bias"] = true;
  const ModelConfig biased = load(c);
  CHECK(biased.qkv_bias);
  CHECK(biased.o_bias);
}

TEST_CASE("family config: which layers slide, and by how much", "[loader][families]") {
  SECTION("Mistral: every layer (unless layer_types says otherwise) if the window is shorter than the context") {
    json::object c = base_config("mistral");
    c["sliding_window"] = 32;
    CHECK(load(c).sliding_windows == std::vector<int>(4, 32));
    CHECK(kv_groups_of(load(c)).windows == std::vector<int>{32});  // every layer slides: one group, released
    c["layer_types"] = json::array{"full_attention", "sliding_attention", "full_attention", "sliding_attention"};
    CHECK(load(c).sliding_windows == std::vector<int>{0, 32, 0, 32});  // where layer_types is written, it decides
    CHECK(kv_groups_of(load(c)).windows == std::vector<int>{0, 32});  // a group of the full layers, one of the sliding
    c.erase("layer_types");
    c["sliding_window"] = 256;
    CHECK_FALSE(load(c).has_sliding_window());
    CHECK(kv_groups_of(load(c)).windows == std::vector<int>{0});
    c["sliding_window"] = nullptr;
    CHECK_FALSE(load(c).has_sliding_window());
  }
  SECTION("Qwen2: from max_window_layers on, only with use_sliding_window") {
    json::object c = base_config("qwen2");
    c["sliding_window"] = 32;
    c["max_window_layers"] = 2;
    CHECK_FALSE(load(c).has_sliding_window());
    c["use_sliding_window"] = true;
    CHECK(load(c).sliding_windows == std::vector<int>{0, 0, 32, 32});
  }
  SECTION("Qwen3: layer_types decides, the window from sliding_window") {
    json::object c = base_config("qwen3");
    c["use_sliding_window"] = true;
    c["sliding_window"] = 48;
    c["max_window_layers"] = 3;  // layer_types takes precedence
    c["layer_types"] = json::array{"sliding_attention", "full_attention", "sliding_attention", "full_attention"};
    CHECK(load(c).sliding_windows == std::vector<int>{48, 0, 48, 0});
    c["use_sliding_window"] = false;  // transformers drops sliding_window then: no layer slides
    CHECK_FALSE(load(c).has_sliding_window());
  }
  SECTION("Phi-3: every layer") {
    json::object c = base_config("phi3");
    c["sliding_window"] = 40;
    CHECK(load(c).sliding_windows == std::vector<int>(4, 40));
    CHECK(kv_groups_of(load(c)).windows == std::vector<int>{40});
  }
  SECTION("what is not supported is named") {
    json::object c = base_config("qwen3");
    c["use_sliding_window"] = true;
    c["sliding_window"] = 32;
    c["layer_types"] = json::array{"sliding_attention", "chunked_attention", "full_attention", "full_attention"};
    CHECK_THAT(error_of(c), Catch::Contains("layer_types") && Catch::Contains("chunked_attention"));
    c["layer_types"] = json::array{"sliding_attention"};
    CHECK_THAT(error_of(c), Catch::Contains("layer_types") && Catch::Contains("one type per layer"));
    json::object m = base_config("mistral");
    m["sliding_window"] = 0;
    CHECK_THAT(error_of(m), Catch::Contains("sliding_window") && Catch::Contains("positive integer"));
  }
}

TEST_CASE("family config: Phi-3 LongRoPE and partial rotary", "[loader][families]") {
  json::object c = base_config("phi3");  // head_dim 16
  c["original_max_position_embeddings"] = 64;
  const std::vector<double> short_factor{1.0, 1.3, 2.1, 3.7}, long_factor{1.2, 2.5, 6.0, 11.0};
  c["rope_parameters"] = json::object{{"rope_type", "longrope"}, {"rope_theta", 10000.0},
                                      {"partial_rotary_factor", 0.5},
                                      {"short_factor", json::value_from(short_factor)},
                                      {"long_factor", json::value_from(long_factor)}};
  const ModelConfig m = load(c);
  CHECK(m.rotary_dim == 8);
  CHECK(m.rope_scaling.longrope);
  CHECK(m.rope_scaling.original_max_position_embeddings == 64);
  // factor = max_position_embeddings / original = 4; attention factor sqrt(1 + ln 4 / ln 64) as in the paper.
  CHECK(m.rope_scaling.attention_factor == Approx(std::sqrt(1.0 + std::log(4.0) / std::log(64.0))));
  // inv_freq[i] = 1 / (factor_i * theta^(2i / rotary_dim)): short factors within 64 positions, long beyond.
  for (const auto& [max_model_len, factors] : {std::pair{64, short_factor}, std::pair{256, long_factor},
                                               std::pair{0, long_factor}}) {
    const std::vector<float> f = m.rope_inv_freq(max_model_len);
    REQUIRE(f.size() == 4);
    for (int i = 0; i < 4; ++i) {
      INFO("max_model_len " << max_model_len << " index " << i);
      CHECK(f[i] == Approx(1.0 / (factors[i] * std::pow(10000.0, 2.0 * i / 8))).epsilon(1e-6));
    }
  }
  SECTION("an explicit attention_factor and factor win") {
    c["rope_parameters"].as_object()["attention_factor"] = 1.5;
    CHECK(load(c).rope_scaling.attention_factor == 1.5);
    c["rope_parameters"].as_object().erase("attention_factor");
    c["rope_parameters"].as_object()["factor"] = 1.0;
    CHECK(load(c).rope_scaling.attention_factor == 1.0);
  }
  SECTION("the old rope_scaling key with type 'su'") {
    c.erase("rope_parameters");
    c["rope_scaling"] = json::object{{"type", "su"}, {"short_factor", json::value_from(short_factor)},
                                     {"long_factor", json::value_from(long_factor)}};
    c["partial_rotary_factor"] = 0.5;
    CHECK(load(c).rope_scaling.longrope);
  }
  SECTION("factor lists of the wrong length and bad partial_rotary_factor are named") {
    c["rope_parameters"].as_object()["short_factor"] = json::array{1.0, 2.0};
    CHECK_THAT(error_of(c), Catch::Contains("short_factor") && Catch::Contains("rotary_dim / 2 = 4"));
    c["rope_parameters"].as_object()["short_factor"] = json::value_from(short_factor);
    c["rope_parameters"].as_object()["partial_rotary_factor"] = 0.0;
    CHECK_THAT(error_of(c), Catch::Contains("partial_rotary_factor"));
  }
}

TEST_CASE("family config: unsupported families and fields fail with one line naming them", "[loader][families]") {
  json::object c = base_config("qwen3");
  c["model_type"] = "gemma2";
  CHECK_THAT(error_of(c), Catch::Contains("model_type 'gemma2'") && Catch::Contains("qwen3, phi3, gemma3_text"));
  c = base_config("qwen3");
  c["architectures"] = json::array{"Qwen3NextForCausalLM"};
  CHECK_THAT(error_of(c), Catch::Contains("architectures") && Catch::Contains("Qwen3NextForCausalLM"));
  c = base_config("qwen3");
  c["rope_parameters"] = json::object{{"full_attention", json::object{{"rope_type", "default"}}},
                                      {"sliding_attention", json::object{{"rope_type", "default"}}}};
  CHECK_THAT(error_of(c), Catch::Contains("rope_parameters") && Catch::Contains("per layer type"));
  c = base_config("phi3");
  c["rope_parameters"] = json::object{{"rope_type", "yarn"}, {"factor", 4.0}};
  CHECK_THAT(error_of(c), Catch::Contains("rope_scaling type 'yarn'"));
  CHECK(error_of(c).find('\n') == std::string::npos);
}

TEST_CASE("family config: Mixtral and Qwen3-MoE experts as transformers 5 writes them", "[loader][families][moe]") {
  json::object mixtral = base_config("mixtral");
  mixtral["num_local_experts"] = 8;
  mixtral["num_experts_per_tok"] = 2;
  mixtral["sliding_window"] = nullptr;
  mixtral["router_aux_loss_coef"] = 0.02;
  const ModelConfig m = load(mixtral);
  CHECK(m.is_moe());
  CHECK(m.moe.num_experts == 8);
  CHECK(m.moe.top_k == 2);
  CHECK(m.moe.renormalize);
  CHECK_FALSE(m.moe.fused_experts);
  CHECK(m.intermediate_size == 128);  // Mixtral's intermediate_size is the expert's
  CHECK_FALSE(m.qk_norm);
  CHECK_FALSE(m.has_sliding_window());
  mixtral["sliding_window"] = 32;  // as Mistral: every layer
  CHECK(load(mixtral).sliding_windows == std::vector<int>(4, 32));

  json::object qwen = base_config("qwen3_moe");
  qwen["head_dim"] = 32;
  qwen["num_experts"] = 16;
  qwen["num_experts_per_tok"] = 4;
  qwen["moe_intermediate_size"] = 48;
  qwen["norm_topk_prob"] = true;
  qwen["decoder_sparse_step"] = 1;
  qwen["mlp_only_layers"] = json::array{};
  qwen["use_sliding_window"] = false;
  qwen["sliding_window"] = 4096;
  const ModelConfig q = load(qwen);
  CHECK(q.moe.num_experts == 16);
  CHECK(q.moe.top_k == 4);
  CHECK(q.moe.renormalize);
  CHECK(q.intermediate_size == 48);  // moe_intermediate_size, not the dense intermediate_size
  CHECK(q.qk_norm);
  CHECK(q.head_dim == 32);
  CHECK_FALSE(q.has_sliding_window());  // use_sliding_window false
  qwen["norm_topk_prob"] = false;
  CHECK_FALSE(load(qwen).moe.renormalize);
  qwen.erase("norm_topk_prob");  // transformers' default
  CHECK_FALSE(load(qwen).moe.renormalize);
  // transformers 5 writes Qwen3-MoE's expert count as num_local_experts, the Hub's configs as num_experts.
  qwen.erase("num_experts");
  qwen["num_local_experts"] = 32;
  CHECK(load(qwen).moe.num_experts == 32);
  // Dense models have no experts.
  CHECK_FALSE(load(base_config("qwen3")).is_moe());
}

TEST_CASE("family config: experts outside what is supported fail naming the field", "[loader][families][moe]") {
  json::object qwen = base_config("qwen3_moe");
  qwen["num_experts"] = 8;
  qwen["num_experts_per_tok"] = 2;
  qwen["moe_intermediate_size"] = 32;
  SECTION("dense layers among sparse ones") {
    qwen["mlp_only_layers"] = json::array{0, 3};
    CHECK_THAT(error_of(qwen), Catch::Contains("'mlp_only_layers'"));
    qwen["mlp_only_layers"] = json::array{};
    qwen["decoder_sparse_step"] = 2;
    CHECK_THAT(error_of(qwen), Catch::Contains("'decoder_sparse_step'"));
  }
  SECTION("missing or inconsistent counts") {
    qwen["num_experts_per_tok"] = 9;
    CHECK_THAT(error_of(qwen), Catch::Contains("'num_experts_per_tok'"));
    qwen.erase("num_experts_per_tok");
    CHECK_THAT(error_of(qwen), Catch::Contains("missing required field 'num_experts_per_tok'"));
    json::object mixtral = base_config("mixtral");
    mixtral["num_experts_per_tok"] = 2;
    CHECK_THAT(error_of(mixtral), Catch::Contains("'num_local_experts'"));
    qwen["num_experts_per_tok"] = 2;
    qwen.erase("moe_intermediate_size");
    CHECK_THAT(error_of(qwen), Catch::Contains("'moe_intermediate_size'"));
  }
}

namespace {

// Gemma 3 text as transformers 5 writes it: rope_parameters per layer type, layer_types, no hidden_act.
json::object gemma3_config() {
  json::object c = base_config("gemma3_text");
  c.erase("hidden_act");
  c["num_hidden_layers"] = 6;
  c["head_dim"] = 32;
  c["hidden_activation"] = "gelu_pytorch_tanh";
  c["query_pre_attn_scalar"] = 24;
  c["sliding_window"] = 16;
  c["attn_logit_softcapping"] = nullptr;
  c["final_logit_softcapping"] = nullptr;
  c["use_bidirectional_attention"] = false;
  c["layer_types"] = json::array{"sliding_attention", "sliding_attention", "sliding_attention",
                                 "sliding_attention", "sliding_attention", "full_attention"};
  c["rope_parameters"] = json::object{
      {"full_attention", json::object{{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1000000.0}}},
      {"sliding_attention", json::object{{"rope_type", "default"}, {"rope_theta", 10000.0}}}};
  return c;
}

}  // namespace

TEST_CASE("family config: Gemma 3 text as transformers 5 writes it", "[loader][families][gemma]") {
  const ModelConfig m = load(gemma3_config());
  CHECK(m.model_type == "gemma3_text");
  CHECK(m.activation == Activation::gelu_tanh);
  CHECK(m.norm_plus_one);
  CHECK(m.sandwich_norms);
  CHECK(m.qk_norm);
  CHECK(m.tie_word_embeddings);  // Gemma 3's default
  CHECK_FALSE(m.qkv_bias);
  CHECK(m.embedding_scale == Approx(8.0));  // sqrt(64)
  CHECK(m.attention_scale() == Approx(1.0 / std::sqrt(24.0)));  // query_pre_attn_scalar, not head_dim 32
  CHECK(m.final_logit_softcap == 0.0);
  CHECK(m.sliding_windows == std::vector<int>{16, 16, 16, 16, 16, 0});
  CHECK(m.local_rope_layers == std::vector<bool>{true, true, true, true, true, false});
  CHECK(m.uses_local_rope(0));
  CHECK_FALSE(m.uses_local_rope(5));
  // Full layers: base 10^6 with linear scaling (every frequency / 8); sliding layers: base 10^4, unscaled.
  CHECK(m.rope_scaling.linear);
  const std::vector<float> full = m.rope_inv_freq(), local = m.local_rope_inv_freq();
  REQUIRE(full.size() == 16);
  REQUIRE(local.size() == 16);
  for (int i = 0; i < 16; ++i) {
    INFO("index " << i);
    CHECK(full[i] == Approx(1.0 / (8.0 * std::pow(1e6, 2.0 * i / 32))).epsilon(1e-6));
    CHECK(local[i] == Approx(1.0 / std::pow(1e4, 2.0 * i / 32)).epsilon(1e-6));
  }
  SECTION("the final logits' soft-cap where the config sets it") {
    json::object c = gemma3_config();
    c["final_logit_softcapping"] = 30.0;
    CHECK(load(c).final_logit_softcap == 30.0);
  }
  SECTION("as transformers 4 wrote it: rope_theta, rope_local_base_freq, sliding_window_pattern") {
    json::object c = gemma3_config();
    c.erase("rope_parameters");
    c.erase("layer_types");
    c.erase("query_pre_attn_scalar");
    c["rope_theta"] = 500000.0;
    c["rope_local_base_freq"] = 20000.0;
    c["sliding_window_pattern"] = 3;
    c["rope_scaling"] = nullptr;
    const ModelConfig old = load(c);
    CHECK(old.rope_theta == 500000.0);
    CHECK(old.local_rope_theta == 20000.0);
    CHECK_FALSE(old.rope_scaling.linear);
    CHECK(old.sliding_windows == std::vector<int>{16, 16, 0, 16, 16, 0});
    CHECK(old.attention_scale() == Approx(1.0 / 16.0));  // query_pre_attn_scalar's default, 256
  }
}

TEST_CASE("family config: what Gemma 3 does not support is named", "[loader][families][gemma]") {
  json::object c = gemma3_config();
  c["hidden_activation"] = "gelu";
  CHECK_THAT(error_of(c), Catch::Contains("hidden_activation"));
  c = gemma3_config();
  c["use_bidirectional_attention"] = true;
  CHECK_THAT(error_of(c), Catch::Contains("use_bidirectional_attention"));
  c = gemma3_config();
  c["rope_parameters"].as_object()["sliding_attention"].as_object()["rope_type"] = "linear";
  CHECK_THAT(error_of(c), Catch::Contains("sliding_attention") && Catch::Contains("rope_type"));
  c = gemma3_config();
  c["rope_parameters"].as_object()["full_attention"] = json::object{{"rope_type", "yarn"}, {"factor", 8.0}};
  CHECK_THAT(error_of(c), Catch::Contains("rope_scaling type 'yarn'"));
  c = gemma3_config();
  c["final_logit_softcapping"] = -1.0;
  CHECK_THAT(error_of(c), Catch::Contains("final_logit_softcapping"));
  c = gemma3_config();
  c["attn_logit_softcapping"] = 50.0;  // Gemma 2's value
  CHECK_THAT(error_of(c), Catch::Contains("attn_logit_softcapping"));
}

TEST_CASE("family config: linear RoPE scaling divides every frequency by its factor", "[loader][families]") {
  json::object c = base_config("mistral");  // head_dim 16
  c["rope_parameters"] = json::object{{"rope_type", "linear"}, {"factor", 4.0}, {"rope_theta", 10000.0}};
  const std::vector<float> f = load(c).rope_inv_freq();
  REQUIRE(f.size() == 8);
  for (int i = 0; i < 8; ++i) CHECK(f[i] == Approx(1.0 / (4.0 * std::pow(10000.0, 2.0 * i / 16))).epsilon(1e-6));
  c["rope_parameters"].as_object()["factor"] = 0.5;
  CHECK_THAT(error_of(c), Catch::Contains("factor"));
}
