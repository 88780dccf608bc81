// LoRA on the GPU: the add_lora kernels (kernels/cuda/lora.h) against their CPU twin add_lora_pairs, row by row over
// slots of different adapters; and the CUDA runner serving adapters against the merged checkpoints (W + scale B A,
// PEFT's merge_and_unload, computed by the test in double from the adapter files): any mix of adapters and the base
// model in one step, prefill, decode graphs and one sequence alone; one slot taking turns between two adapters.
#include <cstring>
#include <fstream>
#include <random>

#include <boost/json.hpp>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/cuda_runner.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/lora.h"
#include "model/loader/config.h"
#include "model/loader/safetensors.h"
#include "model/lora/lora_adapter.h"
#include "model/lora/lora_layout.h"
#include "tests/kernels/cuda/gpu_test_util.h"
#include "tests/kernels/cuda/small_llama.h"
#include "tests/kernels/step_chunks.h"
#include "tests/model/lora/lora_files.h"
#include "tests/model/lora/lora_slots.h"
#include "tests/test_data.h"

using namespace paged;
using namespace paged::gpu_test;
using paged::test::chunk_of;

namespace {

// A pair of rank r on rows [offset, offset + rows) of a layer with k inputs, its values bf16 already (as a slot
// keeps them).
LoraPair random_pair(int offset, int rows, int r, int k, float scale, std::mt19937& rng) {
  LoraPair p{.out_offset = offset, .out_rows = rows, .rank = r, .scale = scale};
  p.a = random_bf16_values(rng, static_cast<size_t>(r) * k, 1.0f / std::sqrt(float(k)));
  p.b = random_bf16_values(rng, static_cast<size_t>(rows) * r, 0.5f);
  return p;
}

// A random float32 Llama checkpoint folder (the shape of small_llama(): head_dim 64, GQA 2, vocab 1000).
void write_random_llama(const std::filesystem::path& dir, uint32_t seed) {
  const ModelConfig c = small_llama();
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << boost::json::serialize(boost::json::object{
      {"architectures", boost::json::array{"LlamaForCausalLM"}}, {"model_type", "llama"},
      {"hidden_size", c.hidden_size}, {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_layers}, {"num_attention_heads", c.num_heads},
      {"num_key_value_heads", c.num_kv_heads}, {"vocab_size", c.vocab_size},
      {"max_position_embeddings", c.max_position_embeddings}, {"rms_norm_eps", 1e-5}, {"rope_theta", 10000.0},
      {"hidden_act", "silu"}, {"tie_word_embeddings", false}, {"torch_dtype", "float32"}});
  std::mt19937 rng(seed);
  std::vector<test::RawTensor> tensors;
  const auto add = [&](const std::string& name, int64_t rows, int64_t cols, float spread, float offset) {
    std::uniform_real_distribution<float> u(-spread, spread);
    std::vector<float> v(static_cast<size_t>(rows * cols));
    for (float& x : v) x = offset + u(rng);
    std::vector<int64_t> shape{rows};
    if (cols > 1) shape.push_back(cols);
    tensors.push_back({name, "F32", shape, test::f32_bytes(v)});
  };
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  add("model.embed_tokens.weight", c.vocab_size, H, 1.0f, 0.0f);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const float in_h = 1.0f / std::sqrt(float(H)), in_i = 1.0f / std::sqrt(float(I));
    add(p + "input_layernorm.weight", H, 1, 0.1f, 1.0f);
    add(p + "post_attention_layernorm.weight", H, 1, 0.1f, 1.0f);
    add(p + "self_attn.q_proj.weight", c.num_heads * D, H, in_h, 0.0f);
    add(p + "self_attn.k_proj.weight", c.num_kv_heads * D, H, in_h, 0.0f);
    add(p + "self_attn.v_proj.weight", c.num_kv_heads * D, H, in_h, 0.0f);
    add(p + "self_attn.o_proj.weight", H, c.num_heads * D, in_h, 0.0f);
    add(p + "mlp.gate_proj.weight", I, H, in_h, 0.0f);
    add(p + "mlp.up_proj.weight", I, H, in_h, 0.0f);
    add(p + "mlp.down_proj.weight", H, I, in_i, 0.0f);
  }
  add("model.norm.weight", H, 1, 0.1f, 1.0f);
  add("lm_head.weight", c.vocab_size, H, 1.0f / std::sqrt(float(H)), 0.0f);
  test::write_safetensors(dir / "model.safetensors", tensors);
}

}  // namespace

TEST_CASE("add_lora adds each row's slot's pairs as add_lora_pairs does; rows without a slot are untouched",
          "[gpu][lora]") {
  require_device();
  std::mt19937 rng(17);
  // One layer, ranks rounded up to 8 in the layout (room 8: QKV 24, O 8, gate/up 16, down 8).
  const std::array<LoraShape, kLoraProjections> shapes{LoraShape{384, 256}, LoraShape{256, 256},
                                                       LoraShape{1024, 256}, LoraShape{256, 40}};
  const LoraLayout layout = lora_layout(1, shapes, 8);
  // Three adapters (slots 0, 1, 2), each with its own pairs: q/k/v of several ranks, some layers left alone.
  std::vector<LoraAdapter> adapters(3);
  for (int s = 0; s < 3; ++s) {
    LoraLayer& L = adapters[s].layers.emplace_back();
    adapters[s].path = "adapter " + std::to_string(s);
    L.qkv = {random_pair(0, 256, 8, 256, 2.0f, rng), random_pair(320, 64, 3 + s, 256, 0.5f, rng)};
    if (s != 1) L.qkv.push_back(random_pair(256, 64, 8, 256, 1.0f, rng));
    if (s != 2) L.o = {random_pair(0, 256, 1 + 3 * s, 256, 4.0f, rng)};
    L.gate_up = {random_pair(512, 512, 8, 256, 0.25f, rng)};
    if (s == 0) L.gate_up.push_back(random_pair(0, 512, 2, 256, 1.0f, rng));
    L.down = {random_pair(0, 256, 6, 40, 1.5f, rng)};
  }
  constexpr int kSlots = 3;
  std::vector<test::PackedLora> packed(kSlots);
  for (int s = 0; s < kSlots; ++s) pack_lora(adapters[s], layout, packed[s].first, packed[s].second);
  const test::LoraSlots all = test::place_lora_slots(layout, packed);
  std::vector<bf16> weight_bits(all.w.size());
  std::memcpy(weight_bits.data(), all.w.data(), all.w.size() * sizeof(uint16_t));
  const DeviceArray<bf16> d_weights(weight_bits);
  const DeviceArray<float> d_scales(all.s);
  const std::vector<int32_t> row_slot{-1, 0, 2, 1, 0, -1, 2, 1};
  const int rows = static_cast<int>(row_slot.size());
  const DeviceArray<int32_t> d_slots(row_slot);
  DeviceArray<float> v(static_cast<size_t>(rows) * kSlots * layout.max_rank);
  DeviceArray<bf16> v16(static_cast<size_t>(rows) * kSlots * layout.max_rank);
  cuda::Gemm gemm;
  const std::vector<LoraPair> LoraLayer::*which[] = {&LoraLayer::qkv, &LoraLayer::o, &LoraLayer::gate_up,
                                                     &LoraLayer::down};
  for (int p = 0; p < kLoraProjections; ++p) {
    const LoraBlock& b = layout.layers[0][p];
    INFO("projection " << p << ": " << b.n << " x " << b.k);
    const std::vector<float> x = random_bf16_values(rng, static_cast<size_t>(rows) * b.k);
    const std::vector<float> y = random_bf16_values(rng, static_cast<size_t>(rows) * b.n);
    const DeviceArray<bf16> d_x(to_bf16(x));
    DeviceArray<bf16> d_y(to_bf16(y));
    const cuda::LoraArgs args{.row_slot = d_slots.get(), .a = d_weights.get() + kSlots * b.a,
                              .b = d_weights.get() + kSlots * b.b, .scales = d_scales.get() + kSlots * b.scale,
                              .slots = kSlots, .rank = b.rank, .n = b.n, .k = b.k};
    CUDA_REQUIRE(cuda::add_lora(gemm, d_y.get(), d_x.get(), v.get(), v16.get(), rows, args, nullptr));
    const std::vector<float> got = to_float(d_y.download());
    int moved = 0;
    for (int t = 0; t < rows; ++t) {
      INFO("row " << t << ", slot " << row_slot[t]);
      std::vector<float> want(y.begin() + int64_t{t} * b.n, y.begin() + int64_t{t + 1} * b.n), scratch;
      // The size of the terms each output sums, sum_j |B[i][j]| |v_j|: the shrink rounds each v_j to bf16 (as PEFT's
      // bf16 modules round A x), an error of up to 2^-9 of each term however much the terms cancel.
      std::vector<double> terms(static_cast<size_t>(b.n), 0.0);
      if (row_slot[t] >= 0) {
        const float* xt = x.data() + int64_t{t} * b.k;
        const std::vector<LoraPair>& pairs = adapters[row_slot[t]].layers[0].*which[p];
        cpu::add_lora_pairs(want.data(), xt, b.k, pairs, scratch);
        for (const LoraPair& q : pairs)
          for (int j = 0; j < q.rank; ++j) {
            double vj = 0.0;
            for (int i = 0; i < b.k; ++i) vj += double(q.a[size_t(j) * b.k + i]) * xt[i];
            for (int i = 0; i < q.out_rows; ++i)
              terms[size_t(q.out_offset + i)] += std::abs(q.b[size_t(i) * q.rank + j] * q.scale * vj);
          }
      }
      for (int i = 0; i < b.n; ++i) {
        const float g = got[int64_t{t} * b.n + i], w = round_bf16(want[i]), before = y[int64_t{t} * b.n + i];
        if (row_slot[t] < 0) {
          REQUIRE(g == before);  // the value unchanged (y + 0)
        } else {
          // A bf16 step of the result either way, and the shrink's rounding of each term.
          REQUIRE(std::abs(g - w) <= 1e-2 * std::abs(w) + terms[size_t(i)] / 256.0 + 1e-3);
          moved += std::abs(w - before) > 0.05f;
        }
      }
    }
    CHECK(moved > rows * b.n / 8);  // the pairs move the rows they add to
  }
  // Bad shapes are refused with a message.
  const cuda::LoraArgs bad{.row_slot = d_slots.get(), .a = d_weights.get(), .b = d_weights.get(),
                           .scales = d_scales.get(), .slots = 1, .rank = 4, .n = 36, .k = 36};
  CHECK(cuda::add_lora(gemm, nullptr, nullptr, v.get(), v16.get(), 2, bad, nullptr) == cudaErrorInvalidValue);
  CHECK(cuda::describe_launch_error(cudaErrorInvalidValue).find("add_lora") != std::string::npos);
}

TEST_CASE("the CUDA runner's adapter rows give the merged checkpoint's logits, beside other adapters and the base "
          "model, in prefill, decode graphs and alone, bf16 and FP8 weights; one slot takes turns",
          "[gpu][lora][runner][fp8]") {
  require_device();
  test::TempDir dir("paged-lora-gpu-");
  const std::filesystem::path base = dir.path() / "base";
  write_random_llama(base, 5);
  // Adapter a: every projection, rank 8; adapter b: attention only, rank 4, rsLoRA.
  const std::vector<test::LoraSpec> all = test::every_projection(base, 8);
  REQUIRE(all.size() == 14);
  std::vector<test::LoraSpec> attention;
  for (const test::LoraSpec& s : test::every_projection(base, 4))
    if (s.module.find("self_attn") != std::string::npos) attention.push_back(s);
  const auto pairs_a = test::write_lora_adapter(dir.path() / "a", all, 16.0, false, 1);
  test::write_merged_checkpoint(base, dir.path() / "merged_a", all, pairs_a, 16.0, false);
  const auto pairs_b = test::write_lora_adapter(dir.path() / "b", attention, 8.0, true, 2);
  test::write_merged_checkpoint(base, dir.path() / "merged_b", attention, pairs_b, 8.0, true);

  const ModelConfig cfg = load_model_config(base.string());
  const LoraAdapter a = load_lora_adapter((dir.path() / "a").string(), cfg, 0, 1, 16);
  const LoraAdapter b = load_lora_adapter((dir.path() / "b").string(), cfg, 0, 1, 16);

  // Three sequences (base, a, b): their prompts in one step, then two decode steps of all three (the second a
  // graph's replay), then the first adapter's sequence alone (one token: not the one-stream GEMVs).
  std::mt19937 rng(8);
  std::vector<std::vector<TokenId>> seqs(3);
  for (int s = 0; s < 3; ++s) {
    seqs[s].resize(10 + 7 * s + 3);
    for (auto& t : seqs[s]) t = static_cast<TokenId>(rng() % cfg.vocab_size);
  }
  const std::array<int32_t, 3> lora_of{0, 1, 2};
  const auto table = [](int s) { return std::vector<int32_t>{4 * s, 4 * s + 1}; };
  std::vector<StepBatch> steps;
  StepBatch prefill;
  for (int s = 0; s < 3; ++s) {
    const int len = static_cast<int>(seqs[s].size()) - 3;
    prefill.seqs.push_back(chunk_of(s, seqs[s], 0, len, table(s)));
  }
  steps.push_back(prefill);
  for (int d = 0; d < 2; ++d) {
    StepBatch decode;
    for (int s = 0; s < 3; ++s) {
      const int at = static_cast<int>(seqs[s].size()) - 3 + d;
      decode.seqs.push_back(chunk_of(s, seqs[s], at, at + 1, table(s)));
    }
    steps.push_back(decode);
  }
  StepBatch alone;
  const int at = static_cast<int>(seqs[1].size()) - 1;
  alone.seqs.push_back(chunk_of(1, seqs[1], at, at + 1, table(1)));
  steps.push_back(alone);
  for (StepBatch& step : steps)
    for (SeqChunk& c : step.seqs) c.samples.push_back({});
  // Every step's logits, by sequence: with `lora` the chunks carry their adapter ids.
  const auto run = [&](ModelRunner& runner, bool lora) {
    std::vector<std::vector<std::vector<float>>> out;  // [step][chunk]
    for (StepBatch step : steps) {
      for (SeqChunk& c : step.seqs) c.lora = lora ? lora_of[c.seq] : 0;
      out.push_back(static_cast<CudaModelRunner&>(runner).forward(step));
    }
    return out;
  };
  CudaRunnerOptions opt = small_runner_options(16, 4, 64);
  // The logits of the base model and of the two merged checkpoints, each run alone with options `o`.
  using Logits = std::vector<std::vector<std::vector<float>>>;
  const auto references = [&](const CudaRunnerOptions& o) {
    const auto one = [&](const std::filesystem::path& folder) {
      const SafeTensors w(folder.string());
      CudaModelRunner r(load_model_config(folder.string()), w, o);
      return run(r, false);
    };
    return std::array<Logits, 3>{one(base), one(dir.path() / "merged_a"), one(dir.path() / "merged_b")};
  };
  const std::array<Logits, 3> want = references(opt);
  const SafeTensors base_weights(base.string());
  CudaRunnerOptions lora_opt = opt;
  lora_opt.max_loras = 2;
  {
    CudaModelRunner runner(cfg, base_weights, lora_opt);
    runner.add_lora(1, a);
    runner.add_lora(2, b);
    const auto got = run(runner, true);
    for (size_t st = 0; st < steps.size(); ++st)
      for (size_t c = 0; c < steps[st].seqs.size(); ++c) {
        const int s = static_cast<int>(steps[st].seqs[c].seq);
        INFO("step " << st << ", sequence " << s << " (adapter " << lora_of[s] << ")");
        const double err = relative_l2(got[st][c], want[s][st][c]);
        const double effect = relative_l2(want[s][st][c], want[0][st][c]);  // what the adapter changes
        CHECK(err < 0.05);  // bf16 roundings of the same sums (the merged weights; the pairs apart)
        if (s != 0) CHECK(effect > 0.2);  // an adapter not applied would fail the line above
      }
    // Unknown and removed adapters are refused.
    StepBatch bad = alone;
    bad.seqs[0].lora = 3;
    CHECK_THROWS_WITH(runner.execute(bad), Catch::Contains("LoRA adapter 3"));
    runner.remove_lora(2);
    bad.seqs[0].lora = 2;
    CHECK_THROWS_WITH(runner.execute(bad), Catch::Contains("LoRA adapter 2"));
    CHECK_THROWS_WITH(runner.add_lora(1, b), Catch::Contains("taken"));
  }
  // FP8 weights: the pairs add to the scaled products (the passes the FP8 path otherwise fuses come apart in steps
  // with LoRA rows). Against the bf16 merged checkpoints, within what FP8 costs the merged checkpoints themselves.
  {
    CudaRunnerOptions fp8 = lora_opt, fp8_plain = opt;
    fp8.fp8_weights = fp8_plain.fp8_weights = true;
    CudaModelRunner runner(cfg, base_weights, fp8);
    runner.add_lora(1, a);
    runner.add_lora(2, b);
    const auto got = run(runner, true);
    const std::array<Logits, 3> fp8_want = references(fp8_plain);
    double lora_err = 0, merged_err = 0;
    int rows = 0;
    for (size_t st = 0; st < steps.size(); ++st)
      for (size_t c = 0; c < steps[st].seqs.size(); ++c) {
        const int s = static_cast<int>(steps[st].seqs[c].seq);
        INFO("FP8, step " << st << ", sequence " << s << " (adapter " << lora_of[s] << ")");
        const double err = relative_l2(got[st][c], want[s][st][c]);
        if (s != 0) CHECK(err < 0.5 * relative_l2(want[s][st][c], want[0][st][c]));
        lora_err += err;
        merged_err += relative_l2(fp8_want[s][st][c], want[s][st][c]);
        ++rows;
      }
    WARN("FP8 weights, means over " << rows << " rows against bf16 merged: with the pairs apart " << lora_err / rows
                                    << ", FP8 merged checkpoints " << merged_err / rows);
    CHECK(lora_err < 2 * merged_err + 0.02 * rows);
  }
  // One slot: the adapters take turns in it (uploaded again each time), a step of both is refused.
  lora_opt.max_loras = 1;
  CudaModelRunner one(cfg, base_weights, lora_opt);
  one.add_lora(1, a);
  one.add_lora(2, b);
  for (int round = 0; round < 2; ++round)
    for (int s : {1, 2}) {
      INFO("round " << round << ", adapter " << s);
      StepBatch step;
      step.seqs.push_back(chunk_of(10 + 2 * round + s, seqs[s], 0, static_cast<int>(seqs[s].size()) - 3,
                                   {8 + 2 * (s - 1), 9 + 2 * (s - 1)}));
      step.seqs[0].samples.push_back({});
      step.seqs[0].lora = s;
      CHECK(relative_l2(one.forward(step).at(0), want[s][0][s]) < 0.05);
    }
  StepBatch both = prefill;
  for (SeqChunk& c : both.seqs) c.lora = lora_of[c.seq];
  CHECK_THROWS_WITH(one.execute(both), Catch::Contains("more LoRA adapters than the runner's 1 slots"));
  // Without slots, adapters are refused.
  CudaModelRunner plain(cfg, base_weights, opt);
  CHECK_THROWS_WITH(plain.add_lora(1, a), Catch::Contains("no LoRA slots"));
}
