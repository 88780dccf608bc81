// The model loader against broken model folders (each a copy of stories260K with one thing broken), sharded and
// bf16/f16 checkpoints written by the test itself, llama3 RoPE scaling against Hugging Face's formula, EOS lists.
// Every broken folder must give a ModelError/TokenizerError whose message names the problem, never a crash.
#include <catch2/catch.hpp>

#include <algorithm>
#include <boost/json.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numbers>
#include <sstream>

#include "model/loader/config.h"
#include "kernels/cpu/cpu_runner.h"
#include "model/loader/safetensors.h"
#include "model/loader/weight_map.h"
#include "model/sampling/sampling_params.h"
#include "model/tokenizer/load_tokenizer.h"
#include "tests/model/loader/safetensors_file.h"
#include "tests/test_data.h"

using namespace paged;
using namespace paged::test;
namespace fs = std::filesystem;
namespace json = boost::json;

namespace {

json::object read_json_object(const fs::path& p) { return json::parse(read_bytes(p)).as_object(); }
void write_json(const fs::path& p, const json::value& v) { write_bytes(p, json::serialize(v)); }

/// A fresh copy of the stories260K folder in a temporary directory, removed at the end of the test.
struct ModelCopy {
  TempDir tmp{"paged_loader_"};
  fs::path dir = tmp.path();
  ModelCopy() {
    for (const char* f : {"config.json", "model.safetensors", "tokenizer.model", "tokenizer_config.json",
                          "generation_config.json"}) {
      fs::copy_file(fs::path(kModel) / f, dir / f);
      fs::permissions(dir / f, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::add);
    }
  }
  std::string path() const { return dir.string(); }
  fs::path operator/(const char* f) const { return dir / f; }
  void edit_config(const std::function<void(json::object&)>& edit, const char* file = "config.json") const {
    json::object o = read_json_object(dir / file);
    edit(o);
    write_json(dir / file, o);
  }
};

// ---- independent bf16 / f16 rounding (round to nearest even through double arithmetic) -----------------------------

/// Rounds x to a binary format with `p` significand bits, smallest normal exponent `emin` (x = 1.f * 2^emin).
double round_to_format(double x, int p, int emin) {
  if (x == 0 || !std::isfinite(x)) return x;
  int e = 0;
  std::frexp(x, &e);                           // x = m * 2^e, |m| in [0.5, 1): unit exponent e - 1
  const int quantum_exp = std::max(e - 1, emin) - (p - 1);
  return std::nearbyint(std::ldexp(x, -quantum_exp)) * std::ldexp(1.0, quantum_exp);  // ties to even
}

uint16_t to_bf16_bits(float x) {
  const float r = static_cast<float>(round_to_format(x, 8, -126));
  uint32_t bits;
  std::memcpy(&bits, &r, 4);
  return static_cast<uint16_t>(bits >> 16);  // exact: r has at most 8 significand bits
}

uint16_t to_f16_bits(float x) {
  const double r = round_to_format(x, 11, -14);
  REQUIRE(std::fabs(r) <= 65504.0);  // the weights are small: no overflow to handle
  const uint16_t sign = std::signbit(r) ? 0x8000 : 0;
  const double a = std::fabs(r);
  if (a < std::ldexp(1.0, -14)) return static_cast<uint16_t>(sign | static_cast<uint16_t>(a * std::ldexp(1.0, 24)));
  int e = 0;
  const double m = std::frexp(a, &e);  // a = m * 2^e = (2m) * 2^(e-1)
  const auto exp_field = static_cast<uint16_t>(e - 1 + 15);
  const auto mant = static_cast<uint16_t>((2 * m - 1) * 1024);
  return static_cast<uint16_t>(sign | exp_field << 10 | mant);
}

/// The float32 tensors of `ts` converted to `dtype` ("BF16" or "F16").
std::vector<RawTensor> convert(std::vector<RawTensor> ts, const std::string& dtype) {
  for (auto& t : ts) {
    REQUIRE(t.dtype == "F32");
    const size_t n = t.bytes.size() / 4;
    std::string out(2 * n, '\0');
    for (size_t i = 0; i < n; ++i) {
      float f;
      std::memcpy(&f, t.bytes.data() + 4 * i, 4);
      const uint16_t h = dtype == "BF16" ? to_bf16_bits(f) : to_f16_bits(f);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
    t.dtype = dtype;
    t.bytes = std::move(out);
  }
  return ts;
}

std::vector<float> floats_of(const RawTensor& t) {
  std::vector<float> v(t.bytes.size() / 4);
  std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
  return v;
}

// ---- loading and running ------------------------------------------------------------------------------------------

/// What the engine does at start-up, in its order: config, tokenizer, weights, the runner's shape checks.
void load_everything(const std::string& dir) {
  ModelConfig cfg = load_model_config(dir);
  auto tok = load_tokenizer(dir);
  SafeTensors w(dir);
  CpuModelRunner runner(cfg, w, {.block_size = 16, .num_blocks = 4});
}

/// The message of the E that `f` throws; fails the test when it throws nothing.
template <class E>
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  FAIL("expected an exception, none was thrown");
  return {};
}

#define CHECK_MODEL_ERROR(dir, ...)                                            \
  do {                                                                         \
    const std::string msg_ = error_of<ModelError>([&] { load_everything(dir); }); \
    INFO("message: " << msg_);                                                 \
    for (const char* part_ : {__VA_ARGS__}) CHECK_THAT(msg_, Catch::Contains(part_)); \
  } while (0)


struct Golden {
  std::vector<std::vector<TokenId>> prompts, greedy;
};

Golden golden() {
  Golden g;
  const json::value doc = json::parse(read_bytes(kGolden));
  for (const auto& c : doc.at("cases").as_array()) {
    g.prompts.push_back(ids_of(c.at("prompt_ids")));
    g.greedy.push_back(ids_of(c.at("greedy_ids")));
  }
  return g;
}

/// Greedy decoding of all prompts in one batch on a runner built from `dir`; also returns the prefill logits.
struct Run {
  std::vector<std::vector<TokenId>> tokens;
  std::vector<std::vector<float>> prefill_logits;
};

Run greedy(const std::string& dir, const std::vector<std::vector<TokenId>>& prompts, int max_tokens) {
  ModelConfig cfg = load_model_config(dir);
  SafeTensors w(dir);
  const int block = 16, per_seq = (128 + max_tokens) / block + 1;
  CpuModelRunner runner(cfg, w, {.block_size = block, .num_blocks = per_seq * static_cast<int>(prompts.size())});
  std::vector<std::vector<int32_t>> tables(prompts.size());
  for (size_t s = 0; s < prompts.size(); ++s)
    for (int b = 0; b < per_seq; ++b) tables[s].push_back(static_cast<int32_t>(s * per_seq + b));
  Run run;
  run.tokens = greedy_on_runner(runner, prompts, max_tokens, tables, &run.prefill_logits);
  return run;
}

size_t common_prefix(const std::vector<TokenId>& a, const std::vector<TokenId>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

}  // namespace

// ---- broken safetensors ------------------------------------------------------------------------------------------

TEST_CASE("loader: a safetensors file whose header length runs beyond the file", "[loader]") {
  ModelCopy m;
  std::string file = read_bytes(m / "model.safetensors");
  const uint64_t huge = file.size() + 100;
  std::memcpy(file.data(), &huge, 8);
  write_bytes(m / "model.safetensors", file);
  CHECK_MODEL_ERROR(m.path(), "model.safetensors", "truncated", "header length");

  write_bytes(m / "model.safetensors", file.substr(0, 5));  // not even the 8-byte length
  CHECK_MODEL_ERROR(m.path(), "model.safetensors", "truncated");

  write_bytes(m / "model.safetensors", "");
  CHECK_MODEL_ERROR(m.path(), "model.safetensors", "truncated");

  const uint64_t max = ~uint64_t{0};  // a length that overflows any naive 8 + n arithmetic
  std::memcpy(file.data(), &max, 8);
  write_bytes(m / "model.safetensors", file);
  CHECK_MODEL_ERROR(m.path(), "model.safetensors", "truncated");
}

TEST_CASE("loader: a safetensors file whose data is cut short", "[loader]") {
  ModelCopy m;
  const std::string file = read_bytes(m / "model.safetensors");
  for (size_t cut : {size_t{1}, size_t{4096}, file.size() / 2}) {
    INFO("cut " << cut << " bytes");
    write_bytes(m / "model.safetensors", std::string_view(file).substr(0, file.size() - cut));
    CHECK_MODEL_ERROR(m.path(), "model.safetensors", "tensor '", "out of range");
  }
}

TEST_CASE("loader: out-of-range or inconsistent data_offsets", "[loader]") {
  ModelCopy m;
  auto tensors = read_safetensors(m / "model.safetensors");
  const std::string victim = "model.layers.3.self_attn.k_proj.weight";
  size_t total = 0;
  for (const auto& t : tensors) total += t.bytes.size();

  SECTION("end beyond the data section") {
    write_safetensors(m / "model.safetensors", tensors, [&](json::object& h) {
      auto& off = h[victim].as_object()["data_offsets"].as_array();
      off[1] = total + 8;
      off[0] = total + 8 - find_tensor(tensors, victim).bytes.size();
    });
    CHECK_MODEL_ERROR(m.path(), victim.c_str(), "data_offsets", "out of range");
  }
  SECTION("begin after end") {
    write_safetensors(m / "model.safetensors", tensors, [&](json::object& h) {
      auto& off = h[victim].as_object()["data_offsets"].as_array();
      std::swap(off[0], off[1]);
    });
    CHECK_MODEL_ERROR(m.path(), victim.c_str(), "data_offsets");
  }
  SECTION("negative offset") {
    write_safetensors(m / "model.safetensors", tensors,
                      [&](json::object& h) { h[victim].as_object()["data_offsets"].as_array()[0] = -16; });
    CHECK_MODEL_ERROR(m.path(), victim.c_str(), "data_offsets");
  }
  SECTION("offsets beyond 2^63") {
    write_safetensors(m / "model.safetensors", tensors, [&](json::object& h) {
      h[victim].as_object()["data_offsets"] = json::array{~uint64_t{0} - 7, ~uint64_t{0}};
    });
    CHECK_MODEL_ERROR(m.path(), victim.c_str(), "data_offsets");
  }
  SECTION("a span that does not match dtype x shape") {
    write_safetensors(m / "model.safetensors", tensors, [&](json::object& h) {
      auto& off = h[victim].as_object()["data_offsets"].as_array();
      off[1] = off[1].to_number<int64_t>() - 4;
    });
    CHECK_MODEL_ERROR(m.path(), victim.c_str(), "does not match");
  }
  SECTION("only two offsets allowed") {
    write_safetensors(m / "model.safetensors", tensors, [&](json::object& h) {
      h[victim].as_object()["data_offsets"].as_array().push_back(0);
    });
    CHECK_MODEL_ERROR(m.path(), victim.c_str(), "data_offsets");
  }
}

TEST_CASE("loader: tensor shapes that disagree with the config", "[loader]") {
  ModelCopy m;
  SECTION("config hidden_size edited") {
    m.edit_config([](json::object& c) { c["hidden_size"] = 128; });
    CHECK_MODEL_ERROR(m.path(), "model.embed_tokens.weight", "[512, 64]", "[512, 128]");
  }
  SECTION("config intermediate_size edited") {
    m.edit_config([](json::object& c) { c["intermediate_size"] = 256; });
    CHECK_MODEL_ERROR(m.path(), "mlp.gate_proj.weight", "[172, 64]", "[256, 64]");
  }
  SECTION("config num_key_value_heads edited") {
    m.edit_config([](json::object& c) { c["num_key_value_heads"] = 8; });
    CHECK_MODEL_ERROR(m.path(), "self_attn.k_proj.weight", "[32, 64]", "[64, 64]");
  }
  SECTION("config num_hidden_layers larger than the checkpoint") {
    m.edit_config([](json::object& c) { c["num_hidden_layers"] = 6; });
    CHECK_MODEL_ERROR(m.path(), "model.layers.5.");
  }
  SECTION("a transposed tensor (same byte count)") {
    auto tensors = read_safetensors(m / "model.safetensors");
    auto& t = find_tensor(tensors, "model.layers.2.mlp.up_proj.weight");
    std::swap(t.shape[0], t.shape[1]);
    write_safetensors(m / "model.safetensors", tensors);
    CHECK_MODEL_ERROR(m.path(), "model.layers.2.mlp.up_proj.weight", "[64, 172]", "[172, 64]");
  }
  SECTION("a shape whose size does not match the bytes") {
    auto tensors = read_safetensors(m / "model.safetensors");
    find_tensor(tensors, "model.norm.weight").shape = {65};
    write_safetensors(m / "model.safetensors", tensors);
    CHECK_MODEL_ERROR(m.path(), "model.norm.weight", "does not match");
  }
  SECTION("a shape whose element count overflows") {
    auto tensors = read_safetensors(m / "model.safetensors");
    // 2^32 * 2^32 wraps to 0 in 64-bit arithmetic: paired with an empty span it must still be refused.
    auto& t = find_tensor(tensors, "model.norm.weight");
    t.shape = {int64_t{1} << 32, int64_t{1} << 32};
    t.bytes.clear();
    write_safetensors(m / "model.safetensors", tensors);
    // Refused by the safetensors reader itself, before any config check could catch it.
    const std::string msg = error_of<ModelError>([&] { SafeTensors w(m.path()); });
    CHECK_THAT(msg, Catch::Contains("model.norm.weight") && Catch::Contains("shape"));
  }
  SECTION("a tensor missing from the checkpoint") {
    auto tensors = read_safetensors(m / "model.safetensors");
    tensors.erase(std::find_if(tensors.begin(), tensors.end(),
                               [](const RawTensor& t) { return t.name == "model.layers.4.mlp.down_proj.weight"; }));
    write_safetensors(m / "model.safetensors", tensors);
    CHECK_MODEL_ERROR(m.path(), "model.layers.4.mlp.down_proj.weight");
  }
  SECTION("untied embeddings without lm_head.weight") {
    m.edit_config([](json::object& c) { c["tie_word_embeddings"] = false; });
    CHECK_MODEL_ERROR(m.path(), "lm_head.weight");
  }
}

TEST_CASE("loader: malformed safetensors headers", "[loader]") {
  ModelCopy m;
  std::string file = read_bytes(m / "model.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  SECTION("not JSON") {
    std::fill(file.begin() + 8, file.begin() + 8 + static_cast<int64_t>(n) / 2, '#');
    write_bytes(m / "model.safetensors", file);
    CHECK_MODEL_ERROR(m.path(), "model.safetensors", "malformed JSON header");
  }
  SECTION("JSON cut in the middle") {
    file[8 + n / 2] = '\0';
    write_bytes(m / "model.safetensors", file);
    CHECK_MODEL_ERROR(m.path(), "model.safetensors", "malformed JSON header");
  }
  SECTION("not an object") {
    std::string h = "[1, 2, 3]";
    h.resize(n, ' ');
    file.replace(8, n, h);
    write_bytes(m / "model.safetensors", file);
    CHECK_MODEL_ERROR(m.path(), "model.safetensors", "malformed JSON header");
  }
  SECTION("an entry without dtype") {
    auto tensors = read_safetensors(m / "model.safetensors");
    write_safetensors(m / "model.safetensors", tensors,
                      [](json::object& h) { h["model.norm.weight"].as_object().erase("dtype"); });
    CHECK_MODEL_ERROR(m.path(), "model.norm.weight", "dtype");
  }
  SECTION("an entry that is not an object") {
    auto tensors = read_safetensors(m / "model.safetensors");
    write_safetensors(m / "model.safetensors", tensors, [](json::object& h) { h["model.norm.weight"] = 7; });
    CHECK_MODEL_ERROR(m.path(), "model.norm.weight");
  }
  SECTION("a shape with a negative or non-integer dimension") {
    auto tensors = read_safetensors(m / "model.safetensors");
    write_safetensors(m / "model.safetensors", tensors,
                      [](json::object& h) { h["model.norm.weight"].as_object()["shape"] = json::array{-64}; });
    CHECK_MODEL_ERROR(m.path(), "model.norm.weight", "shape");
    write_safetensors(m / "model.safetensors", tensors,
                      [](json::object& h) { h["model.norm.weight"].as_object()["shape"] = json::array{"64"}; });
    CHECK_MODEL_ERROR(m.path(), "model.norm.weight", "shape");
  }
}

TEST_CASE("loader: unsupported dtypes", "[loader]") {
  ModelCopy m;
  auto tensors = read_safetensors(m / "model.safetensors");
  for (const char* dtype : {"F64", "I8", "F8_E8M0", "int8", "f32"}) {  // F8_E4M3: test_fp8_checkpoint.cpp
    INFO(dtype);
    write_safetensors(m / "model.safetensors", tensors,
                      [&](json::object& h) { h["model.layers.1.self_attn.v_proj.weight"].as_object()["dtype"] = dtype; });
    CHECK_MODEL_ERROR(m.path(), "model.layers.1.self_attn.v_proj.weight", "unsupported dtype", dtype);
  }
}

TEST_CASE("loader: no weights at all", "[loader]") {
  ModelCopy m;
  fs::remove(m / "model.safetensors");
  CHECK_MODEL_ERROR(m.path(), "model.safetensors");
  CHECK_THAT(error_of<ModelError>([&] { load_everything(m.path() + "/nonexistent"); }),
             Catch::Contains("model directory not found"));
}

// ---- config.json -------------------------------------------------------------------------------------------------

TEST_CASE("loader: unsupported architectures and model types", "[loader]") {
  ModelCopy m;
  SECTION("model_type") {
    m.edit_config([](json::object& c) { c["model_type"] = "gpt2"; });
    CHECK_MODEL_ERROR(m.path(), "model_type", "gpt2");
  }
  SECTION("architectures") {
    m.edit_config([](json::object& c) { c["architectures"] = json::array{"MambaForCausalLM"}; });
    CHECK_MODEL_ERROR(m.path(), "architectures", "MambaForCausalLM");
  }
  SECTION("no model_type") {
    m.edit_config([](json::object& c) { c.erase("model_type"); });
    CHECK_MODEL_ERROR(m.path(), "model_type");
  }
  SECTION("unsupported activation") {
    m.edit_config([](json::object& c) { c["hidden_act"] = "gelu"; });
    CHECK_MODEL_ERROR(m.path(), "hidden_act");
  }
  SECTION("mlp bias") {
    m.edit_config([](json::object& c) { c["mlp_bias"] = true; });
    CHECK_MODEL_ERROR(m.path(), "mlp_bias");
  }
}

TEST_CASE("loader: missing or invalid config fields", "[loader]") {
  ModelCopy m;
  SECTION("required integer fields") {
    for (const char* field : {"hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                              "vocab_size", "max_position_embeddings"}) {
      INFO(field);
      const std::string saved = read_bytes(m / "config.json");
      m.edit_config([&](json::object& c) { c.erase(field); });
      CHECK_MODEL_ERROR(m.path(), "missing", field);
      m.edit_config([&](json::object& c) { c[field] = "64"; });
      CHECK_MODEL_ERROR(m.path(), field, "number");
      m.edit_config([&](json::object& c) { c[field] = 0; });
      CHECK_MODEL_ERROR(m.path(), field, "positive integer");
      m.edit_config([&](json::object& c) { c[field] = 2.5; });
      CHECK_MODEL_ERROR(m.path(), field, "positive integer");
      write_bytes(m / "config.json", saved);
    }
  }
  SECTION("heads not a multiple of KV heads") {
    m.edit_config([](json::object& c) { c["num_key_value_heads"] = 3; });
    CHECK_MODEL_ERROR(m.path(), "num_key_value_heads");
  }
  SECTION("a boolean field of the wrong type") {
    m.edit_config([](json::object& c) { c["tie_word_embeddings"] = "yes"; });
    CHECK_MODEL_ERROR(m.path(), "tie_word_embeddings");
  }
  SECTION("rope_theta not a number") {
    m.edit_config([](json::object& c) { c["rope_theta"] = json::array{1}; });
    CHECK_MODEL_ERROR(m.path(), "rope_theta");
  }
  SECTION("malformed config.json") {
    write_bytes(m / "config.json", "{\"model_type\": \"llama\", ");
    CHECK_MODEL_ERROR(m.path(), "config.json", "malformed JSON");
  }
  SECTION("config.json is not an object") {
    write_bytes(m / "config.json", "[]");
    CHECK_MODEL_ERROR(m.path(), "config.json");
  }
  SECTION("no config.json") {
    fs::remove(m / "config.json");
    CHECK_MODEL_ERROR(m.path(), "config.json");
  }
  SECTION("malformed generation_config.json") {
    write_bytes(m / "generation_config.json", "{eos_token_id: 2}");
    CHECK_MODEL_ERROR(m.path(), "generation_config.json", "malformed JSON");
  }
}

TEST_CASE("loader: unsupported rope_scaling", "[loader]") {
  ModelCopy m;
  SECTION("yarn") {
    m.edit_config([](json::object& c) { c["rope_scaling"] = json::object{{"rope_type", "yarn"}, {"factor", 4.0}}; });
    CHECK_MODEL_ERROR(m.path(), "rope_scaling", "yarn");
  }
  SECTION("dynamic, old 'type' key") {
    m.edit_config([](json::object& c) { c["rope_scaling"] = json::object{{"type", "dynamic"}, {"factor", 2.0}}; });
    CHECK_MODEL_ERROR(m.path(), "rope_scaling", "dynamic");
  }
  SECTION("no type") {
    m.edit_config([](json::object& c) { c["rope_scaling"] = json::object{{"factor", 2.0}}; });
    CHECK_MODEL_ERROR(m.path(), "rope_scaling");
  }
  SECTION("not an object") {
    m.edit_config([](json::object& c) { c["rope_scaling"] = "llama3"; });
    CHECK_MODEL_ERROR(m.path(), "rope_scaling");
  }
  SECTION("llama3 without low_freq_factor") {
    m.edit_config([](json::object& c) {
      c["rope_scaling"] = json::object{{"rope_type", "llama3"}, {"factor", 8.0}, {"high_freq_factor", 4.0},
                                       {"original_max_position_embeddings", 256}};
    });
    CHECK_MODEL_ERROR(m.path(), "rope_scaling", "low_freq_factor");
  }
  SECTION("llama3 with parameters that make the formula divide by zero") {
    m.edit_config([](json::object& c) {
      c["rope_scaling"] = json::object{{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 4.0},
                                       {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 256}};
    });
    CHECK_MODEL_ERROR(m.path(), "rope_scaling", "high_freq_factor");
    m.edit_config([](json::object& c) { c["rope_scaling"].as_object()["high_freq_factor"] = 8.0; });
    REQUIRE_NOTHROW(load_everything(m.path()));
    m.edit_config([](json::object& c) { c["rope_scaling"].as_object()["factor"] = 0.0; });
    CHECK_MODEL_ERROR(m.path(), "rope_scaling", "factor");
    m.edit_config([](json::object& c) {
      c["rope_scaling"].as_object()["factor"] = 8.0;
      c["rope_scaling"].as_object()["original_max_position_embeddings"] = 0;
    });
    CHECK_MODEL_ERROR(m.path(), "rope_scaling", "original_max_position_embeddings");
  }
  SECTION("default type is accepted") {
    m.edit_config([](json::object& c) { c["rope_scaling"] = json::object{{"rope_type", "default"}}; });
    REQUIRE_NOTHROW(load_everything(m.path()));
  }
}

// ---- tokenizer ---------------------------------------------------------------------------------------------------

TEST_CASE("loader: missing or broken tokenizer", "[loader]") {
  ModelCopy m;
  SECTION("no tokenizer file") {
    fs::remove(m / "tokenizer.model");
    const std::string msg = error_of<TokenizerError>([&] { load_everything(m.path()); });
    CHECK_THAT(msg, Catch::Contains("no tokenizer") && Catch::Contains("tokenizer.model"));
  }
  SECTION("tokenizer.model is garbage") {
    write_bytes(m / "tokenizer.model", "this is not a sentencepiece model");
    const std::string msg = error_of<TokenizerError>([&] { load_everything(m.path()); });
    CHECK_THAT(msg, Catch::Contains("tokenizer.model"));
  }
  SECTION("tokenizer.model is empty") {
    write_bytes(m / "tokenizer.model", "");
    const std::string msg = error_of<TokenizerError>([&] { load_everything(m.path()); });
    CHECK_THAT(msg, Catch::Contains("tokenizer.model"));
  }
  SECTION("malformed tokenizer_config.json") {
    write_bytes(m / "tokenizer_config.json", "{\"add_bos_token\": tru");
    const std::string msg = error_of<TokenizerError>([&] { load_everything(m.path()); });
    CHECK_THAT(msg, Catch::Contains("tokenizer_config.json"));
  }
  SECTION("malformed tokenizer.json without a tokenizer.model to fall back on") {
    fs::remove(m / "tokenizer.model");
    write_bytes(m / "tokenizer.json", "{\"model\": ");
    const std::string msg = error_of<TokenizerError>([&] { load_everything(m.path()); });
    CHECK_THAT(msg, Catch::Contains("tokenizer.json"));
  }
  SECTION("invalid UTF-8 is refused by encode") {
    auto tok = load_tokenizer(m.path());
    for (std::string bad : {std::string("Once upon \xff a time"), std::string("\xc3"), std::string("\xed\xa0\x80"),
                            std::string("\xc0\xaf"), std::string("ok \xf4\x90\x80\x80")}) {
      const std::string msg = error_of<TokenizerError>([&] { tok->encode(bad, true); });
      CHECK_THAT(msg, Catch::Contains("UTF-8"));
    }
  }
}

// ---- sharded checkpoints ------------------------------------------------------------------------------------------

TEST_CASE("loader: a checkpoint split into shards loads and computes exactly as the single file", "[loader]") {
  ModelCopy m;
  const auto tensors = read_safetensors(m / "model.safetensors");
  REQUIRE(tensors.size() > 2);
  // Interleave the tensors over two shards so that every layer spans both files.
  std::vector<RawTensor> shard[2];
  json::object weight_map;
  const char* names[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
  for (size_t i = 0; i < tensors.size(); ++i) {
    shard[i % 2].push_back(tensors[i]);
    weight_map[tensors[i].name] = names[i % 2];
  }
  fs::remove(m / "model.safetensors");
  for (int s = 0; s < 2; ++s) write_safetensors(m.dir / names[s], shard[s]);
  write_json(m / "model.safetensors.index.json",
             json::object{{"metadata", json::object{{"total_size", 0}}}, {"weight_map", weight_map}});

  {
    SafeTensors single(kModel), sharded(m.path());
    REQUIRE(sharded.tensors().size() == single.tensors().size());
    for (const auto& [name, t] : single.tensors()) {
      INFO(name);
      REQUIRE(sharded.contains(name));
      const TensorView& u = sharded.get(name);
      CHECK(u.shape == t.shape);
      CHECK(u.dtype == t.dtype);
      REQUIRE(u.nbytes == t.nbytes);
      CHECK(std::memcmp(u.data, t.data, t.nbytes) == 0);
    }
  }
  const Golden g = golden();
  const Run a = greedy(kModel, g.prompts, 64), b = greedy(m.path(), g.prompts, 64);
  CHECK(b.prefill_logits == a.prefill_logits);  // bit for bit: same float32 weights, same arithmetic
  for (size_t i = 0; i < g.prompts.size(); ++i) {
    INFO("case " << i);
    CHECK(b.tokens[i] == a.tokens[i]);
    CHECK(b.tokens[i] == g.greedy[i]);
  }

  SECTION("a shard named in the index is missing") {
    fs::remove(m.dir / names[1]);
    CHECK_MODEL_ERROR(m.path(), names[1]);
  }
  SECTION("the index points at a shard that lacks the tensor") {
    // Move one tensor out of shard 2 while the index still names shard 2 for it.
    const std::string name = shard[1].back().name;
    shard[1].pop_back();
    write_safetensors(m.dir / names[1], shard[1]);
    CHECK_MODEL_ERROR(m.path(), name.c_str());
  }
  SECTION("a tensor present in two shards") {
    shard[1].push_back(shard[0].front());
    write_safetensors(m.dir / names[1], shard[1]);
    CHECK_MODEL_ERROR(m.path(), shard[0].front().name.c_str(), "duplicated");
  }
  SECTION("a malformed index") {
    write_bytes(m / "model.safetensors.index.json", "{\"weight_map\": [1, 2]}");
    CHECK_MODEL_ERROR(m.path(), "model.safetensors.index.json");
    write_bytes(m / "model.safetensors.index.json", "not json");
    CHECK_MODEL_ERROR(m.path(), "model.safetensors.index.json");
  }
  SECTION("an index naming a shard outside the folder") {
    weight_map[tensors[0].name] = "../model.safetensors";
    write_json(m / "model.safetensors.index.json", json::object{{"weight_map", weight_map}});
    CHECK_MODEL_ERROR(m.path(), "model.safetensors.index.json", "../model.safetensors");
  }
}

// ---- bf16 / f16 checkpoints ---------------------------------------------------------------------------------------

TEST_CASE("loader: bf16 and f16 checkpoints are converted to float32 correctly", "[loader]") {
  const auto f32 = read_safetensors(fs::path(kModel) / "model.safetensors");
  const Golden g = golden();
  const Run reference = greedy(kModel, g.prompts, 64);
  for (const std::string dtype : {"BF16", "F16"}) {
    INFO(dtype);
    ModelCopy m;
    const auto half = convert(f32, dtype);
    write_safetensors(m / "model.safetensors", half);
    m.edit_config([&](json::object& c) { c["torch_dtype"] = dtype == "BF16" ? "bfloat16" : "float16"; });
    CHECK(load_model_config(m.path()).torch_dtype == (dtype == "BF16" ? "bfloat16" : "float16"));

    // The loader's conversion of every tensor: exactly the half value the test wrote, and that value is the float32
    // original within half an ulp (relative 2^-8 for bf16's 8 significant bits, 2^-11 for f16's 11, plus half f16's
    // subnormal spacing 2^-24 near zero).
    SafeTensors w(m.path());
    const double rel = dtype == "BF16" ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    const double abs = dtype == "BF16" ? 0.0 : std::ldexp(1.0, -25);
    size_t checked = 0, changed = 0;
    for (size_t k = 0; k < f32.size(); ++k) {
      INFO(f32[k].name);
      REQUIRE(w.get(f32[k].name).dtype == (dtype == "BF16" ? DType::bf16 : DType::f16));
      const std::vector<int64_t>& shape = f32[k].shape;
      const TensorShard whole{.name = f32[k].name, .shape = shape, .rows = shape.size() == 2 ? shape[0] : 1,
                              .cols = shape.back()};
      const std::vector<float> orig = floats_of(f32[k]), conv = read_shard_f32(w, whole);
      REQUIRE(conv.size() == orig.size());
      for (size_t i = 0; i < orig.size(); ++i) {
        uint16_t bits;
        std::memcpy(&bits, half[k].bytes.data() + 2 * i, 2);
        const double expected = round_to_format(orig[i], dtype == "BF16" ? 8 : 11, dtype == "BF16" ? -126 : -14);
        if (conv[i] != expected || std::fabs(conv[i] - orig[i]) > std::fabs(orig[i]) * rel + abs) {
          FAIL_CHECK("element " << i << ": float32 " << orig[i] << " -> " << dtype << " bits " << bits
                                << " loaded as " << conv[i] << ", expected " << expected);
          break;
        }
        changed += conv[i] != orig[i];
        ++checked;
      }
    }
    CHECK(checked > 200000);
    CHECK(changed > checked / 2);  // the conversion really lost precision: the comparison above is not vacuous

    // The paged library's own converters agree with the test's rounding (round to nearest even).
    for (const auto& t : f32) {
      for (float x : floats_of(t)) {
        const uint16_t mine = dtype == "BF16" ? to_bf16_bits(x) : to_f16_bits(x);
        const uint16_t theirs = dtype == "BF16" ? float_to_bf16(x) : float_to_f16(x);
        if (mine != theirs) {
          FAIL_CHECK(dtype << " of " << x << ": test " << mine << ", library " << theirs);
          break;
        }
      }
    }

    // Greedy decoding on the golden prompts mostly agrees with float32. Measured on stories260K: bf16 and f16 both
    // reproduce all 64 tokens of every case; the floor leaves room for a different summation order in the kernels.
    const Run run = greedy(m.path(), g.prompts, 64);
    size_t identical = 0;
    for (size_t i = 0; i < g.prompts.size(); ++i) {
      const size_t prefix = common_prefix(run.tokens[i], reference.tokens[i]);
      INFO("case " << i << ": the first " << prefix << " tokens agree with float32");
      CHECK(prefix >= 16);
      identical += run.tokens[i] == reference.tokens[i];
    }
    CHECK(identical >= (dtype == "BF16" ? 3u : 4u));
    // Prefill logits stay close to float32.
    for (size_t i = 0; i < g.prompts.size(); ++i) {
      double max_diff = 0, max_abs = 0;
      for (size_t v = 0; v < reference.prefill_logits[i].size(); ++v) {
        max_diff = std::max(max_diff, double(std::fabs(run.prefill_logits[i][v] - reference.prefill_logits[i][v])));
        max_abs = std::max(max_abs, double(std::fabs(reference.prefill_logits[i][v])));
      }
      INFO("case " << i << " max |logit diff| " << max_diff << " of max |logit| " << max_abs);
      CHECK(max_diff < (dtype == "BF16" ? 0.02 : 0.003) * max_abs);  // measured: 0.0064 and 0.0007
    }
  }
}

// ---- llama3 RoPE scaling -------------------------------------------------------------------------------------------

namespace {

/// transformers' _compute_llama3_parameters, transcribed: default inverse frequencies, then `where` masks.
std::vector<double> hf_llama3_inv_freq(double base, int dim, double factor, double low_freq_factor,
                                       double high_freq_factor, double old_context_len) {
  std::vector<double> inv_freq;
  for (int i = 0; i < dim; i += 2) inv_freq.push_back(1.0 / std::pow(base, static_cast<double>(i) / dim));
  const double low_freq_wavelen = old_context_len / low_freq_factor;
  const double high_freq_wavelen = old_context_len / high_freq_factor;
  std::vector<double> out;
  for (double f : inv_freq) {
    const double wavelen = 2 * std::numbers::pi / f;
    const double inv_freq_llama = wavelen > low_freq_wavelen ? f / factor : f;
    const double smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
    const double smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama;
    const bool is_medium_freq = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    out.push_back(is_medium_freq ? smoothed : inv_freq_llama);
  }
  return out;
}

}  // namespace

TEST_CASE("loader: llama3 rope_scaling gives Hugging Face's inverse frequencies", "[loader]") {
  struct Case {
    int hidden, heads, kv_heads, head_dim;
    double theta, factor, low, high;
    int orig;
  };
  // Llama 3.1 8B's real values, and small ones that put stories260K-sized heads in every band.
  for (const Case& k : {Case{4096, 32, 8, 128, 500000.0, 8.0, 1.0, 4.0, 8192},
                        Case{3072, 24, 8, 128, 500000.0, 32.0, 1.0, 4.0, 8192},
                        Case{64, 8, 4, 8, 10000.0, 4.0, 1.0, 4.0, 2048},
                        Case{256, 4, 4, 64, 10000.0, 2.0, 2.0, 8.0, 512}}) {
    ModelCopy m;
    m.edit_config([&](json::object& c) {
      c["hidden_size"] = k.hidden;
      c["num_attention_heads"] = k.heads;
      c["num_key_value_heads"] = k.kv_heads;
      c["head_dim"] = k.head_dim;
      c["rope_theta"] = k.theta;
      c["rope_scaling"] = json::object{{"rope_type", "llama3"},
                                       {"factor", k.factor},
                                       {"low_freq_factor", k.low},
                                       {"high_freq_factor", k.high},
                                       {"original_max_position_embeddings", k.orig}};
    });
    const ModelConfig cfg = load_model_config(m.path());
    REQUIRE(cfg.rope_scaling.llama3);
    const std::vector<float> got = cfg.rope_inv_freq();
    const std::vector<double> want = hf_llama3_inv_freq(k.theta, k.head_dim, k.factor, k.low, k.high, k.orig);
    REQUIRE(got.size() == want.size());
    int low = 0, medium = 0, high = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      INFO("head_dim " << k.head_dim << " index " << i);
      CHECK(std::fabs(got[i] - want[i]) <= 1e-6 * want[i]);
      const double plain = 1.0 / std::pow(k.theta, 2.0 * i / k.head_dim);
      if (std::fabs(want[i] - plain) <= 1e-12 * plain) ++high;
      else if (std::fabs(want[i] - plain / k.factor) <= 1e-12 * plain) ++low;
      else ++medium;
    }
    INFO("bands: " << high << " kept, " << medium << " blended, " << low << " divided");
    CHECK(high > 0);
    CHECK(low > 0);
    if (k.head_dim >= 64) CHECK(medium > 0);
  }
  // Without scaling, the plain frequencies.
  const ModelConfig plain = load_model_config(kModel);
  const auto f = plain.rope_inv_freq();
  REQUIRE(f.size() == 4);
  for (int i = 0; i < 4; ++i) CHECK(f[i] == Approx(1.0 / std::pow(10000.0, i / 4.0)).epsilon(1e-6));
}

// ---- EOS ids -------------------------------------------------------------------------------------------------------

TEST_CASE("loader: eos_token_id as a list, merged with generation_config.json", "[loader]") {
  ModelCopy m;
  SECTION("lists in both files, merged in order without duplicates") {
    m.edit_config([](json::object& c) { c["eos_token_id"] = json::array{2, 7}; });
    m.edit_config([](json::object& c) { c["eos_token_id"] = json::array{7, 9, 2}; }, "generation_config.json");
    CHECK(load_model_config(m.path()).eos_token_ids == std::vector<TokenId>{2, 7, 9});
  }
  SECTION("an int in config.json and a list in generation_config.json") {
    m.edit_config([](json::object& c) { c["eos_token_id"] = json::array{2, 3}; }, "generation_config.json");
    CHECK(load_model_config(m.path()).eos_token_ids == std::vector<TokenId>{2, 3});
  }
  SECTION("none in config.json, only in generation_config.json") {
    m.edit_config([](json::object& c) { c.erase("eos_token_id"); });
    m.edit_config([](json::object& c) { c["eos_token_id"] = json::array{5}; }, "generation_config.json");
    CHECK(load_model_config(m.path()).eos_token_ids == std::vector<TokenId>{5});
  }
  SECTION("no generation_config.json") {
    fs::remove(m / "generation_config.json");
    m.edit_config([](json::object& c) { c["eos_token_id"] = json::array{2, 4}; });
    CHECK(load_model_config(m.path()).eos_token_ids == std::vector<TokenId>{2, 4});
  }
  SECTION("a non-integer entry is named") {
    m.edit_config([](json::object& c) { c["eos_token_id"] = json::array{2, "</s>"}; });
    CHECK_MODEL_ERROR(m.path(), "eos_token_id");
  }
  SECTION("a non-integer entry in generation_config.json is named") {
    m.edit_config([](json::object& c) { c["eos_token_id"] = 2.5; }, "generation_config.json");
    CHECK_MODEL_ERROR(m.path(), "generation_config.json", "eos_token_id");
  }
}

