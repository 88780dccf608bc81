// Paged-attention prefill: causal attention of many query tokens per sequence over the paged cache, covering a
// cached prefix and chunked prefill. See attention.h for the contract.
//
// Work split. A thread block owns kRows (query, head) rows of one sequence and one KV head: row r is query
// r / group, head kv_head * group + r % group, so the rows of a GQA group share every K/V tile the block loads.
// The block walks the cache in tiles of kTile tokens up to its last query's position: the tile's K and V go to
// shared memory, warp w scores rows w*8 .. w*8+7 against token `lane` of the tile, then lane r of every warp
// carries row r's online softmax (the four warps compute the same m and l, each for its quarter of head_dim).
// With a sliding window the walk starts at the tile of the block's first row's first visible position, and a row
// skips the tiles wholly before its own window.
#include "kernels/cuda/attention.h"

#include <string>

#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/kv_fp8.h"

namespace paged::cuda {

namespace {

constexpr int kRows = 32;  // (query, head) rows per block: one per lane in the softmax/PV phase
constexpr int kTile = 32;  // tokens per K/V tile: one per lane in the score phase
constexpr int kPrefillThreads = 128;
constexpr int kPrefillWarps = kPrefillThreads / 32;
constexpr float kLog2e = 1.4426950408889634f;

// Eight e4m3 codes (8-byte aligned) times their row's scale, as bf16.
__device__ __forceinline__ Bf16x8 fp8x8_to_bf16x8(const uint8_t* p, float scale) {
  float f[8];
  e4m3x8_to_float(*reinterpret_cast<const uint2*>(p), f);
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] *= scale;
  return float_to_bf16x8(f);
}

// grid: (ceil(max_q_len * group / kRows), num_kv_heads, num_seqs); block: kPrefillThreads.
template <int HEAD_DIM>
__global__ void __launch_bounds__(kPrefillThreads) paged_prefill_kernel(PagedAttentionArgs a, int log2_block_size) {
  constexpr int kVecs = HEAD_DIM / 8;
  // +8 bf16 (16 bytes) per row: the 16-byte loads of 8 consecutive rows then fall on distinct banks.
  constexpr int kPitch = HEAD_DIM + 8;
  constexpr int kRowsPerWarp = kRows / kPrefillWarps;
  constexpr int kDimsPerWarp = HEAD_DIM / kPrefillWarps;

  __shared__ __align__(16) float qs[kRows][HEAD_DIM];  // queries, pre-scaled by scale * log2(e)
  __shared__ __align__(16) bf16 ks[kTile][kPitch];
  __shared__ __align__(16) bf16 vs[kTile][kPitch];
  __shared__ float ss[kRows][kTile + 1];  // +1: lane r reading row r's column t hits bank (r + t) % 32

  const int kv_head = blockIdx.y, seq = blockIdx.z;
  const int q_begin = a.query_start[seq];
  const int q_len = a.query_start[seq + 1] - q_begin;
  const int group = a.num_heads / a.num_kv_heads;
  const int num_rows = q_len * group;
  const int row0 = blockIdx.x * kRows;
  if (row0 >= num_rows) return;
  const int ctx = a.context_lens[seq];
  const int first_pos = ctx - q_len;  // position of the sequence's first query
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  const float q_scale = a.scale * kLog2e;
  for (int i = threadIdx.x; i < kRows * kVecs; i += kPrefillThreads) {
    const int r = i / kVecs, c = (i % kVecs) * 8;
    const int row = row0 + r;
    float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (row < num_rows) {
      const int qi = row / group, head = kv_head * group + row % group;
      bf16x8_to_float(load_bf16x8(a.q + (q_begin + qi) * a.q_stride + static_cast<int64_t>(head) * HEAD_DIM + c), v);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] *= q_scale;
    }
    float4* dst = reinterpret_cast<float4*>(&qs[r][c]);
    dst[0] = make_float4(v[0], v[1], v[2], v[3]);
    dst[1] = make_float4(v[4], v[5], v[6], v[7]);
  }

  const int last_row = min(row0 + kRows, num_rows) - 1;
  const int num_tiles = (first_pos + last_row / group) / kTile + 1;  // tiles up to the block's last position
  const int W = a.window;
  const int first_tile = W > 0 ? max(0, first_pos + row0 / group - W + 1) / kTile : 0;

  const int my_row = row0 + lane;  // the row whose softmax state and output slice this thread owns
  const int my_pos = my_row < num_rows ? first_pos + my_row / group : -1;
  float acc[kDimsPerWarp];
#pragma unroll
  for (int i = 0; i < kDimsPerWarp; ++i) acc[i] = 0.f;
  float m = -INFINITY, l = 0.f;

  const int32_t* table = a.block_tables + static_cast<int64_t>(seq) * a.max_blocks_per_seq;
  const int in_block_mask = (1 << log2_block_size) - 1;
  // The FP8 layout (kernels/cuda/kv_fp8.h), in bytes: a block's codes, then its scales.
  const int64_t fp8_block_bytes = kv_fp8_block_bytes(a.num_kv_heads, 1 << log2_block_size, HEAD_DIM);
  const int64_t fp8_scales_at = kv_fp8_scales_offset(a.num_kv_heads, 1 << log2_block_size, HEAD_DIM);

  for (int tile = first_tile; tile < num_tiles; ++tile) {
    const int t0 = tile * kTile;
    __syncthreads();  // the previous tile is no longer read (and the queries are in place)
    for (int i = threadIdx.x; i < kTile * kVecs; i += kPrefillThreads) {
      const int tt = i / kVecs, c = (i % kVecs) * 8;
      const int t = t0 + tt;
      Bf16x8 kv{}, vv{};
      if (t < ctx && a.k_fp8) {
        const int64_t block = table[t >> log2_block_size] * fp8_block_bytes;
        const int64_t row = (static_cast<int64_t>(kv_head) << log2_block_size) + (t & in_block_mask);
        kv = fp8x8_to_bf16x8(a.k_fp8 + block + row * HEAD_DIM + c,
                             reinterpret_cast<const float*>(a.k_fp8 + block + fp8_scales_at)[row]);
        vv = fp8x8_to_bf16x8(a.v_fp8 + block + row * HEAD_DIM + c,
                             reinterpret_cast<const float*>(a.v_fp8 + block + fp8_scales_at)[row]);
      } else if (t < ctx) {
        // int64: one layer's cache can pass 2^31 elements.
        const int64_t off =
            (((static_cast<int64_t>(table[t >> log2_block_size]) * a.num_kv_heads + kv_head) << log2_block_size) +
             (t & in_block_mask)) * HEAD_DIM + c;
        kv = load_bf16x8(a.k_cache + off);
        vv = load_bf16x8(a.v_cache + off);
      }
      store_bf16x8(&ks[tt][c], kv);
      store_bf16x8(&vs[tt][c], vv);
    }
    __syncthreads();

    float s[kRowsPerWarp];
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) s[rr] = 0.f;
#pragma unroll 4
    for (int c = 0; c < HEAD_DIM; c += 8) {
      float kf[8];
      bf16x8_to_float(load_bf16x8(&ks[lane][c]), kf);
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        const float4 q0 = *reinterpret_cast<const float4*>(&qs[warp * kRowsPerWarp + rr][c]);
        const float4 q1 = *reinterpret_cast<const float4*>(&qs[warp * kRowsPerWarp + rr][c + 4]);
        s[rr] += q0.x * kf[0] + q0.y * kf[1] + q0.z * kf[2] + q0.w * kf[3] + q1.x * kf[4] + q1.y * kf[5] +
                 q1.z * kf[6] + q1.w * kf[7];
      }
    }
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp * kRowsPerWarp + rr, row = row0 + r;
      const int pos = row < num_rows ? first_pos + row / group : -1;
      const int t = t0 + lane;  // causal mask (pos <= ctx - 1 also masks the tail), then the window's
      ss[r][lane] = t <= pos && (W == 0 || t > pos - W) ? s[rr] : -INFINITY;
    }
    __syncthreads();

    // Nothing of this tile is visible to this row (or the row is padding); a tile that is not skipped holds one
    // visible position at least, so the new maximum is finite.
    if (t0 > my_pos || (W > 0 && t0 + kTile - 1 <= my_pos - W)) continue;
    float tile_max = -INFINITY;
#pragma unroll 8
    for (int t = 0; t < kTile; ++t) tile_max = fmaxf(tile_max, ss[lane][t]);
    const float m_new = fmaxf(m, tile_max);
    const float alpha = exp2f(m - m_new);  // 0 on the first visible tile (m = -inf)
    l *= alpha;
#pragma unroll
    for (int i = 0; i < kDimsPerWarp; ++i) acc[i] *= alpha;
    for (int t = 0; t < kTile; ++t) {
      const float p = exp2f(ss[lane][t] - m_new);
      l += p;
      const bf16* v_row = &vs[t][warp * kDimsPerWarp];  // the same address for the whole warp: a broadcast
#pragma unroll
      for (int c = 0; c < kDimsPerWarp; c += 8) {
        float vf[8];
        bf16x8_to_float(load_bf16x8(v_row + c), vf);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[c + j] += p * vf[j];
      }
    }
    m = m_new;
  }

  if (my_pos < 0) return;
  const int qi = my_row / group, head = kv_head * group + my_row % group;
  bf16* o = a.out + (static_cast<int64_t>(q_begin + qi) * a.num_heads + head) * HEAD_DIM + warp * kDimsPerWarp;
  const float inv = 1.0f / l;
#pragma unroll
  for (int c = 0; c < kDimsPerWarp; c += 8) {
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = acc[c + j] * inv;
    store_bf16x8(o + c, float_to_bf16x8(v));
  }
}

}  // namespace

cudaError_t paged_attention_prefill(const PagedAttentionArgs& a, int max_q_len, cudaStream_t stream) {
  const char* name = "paged_attention_prefill";
  if (a.num_kv_heads <= 0 || a.num_heads % a.num_kv_heads != 0)
    return launch_failure(cudaErrorInvalidValue, std::string(name) + ": num_heads " + std::to_string(a.num_heads) +
                                                     " is not a multiple of num_kv_heads " +
                                                     std::to_string(a.num_kv_heads));
  if (!is_supported_block_size(a.block_size))
    return launch_failure(cudaErrorInvalidValue, std::string(name) + ": block_size " +
                                                     std::to_string(a.block_size) + " is not supported (8, 16, 32)");
  if (a.q_stride % 8 != 0 || a.q_stride < static_cast<int64_t>(a.num_heads) * a.head_dim)
    return launch_failure(cudaErrorInvalidValue, std::string(name) + ": q_stride must be a multiple of 8 >= "
                                                                     "num_heads * head_dim");
  if (a.num_seqs <= 0 || max_q_len <= 0) return cudaSuccess;
  const int group = a.num_heads / a.num_kv_heads;
  const dim3 grid((max_q_len * group + kRows - 1) / kRows, a.num_kv_heads, a.num_seqs);
  const int log2_bs = log2_of(a.block_size);
  PAGED_DISPATCH_HEAD_DIM(name, a.head_dim,
                          paged_prefill_kernel<HEAD_DIM><<<grid, kPrefillThreads, 0, stream>>>(a, log2_bs));
  return cudaGetLastError();
}

}  // namespace paged::cuda
