// A mixed step whose leading one-token chunks alone give every SM a block runs their attention through the decode
// kernel and the other chunks' through the prefill kernel (Plan::decode_seqs, cuda_runner.cpp): every row of such a
// step against the CPU runner (float32), on the trained Llama (full attention, long contexts split in partitions) and
// the tiny Gemma 3 (sliding layers, a table per KV group), with the bf16 cache and the FP8 one.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <random>

#include "kernels/cpu/cpu_runner.h"
#include "kernels/cuda/cuda_runner.h"
#include "model/kv/kv_groups.h"
#include "model/loader/config.h"
#include "model/loader/safetensors.h"
#include "tests/kernels/cuda/gpu_test_util.h"
#include "tests/kernels/cuda/small_llama.h"
#include "tests/kernels/step_chunks.h"

using namespace paged;
using namespace paged::gpu_test;
using paged::test::own_blocks_chunk;

TEST_CASE("a mixed step's decode rows (decode kernel) and prefill chunks (prefill kernel) give the CPU runner's "
          "logits",
          "[gpu][runner]") {
  require_device();
  int device = 0, sms = 0;
  REQUIRE(cudaGetDevice(&device) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess);
  for (const std::string& dir : runner_test_models()) {
    const ModelConfig cfg = load_model_config(dir);
    const SafeTensors weights(dir);
    const KvGroups groups = kv_groups_of(cfg);
    const int G = groups.num_groups();
    // Enough one-token chunks for a block on every SM of this device (KV heads x sequences), two prefill chunks after.
    const int decode_rows = (sms + cfg.num_kv_heads - 1) / cfg.num_kv_heads + 3;
    const int num_seqs = decode_rows + 2;
    const int max_len = std::min(1024, cfg.max_position_embeddings);
    const int per_seq = max_len / 16;  // blocks of a sequence in each group (own_blocks_chunk)
    // Random tokens; sequence i (< decode_rows) prefills `split[i]` tokens in step one and decodes one in step two,
    // two of them long (more than one decode partition at the runner's rule); the next one prefills in two chunks,
    // the last one's whole prompt comes in step two.
    std::mt19937 rng(30);
    std::vector<std::vector<TokenId>> tokens(num_seqs);
    std::vector<int> split(num_seqs);
    for (int i = 0; i < num_seqs; ++i) {
      const int len = i < 2 ? max_len * 6 / 10 : i == decode_rows ? max_len / 2 : 2 + static_cast<int>(rng() % 100);
      tokens[i].resize(i < decode_rows ? len + 1 : len);
      for (auto& t : tokens[i]) t = static_cast<TokenId>(3 + rng() % (cfg.vocab_size - 3));
      split[i] = i < decode_rows ? len : i == decode_rows ? 40 : 0;
    }
    const auto chunk = [&](int i, int from, int to) { return own_blocks_chunk(i, tokens[i], from, to, per_seq, G); };
    StepBatch first, mixed;
    for (int i = 0; i < num_seqs; ++i)
      if (split[i] > 0) first.seqs.push_back(chunk(i, 0, split[i]));
    for (int i = 0; i < num_seqs; ++i)
      mixed.seqs.push_back(chunk(i, split[i], static_cast<int>(tokens[i].size())));
    const int blocks = num_seqs * per_seq * G;
    for (const bool fp8_kv : {false, true}) {
      CudaRunnerOptions opt = small_runner_options(blocks, num_seqs, 8192);
      opt.max_model_len = max_len;
      opt.fp8_kv = fp8_kv;
      CudaModelRunner gpu(cfg, weights, opt);
      CpuModelRunner cpu(cfg, weights,
                         {.block_size = 16, .num_blocks = blocks, .max_model_len = max_len, .fp8_kv = fp8_kv});
      gpu.forward(first);
      cpu.forward(first);
      const auto got = gpu.forward(mixed), want = cpu.forward(mixed);
      REQUIRE(got.size() == mixed.seqs.size());
      REQUIRE(want.size() == got.size());
      for (size_t r = 0; r < got.size(); ++r) {
        const double err = relative_l2(got[r], want[r]);
        INFO(dir << (fp8_kv ? ", FP8 cache" : ", bf16 cache") << ": row " << r << " of " << got.size() << " ("
                 << mixed.seqs[r].tokens.size() << " tokens at " << mixed.seqs[r].start_pos << "), relative L2 "
                 << err);
        // bf16 through the layers: a few 1e-2 (Gemma's soft-capped logits up to 6.4e-2, test_runner_gemma3.cpp);
        // the FP8 cache against its emulation as the FP8 test bounds a row (test_fp8.cpp). Attention of the wrong
        // rows, tables or contexts: of order 1.
        CHECK(err < (fp8_kv ? 0.3 : 0.1));
      }
    }
  }
}
