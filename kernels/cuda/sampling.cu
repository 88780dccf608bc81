// GPU sampler; see sampling.h for what it reproduces and why it never sorts.
//
// First each row's maximum and log-sum-exp, read by up to kMaxRowSplits blocks a row (row_stats_kernel); then one
// thread block per row, which a greedy row leaves at once. The row's probabilities (float32, exactly as the CPU
// sampler rounds them) go to the workspace; every question about the descending order is then a "descent": find the
// element at which a running count or a running mass, accumulated in descending order, first reaches a target. A
// descent takes four passes, one per 8-bit digit of the probability's bit pattern (non-negative floats order like
// their bits): each pass histograms, per warp, the count and the double mass of the elements that share the digits
// chosen so far, and a scan of the 256 bins from the top picks the bin where the target is reached.
#include "kernels/cuda/sampling.h"

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <string>

#include "kernels/cuda/device_utils.cuh"

namespace paged::cuda {

namespace {

constexpr int kSampleThreads = 256;
constexpr int kSampleWarps = kSampleThreads / 32;
constexpr int kBins = 256;

struct Histograms {
  unsigned count[kSampleWarps][kBins];  // per warp: each warp writes only its own row, so no atomics are needed
  double mass[kSampleWarps][kBins];
};

struct SampleShared {
  Histograms hist;
  unsigned long long bin_count[kBins];  // the warps' histograms merged
  double bin_mass[kBins];
  double scratch_d[kSampleWarps];
  float scratch_f[kSampleWarps];
  int scratch_i[kSampleWarps];
  // Result of the last descent, written by warp 0.
  unsigned prefix;
  long long count_above;
  double mass_above;
  bool found;
  int token;
};

// The result of a descent: the element's probability bits, how many elements and how much mass come before all
// elements of that value, and how many elements share the value.
struct Position {
  unsigned key;
  long long count_above;
  double mass_above;
  long long ties;
  bool found;
};

enum class Target { count, mass_at_least, mass_above };

// Block-wide: finds, in descending order, the first element at which the running count reaches `count`
// (Target::count), or the running mass reaches `mass` (mass_at_least: cum >= mass) or exceeds it (mass_above:
// cum > mass). found = false when the whole row does not reach a mass target.
__device__ Position descend(const float* __restrict__ probs, int vocab, Target target, long long count, double mass,
                            SampleShared& sh) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  unsigned prefix = 0;
  long long count_above = 0;
  double mass_above = 0.0;
  long long ties = 0;
  for (int level = 0; level < 4; ++level) {
    const int shift = 24 - 8 * level;
    for (int b = lane; b < kBins; b += 32) {
      sh.hist.count[warp][b] = 0;
      sh.hist.mass[warp][b] = 0.0;
    }
    __syncwarp();
    // The loop bound is warp-uniform: all lanes take part in the ballots.
    for (int base = warp * 32; base < vocab; base += kSampleThreads) {
      const int i = base + lane;
      const float p = i < vocab ? probs[i] : 0.f;
      const unsigned key = __float_as_uint(p);
      const bool match = i < vocab && (level == 0 || (key >> (shift + 8)) == prefix);
      const int bin = (key >> shift) & (kBins - 1);
      unsigned pending = __ballot_sync(kFullMask, match);
      while (pending) {  // one round per distinct bin among the warp's matching lanes
        const int b = __shfl_sync(kFullMask, bin, __ffs(pending) - 1);
        const bool mine = match && bin == b;
        const unsigned peers = __ballot_sync(kFullMask, mine);
        const double m = warp_sum(mine ? static_cast<double>(p) : 0.0);
        if (lane == 0) {
          sh.hist.count[warp][b] += __popc(peers);
          sh.hist.mass[warp][b] += m;
        }
        pending &= ~peers;
      }
    }
    __syncthreads();
    for (int b = threadIdx.x; b < kBins; b += kSampleThreads) {
      unsigned long long c = 0;
      double s = 0.0;
      for (int w = 0; w < kSampleWarps; ++w) {
        c += sh.hist.count[w][b];
        s += sh.hist.mass[w][b];
      }
      sh.bin_count[b] = c;
      sh.bin_mass[b] = s;
    }
    __syncthreads();
    if (warp == 0) {
      // Lane L scans bins 255 - 8L down to 248 - 8L; a prefix sum over lanes gives what lies above each lane.
      long long lane_count = 0;
      double lane_mass = 0.0;
      for (int j = 0; j < 8; ++j) {
        const int b = kBins - 1 - 8 * lane - j;
        lane_count += sh.bin_count[b];
        lane_mass += sh.bin_mass[b];
      }
      long long incl_count = lane_count;
      double incl_mass = lane_mass;
      for (int off = 1; off < 32; off <<= 1) {
        const long long c = __shfl_up_sync(kFullMask, incl_count, off);
        const double s = __shfl_up_sync(kFullMask, incl_mass, off);
        if (lane >= off) {
          incl_count += c;
          incl_mass += s;
        }
      }
      auto reached = [&](long long c, double s) {
        if (target == Target::count) return c >= count;
        if (target == Target::mass_at_least) return s >= mass;
        return s > mass;
      };
      const unsigned hit = __ballot_sync(kFullMask, reached(count_above + incl_count, mass_above + incl_mass));
      // Deeper levels re-sum the chosen bin's elements in another order; if rounding leaves the target just out
      // of reach, the target lies at the end of the bin: take its last non-empty sub-bin.
      const unsigned nonempty = __ballot_sync(kFullMask, lane_count > 0);
      const bool found = hit != 0 || (level > 0 && nonempty != 0);
      const int owner = hit != 0 ? __ffs(hit) - 1 : (nonempty != 0 ? 31 - __clz(nonempty) : 0);
      if (lane == owner && found) {
        long long c = count_above + incl_count - lane_count;
        double s = mass_above + incl_mass - lane_mass;
        int chosen = -1, last_nonempty = -1;
        for (int j = 0; j < 8; ++j) {
          const int b = kBins - 1 - 8 * lane - j;
          if (sh.bin_count[b] == 0) continue;
          if (hit != 0 && reached(c + static_cast<long long>(sh.bin_count[b]), s + sh.bin_mass[b])) {
            chosen = b;
            break;
          }
          last_nonempty = b;
          c += sh.bin_count[b];
          s += sh.bin_mass[b];
        }
        if (chosen < 0) {  // the fallback: step back over the last non-empty bin
          chosen = last_nonempty;
          c -= sh.bin_count[chosen];
          s -= sh.bin_mass[chosen];
        }
        sh.prefix = (prefix << 8) | static_cast<unsigned>(chosen);
        sh.count_above = c;
        sh.mass_above = s;
        sh.found = true;
      }
      if (lane == 0 && !found) sh.found = false;
    }
    __syncthreads();
    if (!sh.found) return Position{0, 0, 0.0, 0, false};
    prefix = sh.prefix;
    count_above = sh.count_above;
    mass_above = sh.mass_above;
    ties = static_cast<long long>(sh.bin_count[prefix & (kBins - 1)]);
    __syncthreads();  // sh is rewritten by the next level
  }
  return Position{prefix, count_above, mass_above, ties, true};
}

// Block-wide: the id of the rank-th (1-based) element, in increasing id order, whose probability bits are `key`.
__device__ int nth_with_key(const float* __restrict__ probs, int vocab, unsigned key, long long rank, long long ties,
                            SampleShared& sh) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (threadIdx.x == 0) sh.token = -1;
  __syncthreads();
  if (ties == 1) {  // the usual case: the value is unique, whoever holds it writes it
    for (int i = threadIdx.x; i < vocab; i += kSampleThreads)
      if (__float_as_uint(probs[i]) == key) sh.token = i;
    __syncthreads();
    return sh.token;
  }
  long long seen = 0;
  for (int base = 0; base < vocab; base += kSampleThreads) {
    const int i = base + threadIdx.x;
    const bool match = i < vocab && __float_as_uint(probs[i]) == key;
    const unsigned ballot = __ballot_sync(kFullMask, match);
    if (lane == 0) sh.scratch_i[warp] = __popc(ballot);
    __syncthreads();
    long long before = seen + __popc(ballot & ((1u << lane) - 1));
    long long chunk = 0;
    for (int w = 0; w < kSampleWarps; ++w) {
      if (w < warp) before += sh.scratch_i[w];
      chunk += sh.scratch_i[w];
    }
    if (match && before + 1 == rank) sh.token = i;
    seen += chunk;
    __syncthreads();
    if (seen >= rank) break;  // uniform: every thread has the same `seen`
  }
  return sh.token;
}

// Block-wide: the largest (value, id) in the order "value descending, then id ascending" among the candidates each
// thread offers (value -inf and an id past every other when it has none); every thread gets the result. `scratch_f`
// and `scratch_i` hold one entry per warp; every thread of the block must call it.
__device__ void block_best(float& value, int& id, float* scratch_f, int* scratch_i) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int off = 16; off > 0; off >>= 1) {
    const float v = __shfl_xor_sync(kFullMask, value, off);
    const int i = __shfl_xor_sync(kFullMask, id, off);
    if (v > value || (v == value && i < id)) {
      value = v;
      id = i;
    }
  }
  __syncthreads();  // the scratch may still be read by the previous call
  if (lane == 0) {
    scratch_f[warp] = value;
    scratch_i[warp] = id;
  }
  __syncthreads();
  value = scratch_f[0];
  id = scratch_i[0];
  for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w)
    if (scratch_f[w] > value || (scratch_f[w] == value && scratch_i[w] < id)) {
      value = scratch_f[w];
      id = scratch_i[w];
    }
}

// One slice of a row's logits: its maximum with the lowest id holding it, and the sum of exp(logit - max) over the
// slice (in double, of float exponentials).
struct RowPartial {
  float max;
  int id;
  double sum;
};
constexpr int kMaxRowSplits = 64;      // slices a row is read in, at most
constexpr int kStatsBlocksWanted = 256;  // about two thread blocks per SM of an H100 / H200
constexpr int kStatsThreads = 256;

// grid: (rows, splits); block: kStatsThreads. Block (r, b) reads slice b of logits row r (logits_rows[r], or r) in
// one pass: each thread keeps its running maximum, the first id holding it and its sum of exp(logit - maximum),
// rescaled when the maximum rises; the block merges them into partials[r * kMaxRowSplits + b]. A single-stream step
// has one row: its 128k logits are then read by `splits` blocks at once instead of one.
__global__ void __launch_bounds__(kStatsThreads)
    row_stats_kernel(RowPartial* __restrict__ partials, const float* __restrict__ logits,
                     const int32_t* __restrict__ logits_rows, int vocab) {
  __shared__ float scratch_f[kStatsThreads / 32];
  __shared__ int scratch_i[kStatsThreads / 32];
  __shared__ double scratch_d[kStatsThreads / 32];
  const int row = blockIdx.x, splits = gridDim.y;
  const float* lg = logits + static_cast<int64_t>(logits_rows ? logits_rows[row] : row) * vocab;
  const int chunk = (vocab + splits - 1) / splits, begin = blockIdx.y * chunk, end = min(vocab, begin + chunk);
  float best = -INFINITY;
  int best_id = vocab;
  double sum = 0.0;
#pragma unroll 4
  for (int i = begin + threadIdx.x; i < end; i += kStatsThreads) {
    const float v = lg[i];
    if (v > best) {  // ids increase along a thread's walk: the first maximum wins
      sum = best == -INFINITY ? 0.0 : sum * static_cast<double>(expf(best - v));
      best = v;
      best_id = i;
    }
    if (best != -INFINITY) sum += expf(v - best);  // -inf logits (masked) add nothing, even before a finite one
  }
  float block_max = best;
  int block_id = best_id;
  block_best(block_max, block_id, scratch_f, scratch_i);
  // This thread's sum relative to the block's maximum (nothing from a thread that saw only -inf).
  sum = best == -INFINITY ? 0.0 : sum * static_cast<double>(expf(best - block_max));
  sum = block_sum(sum, scratch_d);
  if (threadIdx.x == 0) partials[row * kMaxRowSplits + blockIdx.y] = {block_max, block_id, sum};
}

// grid: (rows); block: kSampleThreads. Row r samples tokens[r] from logits[r].
__global__ void __launch_bounds__(kSampleThreads)
    sample_kernel(int32_t* __restrict__ tokens, float* __restrict__ logprobs, const float* __restrict__ logits,
                  const int32_t* __restrict__ logits_rows, const SamplingRow* __restrict__ params, int vocab,
                  const RowPartial* __restrict__ partials,  // [rows][kMaxRowSplits], `splits` used a row
                  int splits,
                  float* __restrict__ probs_all)  // [rows][vocab] workspace
{
  __shared__ SampleShared sh;
  const int row = blockIdx.x;
  const float* lg = logits + static_cast<int64_t>(logits_rows ? logits_rows[row] : row) * vocab;
  float* probs = probs_all + static_cast<int64_t>(row) * vocab;
  const SamplingRow prm = params[row];

  // Maximum and its lowest id (the CPU's greedy pick: the first strict improvement) and the log-sum-exp of the raw
  // logits (summed in double as the CPU's log_softmax), merged from row_stats_kernel's slices in slice order. The
  // terms are float exponentials: their rounding moves the logprob by ~1e-7.
  const RowPartial* part = partials + static_cast<int64_t>(row) * kMaxRowSplits;
  float best = -INFINITY;
  int best_id = vocab;
  for (int b = 0; b < splits; ++b)
    if (part[b].max > best) {  // slices are in id order: the first maximum wins
      best = part[b].max;
      best_id = part[b].id;
    }
  if (best_id >= vocab) best_id = 0;  // every logit -inf (or NaN): the CPU keeps its initial pick, id 0
  const float mx = best;
  double sum_exp = 0.0;
  for (int b = 0; b < splits; ++b)
    if (part[b].max != -INFINITY) sum_exp += part[b].sum * static_cast<double>(expf(part[b].max - mx));
  const double lse = mx + log(sum_exp);

  int chosen = best_id;
  if (prm.temperature != 0.0f) {
    // x = exp((l - max) / T) rounded to float, its double sum, p = float(x / sum): the CPU's expression. exp is
    // taken in double and rounded once, which is what glibc's expf returns (correctly rounded in practice).
    const float inv_t = 1.0f / prm.temperature;
    double sum_x = 0.0;
    for (int i = threadIdx.x; i < vocab; i += kSampleThreads) {
      const float x = static_cast<float>(exp(static_cast<double>((lg[i] - mx) * inv_t)));
      probs[i] = x;
      sum_x += x;
    }
    sum_x = block_sum(sum_x, sh.scratch_d);
    for (int i = threadIdx.x; i < vocab; i += kSampleThreads)  // each thread rewrites only its own elements
      probs[i] = static_cast<float>(static_cast<double>(probs[i]) / sum_x);
    const float p_max = static_cast<float>(1.0 / sum_x);  // x of the maximum is exp(0) = 1
    __syncthreads();  // the descents read every thread's probabilities

    long long keep = vocab;
    if (prm.top_k > 0 && prm.top_k < keep) keep = prm.top_k;
    if (prm.top_p < 1.0f) {
      const Position p = descend(probs, vocab, Target::mass_at_least, 0, static_cast<double>(prm.top_p), sh);
      if (p.found) {
        // Within a run of equal values the CPU adds one value at a time; the first index reaching top_p.
        const double v = __uint_as_float(p.key);
        long long j = v > 0 ? static_cast<long long>(ceil((prm.top_p - p.mass_above) / v)) : 1;
        j = max(1ll, min(j, p.ties));
        keep = min(keep, p.count_above + j);
      }
    }
    if (prm.min_p > 0.0f) {
      const float threshold = prm.min_p * p_max;
      int n = 0;
      for (int i = threadIdx.x; i < vocab; i += kSampleThreads) n += probs[i] >= threshold;
      n = block_sum(n, sh.scratch_i);
      keep = min(keep, static_cast<long long>(max(n, 1)));
    }
    double total;
    if (keep == vocab) {
      double s = 0.0;
      for (int i = threadIdx.x; i < vocab; i += kSampleThreads) s += probs[i];
      total = block_sum(s, sh.scratch_d);
    } else {
      const Position p = descend(probs, vocab, Target::count, keep, 0.0, sh);
      total = p.mass_above + static_cast<double>(keep - p.count_above) * __uint_as_float(p.key);
    }
    const double target = sampling_uniform(prm.seed, prm.index) * total;
    Position p = descend(probs, vocab, Target::mass_above, 0, target, sh);
    long long rank = 1;  // 1-based among the elements equal to p.key
    if (p.found) {
      const double v = __uint_as_float(p.key);
      rank = v > 0 ? static_cast<long long>(floor((target - p.mass_above) / v)) + 1 : 1;
      rank = max(1ll, min(rank, p.ties));
    }
    if (!p.found || p.count_above + rank > keep) {  // rounding past the kept set: its last element, as the CPU does
      p = descend(probs, vocab, Target::count, keep, 0.0, sh);
      rank = keep - p.count_above;
    }
    const int id = nth_with_key(probs, vocab, p.key, rank, p.ties, sh);
    if (id >= 0) chosen = id;
  }
  if (threadIdx.x == 0) {
    tokens[row] = chosen;
    logprobs[row] = static_cast<float>(static_cast<double>(lg[chosen]) - lse);
  }
}

constexpr int kScoreThreads = 256;
constexpr int kMaxScoreTop = 64;

// grid: (rows); block: kScoreThreads. Row r scores targets[r] under logits[r]; see score_tokens.
__global__ void __launch_bounds__(kScoreThreads)
    score_kernel(float* __restrict__ logprobs, int32_t* __restrict__ ranks, int32_t* __restrict__ top_ids,
                 float* __restrict__ top_logprobs, const float* __restrict__ logits,
                 const int32_t* __restrict__ targets, int vocab, int num_top) {
  __shared__ double scratch_d[kScoreThreads / 32];
  __shared__ float scratch_f[kScoreThreads / 32];
  __shared__ int scratch_i[kScoreThreads / 32];
  const int row = blockIdx.x;
  const float* lg = logits + static_cast<int64_t>(row) * vocab;
  const float mine = lg[targets[row]];

  // The maximum, then the log-sum-exp in double as paged::log_softmax takes it (exp of each term in double too).
  float best = -INFINITY;
  int best_id = INT32_MAX;
  for (int i = threadIdx.x; i < vocab; i += kScoreThreads) {
    const float v = lg[i];
    if (v > best) {
      best = v;
      best_id = i;
    }
  }
  block_best(best, best_id, scratch_f, scratch_i);
  const double mx = best;
  double sum = 0.0;
  int at_least = 0;
  for (int i = threadIdx.x; i < vocab; i += kScoreThreads) {
    const float v = lg[i];
    sum += exp(static_cast<double>(v) - mx);
    at_least += v >= mine;
  }
  sum = block_sum(sum, scratch_d);
  at_least = block_sum(at_least, scratch_i);
  const double lse = mx + log(sum);
  if (threadIdx.x == 0) {
    logprobs[row] = static_cast<float>(static_cast<double>(mine) - lse);
    ranks[row] = at_least;
  }

  // The top: one block-wide pick per place, each the best of what lies after the previous pick in the order.
  const int k = min(num_top, vocab);
  float prev = best;
  int prev_id = best_id;
  for (int j = 0; j < k; ++j) {
    float value = -INFINITY;
    int id = INT32_MAX;
    if (j == 0) {
      value = prev;
      id = prev_id;
    } else {
      for (int i = threadIdx.x; i < vocab; i += kScoreThreads) {
        const float v = lg[i];
        const bool after = v < prev || (v == prev && i > prev_id);
        if (after && (v > value || (v == value && i < id))) {
          value = v;
          id = i;
        }
      }
      block_best(value, id, scratch_f, scratch_i);
    }
    if (threadIdx.x == 0) {
      top_ids[static_cast<int64_t>(row) * num_top + j] = id;
      top_logprobs[static_cast<int64_t>(row) * num_top + j] = static_cast<float>(static_cast<double>(value) - lse);
    }
    prev = value;
    prev_id = id;
  }
}

// One block per row, the four sections one after the other (ids within a section are distinct but masked ones,
// which write the same value).
__global__ void apply_penalties_kernel(float* logits, const PenaltyRow* rows, const int32_t* ids, const float* values,
                                       int vocab) {
  const PenaltyRow row = rows[blockIdx.x];
  float* l = logits + int64_t{row.logits_row} * vocab;
  for (int i = row.bias + threadIdx.x; i < row.masked; i += blockDim.x) l[ids[i]] = __fadd_rn(l[ids[i]], values[i]);
  __syncthreads();
  for (int i = row.masked + threadIdx.x; i < row.repeated; i += blockDim.x) l[ids[i]] = -INFINITY;
  __syncthreads();
  for (int i = row.repeated + threadIdx.x; i < row.subtract; i += blockDim.x) {
    const float x = l[ids[i]];
    l[ids[i]] = x > 0 ? __fdiv_rn(x, row.repetition) : __fmul_rn(x, row.repetition);
  }
  __syncthreads();
  for (int i = row.subtract + threadIdx.x; i < row.end; i += blockDim.x) l[ids[i]] = __fsub_rn(l[ids[i]], values[i]);
}

}  // namespace

cudaError_t score_tokens(float* logprobs, int32_t* ranks, int32_t* top_ids, float* top_logprobs, const float* logits,
                         const int32_t* targets, int rows, int vocab, int num_top, cudaStream_t stream) {
  if (vocab <= 0) return launch_failure(cudaErrorInvalidValue, "score_tokens: vocab must be positive");
  if (num_top < 0 || num_top > kMaxScoreTop)
    return launch_failure(cudaErrorInvalidValue, "score_tokens: num_top must be in [0, 64]");
  if (rows <= 0) return cudaSuccess;
  score_kernel<<<rows, kScoreThreads, 0, stream>>>(logprobs, ranks, top_ids, top_logprobs, logits, targets, vocab,
                                                   num_top);
  return cudaGetLastError();
}

size_t sampling_workspace_bytes(int rows, int vocab) {
  return (sizeof(RowPartial) * kMaxRowSplits + sizeof(float) * static_cast<size_t>(vocab)) * static_cast<size_t>(rows);
}

cudaError_t sample_tokens(int32_t* tokens, float* logprobs, const float* logits, const int32_t* logits_rows,
                          const SamplingRow* params, int rows, int vocab, void* workspace, size_t workspace_bytes,
                          cudaStream_t stream) {
  if (vocab <= 0) return launch_failure(cudaErrorInvalidValue, "sample_tokens: vocab must be positive");
  if (rows <= 0) return cudaSuccess;
  if (workspace == nullptr || workspace_bytes < sampling_workspace_bytes(rows, vocab))
    return launch_failure(cudaErrorInvalidValue, "sample_tokens: workspace smaller than sampling_workspace_bytes");
  // The workspace: the rows' slice partials, then their probabilities.
  auto* partials = static_cast<RowPartial*>(workspace);
  auto* probs = reinterpret_cast<float*>(partials + static_cast<size_t>(rows) * kMaxRowSplits);
  const int splits = std::clamp(kStatsBlocksWanted / rows, 1, std::min(kMaxRowSplits, (vocab + 1023) / 1024));
  row_stats_kernel<<<dim3(rows, splits), kStatsThreads, 0, stream>>>(partials, logits, logits_rows, vocab);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  sample_kernel<<<rows, kSampleThreads, 0, stream>>>(tokens, logprobs, logits, logits_rows, params, vocab, partials,
                                                      splits, probs);
  return cudaGetLastError();
}

cudaError_t apply_penalties(float* logits, const PenaltyRow* rows, const int32_t* ids, const float* values, int n,
                            int vocab, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  apply_penalties_kernel<<<n, 256, 0, stream>>>(logits, rows, ids, values, vocab);
  return cudaGetLastError();
}

}  // namespace paged::cuda
