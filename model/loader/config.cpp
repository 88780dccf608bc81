#include "model/loader/config.h"

#include <algorithm>
#include <boost/json.hpp>
#include <cmath>
#include <filesystem>
#include <numbers>

#include "model/json_file.h"

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

int positive_int(const json::object& o, std::string_view field) {
  const json::value* v = find(o, field);
  if (!v) throw ModelError("config.json: missing required field '" + std::string(field) + "'");
  double d = number(*v, field);
  if (d < 1 || d != std::floor(d) || d > 1e9)
    throw ModelError("config.json: field '" + std::string(field) + "' must be a positive integer");
  return static_cast<int>(d);
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

}  // namespace

ModelConfig load_model_config(const std::string& model_dir) {
  fs::path dir(model_dir);
  if (!fs::is_directory(dir)) throw ModelError("model directory not found: " + model_dir);
  json::object o = read_json_object<ModelError>(dir / "config.json");
  ModelConfig c;

  const json::value* type = find(o, "model_type");
  if (!type || !type->is_string()) throw ModelError("config.json: missing field 'model_type'");
  c.model_type = std::string(type->as_string());
  if (c.model_type != "llama" && c.model_type != "mistral" && c.model_type != "qwen2")
    throw ModelError("config.json: unsupported model_type '" + c.model_type +
                     "' (supported: llama, mistral, qwen2)");
  if (const json::value* archs = find(o, "architectures"); archs && archs->is_array()) {
    for (const auto& a : archs->as_array()) {
      std::string name = a.is_string() ? std::string(a.as_string()) : "";
      if (name != "LlamaForCausalLM" && name != "MistralForCausalLM" && name != "Qwen2ForCausalLM")
        throw ModelError("config.json: unsupported architectures entry '" + name + "'");
    }
  }

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

  // transformers >= 5 writes rope_theta and the scaling into one "rope_parameters" object.
  const json::value* rope_params = find(o, "rope_parameters");
  if (rope_params && !rope_params->is_object()) throw ModelError("config.json: field 'rope_parameters' must be an object");
  if (const json::value* v = find(o, "rope_theta")) c.rope_theta = number(*v, "rope_theta");
  else if (rope_params && find(rope_params->as_object(), "rope_theta"))
    c.rope_theta = number(*find(rope_params->as_object(), "rope_theta"), "rope_parameters.rope_theta");
  if (const json::value* v = find(o, "rms_norm_eps")) c.rms_norm_eps = number(*v, "rms_norm_eps");
  c.tie_word_embeddings = boolean(o, "tie_word_embeddings", false);
  c.qkv_bias = c.model_type == "qwen2" || boolean(o, "attention_bias", false);
  if (boolean(o, "mlp_bias", false)) throw ModelError("config.json: unsupported field 'mlp_bias' = true");
  if (const json::value* v = find(o, "hidden_act"); v && (!v->is_string() || v->as_string() != "silu"))
    throw ModelError("config.json: unsupported 'hidden_act' (only silu)");
  if (const json::value* v = find(o, "torch_dtype"); v && v->is_string()) c.torch_dtype = std::string(v->as_string());
  if (const json::value* v = find(o, "sliding_window"); v && c.model_type == "mistral" && !v->is_null()) {
    double w = number(*v, "sliding_window");
    if (w < c.max_position_embeddings)
      throw ModelError("config.json: unsupported field 'sliding_window' smaller than max_position_embeddings");
  }
  if (c.model_type == "qwen2" && boolean(o, "use_sliding_window", false))
    throw ModelError("config.json: unsupported field 'use_sliding_window' = true");

  const json::value* rs = find(o, "rope_scaling");
  if (!rs) rs = rope_params;
  if (rs) {
    if (!rs->is_object()) throw ModelError("config.json: field 'rope_scaling' must be an object");
    const auto& r = rs->as_object();
    const json::value* t = find(r, "rope_type");
    if (!t) t = find(r, "type");
    std::string kind = t && t->is_string() ? std::string(t->as_string()) : "";
    if (kind == "llama3") {
      c.rope_scaling.llama3 = true;
      auto get = [&](std::string_view k, double& dst) {
        const json::value* v = find(r, k);
        if (!v) throw ModelError("config.json: rope_scaling is missing '" + std::string(k) + "'");
        dst = number(*v, k);
      };
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
    } else if (kind != "default") {
      throw ModelError("config.json: unsupported rope_scaling type '" + kind + "' (supported: llama3)");
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

std::vector<float> ModelConfig::rope_inv_freq() const {
  const int half = head_dim / 2;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(rope_theta, (2.0 * i) / head_dim);
    if (rope_scaling.llama3) {
      // Llama 3.1 frequency scaling: long wavelengths divided by factor, short kept, a smooth blend between.
      const auto& s = rope_scaling;
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
    }
    inv[i] = static_cast<float>(f);
  }
  return inv;
}

}  // namespace paged
