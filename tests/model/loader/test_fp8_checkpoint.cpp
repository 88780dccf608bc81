// Pre-quantised FP8 checkpoints (model/loader/fp8_checkpoint.h): config.json's quantization_config in the layouts
// vLLM / AutoFP8, transformers' FineGrainedFP8 and compressed-tensors write, each unsupported field refused with its
// name and value; safetensors' F8_E4M3 tensors and the scales beside them, dequantised by read_shard_f32 and checked
// against products computed here.
#include <catch2/catch.hpp>

#include <boost/json.hpp>
#include <cmath>
#include <cstring>

#include "model/loader/config.h"
#include "model/loader/fp8_checkpoint.h"
#include "model/loader/safetensors.h"
#include "model/loader/weight_map.h"
#include "tests/model/loader/safetensors_file.h"
#include "tests/test_data.h"

using namespace paged;
namespace json = boost::json;

namespace {

// stories260K's config.json with `quantization_config` set to the JSON text `qc`, in a fresh folder.
struct QuantisedConfig {
  test::TempDir dir{"paged-fp8-config-"};
  explicit QuantisedConfig(const std::string& qc, const std::string& key = "quantization_config") {
    json::object config = test::read_json(test::kModel + "/config.json").as_object();
    config[key] = json::parse(qc);
    test::write_bytes(dir.path() / "config.json", json::serialize(config));
  }
  ModelConfig load() const { return load_model_config(dir.path().string()); }
};

const std::string kCtWeights =
    R"("weights": {"num_bits": 8, "type": "float", "symmetric": true, "strategy": "channel", "dynamic": false,
                   "group_size": null, "block_structure": null, "actorder": null, "observer": "minmax",
                   "observer_kwargs": {}})";
const std::string kCtTokenInputs =
    R"("input_activations": {"num_bits": 8, "type": "float", "symmetric": true, "strategy": "token",
                             "dynamic": true, "observer": null})";

// A compressed-tensors quantization_config with one group of `weights` and `inputs` (JSON members), and `extra`
// top-level members (by default its status and KV cache scheme as llm-compressor writes them).
std::string compressed_tensors(const std::string& weights, const std::string& inputs,
                               const std::string& extra = R"(, "quantization_status": "compressed",
                                                            "kv_cache_scheme": null)") {
  return R"({"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
             "config_groups": {"group_0": {"targets": ["Linear"], )" +
         weights + ", " + inputs + R"(, "output_activations": null, "format": "float-quantized"}})" + extra + "}";
}

std::string raw_floats(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

}  // namespace

TEST_CASE("quantization_config: the FP8 layouts people publish parse into their scales and activation schemes",
          "[fp8ckpt][loader]") {
  SECTION("no quantization_config: not an FP8 checkpoint") {
    CHECK_FALSE(load_model_config(test::kModel).fp8_checkpoint.enabled);
  }
  SECTION("vLLM / AutoFP8: per tensor, static activations") {
    const Fp8Checkpoint q =
        QuantisedConfig(R"({"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head"]})")
            .load()
            .fp8_checkpoint;
    CHECK(q.enabled);
    CHECK(q.method == "fp8");
    CHECK(q.layout == Fp8ScaleLayout::tensor);
    CHECK(q.scale_suffix == "weight_scale");
    CHECK(q.static_activations);
    CHECK(q.activation_group == 0);
  }
  SECTION("transformers' FineGrainedFP8 (Qwen3-*-FP8, DeepSeek-V3): 128 x 128 blocks, weight_scale_inv") {
    const Fp8Checkpoint q = QuantisedConfig(R"({"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
        "weight_block_size": [128, 64], "modules_to_not_convert": null})")
                                .load()
                                .fp8_checkpoint;
    CHECK(q.layout == Fp8ScaleLayout::block);
    CHECK(q.block_rows == 128);
    CHECK(q.block_cols == 64);
    CHECK(q.scale_suffix == "weight_scale_inv");
    CHECK_FALSE(q.static_activations);
    CHECK(q.activation_group == 64);
  }
  SECTION("compressed-tensors: channel / token dynamic, tensor / tensor static, block / group dynamic") {
    const Fp8Checkpoint channel = QuantisedConfig(compressed_tensors(kCtWeights, kCtTokenInputs)).load().fp8_checkpoint;
    CHECK(channel.method == "compressed-tensors");
    CHECK(channel.layout == Fp8ScaleLayout::channel);
    CHECK(channel.scale_suffix == "weight_scale");
    CHECK_FALSE(channel.static_activations);
    const Fp8Checkpoint tensor = QuantisedConfig(compressed_tensors(
        R"("weights": {"num_bits": 8, "type": "float", "symmetric": true, "strategy": "tensor", "dynamic": false})",
        R"("input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": false})"))
                                     .load()
                                     .fp8_checkpoint;
    CHECK(tensor.layout == Fp8ScaleLayout::tensor);
    CHECK(tensor.static_activations);
    const Fp8Checkpoint block = QuantisedConfig(compressed_tensors(
        R"("weights": {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]})",
        R"("input_activations": {"num_bits": 8, "type": "float", "strategy": "group", "group_size": 128,
                                 "dynamic": true})"))
                                    .load()
                                    .fp8_checkpoint;
    CHECK(block.layout == Fp8ScaleLayout::block);
    CHECK(block.block_rows == 128);
    CHECK(block.scale_suffix == "weight_scale");
    CHECK(block.activation_group == 128);
    const Fp8Checkpoint inferred = QuantisedConfig(compressed_tensors(  // no strategy: group_size -1 is channel
        R"("weights": {"num_bits": 8, "type": "float", "group_size": -1})", R"("input_activations": null)"))
                                       .load()
                                       .fp8_checkpoint;
    CHECK(inferred.layout == Fp8ScaleLayout::channel);
  }
  SECTION("compressed-tensors with llm-compressor's metadata: a dense sparsity config, ratio, version") {
    const Fp8Checkpoint q = QuantisedConfig(compressed_tensors(kCtWeights, kCtTokenInputs, R"(,
        "quantization_status": "compressed", "kv_cache_scheme": null, "global_compression_ratio": 1.4637,
        "version": "0.9.1", "sparsity_config": {"format": "dense", "global_sparsity": 0.14, "ignore": [],
        "registry_requires_subclass": false, "sparsity_structure": "unstructured", "targets": []})"))
                                .load()
                                .fp8_checkpoint;
    CHECK(q.layout == Fp8ScaleLayout::channel);
    const Fp8Checkpoint empty = QuantisedConfig(compressed_tensors(kCtWeights, kCtTokenInputs,
                                                                   R"(, "sparsity_config": {})"))
                                    .load()
                                    .fp8_checkpoint;
    CHECK(empty.enabled);
  }
  SECTION("the startup line says how the weights load and that activations go per token") {
    const Fp8Checkpoint q =
        QuantisedConfig(R"({"quant_method": "fp8", "activation_scheme": "static"})").load().fp8_checkpoint;
    CHECK_THAT(q.describe(true, "bfloat16"), Catch::Contains("loaded as they are") &&
                                                 Catch::Contains("per token") && Catch::Contains("input_scale"));
    CHECK_THAT(q.describe(false, "float32"), Catch::Contains("dequantised to float32"));
    const Fp8Checkpoint b =
        QuantisedConfig(R"({"quant_method": "fp8", "weight_block_size": [128, 128]})").load().fp8_checkpoint;
    CHECK_THAT(b.describe(true, "bfloat16"), Catch::Contains("128x128") && Catch::Contains("quantised again per output"));
  }
}

TEST_CASE("quantization_config: anything else is refused with one line naming the field and its value",
          "[fp8ckpt][loader]") {
  const auto refused = [](const std::string& qc, const std::string& field, const std::string& value) {
    INFO(qc);
    CHECK_THROWS_WITH(QuantisedConfig(qc).load(),
                      Catch::Contains("unsupported quantization_config." + field + " = " + value));
  };
  refused(R"({"quant_method": "gptq", "bits": 4})", "quant_method", "\"gptq\"");
  refused(R"({"quant_method": "fp8", "fmt": "e5m2"})", "fmt", "\"e5m2\"");
  refused(R"({"quant_method": "fp8", "activation_scheme": "per_head"})", "activation_scheme", "\"per_head\"");
  refused(R"({"quant_method": "fp8", "weight_block_size": [128]})", "weight_block_size", "[128]");
  refused(R"({"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]})",
          "activation_scheme", "\"static\"");
  refused(R"({"quant_method": "fp8", "kv_cache_scheme": {"num_bits": 8}})", "kv_cache_scheme", "{\"num_bits\":8}");
  refused(R"({"quant_method": "fp8", "group_size": 64})", "group_size", "64");
  refused(R"({"quant_method": "fp8", "ignored_layers": "lm_head"})", "ignored_layers", "\"lm_head\"");
  refused(compressed_tensors(kCtWeights, kCtTokenInputs, R"(, "kv_cache_scheme": {"num_bits": 8, "type": "float"})"),
          "kv_cache_scheme", "{\"num_bits\":8,\"type\":\"float\"}");
  const std::string groups = "config_groups.group_0.";
  refused(compressed_tensors(R"("weights": {"num_bits": 8, "type": "int", "strategy": "channel"})", kCtTokenInputs),
          groups + "weights.type", "\"int\"");
  refused(compressed_tensors(R"("weights": {"num_bits": 4, "type": "float", "strategy": "channel"})", kCtTokenInputs),
          groups + "weights.num_bits", "4");
  refused(compressed_tensors(R"("weights": {"num_bits": 8, "type": "float", "symmetric": false})", kCtTokenInputs),
          groups + "weights.symmetric", "false");
  refused(compressed_tensors(R"("weights": {"num_bits": 8, "type": "float", "strategy": "group", "group_size": 128})",
                             kCtTokenInputs),
          groups + "weights.strategy", "\"group\"");
  refused(compressed_tensors(R"("weights": {"num_bits": 8, "type": "float", "strategy": "channel", "actorder": "group"})",
                             kCtTokenInputs),
          groups + "weights.actorder", "\"group\"");
  refused(compressed_tensors(kCtWeights, R"("input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                                                   "dynamic": false})"),
          groups + "input_activations.strategy", "\"token\"");
  refused(compressed_tensors(kCtWeights, R"("input_activations": {"num_bits": 8, "type": "int", "strategy": "token",
                                                                   "dynamic": true})"),
          groups + "input_activations.type", "\"int\"");
  refused(compressed_tensors(kCtWeights, kCtTokenInputs + R"(, "unknown_option": 1)"), groups + "unknown_option", "1");
  refused(R"({"quant_method": "compressed-tensors", "format": "int-quantized", "config_groups": {}})", "format",
          "\"int-quantized\"");
  refused(compressed_tensors(kCtWeights, kCtTokenInputs, R"(, "quantization_status": "frozen")"),
          "quantization_status", "\"frozen\"");
  refused(compressed_tensors(kCtWeights, kCtTokenInputs,
                             R"(, "sparsity_config": {"format": "sparse-24-bitmask"})"),
          "sparsity_config", "{\"format\":\"sparse-24-bitmask\"}");
  // Two groups of different schemes (per channel, then per tensor).
  const std::string two = R"({"quant_method": "compressed-tensors", "format": "float-quantized", "config_groups": {
      "group_0": {"targets": ["re:.*proj$"], )" + kCtWeights + ", " + kCtTokenInputs + R"(},
      "group_1": {"targets": ["re:.*down_proj"], "weights": {"num_bits": 8, "type": "float", "strategy": "tensor"}}}})";
  CHECK_THROWS_WITH(QuantisedConfig(two).load(), Catch::Contains("quantization_config.config_groups.group_1") &&
                                                     Catch::Contains("different schemes"));
  CHECK_THROWS_WITH(QuantisedConfig(compressed_tensors(kCtWeights, kCtTokenInputs), "compression_config").load(),
                    Catch::Contains("unsupported field 'compression_config'"));
}

TEST_CASE("safetensors: F8_E4M3 tensors parse as one byte an element; F8_E5M2 is refused by name",
          "[fp8ckpt][loader]") {
  test::TempDir dir("paged-fp8-st-");
  const std::string codes = {'\x38', '\x40', '\xb8', '\x00', '\x7e', '\x01'};  // 1, 2, -1, 0, 448, 2^-9
  test::write_safetensors(dir.path() / "model.safetensors", {{"w.weight", "F8_E4M3", {2, 3}, codes}});
  const SafeTensors st(dir.path().string());
  const TensorView& t = st.get("w.weight");
  CHECK(t.dtype == DType::f8_e4m3);
  CHECK(t.nbytes == 6);
  CHECK(std::string(dtype_name(t.dtype)) == "F8_E4M3");
  const std::vector<float> want = {1.0f, 2.0f, -1.0f, 0.0f, 448.0f, std::ldexp(1.0f, -9)};
  std::vector<float> got(6);
  t.to_floats(0, 6, got.data());
  CHECK(got == want);
  t.to_floats(4, 2, got.data());  // from an offset
  CHECK(got[0] == 448.0f);
  CHECK(got[1] == std::ldexp(1.0f, -9));

  test::write_safetensors(dir.path() / "model.safetensors", {{"w.weight", "F8_E4M3", {2, 2}, codes}});
  CHECK_THROWS_WITH(SafeTensors(dir.path().string()), Catch::Contains("does not match its 6 bytes"));
  test::write_safetensors(dir.path() / "model.safetensors", {{"w.weight", "F8_E5M2", {2, 3}, codes}});
  CHECK_THROWS_WITH(SafeTensors(dir.path().string()), Catch::Contains("dtype F8_E5M2 is not supported"));
}

TEST_CASE("FP8 weights dequantise to code x scale per tensor, channel and block; bad scale tensors are refused",
          "[fp8ckpt][loader]") {
  test::TempDir dir("paged-fp8-scales-");
  // A [3][5] weight of codes 0x30 + i (values 0.5 .. 1.75 and up), shards of it read back.
  std::string codes;
  for (int i = 0; i < 15; ++i) codes += static_cast<char>(0x30 + i);
  const auto code_value = [](int i) { return e4m3_to_float(static_cast<uint8_t>(0x30 + i)); };
  Fp8Checkpoint fp8;
  fp8.enabled = true;
  const auto load = [&](std::vector<test::RawTensor> scales) {
    scales.push_back({"m.weight", "F8_E4M3", {3, 5}, codes});
    test::write_safetensors(dir.path() / "model.safetensors", scales);
  };
  const TensorShard whole{"m.weight", {3, 5}, 0, 3, 0, 5};
  const TensorShard columns{"m.weight", {3, 5}, 0, 3, 2, 3};  // a row-parallel rank's columns 2..4
  const TensorShard rows{"m.weight", {3, 5}, 1, 2, 0, 5};     // a column-parallel rank's rows 1..2

  SECTION("per tensor: a scalar, or [1]") {
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{}, std::vector<int64_t>{1}}) {
      load({{"m.weight_scale", "F32", shape, raw_floats({0.25f})}});
      const SafeTensors st(dir.path().string());
      const std::vector<float> got = read_shard_f32(st, columns, fp8);
      for (int r = 0; r < 3; ++r)
        for (int c = 0; c < 3; ++c) CHECK(got[r * 3 + c] == code_value(r * 5 + 2 + c) * 0.25f);
    }
  }
  SECTION("per channel: [out, 1] (compressed-tensors) in BF16, and [out]") {
    fp8.layout = Fp8ScaleLayout::channel;
    const std::vector<float> s = {0.5f, 0.125f, 3.0f};  // exact in bf16
    std::string bf16;
    for (float v : s) {
      const uint16_t h = float_to_bf16(v);
      bf16.append(reinterpret_cast<const char*>(&h), 2);
    }
    load({{"m.weight_scale", "BF16", {3, 1}, bf16}});
    const SafeTensors st(dir.path().string());
    const std::vector<float> got = read_shard_f32(st, rows, fp8);
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 5; ++c) CHECK(got[r * 5 + c] == code_value((r + 1) * 5 + c) * s[r + 1]);
    CHECK(Fp8WeightScales(st, "m.weight", st.get("m.weight"), fp8).row_scales(1, 2) == std::vector<float>{s[1], s[2]});
    load({{"m.weight_scale", "F32", {3}, raw_floats(s)}});
    const SafeTensors flat(dir.path().string());
    CHECK(read_shard_f32(flat, whole, fp8)[14] == code_value(14) * s[2]);
  }
  SECTION("per block of 2 x 2: the grid [2][3], partial blocks at the edges; weight_scale_inv multiplies") {
    fp8.layout = Fp8ScaleLayout::block;
    fp8.block_rows = fp8.block_cols = 2;
    fp8.scale_suffix = "weight_scale_inv";
    const std::vector<float> s = {1, 2, 4, 8, 16, 32};
    load({{"m.weight_scale_inv", "F32", {2, 3}, raw_floats(s)}});
    const SafeTensors st(dir.path().string());
    CHECK_FALSE(Fp8WeightScales(st, "m.weight", st.get("m.weight"), fp8).per_row());
    const std::vector<float> got = read_shard_f32(st, columns, fp8);
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 3; ++c) CHECK(got[r * 3 + c] == code_value(r * 5 + 2 + c) * s[(r / 2) * 3 + (2 + c) / 2]);
  }
  SECTION("static activations: an input_scale of one positive float beside each FP8 weight") {
    fp8.static_activations = true;
    load({{"m.weight_scale", "F32", {}, raw_floats({0.5f})}, {"m.input_scale", "F32", {1}, raw_floats({0.02f})}});
    CHECK(read_shard_f32(SafeTensors(dir.path().string()), whole, fp8)[0] == code_value(0) * 0.5f);
    load({{"m.weight_scale", "F32", {}, raw_floats({0.5f})}});
    CHECK_THROWS_WITH(read_shard_f32(SafeTensors(dir.path().string()), whole, fp8),
                      Catch::Contains("no 'm.input_scale' beside it"));
    load({{"m.weight_scale", "F32", {}, raw_floats({0.5f})}, {"m.input_scale", "F32", {2}, raw_floats({1, 1})}});
    CHECK_THROWS_WITH(read_shard_f32(SafeTensors(dir.path().string()), whole, fp8),
                      Catch::Contains("'m.input_scale' must be one positive float"));
  }
  SECTION("bad scale tensors: wrong size, absent, FP8 themselves, negative; FP8 without quantization_config") {
    fp8.layout = Fp8ScaleLayout::channel;
    load({{"m.weight_scale", "F32", {2, 1}, raw_floats({1, 1})}});
    CHECK_THROWS_WITH(read_shard_f32(SafeTensors(dir.path().string()), whole, fp8),
                      Catch::Contains("'m.weight_scale' is F32 [2, 1]") && Catch::Contains("needs a float tensor [3, 1]"));
    fp8.layout = Fp8ScaleLayout::block;
    fp8.block_rows = fp8.block_cols = 2;
    load({{"m.weight_scale", "F32", {2, 2}, raw_floats({1, 1, 1, 1})}});
    CHECK_THROWS_WITH(read_shard_f32(SafeTensors(dir.path().string()), whole, fp8),
                      Catch::Contains("[2, 2]") && Catch::Contains("needs a float tensor [2, 3]"));
    load({});
    CHECK_THROWS_WITH(read_shard_f32(SafeTensors(dir.path().string()), whole, fp8),
                      Catch::Contains("no scale tensor 'm.weight_scale'"));
    fp8.layout = Fp8ScaleLayout::tensor;
    load({{"m.weight_scale", "F8_E4M3", {1}, std::string(1, '\x38')}});
    CHECK_THROWS_WITH(read_shard_f32(SafeTensors(dir.path().string()), whole, fp8),
                      Catch::Contains("is F8_E4M3 [1]"));
    load({{"m.weight_scale", "F32", {}, raw_floats({-1.0f})}});
    CHECK_THROWS_WITH(read_shard_f32(SafeTensors(dir.path().string()), whole, fp8),
                      Catch::Contains("finite and not negative"));
    CHECK_THROWS_WITH(read_shard_f32(SafeTensors(dir.path().string()), whole, Fp8Checkpoint{}),
                      Catch::Contains("'m.weight' is F8_E4M3 but config.json has no quantization_config"));
    // transformers 5's fused experts [E, 2I, H] in FP8: not read (per-expert FP8 tensors are).
    test::write_safetensors(dir.path() / "model.safetensors",
                            {{"mlp.experts.gate_up_proj", "F8_E4M3", {1, 3, 5}, codes},
                             {"mlp.experts.gate_up_proj_scale", "F32", {1}, raw_floats({1})}});
    const TensorShard experts{"mlp.experts.gate_up_proj", {1, 3, 5}, 0, 3, 0, 5};
    CHECK_THROWS_WITH(read_shard_f32(SafeTensors(dir.path().string()), experts, fp8),
                      Catch::Contains("F8_E4M3 is read for 2-D linear weights (*.weight) only"));
  }
}
