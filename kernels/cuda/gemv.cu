#include "kernels/cuda/gemv.h"

#include <string>

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

__device__ __forceinline__ Bf16x8 load_streaming(const bf16* p) {
  const uint4 v = __ldcs(reinterpret_cast<const uint4*>(p));  // read once: evict first, keep L2 for activations
  Bf16x8 r;
  static_assert(sizeof(r) == sizeof(v));
  memcpy(&r, &v, sizeof v);
  return r;
}

__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// grid: (ceil(weight row groups / kGroups)); block: kThreads. Warp (group, half) of block b reads weight rows
// (b * kGroups + group) * kWeightRows + {0, 1} over K half `half`; the halves meet in shared memory. With kSiluMul
// a group's two rows are gate row c and up row c + n/2 (one output column), otherwise two output columns.
//
// Programmatic dependent launch: the weights do not depend on the previous kernel, so each warp issues its first
// loads, lets the next kernel launch, and only then waits for the previous kernel's results (x, the residual).
// Kernels that precede a gemv in the decode step (rms_norm, attention) let it launch early the same way.
template <GemvOutput kOut>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const GemvArgs a) {
  constexpr bool kSilu = kOut == GemvOutput::kSiluMul;
  __shared__ float partial[kWarps][kWeightRows];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = warp / kSplit, half = warp % kSplit;
  const int k = a.k, chunks = k / 8;
  const int out_cols = kSilu ? a.n / 2 : a.n;
  const int first = (blockIdx.x * kGroups + group) * (kSilu ? 1 : kWeightRows);  // first output column
  bool valid[kWeightRows];
  const bf16* w_row[kWeightRows];
#pragma unroll
  for (int r = 0; r < kWeightRows; ++r) {
    const int row = kSilu ? first + r * out_cols : first + r;
    valid[r] = kSilu ? first < out_cols : row < a.n;
    w_row[r] = a.w + static_cast<int64_t>(valid[r] ? row : 0) * k;
  }
  const int per_half = (chunks + kSplit - 1) / kSplit;
  const int c_begin = half * per_half, c_end = min(chunks, c_begin + per_half);

  Bf16x8 wv[kWeightRows][kUnroll];
  const auto load = [&](int base) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int r = 0; r < kWeightRows; ++r)
        if (valid[r] && base + 32 * u < c_end) wv[r][u] = load_streaming(w_row[r] + (base + 32 * u) * 8);
  };
  int base = c_begin + lane;
  load(base);
  asm volatile("griddepcontrol.launch_dependents;");
  asm volatile("griddepcontrol.wait;" ::: "memory");

  float acc[kWeightRows] = {};
  for (; base < c_end; base += 32 * kUnroll) {
    Bf16x8 cur[kWeightRows][kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int r = 0; r < kWeightRows; ++r) cur[r][u] = wv[r][u];
    load(base + 32 * kUnroll);  // the next loads fly while these are used
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = base + 32 * u;
      if (c >= c_end) break;
      float xf[8];
      bf16x8_to_float(load_bf16x8(a.x + c * 8), xf);
#pragma unroll
      for (int r = 0; r < kWeightRows; ++r) {
        float wf[8];
        bf16x8_to_float(cur[r][u], wf);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[r] += wf[j] * xf[j];
      }
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
template <GemvOutput kOut>
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
  return cudaLaunchKernelEx(&config, gemv_kernel<kOut>, a);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t gemv(const GemvArgs& a, cudaStream_t stream) {
  const bool silu = a.output == GemvOutput::kSiluMul;
  std::string why;
  if (a.n <= 0 || a.k <= 0 || a.n % (silu ? 16 : 8) != 0 || a.k % 8 != 0)
    why = "n " + std::to_string(a.n) + " and k " + std::to_string(a.k) + " must be positive multiples of 8" +
          (silu ? " (n of 16 with SiLU-and-mul)" : "");
  else if (!aligned16(a.x) || !aligned16(a.w))
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
