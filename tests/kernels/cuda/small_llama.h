// The small random Llama the CUDA runner tests build (head_dim 64, GQA 2, vocab 1000): fast, and every kernel path
// of a real model.
#pragma once

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

}  // namespace paged::gpu_test
