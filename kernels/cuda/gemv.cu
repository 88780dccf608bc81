#include "kernels/cuda/gemv.h"

#include <string>

#include "kernels/cuda/device_utils.cuh"

namespace paged::cuda {

namespace {

// 256 threads: the RMSNorm prologue then sums squares in exactly the order of rms_norm_kernel (same block size,
// same strides, same block_sum), so the normalised input has the unfused path's bits.
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// 16-byte weight vectors each lane keeps in flight per row: with several blocks per SM that covers the latency of
// HBM many times over.
constexpr int kUnroll = 8;
static_assert(kGemvMaxRows == 4, "gemv() dispatches m = 1..4");

__device__ __forceinline__ Bf16x8 load_streaming(const bf16* p) {
  const uint4 v = __ldcs(reinterpret_cast<const uint4*>(p));  // read once: evict first, keep L2 for activations
  Bf16x8 r;
  static_assert(sizeof(r) == sizeof(v));
  memcpy(&r, &v, sizeof v);
  return r;
}

__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// grid: (ceil(out_cols / kWarps)); block: kThreads. Warp w of block b computes output column b * kWarps + w for all
// M input rows; with kSiluMul it reads the two weight rows (gate c, up c) that column needs.
template <int M, GemvInput kIn, GemvOutput kOut>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const GemvArgs a) {
  constexpr int R = kOut == GemvOutput::kSiluMul ? 2 : 1;  // weight rows per output column
  __shared__ float scratch[kWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int k = a.k, chunks = k / 8;
  float inv_rms[M];
  if constexpr (kIn == GemvInput::kRmsNorm) {
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const bf16* row = a.x + static_cast<int64_t>(m) * k;
      float sum_sq = 0.f;
      for (int i = threadIdx.x * 8; i < k; i += kThreads * 8) {
        float v[8];
        bf16x8_to_float(load_bf16x8(row + i), v);
#pragma unroll
        for (int j = 0; j < 8; ++j) sum_sq += v[j] * v[j];
      }
      sum_sq = block_sum(sum_sq, scratch);
      inv_rms[m] = 1.0f / sqrtf(sum_sq / k + a.eps);
    }
  }
  const int out_cols = kOut == GemvOutput::kSiluMul ? a.n / 2 : a.n;
  const int col = blockIdx.x * kWarps + warp;
  if (col >= out_cols) return;  // after the last barrier
  const bf16* w_row[R];
  w_row[0] = a.w + static_cast<int64_t>(col) * k;
  if constexpr (R == 2) w_row[1] = a.w + static_cast<int64_t>(col + out_cols) * k;

  float acc[R][M] = {};
  for (int base = lane; base < chunks; base += 32 * kUnroll) {
    Bf16x8 wv[R][kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (base + 32 * u < chunks) wv[r][u] = load_streaming(w_row[r] + (base + 32 * u) * 8);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = base + 32 * u;
      if (c >= chunks) break;
      float wf[R][8];
#pragma unroll
      for (int r = 0; r < R; ++r) bf16x8_to_float(wv[r][u], wf[r]);
      float nw[8];
      if constexpr (kIn == GemvInput::kRmsNorm) bf16x8_to_float(load_bf16x8(a.norm_weight + c * 8), nw);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float xf[8];
        bf16x8_to_float(load_bf16x8(a.x + static_cast<int64_t>(m) * k + c * 8), xf);
        if constexpr (kIn == GemvInput::kRmsNorm) {
#pragma unroll
          for (int j = 0; j < 8; ++j) xf[j] = round_bf16(nw[j] * (xf[j] * inv_rms[m]));
        }
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[r][m] += wf[r][j] * xf[j];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = warp_sum(acc[r][m]);
  if (lane != 0) return;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    bf16* y = a.y + static_cast<int64_t>(m) * out_cols + col;
    if constexpr (kOut == GemvOutput::kStore) {
      *y = __float2bfloat16_rn(acc[0][m] + (a.bias ? __bfloat162float(a.bias[col]) : 0.f));
    } else if constexpr (kOut == GemvOutput::kAddToResidual) {
      *y = __float2bfloat16_rn(__bfloat162float(*y) + round_bf16(acc[0][m]));
    } else {
      const float g = round_bf16(acc[0][m]), u = round_bf16(acc[R - 1][m]);
      *y = __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
    }
  }
}

template <int M, GemvInput kIn>
void launch_for_output(const GemvArgs& a, unsigned blocks, cudaStream_t stream) {
  switch (a.output) {
    case GemvOutput::kStore:
      gemv_kernel<M, kIn, GemvOutput::kStore><<<blocks, kThreads, 0, stream>>>(a);
      break;
    case GemvOutput::kAddToResidual:
      gemv_kernel<M, kIn, GemvOutput::kAddToResidual><<<blocks, kThreads, 0, stream>>>(a);
      break;
    case GemvOutput::kSiluMul:
      gemv_kernel<M, kIn, GemvOutput::kSiluMul><<<blocks, kThreads, 0, stream>>>(a);
      break;
  }
}

template <int M>
void launch_for_rows(const GemvArgs& a, unsigned blocks, cudaStream_t stream) {
  if (a.input == GemvInput::kRmsNorm)
    launch_for_output<M, GemvInput::kRmsNorm>(a, blocks, stream);
  else
    launch_for_output<M, GemvInput::kPlain>(a, blocks, stream);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t gemv(const GemvArgs& a, cudaStream_t stream) {
  const bool silu = a.output == GemvOutput::kSiluMul, norm = a.input == GemvInput::kRmsNorm;
  std::string why;
  if (a.m < 1 || a.m > kGemvMaxRows)
    why = "m " + std::to_string(a.m) + " must be in [1, " + std::to_string(kGemvMaxRows) + "]";
  else if (a.n <= 0 || a.k <= 0 || a.n % (silu ? 16 : 8) != 0 || a.k % 8 != 0)
    why = "n " + std::to_string(a.n) + " and k " + std::to_string(a.k) + " must be positive multiples of 8" +
          (silu ? " (n of 16 with SiLU-and-mul)" : "");
  else if (!aligned16(a.x) || !aligned16(a.w) || (norm && !aligned16(a.norm_weight)))
    why = "x, w and norm_weight must be 16-byte aligned";
  else if (a.bias && a.output != GemvOutput::kStore)
    why = "a bias needs the plain store output";
  else if (!a.y || (norm && !a.norm_weight))
    why = "missing y or norm_weight";
  if (!why.empty()) return launch_failure(cudaErrorInvalidValue, "gemv: " + why);
  const int out_cols = silu ? a.n / 2 : a.n;
  const auto blocks = static_cast<unsigned>((out_cols + kWarps - 1) / kWarps);
  switch (a.m) {
    case 1: launch_for_rows<1>(a, blocks, stream); break;
    case 2: launch_for_rows<2>(a, blocks, stream); break;
    case 3: launch_for_rows<3>(a, blocks, stream); break;
    default: launch_for_rows<4>(a, blocks, stream); break;
  }
  return cudaGetLastError();
}

}  // namespace paged::cuda
