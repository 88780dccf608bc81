// Pre-quantised FP8 checkpoints on the CUDA runner: tools/make_fp8_checkpoints.py writes every layout of a seeded
// random float32 Llama the CUDA kernels take (head_dim 64, hidden 192 and intermediate 320: partial 128 x 128
// blocks), and the runner loads each one with FP8 weights (codes as they are, or block scales requantised per row;
// left-out layers bf16) against the CPU runner's emulation of the same, and with --quantization none (dequantised to
// bf16) against the CPU runner's exact float32 dequantisation.
#include <random>

#include "kernels/cpu/cpu_runner.h"
#include "kernels/cuda/cuda_runner.h"
#include "model/loader/config.h"
#include "model/loader/safetensors.h"
#include "tests/fp8_checkpoints.h"
#include "tests/kernels/cuda/gpu_test_util.h"
#include "tests/kernels/cuda/small_llama.h"
#include "tests/kernels/step_chunks.h"
#include "tests/test_data.h"

using namespace paged;
using namespace paged::gpu_test;
using paged::test::chunk_of;

TEST_CASE("FP8 checkpoints of every layout on the CUDA runner give the CPU runner's logits, FP8 and dequantised",
          "[gpu][fp8][fp8ckpt]") {
  require_device();
  test::TempDir tmp("paged-fp8-ckpt-gpu-");
  const std::string src = (tmp.path() / "src").string(), out = (tmp.path() / "fp8").string();
  test::make_fp8_checkpoints(src, out, test::all_fp8_layouts(), true);

  // Three prompts of random tokens, prefilled, then one decode step of all three, then one of the first alone (the
  // one-stream GEMV path): the logits after each.
  std::mt19937 rng(21);
  StepBatch prefill, decode, one;
  for (int s = 0; s < 3; ++s) {
    std::vector<TokenId> tokens(9 + 20 * s);
    for (auto& t : tokens) t = static_cast<TokenId>(rng() % 256);
    const std::vector<int32_t> table = {4 * s, 4 * s + 1, 4 * s + 2, 4 * s + 3};
    const int len = static_cast<int>(tokens.size());
    prefill.seqs.push_back(chunk_of(s, tokens, 0, len - 1, table));
    prefill.seqs.back().samples.push_back({});
    decode.seqs.push_back(chunk_of(s, tokens, len - 1, len, table));
    decode.seqs.back().samples.push_back({});
  }
  one.seqs.push_back(chunk_of(0, {0}, 0, 1, {12, 13}));
  one.seqs.back().samples.push_back({});
  const auto logits_of = [&](const ModelConfig& cfg, const SafeTensors& w, bool fp8_weights) {
    CudaRunnerOptions opt = small_runner_options(16, 4, 256);
    opt.fp8_weights = fp8_weights;
    CudaModelRunner gpu(cfg, w, opt);
    CpuModelRunner cpu(cfg, w, {.block_size = 16, .num_blocks = 16, .fp8_weights = fp8_weights});
    std::pair<std::vector<std::vector<float>>, std::vector<std::vector<float>>> rows;
    for (const StepBatch* step : {&prefill, &decode, &one}) {
      for (auto& row : gpu.forward(*step)) rows.first.push_back(std::move(row));
      for (auto& row : cpu.forward(*step)) rows.second.push_back(std::move(row));
    }
    return rows;
  };
  for (const char* layout : test::kFp8Layouts) {
    const std::string dir = out + "/" + layout;
    const ModelConfig cfg = load_model_config(dir);
    const SafeTensors w(dir);
    REQUIRE(cfg.fp8_checkpoint.enabled);
    const auto [gpu_bf16, cpu_f32] = logits_of(cfg, w, false);  // --quantization none: dequantised
    const auto [gpu_fp8, cpu_fp8] = logits_of(cfg, w, true);
    double bf16_err = 0, fp8_err = 0, fp8_own = 0;  // means over the rows
    const double n = static_cast<double>(gpu_fp8.size());
    for (size_t i = 0; i < gpu_fp8.size(); ++i) {
      const double dequantised = relative_l2(gpu_bf16[i], cpu_f32[i]), row = relative_l2(gpu_fp8[i], cpu_fp8[i]);
      INFO(layout << " row " << i << ": CUDA bf16 (dequantised) vs CPU float32 " << dequantised
                  << ", CUDA FP8 vs CPU emulation " << row);
      CHECK(dequantised < 0.05);  // bf16 rounding (as the Gemma 3 test bounds it); a wrong scale or code: order 1
      CHECK(row < 0.3);           // a wrong code, scale or layout: 0.6 and more
      bf16_err += dequantised / n;
      fp8_err += row / n;
      fp8_own += relative_l2(cpu_fp8[i], cpu_f32[i]) / n;
    }
    WARN(layout << ", means over " << n << " rows: CUDA bf16 vs CPU float32 " << bf16_err
                << ", CUDA FP8 vs CPU emulation " << fp8_err << ", FP8's own error on the CPU " << fp8_own);
    CHECK(fp8_err < 2 * fp8_own + 3 * bf16_err);  // as the trained model's FP8 test bounds it (test_fp8.cpp)
  }
}
