// Paged-attention prefill on tensor cores, flash-attention style: causal attention of many query tokens per sequence
// over the paged cache, covering a cached prefix, chunked prefill and decode rows of mixed steps. See attention.h for
// the contract.
//
// Work split. A thread block owns kRows (query, head) rows of one sequence and one KV head: row r is query
// r / group, head kv_head * group + r % group, so the rows of a GQA group share every K/V tile the block loads.
// Warp w owns M_TILES m16 tiles of rows (w * 16 * M_TILES on) as the M dimension of m16n8k16 MMAs
// (kernels/cuda/mma.cuh): every K or V fragment a warp loads from shared memory feeds M_TILES MMAs (two for long
// chunks, where shared-memory reads bound the one-tile loop; one for short ones, whose blocks would be mostly
// padding or masked). With one m-tile a warp holds its queries as A registers for the whole walk; with two (the
// accumulators fill the registers) the block's queries go to shared memory once and each k-step loads its A
// registers from there. The block walks the cache in tiles of kTile tokens up to its last query's position; each tile's K and
// V go to shared memory by cp.async, two stages deep (tile i+1 loads while tile i is computed). The FP8 cache's codes
// and scales load the same way into a staging area, and are dequantised into one bf16 tile just before it is
// computed. Per tile a warp computes S = Q K^T (Q and K rows by ldmatrix), scales and masks it, runs the online
// softmax on the accumulators (a row's 64 scores live in the four lanes of a quad), and adds P V (P's A registers
// are the score accumulators rounded to bf16, V by transposed ldmatrix). A warp skips the tiles none of its rows sees
// (past its last position, or before its window).
#include "kernels/cuda/attention.h"

#include <string>

#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/kv_fp8.h"
#include "kernels/cuda/mma.cuh"

namespace paged::cuda {

namespace {

constexpr int kPrefillWarps = 4;
constexpr int kPrefillThreads = kPrefillWarps * 32;
// (query, head) rows per block: 16 (the MMA's M) per m-tile, M_TILES m-tiles per warp.
template <int M_TILES>
constexpr int kRows = kPrefillWarps * 16 * M_TILES;
constexpr int kTile = 64;                  // tokens per K/V tile
constexpr float kLog2e = 1.4426950408889634f;  // scores are kept in base 2 so that softmax uses exp2f

// +8 bf16 (16 bytes) per shared-memory row: ldmatrix's eight 16-byte rows then fall on distinct banks.
template <int HEAD_DIM>
constexpr int kPitch = HEAD_DIM + 8;

// One stage of the FP8 cache's raw tile: K codes [kTile][HEAD_DIM], V codes, then K and V scales [kTile] each.
template <int HEAD_DIM>
constexpr int kFp8StageBytes = 2 * kTile * HEAD_DIM + 2 * kTile * static_cast<int>(sizeof(float));

// Dynamic shared memory of one block: with two m-tiles the queries [kRows][pitch], then bf16 K and V tiles (two
// stages, or one beside two raw FP8 stages).
template <int HEAD_DIM, bool kFp8, int M_TILES>
constexpr int prefill_smem_bytes() {
  const int queries = M_TILES == 1 ? 0 : kRows<M_TILES> * kPitch<HEAD_DIM> * static_cast<int>(sizeof(bf16));
  const int bf16_tiles = (kFp8 ? 1 : 2) * 2 * kTile * kPitch<HEAD_DIM> * static_cast<int>(sizeof(bf16));
  return queries + bf16_tiles + (kFp8 ? 2 * kFp8StageBytes<HEAD_DIM> : 0);
}

// Eight e4m3 codes (8-byte aligned, shared memory) times their row's scale, as bf16.
__device__ __forceinline__ Bf16x8 fp8x8_to_bf16x8(const uint8_t* p, float scale) {
  float f[8];
  e4m3x8_to_float(*reinterpret_cast<const uint2*>(p), f);
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] *= scale;
  return float_to_bf16x8(f);
}

// grid: (ceil(max_q_len * group / kRows<M_TILES>), num_kv_heads, num_seqs); block: kPrefillThreads; dynamic
// shared memory: prefill_smem_bytes<HEAD_DIM, kFp8, M_TILES>(). kFp8: the cache is the FP8 one (k_fp8 / v_fp8).
template <int HEAD_DIM, bool kFp8, int M_TILES>
__global__ void __launch_bounds__(kPrefillThreads) paged_prefill_kernel(PagedAttentionArgs a, int log2_block_size) {
  constexpr int kPitchD = kPitch<HEAD_DIM>;
  constexpr int kBlockRows = kRows<M_TILES>;
  constexpr int kSteps = HEAD_DIM / 16;      // k-steps of S = Q K^T
  constexpr int kDimTiles = HEAD_DIM / 8;    // n-tiles of O = P V
  constexpr int kTokenTiles = kTile / 8;     // n-tiles of S
  constexpr int kVecsPerRow = HEAD_DIM / 8;  // 16-byte chunks of a Q, K or V row
  constexpr int kTileElems = kTile * kPitchD;
  static_assert(kPrefillThreads == 2 * kTile, "one thread per K or V scale of an FP8 tile");
  extern __shared__ __align__(16) unsigned char prefill_smem[];
  bf16* const qs = reinterpret_cast<bf16*>(prefill_smem);  // two m-tiles: [kBlockRows][kPitchD]
  bf16* const tiles = qs + (M_TILES == 1 ? 0 : kBlockRows * kPitchD);  // [stage][K, V][kTile][kPitchD]; FP8: one stage
  // FP8 only: [stage][kFp8StageBytes] after the bf16 tile.
  uint8_t* const raw = reinterpret_cast<uint8_t*>(tiles + 2 * kTileElems);

  const int kv_head = blockIdx.y, seq = blockIdx.z;
  const int q_begin = a.query_start[seq];
  const int q_len = a.query_start[seq + 1] - q_begin;
  const int group = a.num_heads / a.num_kv_heads;
  const int num_rows = q_len * group;
  // The last row blocks first: under the causal mask they walk the most tiles.
  const int row0 = (gridDim.x - 1 - blockIdx.x) * kBlockRows;
  if (row0 >= num_rows) return;
  const int ctx = a.context_lens[seq];
  const int first_pos = ctx - q_len;  // position of the sequence's first query
  const int W = a.window;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, c = lane % 4;

  // This lane's rows g and g + 8 of each of the warp's m-tiles (position -1: padding past the last row, never
  // written).
  const int warp_row0 = row0 + warp * 16 * M_TILES;
  int pos_lo[M_TILES], pos_hi[M_TILES];
#pragma unroll
  for (int mt = 0; mt < M_TILES; ++mt) {
    const int lo = warp_row0 + 16 * mt + g, hi = lo + 8;
    pos_lo[mt] = lo < num_rows ? first_pos + lo / group : -1;
    pos_hi[mt] = hi < num_rows ? first_pos + hi / group : -1;
  }
  const bool warp_active = warp_row0 < num_rows;
  const int warp_min_pos = first_pos + warp_row0 / group;
  const int warp_max_pos = first_pos + (min(warp_row0 + 16 * M_TILES, num_rows) - 1) / group;

  // One m-tile: the warp's queries as A registers, k-step s: q_regs[s] = {row g cols 16s+2c.., row g+8 cols
  // 16s+2c.., row g cols 16s+2c+8.., row g+8 cols 16s+2c+8..}. Two: the block's queries into shared memory (zeros
  // past the last row), in the first tile's cp.async group.
  const auto query = [&](int row) {
    return a.q + static_cast<int64_t>(q_begin + row / group) * a.q_stride +
           static_cast<int64_t>(kv_head * group + row % group) * HEAD_DIM;
  };
  uint32_t q_regs[M_TILES == 1 ? kSteps : 1][4];
  if constexpr (M_TILES == 1) {
    // Rows past the last get an address too, never read (a select here cost the loop ~20% on the H100).
    const bf16* q_lo = query(warp_row0 + g) + 2 * c;
    const bf16* q_hi = query(warp_row0 + g + 8) + 2 * c;
    const auto word = [](const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); };
#pragma unroll
    for (int k = 0; k < kSteps; ++k) {
      q_regs[k][0] = pos_lo[0] >= 0 ? word(q_lo + 16 * k) : 0u;
      q_regs[k][1] = pos_hi[0] >= 0 ? word(q_hi + 16 * k) : 0u;
      q_regs[k][2] = pos_lo[0] >= 0 ? word(q_lo + 16 * k + 8) : 0u;
      q_regs[k][3] = pos_hi[0] >= 0 ? word(q_hi + 16 * k + 8) : 0u;
    }
  } else {
    for (int i = threadIdx.x; i < kBlockRows * kVecsPerRow; i += kPrefillThreads) {
      const int r = i / kVecsPerRow, col = (i % kVecsPerRow) * 8, row = row0 + r;
      const bool valid = row < num_rows;
      cp_async_16(&qs[r * kPitchD + col], query(valid ? row : 0) + col, valid);
    }
  }
  const bf16* const warp_qs = qs + (warp * 16 * M_TILES) * kPitchD;

  const int last_row = min(row0 + kBlockRows, num_rows) - 1;
  const int num_tiles = (first_pos + last_row / group) / kTile + 1;  // tiles up to the block's last position
  const int first_tile = W > 0 ? max(0, first_pos + row0 / group - W + 1) / kTile : 0;

  const int32_t* table = a.block_tables + static_cast<int64_t>(seq) * a.max_blocks_per_seq;
  const int in_block_mask = (1 << log2_block_size) - 1;
  // The FP8 layout (kernels/cuda/kv_fp8.h), in bytes: a block's codes, then its scales.
  const int64_t fp8_block_bytes = kv_fp8_block_bytes(a.num_kv_heads, 1 << log2_block_size, HEAD_DIM);
  const int64_t fp8_scales_at = kv_fp8_scales_offset(a.num_kv_heads, 1 << log2_block_size, HEAD_DIM);

  // Issues the loads of tile `tile` into stage `stage` (bf16 tiles, or FP8 codes and scales) as one cp.async group;
  // tokens past the context become zeros (their scores are masked, and a zero V keeps P V finite).
  const auto load_tile = [&](int tile, int stage) {
    constexpr int kChunkElems = kFp8 ? 16 : 8;  // 16 bytes: 16 codes or 8 bf16
    constexpr int kChunksPerRow = HEAD_DIM / kChunkElems;
    bf16* ks = tiles + stage * 2 * kTileElems;
    uint8_t* codes = raw + stage * kFp8StageBytes<HEAD_DIM>;  // FP8: K codes, V codes, K scales, V scales
    for (int i = threadIdx.x; i < kTile * kChunksPerRow; i += kPrefillThreads) {
      const int tt = i / kChunksPerRow, col = (i % kChunksPerRow) * kChunkElems;
      const int t = tile * kTile + tt;
      const bool valid = t < ctx;
      const int64_t block = valid ? table[t >> log2_block_size] : 0;
      // This KV head's row of token t within its block.
      const int64_t row = (static_cast<int64_t>(kv_head) << log2_block_size) + (t & in_block_mask);
      if constexpr (kFp8) {
        const int64_t at = block * fp8_block_bytes + row * HEAD_DIM + col;
        cp_async_16(codes + tt * HEAD_DIM + col, a.k_fp8 + at, valid);
        cp_async_16(codes + (kTile + tt) * HEAD_DIM + col, a.v_fp8 + at, valid);
      } else {
        // int64: one layer's cache can pass 2^31 elements.
        const int64_t off = ((block * a.num_kv_heads << log2_block_size) + row) * HEAD_DIM + col;
        cp_async_16(&ks[tt * kPitchD + col], a.k_cache + off, valid);
        cp_async_16(&ks[kTileElems + tt * kPitchD + col], a.v_cache + off, valid);
      }
    }
    if constexpr (kFp8) {  // thread i: the K (i < kTile) or V scale of token i % kTile
      const int tt = threadIdx.x % kTile, t = tile * kTile + tt;
      const bool valid = t < ctx;
      const int64_t block = valid ? table[t >> log2_block_size] : 0;
      const int64_t row = (static_cast<int64_t>(kv_head) << log2_block_size) + (t & in_block_mask);
      const uint8_t* cache = threadIdx.x < kTile ? a.k_fp8 : a.v_fp8;
      cp_async_4(codes + 2 * kTile * HEAD_DIM + threadIdx.x * sizeof(float),
                 cache + block * fp8_block_bytes + fp8_scales_at + row * sizeof(float), valid);
    }
    cp_async_commit();
  };
  // FP8: codes times scales of stage `stage` into the bf16 tile.
  const auto dequantise_tile = [&](int stage) {
    const uint8_t* codes = raw + stage * kFp8StageBytes<HEAD_DIM>;
    const float* scales = reinterpret_cast<const float*>(codes + 2 * kTile * HEAD_DIM);
    for (int i = threadIdx.x; i < kTile * kVecsPerRow; i += kPrefillThreads) {
      const int tt = i / kVecsPerRow, col = (i % kVecsPerRow) * 8;
      store_bf16x8(&tiles[tt * kPitchD + col], fp8x8_to_bf16x8(codes + tt * HEAD_DIM + col, scales[tt]));
      store_bf16x8(&tiles[kTileElems + tt * kPitchD + col],
                   fp8x8_to_bf16x8(codes + (kTile + tt) * HEAD_DIM + col, scales[kTile + tt]));
    }
  };

  const float score_scale = a.scale * kLog2e;
  float o[M_TILES][kDimTiles][4];
  float m_lo[M_TILES], m_hi[M_TILES];  // running maxima of rows g and g + 8 of each m-tile
  float l_lo[M_TILES], l_hi[M_TILES];  // this lane's part of their running sums
#pragma unroll
  for (int mt = 0; mt < M_TILES; ++mt) {
#pragma unroll
    for (int j = 0; j < kDimTiles; ++j) o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.f;
    m_lo[mt] = m_hi[mt] = -INFINITY;
    l_lo[mt] = l_hi[mt] = 0.f;
  }

  if (first_tile < num_tiles) load_tile(first_tile, 0);
  for (int tile = first_tile; tile < num_tiles; ++tile) {
    const int stage = (tile - first_tile) & 1;
    if (tile + 1 < num_tiles) {
      load_tile(tile + 1, stage ^ 1);  // that stage was last read before the __syncthreads ending the previous tile
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // tile `tile` is in shared memory for every thread
    if constexpr (kFp8) {
      dequantise_tile(stage);  // the bf16 tile's last readers finished before the previous tile's last barrier
      __syncthreads();
    }

    const int t0 = tile * kTile;
    if (warp_active && t0 <= warp_max_pos && !(W > 0 && t0 + kTile - 1 <= warp_min_pos - W)) {
      const bf16* ks = tiles + (kFp8 ? 0 : stage) * 2 * kTileElems;
      const bf16* vs = ks + kTileElems;
      // S = Q K^T: n-tile j is tokens 8j .. 8j+7.
      float s[M_TILES][kTokenTiles][4];
#pragma unroll
      for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
        for (int j = 0; j < kTokenTiles; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
      if constexpr (M_TILES == 1) {
        // One ldmatrix gives the B registers of two k-steps, which the held A registers multiply.
#pragma unroll
        for (int j = 0; j < kTokenTiles; ++j)
#pragma unroll
          for (int k = 0; k < kSteps; k += 2) {
            uint32_t b[4];
            ldmatrix_x4(b, &ks[(8 * j + (lane & 7)) * kPitchD + 16 * k + 8 * (lane >> 3)]);
            mma_bf16_16816(s[0][j], q_regs[k][0], q_regs[k][1], q_regs[k][2], q_regs[k][3], b[0], b[1]);
            mma_bf16_16816(s[0][j], q_regs[k + 1][0], q_regs[k + 1][1], q_regs[k + 1][2], q_regs[k + 1][3], b[2],
                           b[3]);
          }
      } else {
        // Per k-step the A registers of every m-tile (one ldmatrix each), then per n-tile one ldmatrix of K's B
        // registers, which all of them multiply.
#pragma unroll
        for (int k = 0; k < kSteps; ++k) {
          uint32_t q[M_TILES][4];
#pragma unroll
          for (int mt = 0; mt < M_TILES; ++mt)
            ldmatrix_x4(q[mt], &warp_qs[(16 * mt + (lane & 15)) * kPitchD + 16 * k + 8 * (lane >> 4)]);
#pragma unroll
          for (int j = 0; j < kTokenTiles; ++j) {
            uint32_t b[2];
            ldmatrix_x2(b, &ks[(8 * j + (lane & 7)) * kPitchD + 16 * k + 8 * ((lane >> 3) & 1)]);
#pragma unroll
            for (int mt = 0; mt < M_TILES; ++mt)
              mma_bf16_16816(s[mt][j], q[mt][0], q[mt][1], q[mt][2], q[mt][3], b[0], b[1]);
          }
        }
      }
      // Scale; mask where a row of the warp does not see the whole tile (causal edge, window edge). Padding rows
      // (zero queries, scores 0) need no mask: their results are never written.
      const bool masked = t0 + kTile - 1 > warp_min_pos || (W > 0 && t0 <= warp_max_pos - W);
#pragma unroll
      for (int mt = 0; mt < M_TILES; ++mt) {
        float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
        for (int j = 0; j < kTokenTiles; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float v = s[mt][j][e] * score_scale;
            if (masked) {
              const int t = t0 + 8 * j + 2 * c + (e & 1), pos = e < 2 ? pos_lo[mt] : pos_hi[mt];
              v = t <= pos && (W == 0 || t > pos - W) ? v : -INFINITY;
            }
            s[mt][j][e] = v;
            if (e < 2)
              mx_lo = fmaxf(mx_lo, v);
            else
              mx_hi = fmaxf(mx_hi, v);
          }
#pragma unroll
        for (int off = 1; off <= 2; off <<= 1) {
          mx_lo = fmaxf(mx_lo, __shfl_xor_sync(kFullMask, mx_lo, off));
          mx_hi = fmaxf(mx_hi, __shfl_xor_sync(kFullMask, mx_hi, off));
        }
        // A row may see nothing of this tile yet (all -inf so far): it subtracts 0 instead, keeping p and alpha 0.
        const float new_lo = fmaxf(m_lo[mt], mx_lo), new_hi = fmaxf(m_hi[mt], mx_hi);
        const float ref_lo = new_lo == -INFINITY ? 0.f : new_lo, ref_hi = new_hi == -INFINITY ? 0.f : new_hi;
        const float alpha_lo = exp2f(m_lo[mt] - ref_lo), alpha_hi = exp2f(m_hi[mt] - ref_hi);
        m_lo[mt] = new_lo;
        m_hi[mt] = new_hi;
        float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
        for (int j = 0; j < kTokenTiles; ++j) {
          s[mt][j][0] = exp2f(s[mt][j][0] - ref_lo);
          s[mt][j][1] = exp2f(s[mt][j][1] - ref_lo);
          s[mt][j][2] = exp2f(s[mt][j][2] - ref_hi);
          s[mt][j][3] = exp2f(s[mt][j][3] - ref_hi);
          sum_lo += s[mt][j][0] + s[mt][j][1];
          sum_hi += s[mt][j][2] + s[mt][j][3];
        }
        l_lo[mt] = l_lo[mt] * alpha_lo + sum_lo;
        l_hi[mt] = l_hi[mt] * alpha_hi + sum_hi;
#pragma unroll
        for (int j = 0; j < kDimTiles; ++j) {
          o[mt][j][0] *= alpha_lo;
          o[mt][j][1] *= alpha_lo;
          o[mt][j][2] *= alpha_hi;
          o[mt][j][3] *= alpha_hi;
        }
      }
      // O += P V: k-step k is tokens 16k .. 16k+15, whose A registers are the accumulators of S's n-tiles 2k and
      // 2k+1; one transposed ldmatrix gives the B registers of two dimension tiles, for every m-tile.
#pragma unroll
      for (int k = 0; k < kTile / 16; ++k) {
        uint32_t p[M_TILES][4];
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt) {
          p[mt][0] = pack_bf16(s[mt][2 * k][0], s[mt][2 * k][1]);
          p[mt][1] = pack_bf16(s[mt][2 * k][2], s[mt][2 * k][3]);
          p[mt][2] = pack_bf16(s[mt][2 * k + 1][0], s[mt][2 * k + 1][1]);
          p[mt][3] = pack_bf16(s[mt][2 * k + 1][2], s[mt][2 * k + 1][3]);
        }
#pragma unroll
        for (int j = 0; j < kDimTiles; j += 2) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, &vs[(16 * k + (lane & 15)) * kPitchD + 8 * j + 8 * (lane >> 4)]);
#pragma unroll
          for (int mt = 0; mt < M_TILES; ++mt) {
            mma_bf16_16816(o[mt][j], p[mt][0], p[mt][1], p[mt][2], p[mt][3], b[0], b[1]);
            mma_bf16_16816(o[mt][j + 1], p[mt][0], p[mt][1], p[mt][2], p[mt][3], b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before the next iteration loads into it
  }

  // A row's sum lives in the four lanes of its quad.
#pragma unroll
  for (int mt = 0; mt < M_TILES; ++mt) {
    float sum_lo = l_lo[mt], sum_hi = l_hi[mt];
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      sum_lo += __shfl_xor_sync(kFullMask, sum_lo, off);
      sum_hi += __shfl_xor_sync(kFullMask, sum_hi, off);
    }
    const auto store_row = [&](int row, float l, int half) {
      bf16* out = a.out +
                  (static_cast<int64_t>(q_begin + row / group) * a.num_heads + kv_head * group + row % group) *
                      HEAD_DIM + 2 * c;
      const float inv = 1.0f / l;  // every real row sees its own position: l > 0
#pragma unroll
      for (int j = 0; j < kDimTiles; ++j)
        *reinterpret_cast<__nv_bfloat162*>(out + 8 * j) =
            __floats2bfloat162_rn(o[mt][j][2 * half] * inv, o[mt][j][2 * half + 1] * inv);
    };
    const int row_lo = warp_row0 + 16 * mt + g;
    if (pos_lo[mt] >= 0) store_row(row_lo, sum_lo, 0);
    if (pos_hi[mt] >= 0) store_row(row_lo + 8, sum_hi, 1);
  }
}

// One launch of the kernel with M_TILES m-tiles a warp.
template <int HEAD_DIM, bool kFp8, int M_TILES>
cudaError_t launch_prefill(const PagedAttentionArgs& a, int max_rows, int log2_block_size, cudaStream_t stream) {
  constexpr int smem = prefill_smem_bytes<HEAD_DIM, kFp8, M_TILES>();
  // Above 48 KiB a kernel must opt in, on each device it runs on (tensor-parallel ranks share the process): set at
  // every launch, a host-side call that is not a stream operation.
  const auto kernel = paged_prefill_kernel<HEAD_DIM, kFp8, M_TILES>;
  const cudaError_t opt_in = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (opt_in != cudaSuccess) return opt_in;
  const dim3 grid((max_rows + kRows<M_TILES> - 1) / kRows<M_TILES>, a.num_kv_heads, a.num_seqs);
  kernel<<<grid, kPrefillThreads, smem, stream>>>(a, log2_block_size);
  return cudaGetLastError();
}

// Two m-tiles a warp for long chunks. H100, head_dim 128, group 4, bench_cuda_attention prefill, us (one m-tile a
// warp throughout / this choice): 32 prompts of 512 446 / 405 (FP8 cache 564 / 452), 8 of 2,048 1,344 / 1,203
// (1,766 / 1,401), 4 chunks of 2,048 after 2,048 1,888 / 1,676 (2,491 / 1,975); two m-tiles on 64 prompts of 256
// (1,024 rows) took 305 against one's 297.
template <int HEAD_DIM, bool kFp8>
cudaError_t launch_prefill(const PagedAttentionArgs& a, int max_rows, int log2_block_size, cudaStream_t stream) {
  return max_rows > kPrefillTwoTileRows ? launch_prefill<HEAD_DIM, kFp8, 2>(a, max_rows, log2_block_size, stream)
                                         : launch_prefill<HEAD_DIM, kFp8, 1>(a, max_rows, log2_block_size, stream);
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
  const int max_rows = max_q_len * (a.num_heads / a.num_kv_heads);
  const int log2_bs = log2_of(a.block_size);
  PAGED_DISPATCH_HEAD_DIM(name, a.head_dim,
                          return a.k_fp8 ? launch_prefill<HEAD_DIM, true>(a, max_rows, log2_bs, stream)
                                         : launch_prefill<HEAD_DIM, false>(a, max_rows, log2_bs, stream));
  return cudaSuccess;
}

}  // namespace paged::cuda
