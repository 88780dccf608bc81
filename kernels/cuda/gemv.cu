#include "kernels/cuda/gemv.h"

#include <string>
#include <utility>

#include <cuda_fp8.h>

#include "kernels/cuda/device_utils.cuh"

namespace paged::cuda {

namespace {

// Shape of the work, chosen on the H200 with Llama-3-8B projections in CUDA graphs (weights far beyond L2): a warp
// streams kWeightRows weight rows over one of kSplit contiguous K ranges, keeping kUnroll 16-byte loads per row in flight
// while it uses the previous ones (a GemvTile). For bf16, fewer loads in flight per warp and more warps did better
// than deep unrolls (4.2-4.4 TB/s on the gate/up and down shapes against cuBLASLt's 3.7-4.2); FP8 rows are half as
// long, so their tile is chosen apart (bench_cuda_runner ops --batch 1 times every tile of kGemvTiles).
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// Asks L2 for `bytes` bytes from p (16-byte aligned, a multiple of 16) without waiting (GemvArgs::prefetch_l2).
__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

// How many of a warp's `count` loads of a row GemvArgs::prefetch_l2 asks ahead: the first `fraction` of them.
__device__ __forceinline__ int prefetch_count(float fraction, int count) {
  return fraction >= 1.0f ? count : fraction > 0.0f ? static_cast<int>(fraction * static_cast<float>(count)) : 0;
}

// The x elements one chunk of weights meets (8, or 16 with kFp8), as floats: converted once for all the chunk's rows.
template <bool kFp8>
__device__ __forceinline__ void load_x(const bf16* x, float (&xf)[kFp8 ? 16 : 8]) {
#pragma unroll
  for (int h = 0; h < (kFp8 ? 2 : 1); ++h) {
    float part[8];
    bf16x8_to_float(load_bf16x8(x + 8 * h), part);
#pragma unroll
    for (int j = 0; j < 8; ++j) xf[8 * h + j] = part[j];
  }
}

// The dot product of one 16-byte load of weights (8 bf16, or 16 e4m3 with kFp8) with the x elements it meets, added
// to acc.
template <bool kFp8>
__device__ __forceinline__ void accumulate(float& acc, const uint4& wv, const float (&xf)[kFp8 ? 16 : 8]) {
  if constexpr (kFp8) {
    const __nv_fp8x2_storage_t* pairs = reinterpret_cast<const __nv_fp8x2_storage_t*>(&wv);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 w2 = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pairs[j], __NV_E4M3)));
      acc += w2.x * xf[2 * j] + w2.y * xf[2 * j + 1];
    }
  } else {
    Bf16x8 w8;
    static_assert(sizeof(w8) == sizeof(wv));
    memcpy(&w8, &wv, sizeof wv);
    float wf[8];
    bf16x8_to_float(w8, wf);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc += wf[j] * xf[j];
  }
}

// kRope: the product's columns in rotation order, so that each pair of columns (2j, 2j + 1) a thread finishes is one
// rotation pair. Column c of a query or key head (head_dim wide) below rotary_dim is row i + (c % 2) * rotary_dim / 2
// of that head, i = (c % head_dim) / 2; every other column is its own row.
__device__ __forceinline__ int rope_row(const GemvRope& r, int column) {
  const int head = column / r.head_dim, t = column - head * r.head_dim;
  if (head >= r.num_heads + r.num_kv_heads || t >= r.rotary_dim) return column;
  return head * r.head_dim + t / 2 + (t % 2) * (r.rotary_dim / 2);
}

// kRope: stores columns c and c + 1 (c even; rope_row's order) with values v0 and v1 (bias added, rounded to bf16)
// as rope_and_cache_kernel leaves them: query heads rotated in y, key heads rotated into the cache with y's copy as
// it was (without caches: rotated in y), value heads and a key's elements past rotary_dim copied to the cache.
__device__ __forceinline__ void store_rope_pair(const GemvArgs& a, int column, float v0, float v1) {
  const GemvRope& r = a.rope;
  const int head = column / r.head_dim, t = column - head * r.head_dim;
  const int rotated_heads = r.num_heads + r.num_kv_heads;
  const int64_t slot = *r.slot;
  bf16* cache = nullptr;  // this head's row of the token's cache block, if it goes to a cache
  if (head >= r.num_heads && r.k_cache && slot >= 0) {
    const int log2_bs = __ffs(r.block_size) - 1;
    const int64_t block = slot >> log2_bs, offset = slot & (r.block_size - 1);
    const int kv_head = head < rotated_heads ? head - r.num_heads : head - rotated_heads;
    cache = (head < rotated_heads ? r.k_cache : r.v_cache) +
            ((block * r.num_kv_heads + kv_head) * r.block_size + offset) * r.head_dim;
  }
  if (head < rotated_heads && t < r.rotary_dim) {
    const int i = t / 2, half = r.rotary_dim / 2;
    // Full-precision sincosf: positions reach 10^5, where the fast intrinsics lose the angle.
    float s, c;
    sincosf(static_cast<float>(*r.position) * r.inv_freq[i], &s, &c);
    s *= r.attention_factor;
    c *= r.attention_factor;
    const bf16 lo = __float2bfloat16_rn(rope_lo(v0, v1, c, s)), hi = __float2bfloat16_rn(rope_hi(v0, v1, c, s));
    bf16* row = a.y + head * r.head_dim;
    if (cache) {
      cache[i] = lo;
      cache[i + half] = hi;
    }
    const bool keep = head >= r.num_heads && r.k_cache;  // rope_and_cache leaves keys unrotated in y with a cache
    row[i] = keep ? __float2bfloat16_rn(v0) : lo;
    row[i + half] = keep ? __float2bfloat16_rn(v1) : hi;
    return;
  }
  a.y[column] = __float2bfloat16_rn(v0);
  a.y[column + 1] = __float2bfloat16_rn(v1);
  if (cache) {
    cache[t] = __float2bfloat16_rn(v0);
    cache[t + 1] = __float2bfloat16_rn(v1);
  }
}

// The product's x, 8 elements at a time: store(i, v) gets elements i..i+7 as floats, for every i of the row between
// the block's threads (each thread its own i). With a norm weight they are RMSNorm(x) * (weight + offset) rounded to
// bf16, in rms_norm_kernel's order of operations (the same bits: every thread sums its chunks strided by the
// block, then the block's sum), else x. Every thread of the block calls it.
template <class Store>
__device__ __forceinline__ void for_x_chunks(const GemvArgs& a, Store store) {
  __shared__ float scratch[kWarps];
  float inv = 1.0f;
  if (a.norm_weight) {
    float sum_sq = 0.f;
    for (int i = threadIdx.x * 8; i < a.k; i += kThreads * 8) {
      float v[8];
      bf16x8_to_float(load_bf16x8(a.x + i), v);
#pragma unroll
      for (int j = 0; j < 8; ++j) sum_sq += v[j] * v[j];
    }
    sum_sq = block_sum(sum_sq, scratch);
    inv = 1.0f / sqrtf(sum_sq / a.k + a.norm_eps);
  }
  for (int i = threadIdx.x * 8; i < a.k; i += kThreads * 8) {
    float v[8];
    bf16x8_to_float(load_bf16x8(a.x + i), v);
    if (a.norm_weight) {
      float w[8];
      bf16x8_to_float(load_bf16x8(a.norm_weight + i), w);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = round_bf16((w[j] + a.norm_offset) * (v[j] * inv));
    }
    store(i, v);
  }
}

// grid: (ceil(row groups / kGroups)); block: kThreads. Warp (group, half) of block b reads the kWeightRows weight
// rows of row group b * kGroups + group over K range `half` of kSplit; the ranges meet in shared memory. A row group
// is kWeightRows output columns, or with kSiluMul kWeightRows / 2 columns' gate rows c and up rows c + n/2. A chunk is
// one 16-byte load of a weight row: 8 bf16 or, with kFp8, 16 e4m3 whose row sums are scaled by w_scale at the end.
//
// Programmatic dependent launch: the weights do not depend on the previous kernel, so each warp issues its first
// loads, lets the next kernel launch, and only then waits for the previous kernel's results (x, the residual).
// Kernels that precede a gemv in the decode step (rms_norm, attention) let it launch early the same way.
template <GemvOutput kOut, bool kFp8, int kSplit, int kWeightRows, int kUnroll>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const GemvArgs a) {
  constexpr bool kSilu = kOut == GemvOutput::kSiluMul;
  constexpr int kPerChunk = kFp8 ? 16 : 8;  // weights per 16-byte load
  constexpr int kGroups = kWarps / kSplit;  // row groups (of kWeightRows weight rows) per block
  constexpr int kColumns = kSilu ? kWeightRows / 2 : kWeightRows;  // output columns per row group
  static_assert(kWarps % kSplit == 0 && (!kSilu || kWeightRows % 2 == 0));
  __shared__ float partial[kWarps][kWeightRows];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = warp / kSplit, half = warp % kSplit;
  const int k = a.k, chunks = k / kPerChunk;
  const int out_cols = kSilu ? a.n / 2 : a.n;
  const int first = (blockIdx.x * kGroups + group) * kColumns;  // first output column
  bool valid[kWeightRows];
  int rows[kWeightRows];
  const char* w_row[kWeightRows];
  const char* w = kFp8 ? reinterpret_cast<const char*>(a.w_fp8) : reinterpret_cast<const char*>(a.w);
#pragma unroll
  for (int r = 0; r < kWeightRows; ++r) {
    // With kSiluMul, rows r and r + kColumns are the gate and up rows of output column first + r % kColumns.
    const int column = first + r % kColumns;
    const int row = kSilu ? column + (r / kColumns) * out_cols : kOut == GemvOutput::kRope ? rope_row(a.rope, column) : column;
    valid[r] = column < out_cols;
    rows[r] = valid[r] ? row : 0;
    w_row[r] = w + static_cast<int64_t>(rows[r]) * chunks * 16;
  }
  const int per_half = (chunks + kSplit - 1) / kSplit;
  const int c_begin = half * per_half, c_end = min(chunks, c_begin + per_half);

  uint4 wv[kWeightRows][kUnroll];
  extern __shared__ __align__(16) unsigned char normed_row[];  // k bf16 with norm_weight
  const auto load = [&](int base) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int r = 0; r < kWeightRows; ++r)
        if (valid[r] && base + 32 * u < c_end) wv[r][u] = load_streaming(w_row[r] + (base + 32 * u) * 16);
  };
  int base = c_begin + lane;
  load(base);
  if (const int ahead = prefetch_count(a.prefetch_l2, c_end - c_begin); ahead > 0 && lane == 0)
#pragma unroll
    for (int r = 0; r < kWeightRows; ++r)
      if (valid[r]) prefetch_l2(w_row[r] + c_begin * 16, ahead * 16);
  allow_dependent_launch();
  wait_for_previous_grid();
  const bf16* x = a.x;
  if (a.norm_weight) {
    bf16* normed = reinterpret_cast<bf16*>(normed_row);
    for_x_chunks(a, [&](int i, const float (&v)[8]) { store_bf16x8(normed + i, float_to_bf16x8(v)); });
    __syncthreads();
    x = normed;
  }

  float acc[kWeightRows] = {};
  for (; base < c_end; base += 32 * kUnroll) {
    uint4 cur[kWeightRows][kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int r = 0; r < kWeightRows; ++r) cur[r][u] = wv[r][u];
    load(base + 32 * kUnroll);  // the next loads fly while these are used
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = base + 32 * u;
      if (c >= c_end) break;
      float xf[kPerChunk];
      load_x<kFp8>(x + c * kPerChunk, xf);
#pragma unroll
      for (int r = 0; r < kWeightRows; ++r) accumulate<kFp8>(acc[r], cur[r][u], xf);
    }
  }
#pragma unroll
  for (int r = 0; r < kWeightRows; ++r) {
    acc[r] = warp_sum(acc[r]);
    if (lane == 0) partial[warp][r] = acc[r];
  }
  __syncthreads();
  if (half != 0 || lane != 0) return;
  float p[kWeightRows];
#pragma unroll
  for (int r = 0; r < kWeightRows; ++r) {
    p[r] = 0.f;
#pragma unroll
    for (int h = 0; h < kSplit; ++h) p[r] += partial[group * kSplit + h][r];
    if constexpr (kFp8) p[r] *= a.w_scale[rows[r]];
  }
  if constexpr (kSilu) {
#pragma unroll
    for (int c = 0; c < kColumns; ++c) {
      if (!valid[c]) continue;
      const float g = round_bf16(p[c]), u = round_bf16(p[c + kColumns]);
      a.y[first + c] = __float2bfloat16_rn(gate_times_up<GateActivation::kSilu>(g, u));
    }
  } else if constexpr (kOut == GemvOutput::kRope) {
#pragma unroll
    for (int r = 0; r < kWeightRows; r += 2) {  // n is even and so is first: both columns of a pair or neither
      if (!valid[r]) continue;
      const auto value = [&](int q) { return round_bf16(p[q] + (a.bias ? __bfloat162float(a.bias[rows[q]]) : 0.f)); };
      store_rope_pair(a, first + r, value(r), value(r + 1));
    }
  } else {
#pragma unroll
    for (int r = 0; r < kWeightRows; ++r) {
      if (!valid[r]) continue;
      bf16* y = a.y + first + r;
      if constexpr (kOut == GemvOutput::kStore)
        *y = __float2bfloat16_rn(p[r] + (a.bias ? __bfloat162float(a.bias[first + r]) : 0.f));
      else
        *y = __float2bfloat16_rn(__bfloat162float(*y) + round_bf16(p[r]));
    }
  }
}

// Two e4m3 weights (the low byte first) as an f16x2 register: e4m3 values are exact in f16.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint16_t pair) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
  return uint32_t{h.x} | (uint32_t{h.y} << 16);
}

// Two floats as an f16x2 register (the first in the low half), saturated to +-65504.
__device__ __forceinline__ uint32_t floats_to_f16x2_sat(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// FP8 weights on the tensor cores (GemvTile::tensor_cores): the GEMV as m16n8k16 f16 MMAs whose A is 16 weight rows
// (e4m3 codes converted to f16 in registers, exactly) and whose B has x in its first column (zeros elsewhere), so a
// 16-byte load of a row costs one conversion per two weights instead of a float conversion and an FMA per weight:
// the CUDA-core kernel's FP8 variant is bound by those instructions, not by the weight reads.
// grid: (ceil(tiles / kTiles)); block: kThreads. Warp (tile, h) of block b reads the 16 rows of tile
// b * kTiles + tile over the h-th of kSplit K ranges, 64 bytes of each row a step: lane (g, q) = (lane / 4, lane % 4)
// loads bytes 16q..16q+15 of rows g and g + 8, the A operands of four MMAs; a k-permutation shared by A and B puts
// them in MMA order (MMA j takes bytes 16q + 4j + {0, 1} as its k 2q, 2q + 1 and 16q + 4j + {2, 3} as 2q + 8, 2q + 9,
// and B's column 0 the same x elements). With kSiluMul rows 0..7 of a tile are gate rows c..c+7 and rows 8..15
// their up rows. x (normed first with a norm weight) goes to shared memory as f16, saturated: activations past
// 65504 would not fit f16 (bf16 activations that large do not occur in the models served; the CPU twin is the
// bf16 product).
template <GemvOutput kOut, int kSplit, int kUnroll>
__global__ void __launch_bounds__(kThreads) gemv_fp8_mma_kernel(const GemvArgs a) {
  constexpr bool kSilu = kOut == GemvOutput::kSiluMul;
  constexpr int kTiles = kWarps / kSplit;  // 16-row tiles per block
  static_assert(kWarps % kSplit == 0);
  __shared__ float partial[kWarps][16];
  extern __shared__ __align__(16) unsigned char x_f16[];  // k f16
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int tile = blockIdx.x * kTiles + warp / kSplit, h = warp % kSplit;
  const int k = a.k, out_cols = kSilu ? a.n / 2 : a.n;
  // This lane's two rows (g and g + 8 of the tile) and whether their outputs exist.
  int row_lo, row_hi;
  bool valid_lo, valid_hi;
  if constexpr (kSilu) {
    row_lo = tile * 8 + g;  // gate row of output column row_lo
    valid_lo = valid_hi = row_lo < out_cols;
    row_hi = row_lo + out_cols;  // its up row
  } else if constexpr (kOut == GemvOutput::kRope) {  // rows g and g + 8: columns 2g and 2g + 1 of the tile
    const int column = tile * 16 + 2 * g;
    row_lo = rope_row(a.rope, column);
    row_hi = rope_row(a.rope, column + 1);
    valid_lo = valid_hi = column < a.n;
  } else {
    row_lo = tile * 16 + g;
    row_hi = row_lo + 8;
    valid_lo = row_lo < a.n;
    valid_hi = row_hi < a.n;
  }
  const uint8_t* w_lo = a.w_fp8 + static_cast<int64_t>(valid_lo ? row_lo : 0) * k + 16 * q;
  const uint8_t* w_hi = a.w_fp8 + static_cast<int64_t>(valid_hi ? row_hi : 0) * k + 16 * q;
  const int steps = k / 64, per = (steps + kSplit - 1) / kSplit;
  const int s_begin = h * per, s_end = min(steps, s_begin + per);

  uint4 wv[kUnroll][2];
  const auto load = [&](int s0) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (s0 + u < s_end) {
        wv[u][0] = load_streaming(w_lo + (s0 + u) * 64);
        wv[u][1] = load_streaming(w_hi + (s0 + u) * 64);
      }
  };
  load(s_begin);
  if (const int ahead = prefetch_count(a.prefetch_l2, s_end - s_begin); ahead > 0 && q == 0) {  // rows g, g + 8
    if (valid_lo) prefetch_l2(w_lo + s_begin * 64, ahead * 64);
    if (valid_hi) prefetch_l2(w_hi + s_begin * 64, ahead * 64);
  }
  allow_dependent_launch();
  wait_for_previous_grid();
  uint32_t* xs = reinterpret_cast<uint32_t*>(x_f16);  // f16x2 words
  for_x_chunks(a, [&](int i, const float (&v)[8]) {
    uint4 packed;
    packed.x = floats_to_f16x2_sat(v[0], v[1]);
    packed.y = floats_to_f16x2_sat(v[2], v[3]);
    packed.z = floats_to_f16x2_sat(v[4], v[5]);
    packed.w = floats_to_f16x2_sat(v[6], v[7]);
    *reinterpret_cast<uint4*>(xs + i / 2) = packed;
  });
  __syncthreads();

  float d[4] = {0.f, 0.f, 0.f, 0.f};  // D[g][2q], D[g][2q + 1], D[g + 8][2q], D[g + 8][2q + 1]
  for (int s = s_begin; s < s_end; s += kUnroll) {
    uint4 cur[kUnroll][2];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      cur[u][0] = wv[u][0];
      cur[u][1] = wv[u][1];
    }
    load(s + kUnroll);  // the next loads fly while these are used
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (s + u >= s_end) break;
      // B: x elements 64 (s + u) + 16q .. + 15 in column 0 (lanes with g = 0), zeros in the other columns.
      uint4 b[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
      if (g == 0) {
        const uint4* xv = reinterpret_cast<const uint4*>(xs + ((s + u) * 64 + 16 * q) / 2);
        b[0] = xv[0];
        b[1] = xv[1];
      }
      const uint32_t* bw = reinterpret_cast<const uint32_t*>(b);
      const uint16_t* lo = reinterpret_cast<const uint16_t*>(&cur[u][0]);
      const uint16_t* hi = reinterpret_cast<const uint16_t*>(&cur[u][1]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t a0 = e4m3x2_to_f16x2(lo[2 * j]), a2 = e4m3x2_to_f16x2(lo[2 * j + 1]);
        const uint32_t a1 = e4m3x2_to_f16x2(hi[2 * j]), a3 = e4m3x2_to_f16x2(hi[2 * j + 1]);
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(bw[2 * j]), "r"(bw[2 * j + 1]));
      }
    }
  }
  // Column 0 of D: lanes with q = 0 hold rows g (d[0]) and g + 8 (d[2]).
  if (q == 0) {
    partial[warp][g] = d[0];
    partial[warp][g + 8] = d[2];
  }
  __syncthreads();
  if (h != 0 || q != 0) return;
  float p_lo = 0.f, p_hi = 0.f;
#pragma unroll
  for (int hh = 0; hh < kSplit; ++hh) {
    p_lo += partial[warp + hh][g];
    p_hi += partial[warp + hh][g + 8];
  }
  if constexpr (kSilu) {
    if (!valid_lo) return;
    const float gate = round_bf16(p_lo * a.w_scale[row_lo]), up = round_bf16(p_hi * a.w_scale[row_hi]);
    a.y[row_lo] = __float2bfloat16_rn(gate_times_up<GateActivation::kSilu>(gate, up));
  } else if constexpr (kOut == GemvOutput::kRope) {
    if (!valid_lo) return;
    const auto value = [&](float p, int row) {
      return round_bf16(p * a.w_scale[row] + (a.bias ? __bfloat162float(a.bias[row]) : 0.f));
    };
    store_rope_pair(a, tile * 16 + 2 * g, value(p_lo, row_lo), value(p_hi, row_hi));
  } else {
    const int rows[2] = {row_lo, row_hi};
    const bool valid[2] = {valid_lo, valid_hi};
    const float p[2] = {p_lo, p_hi};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      if (!valid[r]) continue;
      const float v = p[r] * a.w_scale[rows[r]];
      bf16* y = a.y + rows[r];
      if constexpr (kOut == GemvOutput::kStore)
        *y = __float2bfloat16_rn(v + (a.bias ? __bfloat162float(a.bias[rows[r]]) : 0.f));
      else
        *y = __float2bfloat16_rn(__bfloat162float(*y) + round_bf16(v));
    }
  }
}

template <GemvOutput kOut, bool kFp8, int kSplit, int kWeightRows, int kUnroll>
cudaError_t launch(const GemvArgs& a, cudaStream_t stream) {
  const int columns_per_group = a.output == GemvOutput::kSiluMul ? kWeightRows / 2 : kWeightRows;
  const int out_cols = a.output == GemvOutput::kSiluMul ? a.n / 2 : a.n;
  const int groups = (out_cols + columns_per_group - 1) / columns_per_group, per_block = kWarps / kSplit;
  return launch_early(gemv_kernel<kOut, kFp8, kSplit, kWeightRows, kUnroll>,
                      dim3((groups + per_block - 1) / per_block), dim3(kThreads),
                      a.norm_weight ? static_cast<size_t>(a.k) * sizeof(bf16) : 0, stream, a);
}

template <bool kFp8, int kSplit, int kWeightRows, int kUnroll>
cudaError_t launch(const GemvArgs& a, cudaStream_t stream) {
  switch (a.output) {
    case GemvOutput::kStore: return launch<GemvOutput::kStore, kFp8, kSplit, kWeightRows, kUnroll>(a, stream);
    case GemvOutput::kAddToResidual:
      return launch<GemvOutput::kAddToResidual, kFp8, kSplit, kWeightRows, kUnroll>(a, stream);
    case GemvOutput::kSiluMul: return launch<GemvOutput::kSiluMul, kFp8, kSplit, kWeightRows, kUnroll>(a, stream);
    case GemvOutput::kRope: return launch<GemvOutput::kRope, kFp8, kSplit, kWeightRows, kUnroll>(a, stream);
  }
  return cudaErrorInvalidValue;
}

template <GemvOutput kOut, int kSplit, int kUnroll>
cudaError_t launch_mma(const GemvArgs& a, cudaStream_t stream) {
  const int out_cols = kOut == GemvOutput::kSiluMul ? a.n / 2 : a.n;
  const int tiles = kOut == GemvOutput::kSiluMul ? (out_cols + 7) / 8 : (a.n + 15) / 16, per_block = kWarps / kSplit;
  return launch_early(gemv_fp8_mma_kernel<kOut, kSplit, kUnroll>, dim3((tiles + per_block - 1) / per_block),
                      dim3(kThreads), static_cast<size_t>(a.k) * 2, stream, a);  // x as f16
}

// Tile I of kGemvTiles.
template <size_t I>
cudaError_t launch(const GemvArgs& a, cudaStream_t stream) {
  constexpr GemvTile kTile = kGemvTiles[I];
  if constexpr (kTile.tensor_cores) {
    switch (a.output) {
      case GemvOutput::kStore: return launch_mma<GemvOutput::kStore, kTile.split, kTile.unroll>(a, stream);
      case GemvOutput::kAddToResidual:
        return launch_mma<GemvOutput::kAddToResidual, kTile.split, kTile.unroll>(a, stream);
      case GemvOutput::kSiluMul: return launch_mma<GemvOutput::kSiluMul, kTile.split, kTile.unroll>(a, stream);
      case GemvOutput::kRope: return launch_mma<GemvOutput::kRope, kTile.split, kTile.unroll>(a, stream);
    }
    return cudaErrorInvalidValue;
  } else {
    return a.w_fp8 ? launch<true, kTile.split, kTile.rows, kTile.unroll>(a, stream)
                   : launch<false, kTile.split, kTile.rows, kTile.unroll>(a, stream);
  }
}

// Every tile of kGemvTiles, by its index.
template <size_t... I>
cudaError_t launch_tile(const GemvArgs& a, size_t tile, cudaStream_t stream, std::index_sequence<I...>) {
  cudaError_t e = cudaErrorInvalidValue;
  ((tile == I ? (e = launch<I>(a, stream)) : e), ...);
  return e;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// What is wrong with a kRope product of n columns (empty: nothing).
std::string rope_problem(const GemvRope& r, int n) {
  if (!r.position || !r.slot || !r.inv_freq) return "the RoPE output needs position, slot and inv_freq";
  if (r.head_dim <= 0 || r.head_dim % 2 != 0 || r.num_heads <= 0 || r.num_kv_heads <= 0 ||
      int64_t{r.num_heads + 2 * r.num_kv_heads} * r.head_dim != n)
    return "the RoPE output needs an even head_dim and n = (num_heads + 2 * num_kv_heads) * head_dim (n " +
           std::to_string(n) + ")";
  if (r.rotary_dim < 4 || r.rotary_dim > r.head_dim || r.rotary_dim % 4 != 0)
    return "rotary_dim " + std::to_string(r.rotary_dim) + " must be a multiple of 4 in [4, head_dim]";
  if ((r.k_cache == nullptr) != (r.v_cache == nullptr)) return "both caches or neither";
  if (r.k_cache && !is_supported_block_size(r.block_size))
    return "block_size " + std::to_string(r.block_size) + " is not supported (8, 16, 32)";
  return {};
}

}  // namespace

cudaError_t gemv(const GemvArgs& a, cudaStream_t stream, int tile) {
  const bool silu = a.output == GemvOutput::kSiluMul;
  std::string why;
  if (a.n <= 0 || a.k <= 0 || a.n % (silu ? 16 : 8) != 0 || a.k % 8 != 0)
    why = "n " + std::to_string(a.n) + " and k " + std::to_string(a.k) + " must be positive multiples of 8" +
          (silu ? " (n of 16 with SiLU-and-mul)" : "");
  else if ((a.w == nullptr) == (a.w_fp8 == nullptr) || (a.w_fp8 && (!a.w_scale || a.k % 16 != 0)))
    why = "exactly one of w and w_fp8 (with w_scale, k a multiple of 16)";
  else if (!aligned16(a.x) || !aligned16(a.w ? static_cast<const void*>(a.w) : a.w_fp8))
    why = "x and w must be 16-byte aligned";
  else if (a.bias && a.output != GemvOutput::kStore && a.output != GemvOutput::kRope)
    why = "a bias needs the store or RoPE output";
  else if (!a.y)
    why = "missing y";
  else if (a.norm_weight && (a.k > kMaxNormedK || !aligned16(a.norm_weight)))
    why = "a norm weight needs k at most " + std::to_string(kMaxNormedK) + " and 16-byte alignment";
  else if (tile < -1 || tile >= static_cast<int>(kGemvTiles.size()))
    why = "no tile " + std::to_string(tile);
  else if (a.output == GemvOutput::kRope)
    why = rope_problem(a.rope, a.n);
  const bool mma_fits = a.w_fp8 && a.k % 64 == 0 && a.k <= kMaxNormedK;
  if (tile < 0) tile = !a.w_fp8 ? kGemvTileBf16 : mma_fits ? kGemvTileFp8 : kGemvTileFp8Cores;
  if (why.empty() && kGemvTiles[tile].tensor_cores && !mma_fits)
    why = "tile " + std::to_string(tile) + " needs FP8 weights and k a multiple of 64, at most " +
          std::to_string(kMaxNormedK);
  if (!why.empty()) return launch_failure(cudaErrorInvalidValue, "gemv: " + why);
  const cudaError_t e =
      launch_tile(a, static_cast<size_t>(tile), stream, std::make_index_sequence<kGemvTiles.size()>{});
  return e != cudaSuccess ? e : cudaGetLastError();
}

}  // namespace paged::cuda
