#include "model/loader/config.h"

#include <algorithm>
#include <boost/json.hpp>
#include <cmath>
#include <filesystem>
#include <numbers>

#include "model/json_file.h"
#include "model/loader/fp8_checkpoint.h"

namespace paged {
namespace json = boost::json;
namespace fs = std::filesystem;

namespace {

const json::value* find(const json::object& o, std::string_view key) {
  auto it = o.find(key);
  return it == o.end() || it->value().is_null() ? nullptr : &it->value();
}

double number(const json::value& v, std::string_view field) {
  if (v.is_int64()) return static_cast<double>(v.as_int64());
  if (v.is_uint64()) return static_cast<double>(v.as_uint64());
  if (v.is_double()) return v.as_double();
  throw ModelError("config.json: field '" + std::string(field) + "' must be a number");
}

// The positive integer `v` names (a field of config.json), or a ModelError naming it.
int positive_int_value(const json::value& v, std::string_view field) {
  double d = number(v, field);
  if (d < 1 || d != std::floor(d) || d > 1e9)
    throw ModelError("config.json: field '" + std::string(field) + "' must be a positive integer");
  return static_cast<int>(d);
}

int positive_int(const json::object& o, std::string_view field) {
  const json::value* v = find(o, field);
  if (!v) throw ModelError("config.json: missing required field '" + std::string(field) + "'");
  return positive_int_value(*v, field);
}

bool boolean(const json::object& o, std::string_view field, bool fallback) {
  const json::value* v = find(o, field);
  if (!v) return fallback;
  if (!v->is_bool()) throw ModelError("config.json: field '" + std::string(field) + "' must be a boolean");
  return v->as_bool();
}

// eos_token_id may be an int or a list of ints.
void add_token_ids(const json::value* v, std::vector<TokenId>& out, std::string_view field) {
  if (!v) return;
  auto add = [&](const json::value& x) {
    if (!x.is_int64() && !x.is_uint64()) throw ModelError("field '" + std::string(field) + "' must hold integers");
    TokenId id = static_cast<TokenId>(x.to_number<int64_t>());
    if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  };
  if (v->is_array()) {
    for (const auto& x : v->as_array()) add(x);
  } else {
    add(*v);
  }
}

// c.sliding_windows from sliding_window, layer_types and, for Qwen2 / Qwen3, use_sliding_window and
// max_window_layers, as transformers reads them: the layers layer_types calls "sliding_attention" slide when it is
// there; else Mistral and Phi-3 slide on every layer when sliding_window is set, Qwen only with use_sliding_window,
// from max_window_layers on, Gemma 3 on every layer but each sliding_window_pattern-th (default 6); Llama never. A
// window at least max_position_embeddings long is no window. Gemma 3's sliding layers (whatever their window) take
// its local RoPE: c.local_rope_layers.
void read_sliding_windows(const json::object& o, bool qwen, ModelConfig& c) {
  if (c.model_type == "llama") {
    c.sliding_windows.assign(c.num_layers, 0);
    return;
  }
  c.sliding_windows.assign(c.num_layers, 0);
  const json::value* sw = find(o, "sliding_window");
  if (qwen && !boolean(o, "use_sliding_window", false)) sw = nullptr;
  const int window = sw ? positive_int_value(*sw, "sliding_window") : 0;
  const json::value* types = find(o, "layer_types");
  std::vector<bool> sliding(c.num_layers, !qwen);
  if (types) {
    if (!types->is_array() || types->as_array().size() != static_cast<size_t>(c.num_layers))
      throw ModelError("config.json: field 'layer_types' must list one type per layer");
    for (int l = 0; l < c.num_layers; ++l) {
      const json::value& t = types->as_array()[l];
      const std::string name = t.is_string() ? std::string(t.as_string()) : "";
      if (name != "full_attention" && name != "sliding_attention")
        throw ModelError("config.json: unsupported layer_types entry '" + name +
                         "' (supported: full_attention, sliding_attention)");
      sliding[l] = name == "sliding_attention";
    }
  } else if (qwen) {
    const json::value* first = find(o, "max_window_layers");
    const int from = first ? static_cast<int>(number(*first, "max_window_layers")) : 0;
    for (int l = 0; l < c.num_layers; ++l) sliding[l] = l >= from;
  } else if (c.model_type == "gemma3_text") {
    const json::value* p = find(o, "sliding_window_pattern");
    const int pattern = p ? positive_int_value(*p, "sliding_window_pattern") : 6;
    for (int l = 0; l < c.num_layers; ++l) sliding[l] = (l + 1) % pattern != 0;
  }
  if (c.model_type == "gemma3_text") c.local_rope_layers = sliding;
  if (window == 0 || window >= c.max_position_embeddings) return;
  for (int l = 0; l < c.num_layers; ++l)
    if (sliding[l]) c.sliding_windows[l] = window;
}

// LongRoPE (Phi-3) from the rope scaling object `r`, as transformers' _compute_longrope_parameters reads it:
// short_factor and long_factor of rotary_dim / 2 each; original_max_position_embeddings at the top level first (Phi-3
// keeps it there), then in `r`; factor from `r`, else max_position_embeddings / original; attention_factor from `r`,
// else sqrt(1 + ln(factor) / ln(original)) when factor > 1.
void read_longrope(const json::object& o, const json::object& r, ModelConfig& c) {
  RopeScaling& s = c.rope_scaling;
  s.longrope = true;
  auto factors = [&](std::string_view key, std::vector<double>& out) {
    const json::value* v = find(r, key);
    if (!v || !v->is_array() || v->as_array().size() != static_cast<size_t>(c.rotary_dim / 2))
      throw ModelError("config.json: rope_scaling '" + std::string(key) + "' must list rotary_dim / 2 = " +
                       std::to_string(c.rotary_dim / 2) + " numbers");
    for (const auto& x : v->as_array()) {
      out.push_back(number(x, key));
      if (!(out.back() > 0.0)) throw ModelError("config.json: rope_scaling '" + std::string(key) + "' must be > 0");
    }
  };
  factors("short_factor", s.short_factor);
  factors("long_factor", s.long_factor);
  const json::value* orig = find(o, "original_max_position_embeddings");
  if (!orig) orig = find(r, "original_max_position_embeddings");
  s.original_max_position_embeddings =
      orig ? positive_int_value(*orig, "original_max_position_embeddings") : c.max_position_embeddings;
  const double original = s.original_max_position_embeddings;
  const json::value* f = find(r, "factor");
  s.factor = f ? number(*f, "rope_scaling.factor") : c.max_position_embeddings / original;
  if (const json::value* a = find(r, "attention_factor")) {
    s.attention_factor = number(*a, "rope_scaling.attention_factor");
    if (!(s.attention_factor > 0.0)) throw ModelError("config.json: rope_scaling 'attention_factor' must be > 0");
  } else {
    s.attention_factor = s.factor <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(s.factor) / std::log(original));
  }
}

// A positive number of config.json, or `fallback` when the field is absent or null.
double positive_number(const json::object& o, std::string_view field, double fallback) {
  const json::value* v = find(o, field);
  if (!v) return fallback;
  const double d = number(*v, field);
  if (!(d > 0.0)) throw ModelError("config.json: field '" + std::string(field) + "' must be > 0");
  return d;
}

// Gemma 3 text's own fields, as transformers 4 and 5 write them: GeGLU with gelu_pytorch_tanh, (1 + weight) norms,
// four per layer, q/k norms, embeddings times sqrt(hidden_size), query_pre_attn_scalar (default 256), the final
// logits' soft-cap (null: none) and the sliding layers' RoPE base: rope_parameters.sliding_attention (of the default
// type only), else rope_local_base_freq, else 10^4. Bidirectional attention is refused, and so is a set
// attn_logit_softcapping (Gemma 2's; null in Gemma 3's checkpoints): the attention kernels do not cap scores, and
// transformers 5.17 itself applies the cap in its eager attention and drops it in SDPA, so no one model is meant.
void read_gemma3(const json::object& o, const json::object* sliding_rope, ModelConfig& c) {
  const json::value* act = find(o, "hidden_activation");
  if (!act) act = find(o, "hidden_act");
  if (act && (!act->is_string() || act->as_string() != "gelu_pytorch_tanh"))
    throw ModelError("config.json: unsupported 'hidden_activation' (Gemma 3: only gelu_pytorch_tanh)");
  if (boolean(o, "use_bidirectional_attention", false))
    throw ModelError("config.json: unsupported field 'use_bidirectional_attention' = true");
  c.activation = Activation::gelu_tanh;
  c.norm_plus_one = true;
  c.sandwich_norms = true;
  c.qk_norm = true;
  c.embedding_scale = std::sqrt(static_cast<double>(c.hidden_size));
  c.query_pre_attn_scalar = positive_number(o, "query_pre_attn_scalar", 256.0);
  c.final_logit_softcap = positive_number(o, "final_logit_softcapping", 0.0);
  if (const json::value* cap = find(o, "attn_logit_softcapping"); cap && !cap->is_null())
    throw ModelError("config.json: unsupported field 'attn_logit_softcapping' (attention scores are not soft-capped; "
                     "Gemma 3 checkpoints leave it null)");
  c.local_rope_theta = positive_number(o, "rope_local_base_freq", 10000.0);
  if (sliding_rope) {
    const json::value* t = find(*sliding_rope, "rope_type");
    if (t && (!t->is_string() || t->as_string() != "default"))
      throw ModelError("config.json: unsupported rope_parameters.sliding_attention rope_type (only default)");
    c.local_rope_theta = positive_number(*sliding_rope, "rope_theta", c.local_rope_theta);
  }
}

// The experts of Mixtral (num_local_experts, num_experts_per_tok; intermediate_size is the expert's) and Qwen3-MoE
// (num_experts on the Hub, num_local_experts as transformers 5 writes it; num_experts_per_tok, moe_intermediate_size,
// norm_topk_prob), as transformers reads them. Qwen3-MoE's dense layers among sparse ones (decoder_sparse_step > 1,
// mlp_only_layers) are refused.
void read_experts(const json::object& o, ModelConfig& c) {
  MoeConfig& m = c.moe;
  const bool local = c.model_type == "mixtral" || find(o, "num_local_experts");
  m.num_experts = positive_int(o, local ? "num_local_experts" : "num_experts");
  if (c.model_type == "qwen3_moe") {
    c.intermediate_size = positive_int(o, "moe_intermediate_size");
    m.renormalize = boolean(o, "norm_topk_prob", false);
    const json::value* step = find(o, "decoder_sparse_step");
    if (step && positive_int_value(*step, "decoder_sparse_step") != 1)
      throw ModelError("config.json: unsupported field 'decoder_sparse_step' != 1 (dense layers between sparse ones)");
    if (const json::value* dense = find(o, "mlp_only_layers");
        dense && (!dense->is_array() || !dense->as_array().empty()))
      throw ModelError("config.json: unsupported field 'mlp_only_layers' (dense layers between sparse ones)");
  }
  m.top_k = positive_int(o, "num_experts_per_tok");
  if (m.top_k > m.num_experts)
    throw ModelError("config.json: field 'num_experts_per_tok' exceeds the number of experts");
}

}  // namespace

ModelConfig load_model_config(const std::string& model_dir) {
  fs::path dir(model_dir);
  if (!fs::is_directory(dir)) throw ModelError("model directory not found: " + model_dir);
  json::object o = read_json_object<ModelError>(dir / "config.json");
  ModelConfig c;

  const json::value* type = find(o, "model_type");
  if (!type || !type->is_string()) throw ModelError("config.json: missing field 'model_type'");
  c.model_type = std::string(type->as_string());
  const std::vector<std::pair<std::string, std::string>> kFamilies = {
      {"llama", "LlamaForCausalLM"}, {"mistral", "MistralForCausalLM"}, {"qwen2", "Qwen2ForCausalLM"},
      {"qwen3", "Qwen3ForCausalLM"}, {"phi3", "Phi3ForCausalLM"}, {"gemma3_text", "Gemma3ForCausalLM"},
      {"mixtral", "MixtralForCausalLM"}, {"qwen3_moe", "Qwen3MoeForCausalLM"}};
  if (std::none_of(kFamilies.begin(), kFamilies.end(), [&](const auto& f) { return f.first == c.model_type; }))
    throw ModelError("config.json: unsupported model_type '" + c.model_type +
                     "' (supported: llama, mistral, qwen2, qwen3, phi3, gemma3_text, mixtral, qwen3_moe)");
  if (const json::value* archs = find(o, "architectures"); archs && archs->is_array()) {
    for (const auto& a : archs->as_array()) {
      std::string name = a.is_string() ? std::string(a.as_string()) : "";
      if (std::none_of(kFamilies.begin(), kFamilies.end(), [&](const auto& f) { return f.second == name; }))
        throw ModelError("config.json: unsupported architectures entry '" + name + "'");
    }
  }
  const bool qwen3 = c.model_type == "qwen3" || c.model_type == "qwen3_moe";
  const bool qwen = c.model_type == "qwen2" || qwen3;
  const bool gemma3 = c.model_type == "gemma3_text";

  c.hidden_size = positive_int(o, "hidden_size");
  c.num_layers = positive_int(o, "num_hidden_layers");
  c.num_heads = positive_int(o, "num_attention_heads");
  c.num_kv_heads = find(o, "num_key_value_heads") ? positive_int(o, "num_key_value_heads") : c.num_heads;
  c.intermediate_size = positive_int(o, "intermediate_size");
  c.vocab_size = positive_int(o, "vocab_size");
  c.max_position_embeddings = positive_int(o, "max_position_embeddings");
  c.head_dim = find(o, "head_dim") ? positive_int(o, "head_dim") : c.hidden_size / c.num_heads;
  if (!find(o, "head_dim") && c.hidden_size % c.num_heads != 0)
    throw ModelError("config.json: hidden_size is not a multiple of num_attention_heads");
  if (c.num_heads % c.num_kv_heads != 0)
    throw ModelError("config.json: num_attention_heads must be a multiple of num_key_value_heads");
  if (c.head_dim % 2 != 0) throw ModelError("config.json: head_dim must be even (RoPE)");

  // transformers >= 5 writes rope_theta, partial_rotary_factor and the scaling into one "rope_parameters" object.
  const json::value* rope_params = find(o, "rope_parameters");
  if (rope_params && !rope_params->is_object()) throw ModelError("config.json: field 'rope_parameters' must be an object");
  // Per layer type (Gemma 3): the full layers' RoPE is read as every model's, the sliding layers' by read_gemma3.
  const json::object* sliding_rope = nullptr;
  if (rope_params && (rope_params->as_object().contains("full_attention") ||
                      rope_params->as_object().contains("sliding_attention"))) {
    if (!gemma3)
      throw ModelError("config.json: unsupported field 'rope_parameters' per layer type (one RoPE for all layers "
                       "only)");
    const json::object& per_type = rope_params->as_object();
    for (const char* key : {"full_attention", "sliding_attention"})
      if (const json::value* v = find(per_type, key); v && !v->is_object())
        throw ModelError("config.json: field 'rope_parameters." + std::string(key) + "' must be an object");
    if (const json::value* v = find(per_type, "sliding_attention")) sliding_rope = &v->as_object();
    rope_params = find(per_type, "full_attention");
  }
  if (gemma3) c.rope_theta = 1000000.0;  // transformers' default for Gemma 3's full layers
  // A RoPE field: at the top level (older configs) or in rope_parameters.
  auto rope_field = [&](std::string_view key) -> const json::value* {
    if (const json::value* v = find(o, key)) return v;
    return rope_params ? find(rope_params->as_object(), key) : nullptr;
  };
  if (const json::value* v = rope_field("rope_theta")) c.rope_theta = number(*v, "rope_theta");
  c.rotary_dim = c.head_dim;
  if (const json::value* v = rope_field("partial_rotary_factor")) {
    const double f = number(*v, "partial_rotary_factor");
    const int dim = static_cast<int>(c.head_dim * f);
    if (!(f > 0.0 && f <= 1.0) || dim < 2 || dim % 2 != 0)
      throw ModelError("config.json: field 'partial_rotary_factor' must be in (0, 1] and leave an even rotary "
                       "dimension of head_dim");
    c.rotary_dim = dim;
  }
  if (const json::value* v = find(o, "rms_norm_eps")) c.rms_norm_eps = number(*v, "rms_norm_eps");
  c.tie_word_embeddings = boolean(o, "tie_word_embeddings", gemma3);
  // attention_bias is a field of Llama, Qwen3, Qwen3-MoE and Gemma 3 (q, k, v and o get biases); Mistral, Mixtral and
  // Phi-3 have none (HF ignores the key there), Qwen2 always biases q, k, v and never o.
  const bool attention_bias = (c.model_type == "llama" || qwen3 || gemma3) && boolean(o, "attention_bias", false);
  c.qkv_bias = c.model_type == "qwen2" || attention_bias;
  c.o_bias = attention_bias;
  c.qk_norm = qwen3;
  if (c.model_type == "mixtral" || c.model_type == "qwen3_moe") read_experts(o, c);
  c.fused_projections = c.model_type == "phi3";
  if (boolean(o, "mlp_bias", false)) throw ModelError("config.json: unsupported field 'mlp_bias' = true");
  if (gemma3)
    read_gemma3(o, sliding_rope, c);
  else if (const json::value* v = find(o, "hidden_act"); v && (!v->is_string() || v->as_string() != "silu"))
    throw ModelError("config.json: unsupported 'hidden_act' (only silu)");
  if (const json::value* q = find(o, "quantization_config")) c.fp8_checkpoint = read_quantization_config(*q);
  if (const json::value* q = find(o, "compression_config"))
    throw ModelError("config.json: unsupported field 'compression_config' = " + json::serialize(*q) +
                     " (compressed-tensors' older name: rename it quantization_config)");
  for (const char* key : {"dtype", "torch_dtype"})  // transformers 5 writes "dtype", older versions "torch_dtype"
    if (const json::value* v = find(o, key); v && v->is_string()) {
      c.torch_dtype = std::string(v->as_string());
      break;
    }
  read_sliding_windows(o, qwen, c);

  const json::value* rs = find(o, "rope_scaling");
  if (!rs) rs = rope_params;
  if (rs) {
    if (!rs->is_object()) throw ModelError("config.json: field 'rope_scaling' must be an object");
    const auto& r = rs->as_object();
    const json::value* t = find(r, "rope_type");
    if (!t) t = find(r, "type");
    std::string kind = t && t->is_string() ? std::string(t->as_string()) : "";
    auto get = [&](std::string_view k, double& dst) {
      const json::value* v = find(r, k);
      if (!v) throw ModelError("config.json: rope_scaling is missing '" + std::string(k) + "'");
      dst = number(*v, k);
    };
    if (kind == "llama3") {
      c.rope_scaling.llama3 = true;
      get("factor", c.rope_scaling.factor);
      get("low_freq_factor", c.rope_scaling.low_freq_factor);
      get("high_freq_factor", c.rope_scaling.high_freq_factor);
      double orig = 0;
      get("original_max_position_embeddings", orig);
      c.rope_scaling.original_max_position_embeddings = static_cast<int>(orig);
      // The values HF's _validate_llama3_parameters demands; anything else makes the blend divide by zero or
      // produce non-finite frequencies.
      const RopeScaling& s = c.rope_scaling;
      if (!(s.factor >= 1.0)) throw ModelError("config.json: rope_scaling 'factor' must be >= 1");
      if (!(s.low_freq_factor > 0.0)) throw ModelError("config.json: rope_scaling 'low_freq_factor' must be > 0");
      if (!(s.high_freq_factor > s.low_freq_factor))
        throw ModelError("config.json: rope_scaling 'high_freq_factor' must be greater than 'low_freq_factor'");
      if (!(orig >= 1.0 && orig <= 1e9 && orig == std::floor(orig)))
        throw ModelError("config.json: rope_scaling 'original_max_position_embeddings' must be a positive integer");
    } else if (kind == "longrope" || (kind == "su" && c.model_type == "phi3")) {
      read_longrope(o, r, c);
    } else if (kind == "linear") {
      c.rope_scaling.linear = true;
      get("factor", c.rope_scaling.factor);
      if (!(c.rope_scaling.factor >= 1.0)) throw ModelError("config.json: rope_scaling 'factor' must be >= 1");
    } else if (kind != "default") {
      throw ModelError("config.json: unsupported rope_scaling type '" + kind +
                       "' (supported: llama3, longrope, linear)");
    }
  }

  if (const json::value* v = find(o, "bos_token_id")) c.bos_token_id = static_cast<TokenId>(number(*v, "bos_token_id"));
  add_token_ids(find(o, "eos_token_id"), c.eos_token_ids, "eos_token_id");
  if (fs::exists(dir / "generation_config.json")) {
    json::object g = read_json_object<ModelError>(dir / "generation_config.json");
    add_token_ids(find(g, "eos_token_id"), c.eos_token_ids, "generation_config.json eos_token_id");
  }
  return c;
}

std::vector<float> ModelConfig::rope_inv_freq(int max_model_len) const {
  const int dims = rotary_dims(), half = dims / 2;
  const RopeScaling& s = rope_scaling;
  const int context = max_model_len > 0 ? max_model_len : max_position_embeddings;
  const std::vector<double>& longrope = context > s.original_max_position_embeddings ? s.long_factor : s.short_factor;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(rope_theta, (2.0 * i) / dims);
    if (s.llama3) {
      // Llama 3.1 frequency scaling: long wavelengths divided by factor, short kept, a smooth blend between.
      double low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
      double high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
      double wavelen = 2.0 * std::numbers::pi / f;
      if (wavelen > low_wavelen) {
        f = f / s.factor;
      } else if (wavelen >= high_wavelen) {
        double smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) /
                        (s.high_freq_factor - s.low_freq_factor);
        f = (1.0 - smooth) * f / s.factor + smooth * f;
      }
    } else if (s.longrope) {
      f = f / longrope[i];  // LongRoPE: each frequency divided by its rescale factor
    } else if (s.linear) {
      f = f / s.factor;  // positions divided by factor
    }
    inv[i] = static_cast<float>(f);
  }
  return inv;
}

std::vector<float> ModelConfig::local_rope_inv_freq() const {
  const int dims = rotary_dims();
  std::vector<float> inv(dims / 2);
  for (int i = 0; i < dims / 2; ++i) inv[i] = static_cast<float>(1.0 / std::pow(local_rope_theta, (2.0 * i) / dims));
  return inv;
}

float ModelConfig::attention_scale() const {
  return static_cast<float>(1.0 / std::sqrt(query_pre_attn_scalar > 0.0 ? query_pre_attn_scalar : head_dim));
}

bool ModelConfig::has_sliding_window() const {
  return std::any_of(sliding_windows.begin(), sliding_windows.end(), [](int w) { return w > 0; });
}

}  // namespace paged
