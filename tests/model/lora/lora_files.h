// LoRA adapter folders for the tests, written as PEFT writes them (adapter_config.json, adapter_model.safetensors with
// base_model.model.<module>.lora_A.weight [r][in] and lora_B.weight [out][r]), and the reference they are checked
// against: the base checkpoint with each pair merged into its weight, W + scale * B A (PEFT's merge_and_unload),
// computed here in double from the files' own bytes, independently of model/lora.
#pragma once

#include <catch2/catch.hpp>

#include <boost/json.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "tests/model/loader/safetensors_file.h"

namespace paged::test {

/// One pair to write: the module (e.g. "model.layers.0.self_attn.q_proj"), its base weight's [out][in] and r.
struct LoraSpec {
  std::string module;
  int64_t out = 0, in = 0;
  int rank = 4;
};

inline std::string f32_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}
inline std::vector<float> f32_values(const std::string& bytes) {
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

/// Writes the adapter folder `dir`: one random pair per spec (A and B uniform, sized so that the pairs change a
/// model's outputs), adapter_config.json with r (the first spec's), lora_alpha and use_rslora, and `extra_config`
/// keys on top. Returns each module's pair as written: {A, B}.
inline std::map<std::string, std::pair<std::vector<float>, std::vector<float>>> write_lora_adapter(
    const std::filesystem::path& dir, const std::vector<LoraSpec>& specs, double alpha, bool rslora, uint32_t seed,
    const boost::json::object& extra_config = {}) {
  std::filesystem::create_directories(dir);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<RawTensor> tensors;
  std::map<std::string, std::pair<std::vector<float>, std::vector<float>>> pairs;
  for (const LoraSpec& s : specs) {
    std::vector<float> a(static_cast<size_t>(s.rank * s.in)), b(static_cast<size_t>(s.out * s.rank));
    for (float& x : a) x = u(rng) / std::sqrt(float(s.in));
    for (float& x : b) x = 0.5f * u(rng) / std::sqrt(float(s.rank));
    tensors.push_back({"base_model.model." + s.module + ".lora_A.weight", "F32", {s.rank, s.in}, f32_bytes(a)});
    tensors.push_back({"base_model.model." + s.module + ".lora_B.weight", "F32", {s.out, s.rank}, f32_bytes(b)});
    pairs[s.module] = {a, b};
  }
  write_safetensors(dir / "adapter_model.safetensors", tensors);
  boost::json::object config{{"peft_type", "LORA"}, {"r", specs.empty() ? 8 : specs[0].rank},
                             {"lora_alpha", alpha}, {"use_rslora", rslora}, {"bias", "none"},
                             {"task_type", "CAUSAL_LM"}, {"modules_to_save", nullptr}};
  for (const auto& [k, v] : extra_config) config[k] = v;
  std::ofstream(dir / "adapter_config.json") << boost::json::serialize(config);
  return pairs;
}

/// The LoRA specs of every q/k/v/o/gate/up/down projection of every layer of a Llama-shaped float32 checkpoint
/// folder `model` (one model.safetensors), rank r.
inline std::vector<LoraSpec> every_projection(const std::filesystem::path& model, int rank) {
  std::vector<LoraSpec> specs;
  for (const RawTensor& t : read_safetensors(model / "model.safetensors")) {
    static const char* kProj[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    for (const char* p : kProj)
      if (t.name.size() > 7 && t.name.find(std::string(".") + p + ".weight") != std::string::npos)
        specs.push_back({t.name.substr(0, t.name.size() - 7), t.shape.at(0), t.shape.at(1), rank});
  }
  return specs;
}

/// Copies the float32 checkpoint folder `model` to `merged` with each pair of `pairs` merged into its weight:
/// W + scale * B A, scale alpha / r (alpha / sqrt(r) with rslora).
inline void write_merged_checkpoint(const std::filesystem::path& model, const std::filesystem::path& merged,
                                    const std::vector<LoraSpec>& specs,
                                    const std::map<std::string, std::pair<std::vector<float>, std::vector<float>>>& pairs,
                                    double alpha, bool rslora) {
  std::filesystem::create_directories(merged);
  for (const auto& e : std::filesystem::directory_iterator(model))
    if (e.is_regular_file() && e.path().filename() != "model.safetensors")
      std::filesystem::copy_file(e.path(), merged / e.path().filename(),
                                 std::filesystem::copy_options::overwrite_existing);
  std::vector<RawTensor> tensors = read_safetensors(model / "model.safetensors");
  for (RawTensor& t : tensors) {
    for (const LoraSpec& s : specs) {
      if (t.name != s.module + ".weight") continue;
      REQUIRE(t.dtype == "F32");
      std::vector<float> w = f32_values(t.bytes);
      const auto& [a, b] = pairs.at(s.module);
      const double scale = rslora ? alpha / std::sqrt(double(s.rank)) : alpha / s.rank;
      for (int64_t o = 0; o < s.out; ++o)
        for (int64_t i = 0; i < s.in; ++i) {
          double d = 0.0;
          for (int j = 0; j < s.rank; ++j) d += double(b[o * s.rank + j]) * double(a[j * s.in + i]);
          w[o * s.in + i] = static_cast<float>(double(w[o * s.in + i]) + scale * d);
        }
      t.bytes = f32_bytes(w);
    }
  }
  write_safetensors(merged / "model.safetensors", tensors);
}

}  // namespace paged::test
