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

__device__ __forceinline__ uint4 load_streaming(const void* p) {
  return __ldcs(reinterpret_cast<const uint4*>(p));  // read once: evict first, keep L2 for activations
}

__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

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
    const int row = kSilu ? column + (r / kColumns) * out_cols : column;
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
  asm volatile("griddepcontrol.launch_dependents;");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const bf16* x = a.x;
  if (a.norm_weight) {
    // RMSNorm of x into shared memory with rms_norm_kernel's order of operations (same bits): every thread sums
    // its 8-element chunks, strided by the block, then the block's sum.
    __shared__ float scratch[kWarps];
    bf16* normed = reinterpret_cast<bf16*>(normed_row);
    float sum_sq = 0.f;
    for (int i = threadIdx.x * 8; i < k; i += kThreads * 8) {
      float v[8];
      bf16x8_to_float(load_bf16x8(a.x + i), v);
#pragma unroll
      for (int j = 0; j < 8; ++j) sum_sq += v[j] * v[j];
    }
    sum_sq = block_sum(sum_sq, scratch);
    const float inv = 1.0f / sqrtf(sum_sq / k + a.norm_eps);
    for (int i = threadIdx.x * 8; i < k; i += kThreads * 8) {
      float v[8], w[8];
      bf16x8_to_float(load_bf16x8(a.x + i), v);
      bf16x8_to_float(load_bf16x8(a.norm_weight + i), w);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = (w[j] + a.norm_offset) * (v[j] * inv);
      store_bf16x8(normed + i, float_to_bf16x8(v));
    }
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
      a.y[first + c] = __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
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

// Launches with programmatic stream serialization allowed, so that the kernel may start while the previous one
// finishes (it waits for that one's results itself, see gemv_kernel).
template <GemvOutput kOut, bool kFp8, int kSplit, int kWeightRows, int kUnroll>
cudaError_t launch(const GemvArgs& a, cudaStream_t stream) {
  const int columns_per_group = a.output == GemvOutput::kSiluMul ? kWeightRows / 2 : kWeightRows;
  const int out_cols = a.output == GemvOutput::kSiluMul ? a.n / 2 : a.n;
  const int groups = (out_cols + columns_per_group - 1) / columns_per_group, per_block = kWarps / kSplit;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>((groups + per_block - 1) / per_block));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = a.norm_weight ? static_cast<size_t>(a.k) * sizeof(bf16) : 0;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, gemv_kernel<kOut, kFp8, kSplit, kWeightRows, kUnroll>, a);
}

template <bool kFp8, int kSplit, int kWeightRows, int kUnroll>
cudaError_t launch(const GemvArgs& a, cudaStream_t stream) {
  switch (a.output) {
    case GemvOutput::kStore: return launch<GemvOutput::kStore, kFp8, kSplit, kWeightRows, kUnroll>(a, stream);
    case GemvOutput::kAddToResidual:
      return launch<GemvOutput::kAddToResidual, kFp8, kSplit, kWeightRows, kUnroll>(a, stream);
    case GemvOutput::kSiluMul: return launch<GemvOutput::kSiluMul, kFp8, kSplit, kWeightRows, kUnroll>(a, stream);
  }
  return cudaErrorInvalidValue;
}

template <int kSplit, int kWeightRows, int kUnroll>
cudaError_t launch(const GemvArgs& a, cudaStream_t stream) {
  return a.w_fp8 ? launch<true, kSplit, kWeightRows, kUnroll>(a, stream)
                 : launch<false, kSplit, kWeightRows, kUnroll>(a, stream);
}

// Every tile of kGemvTiles, by its index.
template <size_t... I>
cudaError_t launch_tile(const GemvArgs& a, size_t tile, cudaStream_t stream, std::index_sequence<I...>) {
  cudaError_t e = cudaErrorInvalidValue;
  ((tile == I ? (e = launch<kGemvTiles[I].split, kGemvTiles[I].rows, kGemvTiles[I].unroll>(a, stream)) : e), ...);
  return e;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

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
  else if (a.bias && a.output != GemvOutput::kStore)
    why = "a bias needs the plain store output";
  else if (!a.y)
    why = "missing y";
  else if (a.norm_weight && (a.k > kMaxNormedK || !aligned16(a.norm_weight)))
    why = "a norm weight needs k at most " + std::to_string(kMaxNormedK) + " and 16-byte alignment";
  else if (tile < -1 || tile >= static_cast<int>(kGemvTiles.size()))
    why = "no tile " + std::to_string(tile);
  if (!why.empty()) return launch_failure(cudaErrorInvalidValue, "gemv: " + why);
  if (tile < 0) tile = a.w_fp8 ? kGemvTileFp8 : kGemvTileBf16;
  const cudaError_t e =
      launch_tile(a, static_cast<size_t>(tile), stream, std::make_index_sequence<kGemvTiles.size()>{});
  return e != cudaSuccess ? e : cudaGetLastError();
}

}  // namespace paged::cuda
