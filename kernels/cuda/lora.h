// LoRA pairs on the GPU, for steps that mix adapters row by row (S-LoRA and Punica's batched shape): every row of a
// step names the slot of its adapter (or none), and a fused linear layer's pairs add to that row's output,
// y += B (scale * (A x)), with A, B^T and the scales of the slot's block (model/lora/lora_layout.h). Two kernels: the
// shrink (v = scale * A x, [rows][rank] floats) and the expand (y += B v, in float, rounded to bf16 once); rank
// columns whose scale is 0 (room no pair took) are skipped. CPU twin: add_lora_pairs (kernels/cpu/ops.h) over the
// pairs the slot was packed from.
#pragma once

#include <cstdint>

#include "kernels/cuda/launch.h"
#include "model/lora/lora_layout.h"

namespace paged::cuda {

/// One fused linear layer's pairs in the slots of a runner.
struct LoraArgs {
  const int32_t* row_slot = nullptr;  // [rows]: each row's slot, -1 for none
  const bf16* weights = nullptr;      // slot 0's bf16 weights; slot s's start slot_weights elements further on each
  const float* scales = nullptr;      // slot 0's scales, slot_scales floats a slot
  int64_t slot_weights = 0, slot_scales = 0;
  LoraBlock block;                    // the layer's room in every slot
};

/// y [rows][block.n] += the pairs of each row's slot applied to x [rows][block.k]; `v` is scratch of [rows][block.rank]
/// floats. Nothing for block.rank 0 or no rows. cudaErrorInvalidValue (with a message) for a negative row count or
/// a block without shape.
cudaError_t add_lora(bf16* y, const bf16* x, float* v, int rows, const LoraArgs& args, cudaStream_t stream);

}  // namespace paged::cuda
