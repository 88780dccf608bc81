// Paged-attention decode, flash-decoding style. See attention.h for the contract.
//
// Work split. A thread block owns (KV head, sequence, partition): it reads the partition's K and V rows of that KV
// head exactly once and serves all `group` query heads that share them (GQA) on tensor cores, so the cache is read
// once per KV head and not once per query head. A sequence that fits one partition writes its output directly;
// longer ones merge their partitions' (normalised partial output, max, sum): up to kMaxDecodeCluster partitions as
// one thread block cluster in distributed shared memory, more through global memory and paged_decode_reduce_kernel.
#include "kernels/cuda/attention.h"

#include <string>

#include <cooperative_groups.h>

#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/kv_fp8.h"
#include "kernels/cuda/mma.cuh"

namespace paged::cuda {

namespace {

constexpr int kDecodeThreads = 128;
constexpr int kDecodeWarps = kDecodeThreads / 32;
constexpr float kLog2e = 1.4426950408889634f;  // scores are kept in base 2 so that softmax uses exp2f

// mma_bf16_16816 (kernels/cuda/mma.cuh) with rows 8..15 of A zero and their results dropped (groups of at most 8
// query heads): the caller keeps two accumulators per tile instead of four, which is what lets three thread blocks
// share an SM.
__device__ __forceinline__ void mma_bf16_16816_top(float (&d)[2], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
  [[maybe_unused]] float unused0, unused1;
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %12};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(unused0), "=f"(unused1)
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1), "f"(d[0]), "f"(d[1]), "f"(0.f));
}

// Thread block clusters (sm_90): the partitions of one KV head and sequence merge in distributed shared memory
// (launch_decode launches them so: cluster rank = partition). Elsewhere every block is its own cluster.
__device__ __forceinline__ unsigned cluster_size() {
#if __CUDA_ARCH__ >= 900
  return cooperative_groups::this_cluster().num_blocks();
#else
  return 1;
#endif
}

__device__ __forceinline__ void cluster_sync() {
#if __CUDA_ARCH__ >= 900
  cooperative_groups::this_cluster().sync();
#endif
}

// The same shared variable as *p in the cluster's block `rank`.
template <class T>
__device__ __forceinline__ const T* cluster_peer(const T* p, int rank) {
#if __CUDA_ARCH__ >= 900
  return cooperative_groups::this_cluster().map_shared_rank(p, rank);
#else
  return p;
#endif
}

// Loads 8 bf16 (16 bytes) as four 32-bit words into w[0..3].
__device__ __forceinline__ void load_words(uint32_t* w, const bf16* p) {
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  w[0] = v.x;
  w[1] = v.y;
  w[2] = v.z;
  w[3] = v.w;
}

// Eight e4m3 codes as four 32-bit words of two bf16 each, exactly (every e4m3 value is a bf16 value): an FP8 cache
// row's slice in the registers a bf16 row's goes to.
__device__ __forceinline__ void codes_to_words(uint32_t* w, const uint2& codes) {
  float f[8];
  e4m3x8_to_float(codes, f);
#pragma unroll
  for (int h = 0; h < 4; ++h) w[h] = pack_bf16(f[2 * h], f[2 * h + 1]);
}

// 8 * N e4m3 codes from global memory as N uint2 (zeros where !valid), in 16-byte loads where N is even: each load in
// flight then carries twice the bytes (the FP8 loop is bound by its loads in flight, not by their bytes). `p` is
// 16-byte aligned when N is even (a slice of a cache row), 8-byte aligned otherwise.
template <int N>
__device__ __forceinline__ void load_codes(uint2 (&dst)[N], const uint8_t* p, bool valid) {
  if constexpr (N % 2 == 0) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const uint4 v = valid ? reinterpret_cast<const uint4*>(p)[i] : make_uint4(0u, 0u, 0u, 0u);
      dst[2 * i] = make_uint2(v.x, v.y);
      dst[2 * i + 1] = make_uint2(v.z, v.w);
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) dst[i] = valid ? reinterpret_cast<const uint2*>(p)[i] : make_uint2(0u, 0u);
  }
}

// grid: (num_kv_heads, num_seqs, max_partitions); block: kDecodeThreads (4 warps).
//
// Tensor cores. The M dimension of the MMA is the group's query heads (rows 0..15; rows >= group are zero queries
// whose results are dropped), so each K/V row read from memory serves every query head of its KV head.
// Warp w takes the 16-token chunks w, w + 4, ... of the partition and keeps its own online softmax (max, sum, 16 x
// HEAD_DIM output in MMA accumulators); the four warps merge through shared memory at the end.
//
// The dot products do not care in which order head_dim is summed, so head_dim is permuted to make every operand a
// plain 16-byte load from global memory, with no shared-memory staging:
//   scores S = Q K^T: lane (g, c) loads token g of each 8-token tile, elements [c * D/4, (c + 1) * D/4); in k-step s
//   its B registers are elements s*4 + {0,1} and s*4 + {2,3} of that slice, and Q's A registers use the same map;
//   output O = P V: lane (g, c) loads tokens {2c, 2c+1, 2c+8, 2c+9} of the chunk, elements [g * D/8, (g + 1) * D/8);
//   n-tile j's column g is element g * D/8 + j, so its B registers pair two tokens' element j (one byte permute),
//   and accumulator column n of tile j is element n * D/8 + j: lane (g, c) ends with elements [2c * D/8, (2c + 2) *
//   D/8) of rows g and g + 8.
// P goes from the score accumulators straight into A registers (the accumulator layout of two 8-token tiles is the
// A layout of one 16-token k-step). kTall: the group has more than 8 query heads, rows 8..15 are used too.
// kFp8: the FP8 cache. Its codes go to the same registers as bf16 (exact), a token's key scale multiplies its
// scores and its value scale its probabilities in P V (the softmax sums take the probabilities unscaled).
template <int HEAD_DIM, bool kTall, bool kFp8>
// FP8, groups of 8 or fewer: registers for three blocks an SM, as bf16 takes by itself (the loads in flight bound the
// kernel; a few bytes spill).
__global__ void __launch_bounds__(kDecodeThreads, kFp8 && !kTall ? 3 : 1)
    paged_decode_kernel(PagedAttentionArgs a, int log2_block_size, int partition_size, int max_partitions,
                        float* __restrict__ part_out,  // [num_seqs][num_heads][max_partitions][HEAD_DIM]
                        float* __restrict__ part_max,  // [num_seqs][num_heads][max_partitions]
                        float* __restrict__ part_sum)  // [num_seqs][num_heads][max_partitions]
{
  constexpr int kRows = kTall ? 16 : 8;     // query heads of the group the block can hold (MMA rows in use)
  constexpr int kAcc = kTall ? 4 : 2;       // accumulators per lane and 8-column tile
  constexpr int kSteps = HEAD_DIM / 16;     // k-steps of S = Q K^T
  constexpr int kTiles = HEAD_DIM / 8;      // n-tiles of O = P V
  constexpr int kSlice = HEAD_DIM / 4;      // elements of a K row one lane holds
  constexpr int kVSlice = HEAD_DIM / 8;     // elements of a V row one lane holds
  constexpr int kMaxBlocks = kMaxDecodePartition / 8;

  __shared__ __align__(16) float warp_out[kDecodeWarps][kRows][HEAD_DIM];  // per-warp P.V, unnormalised
  __shared__ float warp_max[kDecodeWarps][kRows], warp_sum[kDecodeWarps][kRows];
  __shared__ float part_max_smem[kRows], part_sum_smem[kRows];  // in a cluster: this partition's, for the merge
  __shared__ int blocks[kMaxBlocks];

  wait_for_previous_grid();  // launched early (launch_early): the cache write and the queries before it
  allow_dependent_launch();  // the reduction, or the O projection, may launch now (device_utils.cuh)
  const int kv_head = blockIdx.x, seq = blockIdx.y, part = blockIdx.z;
  const int ctx = a.context_lens[seq];
  const int start = part * partition_size;
  // The first position the query sees (sliding window); partitions wholly before it are skipped here and by the
  // merge alike, and tokens before it are masked. The grid is sized for max_context_len: shorter sequences have
  // fewer partitions, and the blocks past them have nothing to do either.
  const int lo = a.window > 0 ? max(0, ctx - a.window) : 0;
  const bool active = start < ctx && start + min(partition_size, ctx - start) > lo;
  // Launched in clusters (one per KV head and sequence), the partitions merge in distributed shared memory and an
  // idle block still takes part; otherwise it leaves.
  const bool in_cluster = cluster_size() > 1;
  if (!active && !in_cluster) return;
  const int len = active ? min(partition_size, ctx - start) : 0;
  const int group = a.num_heads / a.num_kv_heads;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, c = lane % 4;

  // The block table slice goes to shared memory once: token lookups are then shared loads, one dependent global
  // load fewer on the path to each K/V row.
  const int first_block = start >> log2_block_size;
  const int num_blocks = len > 0 ? ((start + len - 1) >> log2_block_size) - first_block + 1 : 0;
  const int32_t* table = a.block_tables + static_cast<int64_t>(seq) * a.max_blocks_per_seq + first_block;
  for (int i = threadIdx.x; i < num_blocks; i += kDecodeThreads) blocks[i] = table[i];

  // Q as A registers: rows g and g + 8 (query heads kv_head * group + g, + 8), this lane's permuted slice.
  uint32_t q_lo[kSlice / 2], q_hi[kTall ? kSlice / 2 : 1];
  {
    const bf16* q_row = a.q + seq * a.q_stride + static_cast<int64_t>(kv_head) * group * HEAD_DIM + c * kSlice;
#pragma unroll
    for (int i = 0; i < kSlice / 8; ++i) {
      if (g < group) {
        load_words(&q_lo[4 * i], q_row + g * HEAD_DIM + 8 * i);
      } else {
        q_lo[4 * i] = q_lo[4 * i + 1] = q_lo[4 * i + 2] = q_lo[4 * i + 3] = 0u;
      }
      if constexpr (kTall) {
        if (g + 8 < group) {
          load_words(&q_hi[4 * i], q_row + (g + 8) * HEAD_DIM + 8 * i);
        } else {
          q_hi[4 * i] = q_hi[4 * i + 1] = q_hi[4 * i + 2] = q_hi[4 * i + 3] = 0u;
        }
      }
    }
  }
  __syncthreads();

  // Element offset of token j (relative to start) of this KV head; int64: one layer's cache passes 2^31 elements.
  const int64_t block_stride = static_cast<int64_t>(a.num_kv_heads) * HEAD_DIM << log2_block_size;
  const int64_t head_offset = static_cast<int64_t>(kv_head) * HEAD_DIM << log2_block_size;
  const int in_block_mask = (1 << log2_block_size) - 1;
  auto token_offset = [&](int j) {
    return blocks[j >> log2_block_size] * block_stride + head_offset + (j & in_block_mask) * HEAD_DIM;
  };
  // The FP8 layout (kernels/cuda/kv_fp8.h), in bytes: a block's codes, then its scales.
  const int64_t fp8_block_bytes = kv_fp8_block_bytes(a.num_kv_heads, 1 << log2_block_size, HEAD_DIM);
  const int64_t fp8_scales_at = kv_fp8_scales_offset(a.num_kv_heads, 1 << log2_block_size, HEAD_DIM);
  auto code_offset = [&](int j) {
    return blocks[j >> log2_block_size] * fp8_block_bytes + head_offset + (j & in_block_mask) * HEAD_DIM;
  };
  auto scale_of = [&](const uint8_t* cache, int j) {
    const int64_t row = (static_cast<int64_t>(kv_head) << log2_block_size) + (j & in_block_mask);
    return reinterpret_cast<const float*>(cache + blocks[j >> log2_block_size] * fp8_block_bytes + fp8_scales_at)[row];
  };

  const float score_scale = a.scale * kLog2e;  // scores in base 2: softmax uses exp2f
  float o[kTiles][kAcc];
#pragma unroll
  for (int j = 0; j < kTiles; ++j)
#pragma unroll
    for (int e = 0; e < kAcc; ++e) o[j][e] = 0.f;
  float m_lo = -INFINITY, m_hi = -INFINITY;  // running max of rows g and g + 8
  float l_lo = 0.f, l_hi = 0.f;              // this lane's part of the running sums

  // One 16-token chunk from t0 (holding a visible token): S = Q K^T from kw, the online softmax, O += P V from vw;
  // FP8: the tokens' key scales on the scores, their value scales on P.
  const auto process = [&](int t0, const uint32_t (&kw)[2][kSlice / 2], const uint32_t (&vw)[4][kVSlice / 2],
                           const float (&k_scale)[2][2], const float (&v_scale)[2][2]) {
    // S = Q K^T for the two 8-token tiles. Lane (g, c) gets tokens tile*8 + 2c + {0, 1} of row g (s[tile][0..1])
    // and of row g + 8 (s[tile][2..3], kTall only); a row's 16 scores live in the 4 lanes of a quad.
    float s[2][kAcc];
#pragma unroll
    for (int tile = 0; tile < 2; ++tile) {
#pragma unroll
      for (int e = 0; e < kAcc; ++e) s[tile][e] = 0.f;
#pragma unroll
      for (int k = 0; k < kSteps; ++k) {
        if constexpr (kTall)
          mma_bf16_16816(s[tile], q_lo[2 * k], q_hi[2 * k], q_lo[2 * k + 1], q_hi[2 * k + 1], kw[tile][2 * k],
                         kw[tile][2 * k + 1]);
        else
          mma_bf16_16816_top(s[tile], q_lo[2 * k], q_lo[2 * k + 1], kw[tile][2 * k], kw[tile][2 * k + 1]);
      }
    }
    // Scale, mask the tail, online softmax.
    float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
    for (int tile = 0; tile < 2; ++tile) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int j = t0 + tile * 8 + 2 * c + e;
        const bool valid = j < len && start + j >= lo;
        float scale = score_scale;
        if constexpr (kFp8) scale *= k_scale[tile][e];
        s[tile][e] = valid ? s[tile][e] * scale : -INFINITY;
        mx_lo = fmaxf(mx_lo, s[tile][e]);
        if constexpr (kTall) {
          s[tile][2 + e] = valid ? s[tile][2 + e] * scale : -INFINITY;
          mx_hi = fmaxf(mx_hi, s[tile][2 + e]);
        }
      }
    }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(kFullMask, mx_lo, off));
      if constexpr (kTall) mx_hi = fmaxf(mx_hi, __shfl_xor_sync(kFullMask, mx_hi, off));
    }
    // Every chunk run holds at least one valid token (it reaches past lo, and lo < start + len), so the new maxima
    // are finite; the old may be -inf (alpha 0).
    const float new_lo = fmaxf(m_lo, mx_lo);
    const float alpha_lo = exp2f(m_lo - new_lo);
    m_lo = new_lo;
    float p[2][kAcc];
#pragma unroll
    for (int tile = 0; tile < 2; ++tile) {
      p[tile][0] = exp2f(s[tile][0] - new_lo);
      p[tile][1] = exp2f(s[tile][1] - new_lo);
    }
    l_lo = l_lo * alpha_lo + p[0][0] + p[0][1] + p[1][0] + p[1][1];
    float alpha_hi = 1.f;
    if constexpr (kTall) {
      const float new_hi = fmaxf(m_hi, mx_hi);
      alpha_hi = exp2f(m_hi - new_hi);
      m_hi = new_hi;
#pragma unroll
      for (int tile = 0; tile < 2; ++tile) {
        p[tile][2] = exp2f(s[tile][2] - new_hi);
        p[tile][3] = exp2f(s[tile][3] - new_hi);
      }
      l_hi = l_hi * alpha_hi + p[0][2] + p[0][3] + p[1][2] + p[1][3];
    }
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      o[j][0] *= alpha_lo;
      o[j][1] *= alpha_lo;
      if constexpr (kTall) {
        o[j][2] *= alpha_hi;
        o[j][3] *= alpha_hi;
      }
    }
    // O += P V: P's A registers are the score accumulators, rounded to bf16 (FP8: times each token's value scale).
    if constexpr (kFp8) {
#pragma unroll
      for (int tile = 0; tile < 2; ++tile)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          p[tile][e] *= v_scale[tile][e];
          if constexpr (kTall) p[tile][2 + e] *= v_scale[tile][e];
        }
    }
    const uint32_t pa0 = pack_bf16(p[0][0], p[0][1]), pa2 = pack_bf16(p[1][0], p[1][1]);
    uint32_t pa1 = 0u, pa3 = 0u;
    if constexpr (kTall) {
      pa1 = pack_bf16(p[0][2], p[0][3]);
      pa3 = pack_bf16(p[1][2], p[1][3]);
    }
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      // Element j of the lane's V slice from tokens 2c and 2c+1 (b0), 2c+8 and 2c+9 (b1).
      const uint32_t sel = (j & 1) ? 0x7632u : 0x5410u;
      const uint32_t b0 = __byte_perm(vw[0][j / 2], vw[1][j / 2], sel);
      const uint32_t b1 = __byte_perm(vw[2][j / 2], vw[3][j / 2], sel);
      if constexpr (kTall)
        mma_bf16_16816(o[j], pa0, pa1, pa2, pa3, b0, b1);
      else
        mma_bf16_16816_top(o[j], pa0, pa2, b0, b1);
    }
  };

  if constexpr (kFp8) {
    // 32 tokens a warp and iteration: the codes and scales of two chunks in flight at once, as many bytes as one bf16
    // chunk's (the loads' latency, not the bytes, bounds this loop), converted once all are issued.
    // Measured and not kept (bench_cuda_attention, best partition): a per-warp shared-memory ring of four 16-token
    // stages, filled by the lanes' cp.async or by bulk copies with an mbarrier, matched this loop at 1000 x 2,000 on
    // an H100 (~2.85 TB/s, that card's DRAM bound) and lost 10-40% at small batches (160 x 600, 32 x 300); with L2-only
    // cp.async.cg of the K slices (two half sectors a lane) it lost 37%. f16 operands (one cvt.rn.f16x2.e4m3x2 a code
    // pair, Q pre-scaled, P over a running value scale) take 22% fewer instructions but ~190 registers here: spilling
    // at three blocks an SM they lose 8-20%; at two (H200) 900 x 576 takes 421 us against 386, 64 x 4,000 168 vs 184.
    for (int t0 = warp * 32; t0 < len; t0 += kDecodeWarps * 32) {
      if (start + t0 + 32 <= lo) continue;  // both chunks are before the window
      uint2 k_codes[2][2][kSlice / 8], v_codes[2][4][kVSlice / 8];
      // The 32 tokens' scales: lane i loads token t0 + i's, and the lanes that use a token's take it by shuffle (one
      // load a lane for each cache instead of eight).
      const float k_lane_scale = t0 + lane < len ? scale_of(a.k_fp8, t0 + lane) : 0.f;
      const float v_lane_scale = t0 + lane < len ? scale_of(a.v_fp8, t0 + lane) : 0.f;
      float k_scale[2][2][2], v_scale[2][2][2];  // [chunk][tile][e]: tokens tile * 8 + 2c + e of the chunk
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int base = t0 + 16 * h;
#pragma unroll
        for (int tile = 0; tile < 2; ++tile) {
          const int j = base + tile * 8 + g;
          load_codes<kSlice / 8>(k_codes[h][tile], a.k_fp8 + code_offset(j) + c * kSlice, j < len);
        }
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int j = base + 2 * c + (r & 1) + (r >> 1) * 8;
          load_codes<kVSlice / 8>(v_codes[h][r], a.v_fp8 + code_offset(j) + g * kVSlice, j < len);
        }
#pragma unroll
        for (int tile = 0; tile < 2; ++tile)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int from = 16 * h + tile * 8 + 2 * c + e;
            k_scale[h][tile][e] = __shfl_sync(kFullMask, k_lane_scale, from);
            v_scale[h][tile][e] = __shfl_sync(kFullMask, v_lane_scale, from);
          }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int base = t0 + 16 * h;
        if (base >= len || start + base + 16 <= lo) continue;  // no visible token in this chunk
        uint32_t kw[2][kSlice / 2], vw[4][kVSlice / 2];
#pragma unroll
        for (int tile = 0; tile < 2; ++tile)
#pragma unroll
          for (int i = 0; i < kSlice / 8; ++i) codes_to_words(&kw[tile][4 * i], k_codes[h][tile][i]);
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
          for (int i = 0; i < kVSlice / 8; ++i) codes_to_words(&vw[r][4 * i], v_codes[h][r][i]);
        process(base, kw, vw, k_scale[h], v_scale[h]);
      }
    }
  } else {
    for (int t0 = warp * 16; t0 < len; t0 += kDecodeWarps * 16) {
      if (start + t0 + 16 <= lo) continue;  // the whole chunk is before the window
      // All loads of the chunk first: 16 (head_dim 128) 16-byte loads in flight per lane.
      uint32_t kw[2][kSlice / 2];
      uint32_t vw[4][kVSlice / 2];
#pragma unroll
      for (int tile = 0; tile < 2; ++tile) {
        const int j = t0 + tile * 8 + g;
#pragma unroll
        for (int i = 0; i < kSlice / 8; ++i) {
          if (j < len) {
            load_words(&kw[tile][4 * i], a.k_cache + token_offset(j) + c * kSlice + 8 * i);
          } else {
            kw[tile][4 * i] = kw[tile][4 * i + 1] = kw[tile][4 * i + 2] = kw[tile][4 * i + 3] = 0u;
          }
        }
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int j = t0 + 2 * c + (r & 1) + (r >> 1) * 8;  // tokens 2c, 2c+1, 2c+8, 2c+9 of the chunk
#pragma unroll
        for (int i = 0; i < kVSlice / 8; ++i) {
          if (j < len) {
            load_words(&vw[r][4 * i], a.v_cache + token_offset(j) + g * kVSlice + 8 * i);
          } else {  // zeros, not garbage: a NaN pattern times p = 0 would still be NaN
            vw[r][4 * i] = vw[r][4 * i + 1] = vw[r][4 * i + 2] = vw[r][4 * i + 3] = 0u;
          }
        }
      }
      constexpr float kNoScale[2][2] = {{1.f, 1.f}, {1.f, 1.f}};
      process(t0, kw, vw, kNoScale, kNoScale);
    }
  }

  // Row sums over the quad, then this warp's state to shared memory.
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    l_lo += __shfl_xor_sync(kFullMask, l_lo, off);
    if constexpr (kTall) l_hi += __shfl_xor_sync(kFullMask, l_hi, off);
  }
  if (c == 0) {
    warp_max[warp][g] = m_lo;
    warp_sum[warp][g] = l_lo;
    if constexpr (kTall) {
      warp_max[warp][g + 8] = m_hi;
      warp_sum[warp][g + 8] = l_hi;
    }
  }
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    warp_out[warp][g][2 * c * kVSlice + j] = o[j][0];
    warp_out[warp][g][(2 * c + 1) * kVSlice + j] = o[j][1];
    if constexpr (kTall) {
      warp_out[warp][g + 8][2 * c * kVSlice + j] = o[j][2];
      warp_out[warp][g + 8][(2 * c + 1) * kVSlice + j] = o[j][3];
    }
  }
  __syncthreads();

  // Merge the warps (a warp without tokens has max -inf and weight 0), normalise, write.
  const int num_parts = (ctx + partition_size - 1) / partition_size;
  for (int idx = threadIdx.x; idx < group * HEAD_DIM; idx += kDecodeThreads) {
    const int row = idx / HEAD_DIM, d = idx % HEAD_DIM;
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) m = fmaxf(m, warp_max[w][row]);
    float sum = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < kDecodeWarps; ++w) {
      const float weight = exp2f(warp_max[w][row] - m);
      sum += weight * warp_sum[w][row];
      acc += weight * warp_out[w][row][d];
    }
    const int64_t head = static_cast<int64_t>(seq) * a.num_heads + kv_head * group + row;
    if (num_parts == 1) {
      if (active) a.out[head * HEAD_DIM + d] = __float2bfloat16_rn(acc / sum);
    } else if (in_cluster) {  // this partition's result for the merge (each element read above by this thread only)
      warp_out[0][row][d] = active ? acc / sum : 0.f;
      if (d == 0) {
        part_max_smem[row] = active ? m : -INFINITY;
        part_sum_smem[row] = active ? sum : 0.f;
      }
    } else {
      part_out[(head * max_partitions + part) * HEAD_DIM + d] = acc / sum;
      if (d == 0) {
        part_max[head * max_partitions + part] = m;
        part_sum[head * max_partitions + part] = sum;
      }
    }
  }
  if (!in_cluster) return;
  // The cluster's merge, by its first block: paged_decode_reduce_kernel's sums in its order, over the peers' shared
  // memory. The second barrier keeps the peers' shared memory alive until it has been read.
  cluster_sync();
  if (part == 0 && num_parts > 1) {
    const int first_part = a.window > 0 ? max(0, ctx - a.window) / partition_size : 0;
    for (int idx = threadIdx.x; idx < group * HEAD_DIM; idx += kDecodeThreads) {
      const int row = idx / HEAD_DIM, d = idx % HEAD_DIM;
      float m = -INFINITY;
      for (int p = first_part; p < num_parts; ++p) m = fmaxf(m, *cluster_peer(&part_max_smem[row], p));
      float total = 0.f, out = 0.f;
      for (int p = first_part; p < num_parts; ++p) {
        const float w = *cluster_peer(&part_sum_smem[row], p) * exp2f(*cluster_peer(&part_max_smem[row], p) - m);
        total += w;
        out += w * *cluster_peer(&warp_out[0][row][d], p);
      }
      const int64_t head = static_cast<int64_t>(seq) * a.num_heads + kv_head * group + row;
      a.out[head * HEAD_DIM + d] = __float2bfloat16_rn(out / total);
    }
  }
  cluster_sync();
}

// grid: (num_heads, num_seqs); block: HEAD_DIM threads, one per output element. Merges the partitions of a sequence
// that has more than one: weights sum_p * 2^(max_p - max) on the per-partition normalised outputs.
template <int HEAD_DIM>
__global__ void __launch_bounds__(HEAD_DIM)
    paged_decode_reduce_kernel(PagedAttentionArgs a, int partition_size, int max_partitions,
                               const float* __restrict__ part_out,  // [num_seqs][num_heads][max_partitions][HEAD_DIM]
                               const float* __restrict__ part_max,  // [num_seqs][num_heads][max_partitions]
                               const float* __restrict__ part_sum)  // [num_seqs][num_heads][max_partitions]
{
  // The O projection may launch before the partitions are done (every block of theirs is running by now): it waits
  // for this grid all the same, and meanwhile pulls its weights into L2 (GemvArgs::prefetch_l2).
  allow_dependent_launch();
  wait_for_previous_grid();
  const int head = blockIdx.x, seq = blockIdx.y, d = threadIdx.x;
  const int ctx = a.context_lens[seq];
  const int num_parts = (ctx + partition_size - 1) / partition_size;
  if (num_parts <= 1) return;  // written by the decode kernel itself
  // Partitions before the sliding window wrote nothing (the decode kernel skipped them).
  const int first_part = a.window > 0 ? max(0, ctx - a.window) / partition_size : 0;
  const int64_t row = (static_cast<int64_t>(seq) * a.num_heads + head) * max_partitions;
  float m = -INFINITY;
  for (int p = first_part; p < num_parts; ++p) m = fmaxf(m, part_max[row + p]);
  float total = 0.f, o = 0.f;
  for (int p = first_part; p < num_parts; ++p) {
    const float w = part_sum[row + p] * exp2f(part_max[row + p] - m);
    total += w;
    o += w * part_out[(row + p) * HEAD_DIM + d];
  }
  a.out[(static_cast<int64_t>(seq) * a.num_heads + head) * HEAD_DIM + d] = __float2bfloat16_rn(o / total);
}

struct DecodeLaunch {
  int log2_block_size, partition_size, max_partitions;
  float *part_out, *part_max, *part_sum;
};

// Whether the current device launches thread block clusters (sm_90 on).
bool clusters_available() {
  int device = 0, available = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&available, cudaDevAttrClusterLaunch, device) == cudaSuccess && available != 0;
}

// Thread blocks of paged_decode_kernel<HEAD_DIM, kTall, kFp8> resident on one SM at once (the occupancy calculator's,
// once per instantiation).
template <int HEAD_DIM, bool kTall, bool kFp8>
int decode_blocks_per_sm() {
  static const int per_sm = [] {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, paged_decode_kernel<HEAD_DIM, kTall, kFp8>, kDecodeThreads,
                                                      0) != cudaSuccess)
      n = 0;
    return n;
  }();
  return per_sm;
}

template <int HEAD_DIM, bool kTall, bool kFp8>
cudaError_t launch_decode(const PagedAttentionArgs& a, const DecodeLaunch& l, cudaStream_t stream) {
  const dim3 grid(a.num_kv_heads, a.num_seqs, l.max_partitions);
  // Up to kMaxDecodeCluster partitions merge inside the decode kernel, as one cluster (no reduction kernel after
  // it), when the whole grid is resident in one wave. A cluster keeps its blocks until its slowest partition has
  // ended, idle ones included (a sequence shorter than the grid's context still has a block for every partition):
  // in a grid of several waves those blocks keep others waiting (H100, same run, ShareGPT-like mix of the 8B shape:
  // 8,982 output tok/s with clusters in every grid of up to 8 partitions, 10,807 with this rule, 10,772 never).
  int device = 0, sms = 0;
  const bool clustered = l.max_partitions > 1 && l.max_partitions <= kMaxDecodeCluster && clusters_available() &&
                         cudaGetDevice(&device) == cudaSuccess &&
                         cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess &&
                         int64_t{grid.x} * grid.y * grid.z <= int64_t{sms} * decode_blocks_per_sm<HEAD_DIM, kTall, kFp8>();
  const dim3 cluster(1, 1, clustered ? l.max_partitions : 1);
  const cudaError_t e = launch_early_in_clusters(paged_decode_kernel<HEAD_DIM, kTall, kFp8>, grid,
                                                 dim3(kDecodeThreads), cluster, 0, stream, a, l.log2_block_size,
                                                 l.partition_size, l.max_partitions, l.part_out, l.part_max,
                                                 l.part_sum);
  if (e != cudaSuccess || l.max_partitions <= 1 || clustered) return e;
  return launch_early(paged_decode_reduce_kernel<HEAD_DIM>, dim3(a.num_heads, a.num_seqs), dim3(HEAD_DIM), 0, stream,
                      a, l.partition_size, l.max_partitions, static_cast<const float*>(l.part_out),
                      static_cast<const float*>(l.part_max), static_cast<const float*>(l.part_sum));
}

template <int HEAD_DIM>
cudaError_t launch_decode(const PagedAttentionArgs& a, const DecodeLaunch& l, cudaStream_t stream) {
  const bool tall = a.num_heads / a.num_kv_heads > 8, fp8 = a.k_fp8 != nullptr;
  if (tall) return fp8 ? launch_decode<HEAD_DIM, true, true>(a, l, stream) : launch_decode<HEAD_DIM, true, false>(a, l, stream);
  return fp8 ? launch_decode<HEAD_DIM, false, true>(a, l, stream) : launch_decode<HEAD_DIM, false, false>(a, l, stream);
}

int partitions_for(int max_context_len, int partition_size) {
  return (max_context_len + partition_size - 1) / partition_size;
}

}  // namespace

size_t paged_attention_decode_workspace(int num_seqs, int num_heads, int head_dim, int max_context_len,
                                        int partition_size) {
  if (partition_size <= 0) return 0;
  const int parts = partitions_for(max_context_len, partition_size);
  if (parts <= 1) return 0;
  const size_t rows = static_cast<size_t>(num_seqs) * num_heads * parts;
  return sizeof(float) * (rows * head_dim + 2 * rows);
}

cudaError_t paged_attention_decode(const PagedAttentionArgs& a, int max_context_len, int partition_size,
                                   void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const char* name = "paged_attention_decode";
  if (a.num_kv_heads <= 0 || a.num_heads % a.num_kv_heads != 0 || a.num_heads / a.num_kv_heads > 16)
    return launch_failure(cudaErrorInvalidValue, std::string(name) + ": num_heads " + std::to_string(a.num_heads) +
                                                     " / num_kv_heads " + std::to_string(a.num_kv_heads) +
                                                     " must be a whole group of at most 16");
  if (!is_supported_block_size(a.block_size))
    return launch_failure(cudaErrorInvalidValue, std::string(name) + ": block_size " +
                                                     std::to_string(a.block_size) + " is not supported (8, 16, 32)");
  if (partition_size <= 0 || partition_size > kMaxDecodePartition || partition_size % a.block_size != 0)
    return launch_failure(cudaErrorInvalidValue, std::string(name) + ": partition_size " +
                                                     std::to_string(partition_size) +
                                                     " must be a multiple of block_size and at most " +
                                                     std::to_string(kMaxDecodePartition));
  if (a.q_stride % 8 != 0 || a.q_stride < static_cast<int64_t>(a.num_heads) * a.head_dim)
    return launch_failure(cudaErrorInvalidValue, std::string(name) + ": q_stride must be a multiple of 8 >= "
                                                                     "num_heads * head_dim");
  if (a.num_seqs <= 0) return cudaSuccess;
  if (max_context_len <= 0)
    return launch_failure(cudaErrorInvalidValue, std::string(name) + ": max_context_len must be positive");
  const size_t need = paged_attention_decode_workspace(a.num_seqs, a.num_heads, a.head_dim, max_context_len,
                                                       partition_size);
  if (workspace_bytes < need || (need > 0 && workspace == nullptr))
    return launch_failure(cudaErrorInvalidValue, std::string(name) + ": workspace of " +
                                                     std::to_string(workspace_bytes) + " bytes, " +
                                                     std::to_string(need) + " needed");
  DecodeLaunch l;
  l.log2_block_size = log2_of(a.block_size);
  l.partition_size = partition_size;
  l.max_partitions = partitions_for(max_context_len, partition_size);
  const size_t rows = static_cast<size_t>(a.num_seqs) * a.num_heads * l.max_partitions;
  l.part_out = static_cast<float*>(workspace);
  l.part_max = need > 0 ? l.part_out + rows * a.head_dim : nullptr;
  l.part_sum = need > 0 ? l.part_max + rows : nullptr;
  PAGED_DISPATCH_HEAD_DIM(name, a.head_dim, return launch_decode<HEAD_DIM>(a, l, stream));
  return cudaSuccess;
}

}  // namespace paged::cuda
