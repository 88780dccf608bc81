// The small random Llama the CUDA runner tests build (head_dim 64, GQA 2, vocab 1000): fast, and every kernel path
// of a real model; and the runner options they build it with.
#pragma once

#include "kernels/cuda/cuda_runner.h"
#include "model/loader/config.h"

namespace paged::gpu_test {

inline ModelConfig small_llama() {
  ModelConfig c;
  c.model_type = "llama";
  c.hidden_size = 256;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.intermediate_size = 512;
  c.vocab_size = 1000;
  c.max_position_embeddings = 256;
  c.rms_norm_eps = 1e-5;
  c.torch_dtype = "bfloat16";
  return c;
}

/// The runner options the tests use with it: 16-token blocks, contexts of 256, a small swap pool.
inline CudaRunnerOptions small_runner_options(int num_blocks, int max_num_seqs, int max_num_batched_tokens) {
  CudaRunnerOptions opt;
  opt.block_size = 16;
  opt.num_blocks = num_blocks;
  opt.max_num_seqs = max_num_seqs;
  opt.max_num_batched_tokens = max_num_batched_tokens;
  opt.max_model_len = 256;
  opt.swap_space_gib = 0.01;
  return opt;
}

}  // namespace paged::gpu_test
