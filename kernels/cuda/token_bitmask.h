// Structured outputs on the GPU: a token bitmask (model/constraint/token_mask.h's layout) applied to logits rows.
#pragma once

#include <cstdint>

#include "kernels/cuda/launch.h"

namespace paged::cuda {

/// Sets to -inf every logit of row rows[i] whose bit in mask i is clear (bit id % 32 of word id / 32), as
/// paged::apply_token_mask (model/sampling/sampler.h, its CPU twin) does. grid (ceil(vocab / 256), n), 256 threads;
/// rows name distinct logits rows.
cudaError_t apply_token_bitmask(float* logits,          // [logits rows][vocab]
                                const int32_t* rows,    // [n], device memory: the logits row of each mask
                                const uint32_t* masks,  // [n][ceil(vocab / 32)], device memory
                                int n, int vocab, cudaStream_t stream);

}  // namespace paged::cuda
