// Token sampling on the GPU: greedy, temperature, top-k, top-p, min-p, seeded. It reproduces paged::sample_logits
// (model/sampler.h) for logits that already carry the penalties: the same random number random_uniform(seed, index)
// (splitmix64, bit for bit), the same probabilities, the same cuts and the same inverse-CDF walk over the
// probabilities sorted descending with ties broken by the lower id. It never sorts: the token at a given position of
// that order is found by a radix descent over the bits of the float32 probabilities (4 passes of 8 bits, counting
// elements and summing their mass in double per digit), which selects exactly what the sorted walk selects up to
// the rounding of double sums taken in a different order.
// Penalties and logit bias are applied before it by apply_penalties (the same operations as the CPU's); beam
// candidates are the CPU sampler's. score_tokens scores known tokens (a prompt's, a sampled row's alternatives).
#pragma once

#include <cstddef>
#include <cstdint>
#include "kernels/cuda/launch.h"

namespace paged::cuda {

/// Sampling parameters of one row, with SamplingParams' meaning.
struct SamplingRow {
  float temperature = 0.0f;  // 0: greedy (argmax, lowest id among equal maxima)
  int top_k = -1;            // <= 0: off
  float top_p = 1.0f;        // (0, 1]; 1: off
  float min_p = 0.0f;        // [0, 1]; 0: off
  uint64_t seed = 0;         // the sequence's seed
  uint64_t index = 0;        // tokens the sequence generated so far: position in its random stream
};

/// One row's logits processing (paged::PenaltyOps; kernels/cuda/penalty_rows.h packs them) for apply_penalties: its sections of the ids / values arrays,
/// [bias, masked) bias, [masked, repeated) masked, [repeated, subtract) repeated, [subtract, end) subtracted.
struct PenaltyRow {
  int32_t logits_row = 0;
  float repetition = 1.0f;
  int32_t bias = 0, masked = 0, repeated = 0, subtract = 0, end = 0;
};

/// Applies each row's PenaltyOps to its logits row in place, as paged::apply_penalty_ops (its CPU twin) does, with
/// the same float operations (no contraction). grid (n), one thread block per row; rows name distinct logits rows.
cudaError_t apply_penalties(float* logits,              // [logits rows][vocab]
                            const PenaltyRow* rows,     // [n], device memory
                            const int32_t* ids,         // the rows' sections, each id in [0, vocab)
                            const float* values,        // parallel to ids (bias and subtract sections)
                            int n, int vocab, cudaStream_t stream);

/// Workspace bytes sample_tokens needs for `rows` rows of `vocab` logits (one float32 probability per logit).
size_t sampling_workspace_bytes(int rows, int vocab);

/// Samples one token per row. Two launches: the rows' maxima and log-sum-exps, each row read once by up to 64 thread
/// blocks at a time (a one-stream step's single row is then not read by one SM alone), then one thread block per row,
/// which a greedy row leaves at once. Row r reads logits row logits_rows[r]
/// (several samples of one sequence share its logits), or row r when logits_rows is null.
/// logprobs[r] = log-softmax of those logits at the chosen token, before temperature (as the CPU sampler reports).
cudaError_t sample_tokens(int32_t* tokens,              // [rows]
                          float* logprobs,              // [rows]
                          const float* logits,          // [logits rows][vocab]
                          const int32_t* logits_rows,   // [rows] or nullptr
                          const SamplingRow* params,    // [rows], device memory
                          int rows, int vocab, void* workspace, size_t workspace_bytes, cudaStream_t stream);

/// Scores one known token per row (prompt logprobs), as paged::score_token (model/sampling/sampler.h), its CPU twin,
/// does: logprobs[r] = log-softmax of logits row r at targets[r] (the log-sum-exp in double), ranks[r] = how many of
/// the row's logits are at least the target's, and the min(num_top, vocab) largest logits of the row, descending
/// with ties by the lower id, as ids and logprobs in top_ids / top_logprobs row r (num_top entries a row).
/// grid (rows), one thread block per row; num_top in [0, 64].
cudaError_t score_tokens(float* logprobs,          // [rows]
                         int32_t* ranks,           // [rows]
                         int32_t* top_ids,         // [rows][num_top]
                         float* top_logprobs,      // [rows][num_top]
                         const float* logits,      // [rows][vocab]
                         const int32_t* targets,   // [rows], each in [0, vocab)
                         int rows, int vocab, int num_top, cudaStream_t stream);

/// The uniform in [0, 1) of paged::random_uniform(seed, index), callable from host and device code alike.
__host__ __device__ inline double sampling_uniform(uint64_t seed, uint64_t index) {
  uint64_t z = seed + (index + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * (1.0 / 9007199254740992.0);
}

}  // namespace paged::cuda
