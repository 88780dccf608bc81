// Deterministic random bf16 fills: the weights of a model built from a config alone (benchmarks of the runner
// without a checkpoint on disk).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/launch.h"

namespace paged::cuda {

/// p[i] = offset + scale * (2 u(seed, i) - 1) with u the sampler's counter-based uniform (sampling_uniform):
/// the same values whatever the launch shape.
cudaError_t fill_random_bf16(bf16* p,  // [n]
                             size_t n, uint64_t seed, float scale, float offset, cudaStream_t stream);

}  // namespace paged::cuda
