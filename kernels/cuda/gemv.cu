#include "kernels/cuda/gemv.h"

#include <string>

#include <cuda_fp8.h>

#include "kernels/cuda/device_utils.cuh"

namespace paged::cuda {

namespace {

// Shape of the work, chosen on the H200 with Llama-3-8B projections in CUDA graphs (weights far beyond L2): a warp
// streams kWeightRows weight rows over one of kSplit contiguous K ranges, keeping kUnroll 16-byte loads per row in
// flight while it uses the previous ones. Fewer loads in flight per warp and more warps did better than deep unrolls
// (4.2-4.4 TB/s on the gate/up and down shapes against cuBLASLt's 3.7-4.2).
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kSplit = 2;
constexpr int kWeightRows = 2;
constexpr int kUnroll = 2;
constexpr int kGroups = kWarps / kSplit;  // row groups (of kWeightRows weight rows) per block

__device__ __forceinline__ uint4 load_streaming(const void* p) {
  return __ldcs(reinterpret_cast<const uint4*>(p));  // read once: evict first, keep L2 for activations
}

__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// The dot product of one 16-byte load of weights (8 bf16, or 16 e4m3 with kFp8) with the x elements it meets, from
// element `first`, added to acc.
template <bool kFp8>
__device__ __forceinline__ void accumulate(float& acc, const uint4& wv, const bf16* x) {
  if constexpr (kFp8) {
    const __nv_fp8x2_storage_t* pairs = reinterpret_cast<const __nv_fp8x2_storage_t*>(&wv);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float xf[8];
      bf16x8_to_float(load_bf16x8(x + 8 * h), xf);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 w2 = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pairs[4 * h + j], __NV_E4M3)));
        acc += w2.x * xf[2 * j] + w2.y * xf[2 * j + 1];
      }
    }
  } else {
    Bf16x8 w8;
    static_assert(sizeof(w8) == sizeof(wv));
    memcpy(&w8, &wv, sizeof wv);
    float xf[8], wf[8];
    bf16x8_to_float(load_bf16x8(x), xf);
    bf16x8_to_float(w8, wf);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc += wf[j] * xf[j];
  }
}

// grid: (ceil(weight row groups / kGroups)); block: kThreads. Warp (group, half) of block b reads weight rows
// (b * kGroups + group) * kWeightRows + {0, 1} over K half `half`; the halves meet in shared memory. With kSiluMul
// a group's two rows are gate row c and up row c + n/2 (one output column), otherwise two output columns. A chunk is
// one 16-byte load of a weight row: 8 bf16 or, with kFp8, 16 e4m3 whose row sums are scaled by w_scale at the end.
//
// Programmatic dependent launch: the weights do not depend on the previous kernel, so each warp issues its first
// loads, lets the next kernel launch, and only then waits for the previous kernel's results (x, the residual).
// Kernels that precede a gemv in the decode step (rms_norm, attention) let it launch early the same way.
template <GemvOutput kOut, bool kFp8>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const GemvArgs a) {
  constexpr bool kSilu = kOut == GemvOutput::kSiluMul;
  constexpr int kPerChunk = kFp8 ? 16 : 8;  // weights per 16-byte load
  __shared__ float partial[kWarps][kWeightRows];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = warp / kSplit, half = warp % kSplit;
  const int k = a.k, chunks = k / kPerChunk;
  const int out_cols = kSilu ? a.n / 2 : a.n;
  const int first = (blockIdx.x * kGroups + group) * (kSilu ? 1 : kWeightRows);  // first output column
  bool valid[kWeightRows];
  int rows[kWeightRows];
  const char* w_row[kWeightRows];
  const char* w = kFp8 ? reinterpret_cast<const char*>(a.w_fp8) : reinterpret_cast<const char*>(a.w);
#pragma unroll
  for (int r = 0; r < kWeightRows; ++r) {
    const int row = kSilu ? first + r * out_cols : first + r;
    valid[r] = kSilu ? first < out_cols : row < a.n;
    rows[r] = valid[r] ? row : 0;
    w_row[r] = w + static_cast<int64_t>(rows[r]) * chunks * 16;
  }
  const int per_half = (chunks + kSplit - 1) / kSplit;
  const int c_begin = half * per_half, c_end = min(chunks, c_begin + per_half);

  uint4 wv[kWeightRows][kUnroll];
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
#pragma unroll
      for (int r = 0; r < kWeightRows; ++r) accumulate<kFp8>(acc[r], cur[r][u], a.x + c * kPerChunk);
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
    if (!valid[0]) return;
    const float g = round_bf16(p[0]), u = round_bf16(p[1]);
    a.y[first] = __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
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
template <GemvOutput kOut, bool kFp8>
cudaError_t launch(const GemvArgs& a, unsigned blocks, cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, gemv_kernel<kOut, kFp8>, a);
}

template <GemvOutput kOut>
cudaError_t launch(const GemvArgs& a, unsigned blocks, cudaStream_t stream) {
  return a.w_fp8 ? launch<kOut, true>(a, blocks, stream) : launch<kOut, false>(a, blocks, stream);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t gemv(const GemvArgs& a, cudaStream_t stream) {
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
  if (!why.empty()) return launch_failure(cudaErrorInvalidValue, "gemv: " + why);
  const int groups = silu ? a.n / 2 : a.n / kWeightRows;
  const auto blocks = static_cast<unsigned>((groups + kGroups - 1) / kGroups);
  cudaError_t e = cudaSuccess;
  switch (a.output) {
    case GemvOutput::kStore: e = launch<GemvOutput::kStore>(a, blocks, stream); break;
    case GemvOutput::kAddToResidual: e = launch<GemvOutput::kAddToResidual>(a, blocks, stream); break;
    case GemvOutput::kSiluMul: e = launch<GemvOutput::kSiluMul>(a, blocks, stream); break;
  }
  return e != cudaSuccess ? e : cudaGetLastError();
}

}  // namespace paged::cuda
