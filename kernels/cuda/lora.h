// LoRA pairs on the GPU, for steps that mix adapters row by row (S-LoRA and Punica's batched shape): every row of a
// step names the slot of its adapter (or none), and a fused linear layer's pairs add to that row's output,
// y += B (scale * (A x)). The runner keeps every slot's block side by side (model/lora/lora_layout.h), so that two
// tensor-core products cover all slots at once: the shrink v = x A_all^T over every slot's rank columns (float32),
// a pass that keeps each row's own slot's columns, scaled and rounded to bf16 (the others 0), and the expand
// y += v B_all^T (float32 sums, rounded to bf16 once). The products read all slots' A and B: slots x rank columns
// against the layer's n, a few percent of the base product at the ranks served. CPU twin: add_lora_pairs
// (kernels/cpu/ops.h) over the pairs the slot was packed from.
#pragma once

#include <cstdint>

#include "kernels/cuda/launch.h"

namespace paged::cuda {

class Gemm;  // kernels/cuda/gemm.h (C++20, which the kernels' C++17 does not include)

/// One fused linear layer's pairs in the `slots` slots of a runner (a LoraBlock of the runner's arrays).
struct LoraArgs {
  const int32_t* row_slot = nullptr;  // [rows]: each row's slot, -1 for none
  const bf16* a = nullptr;            // [slots * rank][k]: slot s's A from row s * rank
  const bf16* b = nullptr;            // [n][slots * rank]: slot s's B from column s * rank
  const float* scales = nullptr;      // [slots * rank]
  int slots = 0, rank = 0, n = 0, k = 0;
};

/// y [rows][n] += the pairs of each row's slot applied to x [rows][k], through `gemm`; `v` [rows][slots * rank]
/// floats and `v16` [rows][slots * rank] bf16 are scratch. Nothing for rank 0 or no rows. cudaErrorInvalidValue
/// (with a message) for a negative row count or slot count, or a shape the products do not take (n, k and
/// slots * rank multiples of 8).
cudaError_t add_lora(Gemm& gemm, bf16* y, const bf16* x, float* v, bf16* v16, int rows, const LoraArgs& args,
                     cudaStream_t stream);

/// add_lora's pass between its products: v16[t][c] = bf16(v[t][c] * args.scales[c]) for the columns of row t's slot
/// (c / args.rank == row_slot[t]), else 0, over `rows` rows of slots * rank columns.
cudaError_t lora_keep_slot(bf16* v16, const float* v, int rows, const LoraArgs& args, cudaStream_t stream);

}  // namespace paged::cuda
