// The CUDA runner (bf16) against the CPU runner (float32) on the tiny Gemma 3 text checkpoints of tests/models/
// (tools/gpu/make_family_refs.py: five sliding layers to one full, (1 + weight) norms, four per layer, GeGLU, scaled
// embeddings, query_pre_attn_scalar, and in gemma3-softcap the final soft-cap and linear RoPE on the full layers). The
// CPU runner follows Hugging Face float32 there (tests/kernels/cpu/test_model_families.cpp), so this checks every
// Gemma kernel of the CUDA path in place: prefill in two chunks across the window, then one-token steps (the decode
// graphs) teacher-forced by the CPU's greedy tokens. A folder that is absent is skipped with a warning.
#include <filesystem>

#include "kernels/cpu/cpu_runner.h"
#include "kernels/cuda/cuda_runner.h"
#include "model/loader/config.h"
#include "model/loader/safetensors.h"
#include "tests/kernels/cuda/gpu_test_util.h"
#include "tests/kernels/cuda/small_llama.h"
#include "tests/kernels/step_chunks.h"

using namespace paged;
using namespace paged::gpu_test;
using paged::test::group_tables_for;
using paged::test::with_tables;
using paged::test::chunk_of;

TEST_CASE("the CUDA runner (bf16) follows the CPU runner (float32) on the tiny Gemma 3 checkpoints",
          "[gpu][runner][gemma]") {
  require_device();
  for (const std::string name : {"gemma3", "gemma3-softcap"}) {
    const std::string dir = std::string(PAGED_SOURCE_DIR) + "/tests/models/" + name;
    if (!std::filesystem::exists(dir + "/config.json")) {
      WARN("skipped: " << dir << " is absent (python3 tools/gpu/make_family_refs.py --families gemma3)");
      continue;
    }
    const ModelConfig cfg = load_model_config(dir);
    REQUIRE(cfg.sandwich_norms);
    const SafeTensors weights(dir);
    // 256 positions of 16 in each KV group (a table per group: the sliding layers' and the full ones'), the sliding
    // groups' blocks before their window released as the steps go.
    const KvGroups groups = kv_groups_of(cfg);
    REQUIRE(groups.num_groups() > 1);
    const int blocks = 16 * groups.num_groups();
    CpuModelRunner cpu(cfg, weights, {.block_size = 16, .num_blocks = blocks, .max_model_len = 256});
    CudaModelRunner gpu(cfg, weights, small_runner_options(blocks, 4, 256));
    std::vector<std::vector<int32_t>> tables = group_tables_for(groups, 16);
    std::mt19937 rng(16);
    std::vector<TokenId> tokens(150);
    for (auto& t : tokens) t = static_cast<TokenId>(3 + rng() % (cfg.vocab_size - 3));
    // One step of both runners over tokens[from, to); the logits of its last token, compared.
    const auto step = [&](int from, int to, bool sample) {
      StepBatch batch;
      batch.seqs.push_back(with_tables(chunk_of(0, tokens, from, to, {}), tables, groups, 16, true));
      if (sample) batch.seqs.back().samples.push_back({});
      const auto want = cpu.forward(batch), got = gpu.forward(batch);
      if (!sample) return TokenId{-1};
      REQUIRE(got.size() == 1);
      REQUIRE(want.size() == 1);
      const double err = relative_l2(got[0], want[0]);
      INFO(name << ": tokens " << from << ".." << to << ", relative L2 " << err);
      // bf16 through seven layers and a final soft-cap that squeezes the logits together: up to 6.4e-2 on the H200
      // (HF's own bf16 run of a soft-capped Gemma 3 differs from its float32 by as much, tools/gpu/hf_parity.py); a
      // kernel left out or wrong gives errors of order 1.
      CHECK(err < 0.1);
      return static_cast<TokenId>(std::max_element(want[0].begin(), want[0].end()) - want[0].begin());
    };
    step(0, 100, false);
    tokens.push_back(step(100, 150, true));
    for (int k = 0; k < 12; ++k) {
      const int n = static_cast<int>(tokens.size());
      tokens.push_back(step(n - 1, n, true));
    }
  }
}
