#include "model/lora/lora_adapter.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <regex>
#include <set>

#include "model/hash_mix.h"
#include "model/json_file.h"
#include "model/loader/safetensors.h"
#include "model/loader/weight_map.h"

namespace paged {
namespace json = boost::json;
namespace fs = std::filesystem;

namespace {

// What adapter_config.json says that loading needs.
struct AdapterConfig {
  double alpha = 8.0;  // PEFT's default lora_alpha
  bool rslora = false;
  std::vector<std::pair<std::string, double>> alpha_pattern;  // module pattern -> lora_alpha
};

AdapterConfig read_adapter_config(const fs::path& dir) {
  const std::string where = (dir / "adapter_config.json").string();
  const json::object o = read_json_object<ModelError>(dir / "adapter_config.json");
  const auto bad = [&](const std::string& why) { return ModelError(where + ": " + why); };
  const auto flag = [&](const char* key) {
    const json::value* v = o.if_contains(key);
    if (v && !v->is_bool() && !v->is_null()) throw bad(std::string("'") + key + "' must be true or false");
    return v && v->is_bool() && v->get_bool();
  };
  const auto number = [&](const json::value& v, const std::string& key) {
    if (!v.is_number()) throw bad("'" + key + "' must be a number");
    const double x = v.to_number<double>();
    if (!std::isfinite(x)) throw bad("'" + key + "' must be finite");
    return x;
  };
  if (const json::value* t = o.if_contains("peft_type"); t && !(t->is_string() && t->get_string() == "LORA"))
    throw bad("peft_type must be LORA (other PEFT methods are not LoRA adapters)");
  if (flag("use_dora")) throw bad("DoRA adapters (use_dora) are not supported");
  if (flag("fan_in_fan_out")) throw bad("fan_in_fan_out (GPT-2's Conv1D layout) is not supported");
  if (const json::value* b = o.if_contains("bias"); b && !(b->is_string() && b->get_string() == "none") &&
                                                      !b->is_null())
    throw bad("LoRA biases (bias other than \"none\") are not supported");
  if (const json::value* m = o.if_contains("modules_to_save");
      m && !m->is_null() && !(m->is_array() && m->get_array().empty()))
    throw bad("modules_to_save (whole modules trained beside the LoRA pairs) is not supported");
  AdapterConfig c;
  if (const json::value* a = o.if_contains("lora_alpha")) c.alpha = number(*a, "lora_alpha");
  c.rslora = flag("use_rslora");
  if (const json::value* p = o.if_contains("alpha_pattern"); p && !p->is_null()) {
    if (!p->is_object()) throw bad("'alpha_pattern' must be an object");
    for (const auto& kv : p->get_object())
      c.alpha_pattern.emplace_back(std::string(kv.key()), number(kv.value(), "alpha_pattern." + std::string(kv.key())));
  }
  return c;
}

// lora_alpha of `module` (e.g. "model.layers.0.self_attn.q_proj"): PEFT's alpha_pattern (a key matching the name's
// tail, a regular expression as PEFT takes it), else lora_alpha.
double alpha_of(const AdapterConfig& c, const std::string& module) {
  for (const auto& [key, alpha] : c.alpha_pattern) {
    try {
      if (std::regex_match(module, std::regex("(.*\\.)?(" + key + ")"))) return alpha;
    } catch (const std::regex_error&) {
      throw ModelError("adapter_config.json: alpha_pattern key '" + key + "' is not a valid pattern");
    }
  }
  return c.alpha;
}

// Reads the pairs of one fused linear layer of the rank (its shards back to back); records the tensors taken.
void read_pairs(const SafeTensors& st, const AdapterConfig& cfg, const RankParam& param, int max_lora_rank,
                std::vector<LoraPair>& out, std::set<std::string>& used, uint64_t& hash) {
  int offset = 0;
  for (const TensorShard& s : param.shards) {
    const std::string module = s.name.substr(0, s.name.size() - std::string(".weight").size());
    const std::string a_name = "base_model.model." + module + ".lora_A.weight";
    const std::string b_name = "base_model.model." + module + ".lora_B.weight";
    const int at = offset;
    offset += static_cast<int>(s.rows);
    const bool has_a = st.contains(a_name), has_b = st.contains(b_name);
    if (!has_a && !has_b) continue;
    if (has_a != has_b) throw ModelError("adapter has " + (has_a ? a_name : b_name) + " without its other half");
    const TensorView& a = st.tensors().at(a_name);
    const TensorView& b = st.tensors().at(b_name);
    const int64_t out_dim = s.shape.at(0), in_dim = s.shape.at(1);
    if (a.shape.size() != 2 || a.shape[0] < 1 || a.shape[1] != in_dim || b.shape.size() != 2 ||
        b.shape[0] != out_dim || b.shape[1] != a.shape[0])
      throw ModelError("adapter pair " + module + ": lora_A [r][" + std::to_string(in_dim) + "] and lora_B [" +
                       std::to_string(out_dim) + "][r] expected for its base weight");
    if (a.dtype == DType::f8_e4m3 || b.dtype == DType::f8_e4m3)
      throw ModelError("adapter pair " + module + ": FP8 LoRA weights are not supported");
    const int r = static_cast<int>(a.shape[0]);
    if (r > max_lora_rank)
      throw ModelError("adapter pair " + module + " has rank " + std::to_string(r) + ", above --max-lora-rank " +
                       std::to_string(max_lora_rank));
    LoraPair p;
    p.out_offset = at;
    p.out_rows = static_cast<int>(s.rows);
    p.rank = r;
    const double alpha = alpha_of(cfg, module);
    p.scale = static_cast<float>(cfg.rslora ? alpha / std::sqrt(double(r)) : alpha / r);
    p.a = read_shard_f32(st, {a_name, a.shape, 0, r, s.col_begin, s.cols});
    p.b = read_shard_f32(st, {b_name, b.shape, s.row_begin, s.rows, 0, r});
    if (used.insert(a_name).second) {  // a fused tensor's shards share one pair: hashed once
      uint32_t scale_bits = 0;
      std::memcpy(&scale_bits, &p.scale, sizeof scale_bits);
      hash = hash_mix(hash, hash_bytes(module));
      hash = hash_mix(hash, scale_bits);
      hash = hash_mix(hash, hash_bytes({static_cast<const char*>(a.data), a.nbytes}));
      hash = hash_mix(hash, hash_bytes({static_cast<const char*>(b.data), b.nbytes}));
    }
    used.insert(b_name);
    out.push_back(std::move(p));
  }
}

}  // namespace

LoraAdapter load_lora_adapter(const std::string& path, const ModelConfig& config, int tp_rank, int tp_size,
                              int max_lora_rank) {
  const fs::path dir(path);
  if (!fs::is_directory(dir)) throw ModelError("LoRA adapter " + path + ": not a folder");
  if (!fs::exists(dir / "adapter_config.json"))
    throw ModelError("LoRA adapter " + path + ": no adapter_config.json (a PEFT adapter folder has it)");
  const AdapterConfig cfg = read_adapter_config(dir);
  if (!fs::exists(dir / "adapter_model.safetensors")) {
    if (fs::exists(dir / "adapter_model.bin"))
      throw ModelError("LoRA adapter " + path + ": adapter_model.bin (PyTorch pickle) is not read; save the adapter "
                       "with safe_serialization (adapter_model.safetensors)");
    throw ModelError("LoRA adapter " + path + ": no adapter_model.safetensors");
  }
  const SafeTensors st(SafeTensors::File{(dir / "adapter_model.safetensors").string()});
  const WeightMap map = rank_weight_map(config, tp_rank, tp_size);
  LoraAdapter adapter;
  adapter.path = path;
  adapter.layers.resize(map.layers.size());
  std::set<std::string> used;
  uint64_t hash = hash_mix(0, 0x4c6f5241);  // "LoRA"
  for (size_t l = 0; l < map.layers.size(); ++l) {
    const RankLayer& in = map.layers[l];
    LoraLayer& out = adapter.layers[l];
    read_pairs(st, cfg, in.wqkv, max_lora_rank, out.qkv, used, hash);
    read_pairs(st, cfg, in.wo, max_lora_rank, out.o, used, hash);
    if (!config.is_moe()) {  // the experts' linears take no pairs: their tensors stay unused, and refused below
      read_pairs(st, cfg, in.w_gate_up, max_lora_rank, out.gate_up, used, hash);
      read_pairs(st, cfg, in.w_down, max_lora_rank, out.down, used, hash);
    }
    for (const auto* pairs : {&out.qkv, &out.o, &out.gate_up, &out.down})
      for (const LoraPair& p : *pairs) adapter.max_rank = std::max(adapter.max_rank, p.rank);
  }
  for (const auto& [name, t] : st.tensors())
    if (!used.count(name))
      throw ModelError("LoRA adapter " + path + ": tensor '" + name + "' adds to no linear layer of this " +
                       config.model_type + " model (pairs on the q/k/v/o projections and a dense MLP's gate/up/down "
                       "are taken; embeddings, the LM head and experts are not)");
  if (used.empty()) throw ModelError("LoRA adapter " + path + ": no LoRA pair for this model's layers");
  adapter.content_hash = std::max<uint64_t>(1, hash);
  return adapter;
}

}  // namespace paged
