// Device-side helpers shared by the .cu files of kernels/cuda: 16-byte bf16 vectors, warp reductions, and the one
// switch that turns a runtime head size into a template parameter. CUDA translation units only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/launch.h"

namespace paged::cuda {

constexpr unsigned kFullMask = 0xffffffffu;

// Eight bf16 values: one 16-byte load or store, the unit every kernel here moves memory in.
struct alignas(16) Bf16x8 {
  __nv_bfloat162 h[4];
};

__device__ __forceinline__ void bf16x8_to_float(const Bf16x8& v, float (&f)[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = __bfloat1622float2(v.h[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

__device__ __forceinline__ Bf16x8 float_to_bf16x8(const float (&f)[8]) {
  Bf16x8 v;
#pragma unroll
  for (int i = 0; i < 4; ++i) v.h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return v;
}

// Eight e4m3 codes (8 bytes, element 0 in the lowest byte) as floats, exactly (the FP8 KV cache's rows).
__device__ __forceinline__ void e4m3x8_to_float(const uint2& v, float (&f)[8]) {
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    const uint32_t word = h < 2 ? v.x : v.y;
    const __half2_raw pair = __nv_cvt_fp8x2_to_halfraw2(
        static_cast<__nv_fp8x2_storage_t>((word >> (16 * (h & 1))) & 0xffffu), __NV_E4M3);
    const float2 x = __half22float2(__half2(pair));
    f[2 * h] = x.x;
    f[2 * h + 1] = x.y;
  }
}

// v rounded to bf16 and back: the value a bf16 store of v keeps.
__device__ __forceinline__ float round_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

__device__ __forceinline__ Bf16x8 load_bf16x8(const bf16* p) { return *reinterpret_cast<const Bf16x8*>(p); }
// 16 bytes read once (evict first), so that they push nothing else out of L1 and L2: weights streamed by a GEMV, a
// product row read by one pass. p 16-byte aligned.
__device__ __forceinline__ uint4 load_streaming(const void* p) { return __ldcs(reinterpret_cast<const uint4*>(p)); }
__device__ __forceinline__ Bf16x8 load_streaming_bf16x8(const bf16* p) {
  const uint4 v = load_streaming(p);
  Bf16x8 r;
  memcpy(&r, &v, sizeof r);
  return r;
}
__device__ __forceinline__ void store_bf16x8(bf16* p, const Bf16x8& v) { *reinterpret_cast<Bf16x8*>(p) = v; }
// Eight floats from p (16-byte aligned) in two 16-byte loads.
__device__ __forceinline__ void load_float8(const float* p, float (&f)[8]) {
  const float4 lo = *reinterpret_cast<const float4*>(p), hi = *reinterpret_cast<const float4*>(p + 4);
  f[0] = lo.x, f[1] = lo.y, f[2] = lo.z, f[3] = lo.w, f[4] = hi.x, f[5] = hi.y, f[6] = hi.z, f[7] = hi.w;
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFullMask, v, off);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
}

// Sum over all threads of the block; every thread gets the result. `scratch` holds one T per warp; the block size
// is a multiple of 32. Contains two __syncthreads, so every thread of the block must call it.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T total = 0;
  for (int w = 0; w < warps; ++w) total += scratch[w];  // fixed order: every thread gets the same bits
  return total;
}

// Max over all threads of the block; every thread gets the result (as block_sum: two __syncthreads, every thread
// calls it).
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float m = scratch[0];
  for (int w = 1; w < warps; ++w) m = fmaxf(m, scratch[w]);
  return m;
}

// The arithmetic the FP8 passes share (fp8.cu), one helper each, so that a kernel fusing several passes computes the
// bits of the passes it replaces. A row of absmax m is quantised with the multiplier 448 / m into codes and keeps
// m / 448 as its scale (1 and 1 for a zero row); IEEE divisions, as the CPU twin's (kernels/cpu/fp8.h).
constexpr float kFp8Max = 448.0f;
__device__ __forceinline__ float fp8_row_multiplier(float absmax) {
  return absmax > 0.f ? __fdiv_rn(kFp8Max, absmax) : 1.f;
}
__device__ __forceinline__ float fp8_row_scale(float absmax) { return absmax > 0.f ? __fdiv_rn(absmax, kFp8Max) : 1.f; }
__device__ __forceinline__ uint8_t e4m3_code(float v) { return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3); }
// Eight values times multiplier as e4m3 codes, one 8-byte store (q 8-byte aligned).
__device__ __forceinline__ void store_e4m3x8(uint8_t* q, const float (&f)[8], float multiplier) {
  uint2 packed;
  uint8_t* b = reinterpret_cast<uint8_t*>(&packed);
#pragma unroll
  for (int i = 0; i < 8; ++i) b[i] = e4m3_code(f[i] * multiplier);
  *reinterpret_cast<uint2*>(q) = packed;
}
// The middle of quantising one row per block, called by every thread with its part of the row's absmax: the row's
// scale written by thread 0, its multiplier returned. Two __syncthreads (block_max).
__device__ __forceinline__ float block_row_multiplier(float absmax, float* scratch, float* scale) {
  absmax = block_max(absmax, scratch);
  if (threadIdx.x == 0) *scale = fp8_row_scale(absmax);
  return fp8_row_multiplier(absmax);
}
// The end of quantising one bf16 row per block (quantize_rows_fp8 and the kernels that fuse it), called by every
// thread: `absmax` is this thread's part of the row's absmax, over the chunks it owns (elements i..i+7 for i =
// threadIdx.x * 8, stepping by blockDim.x * 8), which it then reads back from `row` (written by this same thread, or
// never written in this kernel) as codes into q; thread 0 writes the row's scale. Two __syncthreads (block_max).
__device__ __forceinline__ void quantize_own_chunks(float absmax, float* scratch, const bf16* row, int cols,
                                                    uint8_t* q, float* scale) {
  const float multiplier = block_row_multiplier(absmax, scratch, scale);
  for (int c = threadIdx.x * 8; c < cols; c += blockDim.x * 8) {
    float f[8];
    bf16x8_to_float(load_bf16x8(row + c), f);
    store_e4m3x8(q + c, f, multiplier);
  }
}
// A row of `32 * E` elements held by one warp, lane l owning elements [l * E, l * E + E): quantised as
// quantize_rows_fp8 does a row (the same codes and scale), codes to row_codes, the scale by lane 0. All lanes call it.
template <int E>
__device__ __forceinline__ void quantize_warp_row(const float (&v)[E], uint8_t* row_codes, float* scale) {
  float absmax = 0.f;
#pragma unroll
  for (int e = 0; e < E; ++e) absmax = fmaxf(absmax, fabsf(v[e]));
  absmax = warp_max(absmax);
  const float multiplier = fp8_row_multiplier(absmax);
  uint8_t codes[E];
#pragma unroll
  for (int e = 0; e < E; ++e) codes[e] = e4m3_code(v[e] * multiplier);
  const int lane = threadIdx.x % 32;
  if constexpr (E == 4) {
    *reinterpret_cast<uint32_t*>(row_codes + lane * E) = *reinterpret_cast<const uint32_t*>(codes);
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e) row_codes[lane * E + e] = codes[e];
  }
  if (lane == 0) *scale = fp8_row_scale(absmax);
}
// One element of a product of row-quantised codes with its scales (and bias) applied: scale_fp8_product.
__device__ __forceinline__ float scale_fp8_element(float product, float x_scale, float w_scale, float bias) {
  return product * x_scale * w_scale + bias;
}

// The gate's activation of a gated MLP, and act(gate) * up. SiLU with the hardware's exponential and division (a
// few ulp of float32, far below the bf16 rounding that follows; act_and_mul_fp8 is bound by its instructions):
// g / (1 + e^-g) is -0 for g < -87 (the denominator overflows) and g for large g.
enum class GateActivation { kSilu, kGeluTanh };
template <GateActivation kAct>
__device__ __forceinline__ float gate_times_up(float g, float u) {
  if constexpr (kAct == GateActivation::kSilu) {
    return __fdividef(g, 1.0f + __expf(-g)) * u;
  } else {  // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
    return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g))) * u;
  }
}

// Programmatic dependent launch: a kernel started by launch_early may begin while the stream's previous kernel is
// still running, once every block of that one has called allow_dependent_launch (or finished). It must call
// wait_for_previous_grid before it touches anything the previous kernel reads or writes, in every block, before any
// early return (a grid whose blocks all returned without waiting could complete before its predecessor). The GEMVs
// (gemv.cu) stream their weights before they wait; RoPE and the decode attention wait first and gain the launch.

// Lets the next kernel of the stream start now if it was launched with launch_early. A no-op for any other
// successor, which still starts after this grid completes.
__device__ __forceinline__ void allow_dependent_launch() { asm volatile("griddepcontrol.launch_dependents;"); }

// Waits until the previous kernel of the stream has completed and its writes are visible (at once when this kernel
// was launched normally).
__device__ __forceinline__ void wait_for_previous_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// Launches kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization allowed, in thread
// block clusters of `cluster` blocks (sm_90; (1, 1, 1): none).
template <class... Params, class... Args>
cudaError_t launch_early_in_clusters(void (*kernel)(Params...), dim3 grid, dim3 block, dim3 cluster, size_t smem,
                                     cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[2];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  attribute[1].id = cudaLaunchAttributeClusterDimension;
  attribute[1].val.clusterDim.x = cluster.x;
  attribute[1].val.clusterDim.y = cluster.y;
  attribute[1].val.clusterDim.z = cluster.z;
  config.attrs = attribute;
  config.numAttrs = cluster.x * cluster.y * cluster.z > 1 ? 2 : 1;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Args&&>(args)...);
}

template <class... Params, class... Args>
cudaError_t launch_early(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                         Args&&... args) {
  return launch_early_in_clusters(kernel, grid, block, dim3(1, 1, 1), smem, stream, static_cast<Args&&>(args)...);
}

inline bool is_supported_block_size(int block_size) {
  for (int b : kSupportedBlockSizes)
    if (b == block_size) return true;
  return false;
}

inline int log2_of(int power_of_two) {
  int l = 0;
  while ((1 << l) < power_of_two) ++l;
  return l;
}

inline cudaError_t unsupported_head_dim(const char* kernel, int head_dim) {
  return launch_failure(cudaErrorInvalidValue, std::string(kernel) + ": head_dim " + std::to_string(head_dim) +
                                                   " is not supported (supported: 64, 128)");
}

// One RoPE rotation pair (a, b) = (x[i], x[i + rotary_dim / 2]) by the angle whose cosine and sine (times the
// attention factor) are c and s: the new x[i] and x[i + rotary_dim / 2]. One expression for every kernel that
// rotates, so that they agree bit for bit.
__device__ __forceinline__ float rope_lo(float a, float b, float c, float s) { return a * c - b * s; }
__device__ __forceinline__ float rope_hi(float a, float b, float c, float s) { return b * c + a * s; }

}  // namespace paged::cuda

// Runs the statements with HEAD_DIM bound to the compile-time head size; returns the launch failure from the
// enclosing launcher for any other size. The list of cases is kSupportedHeadDims.
#define PAGED_DISPATCH_HEAD_DIM(kernel_name, head_dim, ...)          \
  switch (head_dim) {                                                \
    case 64: {                                                       \
      constexpr int HEAD_DIM = 64;                                   \
      __VA_ARGS__;                                                   \
      break;                                                         \
    }                                                                \
    case 128: {                                                      \
      constexpr int HEAD_DIM = 128;                                  \
      __VA_ARGS__;                                                   \
      break;                                                         \
    }                                                                \
    default:                                                         \
      return ::paged::cuda::unsupported_head_dim(kernel_name, head_dim); \
  }
