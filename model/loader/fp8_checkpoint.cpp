#include "model/loader/fp8_checkpoint.h"

#include <algorithm>
#include <boost/json.hpp>
#include <cmath>
#include <set>

namespace paged {
namespace json = boost::json;

namespace {

// The path of a field inside quantization_config, for messages: "quantization_config.config_groups.group_0.weights".
std::string field_path(const std::string& parent, std::string_view key) {
  return parent + "." + std::string(key);
}

[[noreturn]] void refuse(const std::string& path, const json::value& value, const std::string& why = "") {
  throw ModelError("config.json: unsupported " + path + " = " + json::serialize(value) +
                   (why.empty() ? std::string() : " (" + why + ")"));
}

// Refuses the first key of `o` outside `known`.
void only_known_fields(const json::object& o, const std::string& path, const std::set<std::string_view>& known) {
  for (const auto& kv : o)
    if (!known.count(kv.key())) refuse(field_path(path, kv.key()), kv.value(), "a field this runtime does not read");
}

const json::value* field(const json::object& o, std::string_view key) {
  auto it = o.find(key);
  return it == o.end() || it->value().is_null() ? nullptr : &it->value();
}

std::string text(const json::object& o, std::string_view key, const std::string& path) {
  const json::value* v = field(o, key);
  if (!v) throw ModelError("config.json: " + field_path(path, key) + " is missing");
  if (!v->is_string()) refuse(field_path(path, key), *v, "must be a string");
  return std::string(v->as_string());
}

// A list of strings (or null); refused otherwise.
void require_strings(const json::object& o, std::string_view key, const std::string& path) {
  const json::value* v = field(o, key);
  if (!v) return;
  if (!v->is_array()) refuse(field_path(path, key), *v, "must be a list of names");
  for (const auto& x : v->as_array())
    if (!x.is_string()) refuse(field_path(path, key), *v, "must be a list of names");
}

// [rows, cols] of positive integers.
std::pair<int, int> block_shape(const json::value& v, const std::string& path) {
  if (!v.is_array() || v.as_array().size() != 2) refuse(path, v, "must be [rows, cols]");
  int out[2];
  for (int i = 0; i < 2; ++i) {
    const json::value& d = v.as_array()[i];
    if (!d.is_int64() || d.as_int64() < 1 || d.as_int64() > (1 << 20)) refuse(path, v, "must be positive integers");
    out[i] = static_cast<int>(d.as_int64());
  }
  return {out[0], out[1]};
}

// The value of `key` must be `expected` (when present, or always when `required`).
void require_value(const json::object& o, std::string_view key, const json::value& expected, const std::string& path,
                   bool required, const std::string& why) {
  const json::value* v = field(o, key);
  if (!v) {
    if (required) throw ModelError("config.json: " + field_path(path, key) + " is missing");
    return;
  }
  const bool equal = v->is_number() && expected.is_number() ? v->to_number<double>() == expected.to_number<double>()
                                                            : *v == expected;
  if (!equal) refuse(field_path(path, key), *v, why);
}

// quant_method "fp8": vLLM / AutoFP8 per tensor, or transformers' FineGrainedFP8 per block.
Fp8Checkpoint fp8_method(const json::object& q, const std::string& path) {
  only_known_fields(q, path, {"quant_method", "activation_scheme", "weight_block_size", "ignored_layers",
                              "modules_to_not_convert", "fmt", "dequantize", "kv_cache_scheme"});
  Fp8Checkpoint c;
  c.enabled = true;
  c.method = "fp8";
  require_value(q, "fmt", "e4m3", path, false, "FP8 checkpoints load as e4m3");
  require_value(q, "kv_cache_scheme", nullptr, path, false, "the KV cache scales of a checkpoint are not read");
  if (const json::value* d = field(q, "dequantize"); d && !d->is_bool()) refuse(field_path(path, "dequantize"), *d);
  require_strings(q, "ignored_layers", path);
  require_strings(q, "modules_to_not_convert", path);
  const std::string scheme = field(q, "activation_scheme") ? text(q, "activation_scheme", path) : "dynamic";
  if (scheme != "dynamic" && scheme != "static")
    refuse(field_path(path, "activation_scheme"), json::value(scheme), "dynamic or static");
  c.static_activations = scheme == "static";
  if (const json::value* b = field(q, "weight_block_size")) {
    std::tie(c.block_rows, c.block_cols) = block_shape(*b, field_path(path, "weight_block_size"));
    if (c.static_activations)
      refuse(field_path(path, "activation_scheme"), json::value(scheme), "block-wise weights take dynamic activations");
    c.layout = Fp8ScaleLayout::block;
    c.scale_suffix = "weight_scale_inv";
    c.activation_group = c.block_cols;
  }
  return c;
}

// The common fields of compressed-tensors' QuantizationArgs: 8-bit symmetric floats.
void float8_args(const json::object& a, const std::string& path) {
  only_known_fields(a, path, {"num_bits", "type", "symmetric", "group_size", "strategy", "block_structure", "dynamic",
                              "actorder", "observer", "observer_kwargs", "scale_dtype", "zp_dtype"});
  require_value(a, "num_bits", 8, path, true, "FP8 only: 8 bits");
  require_value(a, "type", "float", path, true, "FP8 only: float; integer schemes are not supported");
  require_value(a, "symmetric", true, path, false, "asymmetric quantisation is not supported");
  if (const json::value* v = field(a, "actorder"); v && !(v->is_bool() && !v->as_bool()))
    refuse(field_path(path, "actorder"), *v, "activation ordering is not supported");
  require_value(a, "zp_dtype", nullptr, path, false, "zero points are not supported");
}

// A QuantizationArgs strategy: given, or inferred as compressed-tensors does (no group_size: tensor; -1: channel).
std::string strategy_of(const json::object& a, const std::string& path) {
  if (field(a, "strategy")) return text(a, "strategy", path);
  const json::value* g = field(a, "group_size");
  if (!g) return "tensor";
  if (g->is_int64() && g->as_int64() == -1) return "channel";
  return "group";
}

// One config group's scheme, as an Fp8Checkpoint.
Fp8Checkpoint compressed_group(const json::object& g, const std::string& path) {
  only_known_fields(g, path, {"targets", "weights", "input_activations", "output_activations", "format"});
  require_strings(g, "targets", path);
  require_value(g, "output_activations", nullptr, path, false, "output activations are not quantised here");
  require_value(g, "format", "float-quantized", path, false, "only float-quantized");
  Fp8Checkpoint c;
  c.enabled = true;
  c.method = "compressed-tensors";
  const json::value* w = field(g, "weights");
  if (!w || !w->is_object()) throw ModelError("config.json: " + field_path(path, "weights") + " must be an object");
  const std::string wpath = field_path(path, "weights");
  const json::object& wa = w->as_object();
  float8_args(wa, wpath);
  require_value(wa, "dynamic", false, wpath, false, "weights are stored quantised");
  const std::string strategy = strategy_of(wa, wpath);
  if (strategy == "tensor" || strategy == "channel") {
    c.layout = strategy == "tensor" ? Fp8ScaleLayout::tensor : Fp8ScaleLayout::channel;
    require_value(wa, "block_structure", nullptr, wpath, false, "only with strategy block");
    if (const json::value* gs = field(wa, "group_size"); gs && !(strategy == "channel" && gs->is_int64() && gs->as_int64() == -1))
      refuse(field_path(wpath, "group_size"), *gs, "group-wise weights are not supported");
  } else if (strategy == "block") {
    c.layout = Fp8ScaleLayout::block;
    const json::value* b = field(wa, "block_structure");
    if (!b) throw ModelError("config.json: " + field_path(wpath, "block_structure") + " is missing (strategy block)");
    std::tie(c.block_rows, c.block_cols) = block_shape(*b, field_path(wpath, "block_structure"));
    require_value(wa, "group_size", nullptr, wpath, false, "group-wise weights are not supported");
  } else {
    refuse(field_path(wpath, "strategy"), json::value(strategy), "tensor, channel or block");
  }
  if (const json::value* in = field(g, "input_activations")) {
    const std::string ipath = field_path(path, "input_activations");
    if (!in->is_object()) refuse(ipath, *in, "must be an object");
    const json::object& ia = in->as_object();
    float8_args(ia, ipath);
    const json::value* dyn = field(ia, "dynamic");
    const bool dynamic = dyn && dyn->is_bool() && dyn->as_bool();
    if (dyn && !dyn->is_bool()) refuse(field_path(ipath, "dynamic"), *dyn, "true or false");
    const std::string s = strategy_of(ia, ipath);
    const bool supported = (s == "token" && dynamic) || s == "tensor" || (s == "group" && dynamic);
    if (!supported)
      refuse(field_path(ipath, "strategy"), json::value(s),
             std::string(dynamic ? "dynamic" : "static") + " activations: token or group dynamic, tensor static");
    c.static_activations = s == "tensor" && !dynamic;  // dynamic per tensor: the per-token scales are finer still
    if (s == "group") {
      const json::value* gs = field(ia, "group_size");
      if (!gs || !gs->is_int64() || gs->as_int64() < 1)
        refuse(field_path(ipath, "group_size"), gs ? *gs : json::value(nullptr), "a positive group size");
      c.activation_group = static_cast<int>(gs->as_int64());
    }
    require_value(ia, "block_structure", nullptr, ipath, false, "block-wise activations are not supported");
  }
  return c;
}

// quant_method "compressed-tensors", format "float-quantized".
Fp8Checkpoint compressed_tensors_method(const json::object& q, const std::string& path) {
  only_known_fields(q, path, {"quant_method", "format", "config_groups", "ignore", "kv_cache_scheme",
                              "quantization_status", "global_compression_ratio", "sparsity_config",
                              "transform_config", "version", "provider", "run_compressed"});
  require_value(q, "format", "float-quantized", path, true, "only float-quantized (FP8) checkpoints");
  require_value(q, "quantization_status", "compressed", path, false, "the weights must be stored compressed");
  require_value(q, "kv_cache_scheme", nullptr, path, false, "the KV cache scales of a checkpoint are not read");
  require_value(q, "transform_config", nullptr, path, false, "transforms are not supported");
  // llm-compressor writes {} or a config of format "dense" (no sparse compression) in dense checkpoints.
  if (const json::value* s = field(q, "sparsity_config")) {
    const json::value* format = s->is_object() ? field(s->as_object(), "format") : nullptr;
    if (!(s->is_object() && (s->as_object().empty() || (format && *format == "dense"))))
      refuse(field_path(path, "sparsity_config"), *s, "sparse checkpoints are not supported");
  }
  require_strings(q, "ignore", path);
  const json::value* groups = field(q, "config_groups");
  if (!groups || !groups->is_object() || groups->as_object().empty())
    throw ModelError("config.json: " + field_path(path, "config_groups") + " must name at least one group");
  Fp8Checkpoint c;
  bool first = true;
  for (const auto& kv : groups->as_object()) {
    const std::string gpath = field_path(field_path(path, "config_groups"), kv.key());
    if (!kv.value().is_object()) refuse(gpath, kv.value(), "must be an object");
    const Fp8Checkpoint g = compressed_group(kv.value().as_object(), gpath);
    if (!first && (g.layout != c.layout || g.block_rows != c.block_rows || g.block_cols != c.block_cols ||
                   g.static_activations != c.static_activations || g.activation_group != c.activation_group))
      refuse(gpath, kv.value(), "groups of different schemes are not supported");
    c = g;
    first = false;
  }
  return c;
}

const char* layout_name(const Fp8Checkpoint& c) {
  switch (c.layout) {
    case Fp8ScaleLayout::tensor: return "a scale per tensor";
    case Fp8ScaleLayout::channel: return "a scale per output channel";
    case Fp8ScaleLayout::block: return "block scales";
  }
  return "?";
}

}  // namespace

Fp8Checkpoint read_quantization_config(const json::value& v) {
  const std::string path = "quantization_config";
  if (!v.is_object()) refuse(path, v, "must be an object");
  const json::object& q = v.as_object();
  const std::string method = text(q, "quant_method", path);
  if (method == "fp8") return fp8_method(q, path);
  if (method == "compressed-tensors") return compressed_tensors_method(q, path);
  refuse(field_path(path, "quant_method"), json::value(method), "supported: fp8, compressed-tensors");
}

std::string Fp8Checkpoint::describe(bool fp8_linears, const std::string& dequantised_dtype) const {
  if (!enabled) return "";
  std::string s = "FP8 checkpoint (" + method + ": e4m3 weights with " + layout_name(*this);
  if (layout == Fp8ScaleLayout::block) s += " of " + std::to_string(block_rows) + "x" + std::to_string(block_cols);
  if (!fp8_linears) return s + "), dequantised to " + dequantised_dtype + " at load";
  s += layout == Fp8ScaleLayout::block ? "), dequantised to bf16 and quantised again per output channel at load"
                                       : "), loaded as they are";
  s += "; activations quantised dynamically per token";
  if (static_activations) s += " (the checkpoint's static input_scale per layer is not used)";
  if (activation_group > 0) s += " (the checkpoint's: per token in groups of " + std::to_string(activation_group) + ")";
  return s;
}

Fp8WeightScales::Fp8WeightScales(const SafeTensors& weights, const std::string& weight_name, const TensorView& weight,
                                 const Fp8Checkpoint& fp8) {
  const std::string suffix = ".weight";
  if (!fp8.enabled)
    throw ModelError("tensor '" + weight_name + "' is F8_E4M3 but config.json has no quantization_config");
  if (weight.shape.size() != 2 || weight_name.size() < suffix.size() ||
      weight_name.compare(weight_name.size() - suffix.size(), suffix.size(), suffix) != 0)
    throw ModelError("tensor '" + weight_name + "': F8_E4M3 is read for 2-D linear weights (*.weight) only");
  const std::string module = weight_name.substr(0, weight_name.size() - suffix.size() + 1);  // "....o_proj."
  const std::string scale_name = module + fp8.scale_suffix;
  if (!weights.contains(scale_name))
    throw ModelError("FP8 tensor '" + weight_name + "' has no scale tensor '" + scale_name + "' beside it");
  const TensorView& s = weights.get(scale_name);
  const int64_t out = weight.shape[0], in = weight.shape[1];
  columns_ = in;
  int64_t grid_rows = 1;
  std::vector<int64_t> expected;  // the shape the layout implies (tensor: [] or [1]; channel: [out] or [out, 1])
  switch (fp8.layout) {
    case Fp8ScaleLayout::tensor:
      block_rows_ = out, block_cols_ = in;
      expected = {1};
      break;
    case Fp8ScaleLayout::channel:
      block_cols_ = in;
      grid_rows = out;
      expected = {out, 1};
      break;
    case Fp8ScaleLayout::block:
      block_rows_ = fp8.block_rows, block_cols_ = fp8.block_cols;
      grid_rows = (out + block_rows_ - 1) / block_rows_;
      grid_cols_ = (in + block_cols_ - 1) / block_cols_;
      expected = {grid_rows, grid_cols_};
      break;
  }
  block_rows_ = std::max<int64_t>(block_rows_, 1);
  block_cols_ = std::max<int64_t>(block_cols_, 1);
  const bool fits = s.shape == expected || (fp8.layout == Fp8ScaleLayout::tensor && s.shape.empty()) ||
                    (fp8.layout == Fp8ScaleLayout::channel && s.shape == std::vector<int64_t>{out});
  if (!fits || s.dtype == DType::f8_e4m3) {
    std::string got = "[", want = "[";
    for (size_t i = 0; i < s.shape.size(); ++i) got += (i ? ", " : "") + std::to_string(s.shape[i]);
    for (size_t i = 0; i < expected.size(); ++i) want += (i ? ", " : "") + std::to_string(expected[i]);
    throw ModelError("FP8 scale tensor '" + scale_name + "' is " + dtype_name(s.dtype) + " " + got +
                     "]; the weight " + weight_name + " [" + std::to_string(out) + ", " + std::to_string(in) +
                     "] with " + layout_name(fp8) + " needs a float tensor " + want + "]");
  }
  scales_.resize(static_cast<size_t>(s.numel()));
  s.to_floats(0, s.numel(), scales_.data());
  for (int64_t i = 0; i < s.numel(); ++i) {
    if (!std::isfinite(scales_[i]) || scales_[i] < 0.0f)
      throw ModelError("FP8 scale tensor '" + scale_name + "' holds " + std::to_string(scales_[i]) +
                       " at " + std::to_string(i) + " (scales must be finite and not negative)");
  }
  if (fp8.static_activations) {  // the layer's activation scale: checked (and counted as loaded), not used
    const std::string input = module + "input_scale";
    if (!weights.contains(input))
      throw ModelError("FP8 tensor '" + weight_name + "' has no '" + input + "' beside it (static activations)");
    const TensorView& a = weights.get(input);
    float value = 0.0f;
    if (a.numel() == 1) a.to_floats(0, 1, &value);
    if (a.numel() != 1 || a.shape.size() > 1 || a.dtype == DType::f8_e4m3 || !(value > 0.0f))
      throw ModelError("FP8 activation scale '" + input + "' must be one positive float ([] or [1]), not " +
                       dtype_name(a.dtype) + " of " + std::to_string(a.numel()) + " elements");
  }
}

void Fp8WeightScales::dequantise(int64_t row, int64_t col_begin, int64_t n, float* values) const {
  const float* row_scales = &scales_[static_cast<size_t>((row / block_rows_) * grid_cols_)];
  for (int64_t c = col_begin, end = col_begin + n; c < end;) {  // a block's run of columns at a time
    const int64_t block = c / block_cols_, run_end = std::min(end, (block + 1) * block_cols_);
    const float s = row_scales[block];
    for (; c < run_end; ++c) values[c - col_begin] *= s;
  }
}

std::vector<float> Fp8WeightScales::row_scales(int64_t row_begin, int64_t rows) const {
  std::vector<float> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) out[r] = at(row_begin + r, 0);
  return out;
}

}  // namespace paged
