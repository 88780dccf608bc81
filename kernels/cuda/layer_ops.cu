#include "kernels/cuda/layer_ops.h"

#include <algorithm>
#include <string>

#include "kernels/cuda/device_utils.cuh"

namespace paged::cuda {

namespace {

constexpr int kRowThreads = 256;

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

cudaError_t bad_width(const char* kernel, const char* what, int width) {
  return launch_failure(cudaErrorInvalidValue, std::string(kernel) + ": " + what + " " + std::to_string(width) +
                                                   " must be a positive multiple of 8 with 16-byte aligned pointers");
}

// grid: (n); block: kRowThreads. Block i copies row rows[i] of the table in 16-byte vectors, times scale unless it
// is 1.
__global__ void __launch_bounds__(kRowThreads)
    gather_rows_kernel(bf16* __restrict__ out, const bf16* __restrict__ table, const int32_t* __restrict__ rows,
                       int width, int table_rows, float scale) {
  const int32_t r = rows[blockIdx.x];
  bf16* dst = out + static_cast<int64_t>(blockIdx.x) * width;  // int64: n * width can pass 2^31
  const bool valid = r >= 0 && r < table_rows;
  const bf16* src = table + static_cast<int64_t>(valid ? r : 0) * width;
  Bf16x8 zero;
  for (int i = 0; i < 4; ++i) zero.h[i] = __floats2bfloat162_rn(0.f, 0.f);
  for (int i = threadIdx.x * 8; i < width; i += blockDim.x * 8) {
    Bf16x8 v = valid ? load_bf16x8(src + i) : zero;
    if (scale != 1.0f) {
      float f[8];
      bf16x8_to_float(v, f);
#pragma unroll
      for (int j = 0; j < 8; ++j) f[j] *= scale;
      v = float_to_bf16x8(f);
    }
    store_bf16x8(dst + i, v);
  }
}

// grid: (rows); block: kThreads. Block r normalises row r; thread t owns the chunks (8 elements) at
// i = (t + c * kThreads) * 8, c < kChunks, and holds them in registers from its one read to its last write. With
// kAdd, residual[r] += x[r] first and the rounded sum is normalised. With fp8.q, the normalised row is also
// quantised as quantize_rows_fp8 does: the input of an FP8 product, without a launch of its own. With
// product.x_scale (kAdd), x is a product of FP8 codes that gets its scales (scale_fp8_product's pass) as it is read.
// A thread's chunks in this order and the block sum are the order of operations the GEMV's own norm repeats
// (gemv.cu's for_x_chunks: 256 threads), so both give the same bits.
template <bool kAdd, int kThreads, int kChunks>
__global__ void __launch_bounds__(kThreads)
    rms_norm_kernel(bf16* __restrict__ out, bf16* __restrict__ residual, const bf16* __restrict__ x,
                    const bf16* __restrict__ weight, int hidden, float eps, float weight_offset, Fp8Rows fp8,
                    Fp8Product product) {
  allow_dependent_launch();  // the projection after the norm may start streaming its weights
  __shared__ float scratch[kThreads / 32];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * hidden;
  const bf16* src = kAdd ? residual + row : x + row;
  const float sx = product.x_scale ? product.x_scale[blockIdx.x] : 1.f;  // before fp8.scale[row] is written
  const auto at = [&](int c) { return (static_cast<int>(threadIdx.x) + c * kThreads) * 8; };
  float v[kChunks][8];
  float sum_sq = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int i = at(c);
    if (i >= hidden) continue;
    bf16x8_to_float(load_bf16x8(src + i), v[c]);
    if constexpr (kAdd) {
      float a[8];
      bf16x8_to_float(load_bf16x8(x + row + i), a);
      if (product.x_scale) {
        float b[8] = {};
        if (product.bias) bf16x8_to_float(load_bf16x8(product.bias + i), b);
#pragma unroll
        for (int j = 0; j < 8; ++j) a[j] = round_bf16(scale_fp8_element(a[j], sx, product.w_scale[i + j], b[j]));
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) v[c][j] += a[j];
      const Bf16x8 rounded = float_to_bf16x8(v[c]);
      store_bf16x8(residual + row + i, rounded);
      bf16x8_to_float(rounded, v[c]);  // HF normalises the bf16 residual, not the float sum
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) sum_sq += v[c][j] * v[c][j];
  }
  sum_sq = block_sum(sum_sq, scratch);
  const float inv = 1.0f / sqrtf(sum_sq / hidden + eps);
  float absmax = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int i = at(c);
    if (i >= hidden) continue;
    float w[8];
    bf16x8_to_float(load_bf16x8(weight + i), w);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[c][j] = (w[j] + weight_offset) * (v[c][j] * inv);
    const Bf16x8 rounded = float_to_bf16x8(v[c]);
    if (out) store_bf16x8(out + row + i, rounded);
    if (fp8.q) {
      bf16x8_to_float(rounded, v[c]);
#pragma unroll
      for (int j = 0; j < 8; ++j) absmax = fmaxf(absmax, fabsf(v[c][j]));
    }
  }
  if (!fp8.q) return;
  const float multiplier = block_row_multiplier(absmax, scratch, fp8.scale + blockIdx.x);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int i = at(c);
    if (i < hidden) store_e4m3x8(fp8.q + row + i, v[c], multiplier);
  }
}

constexpr int kMaxNormHidden = 1024 * 8 * 8;  // the widest row rms_norm_kernel's registers hold

cudaError_t too_wide(const char* kernel, int hidden) {
  return launch_failure(cudaErrorInvalidValue, std::string(kernel) + ": hidden " + std::to_string(hidden) +
                                                   " is more than the " + std::to_string(kMaxNormHidden) +
                                                   " a block's registers hold");
}

// rms_norm_kernel for a row of `hidden`: 256 threads holding up to 8 chunks each (hidden <= 16,384, the GEMV's
// kMaxNormedK), else 1,024 threads (hidden <= kMaxNormHidden).
template <bool kAdd>
cudaError_t launch_rms_norm(int rows, int hidden, cudaStream_t stream, bf16* out, bf16* residual, const bf16* x,
                            const bf16* weight, float eps, float weight_offset, const Fp8Rows& fp8,
                            const Fp8Product& product) {
  const auto launch = [&](auto kernel, int threads) {
    kernel<<<rows, threads, 0, stream>>>(out, residual, x, weight, hidden, eps, weight_offset, fp8, product);
    return cudaGetLastError();
  };
  const int chunks = (hidden / 8 + kRowThreads - 1) / kRowThreads;
  if (chunks <= 1) return launch(rms_norm_kernel<kAdd, kRowThreads, 1>, kRowThreads);
  if (chunks <= 2) return launch(rms_norm_kernel<kAdd, kRowThreads, 2>, kRowThreads);
  if (chunks <= 4) return launch(rms_norm_kernel<kAdd, kRowThreads, 4>, kRowThreads);
  if (chunks <= 8) return launch(rms_norm_kernel<kAdd, kRowThreads, 8>, kRowThreads);
  return launch(rms_norm_kernel<kAdd, 1024, 8>, 1024);
}

// grid: (ceil(inter / 8 / kRowThreads), min(tokens, 65535)); block: kRowThreads. One thread per 8 outputs of a row
// (no 64-bit division of a flat index: it cost as much as the activation), rows strided by the grid's height.
template <GateActivation kAct>
__global__ void __launch_bounds__(kRowThreads)
    act_and_mul_kernel(bf16* __restrict__ out, const bf16* __restrict__ gate_up, int tokens, int inter) {
  const int c = (blockIdx.x * kRowThreads + threadIdx.x) * 8;
  if (c >= inter) return;
  for (int64_t t = blockIdx.y; t < tokens; t += gridDim.y) {
    float g[8], u[8];
    bf16x8_to_float(load_bf16x8(gate_up + t * 2 * inter + c), g);
    bf16x8_to_float(load_bf16x8(gate_up + t * 2 * inter + inter + c), u);
#pragma unroll
    for (int j = 0; j < 8; ++j) g[j] = gate_times_up<kAct>(g[j], u[j]);
    store_bf16x8(out + t * inter + c, float_to_bf16x8(g));
  }
}

template <GateActivation kAct>
cudaError_t act_and_mul(const char* name, bf16* out, const bf16* gate_up, int tokens, int inter,
                        cudaStream_t stream) {
  if (inter <= 0 || inter % 8 != 0 || !aligned16(out) || !aligned16(gate_up)) return bad_width(name, "inter", inter);
  if (tokens <= 0) return cudaSuccess;
  const dim3 grid((inter / 8 + kRowThreads - 1) / kRowThreads, std::min(tokens, 65535));
  act_and_mul_kernel<kAct><<<grid, kRowThreads, 0, stream>>>(out, gate_up, tokens, inter);
  return cudaGetLastError();
}

// grid: (ceil(n / kRowThreads)); block: kRowThreads. One element per thread.
__global__ void __launch_bounds__(kRowThreads) soft_cap_kernel(float* __restrict__ x, int64_t n, float cap) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = tanhf(x[i] / cap) * cap;
}

}  // namespace

cudaError_t gather_rows(bf16* out, const bf16* table, const int32_t* rows, int n, int width, int table_rows,
                        float scale, cudaStream_t stream) {
  if (width <= 0 || width % 8 != 0 || !aligned16(out) || !aligned16(table)) return bad_width("gather_rows", "width", width);
  if (n <= 0) return cudaSuccess;
  gather_rows_kernel<<<n, kRowThreads, 0, stream>>>(out, table, rows, width, table_rows, scale);
  return cudaGetLastError();
}

namespace {

// Why a norm's FP8 arguments cannot be taken, or "" when they can.
std::string fp8_arguments_error(const Fp8Rows& fp8, const Fp8Product& product, const bf16* out) {
  if (reinterpret_cast<uintptr_t>(fp8.q) % 8 != 0 || (fp8.q && !fp8.scale))
    return "FP8 rows need q 8-byte aligned and their scales";
  if (!out && !fp8.q) return "out may be null only with FP8 rows";
  if (product.x_scale && (!product.w_scale || !aligned16(product.bias)))
    return "an FP8 product needs both scale vectors and a 16-byte aligned bias";
  return "";
}

}  // namespace

cudaError_t rms_norm(bf16* out, const bf16* x, const bf16* weight, int rows, int hidden, float eps,
                     float weight_offset, cudaStream_t stream, Fp8Rows fp8) {
  if (hidden <= 0 || hidden % 8 != 0 || !aligned16(out) || !aligned16(x) || !aligned16(weight))
    return bad_width("rms_norm", "hidden", hidden);
  if (hidden > kMaxNormHidden) return too_wide("rms_norm", hidden);
  if (const std::string why = fp8_arguments_error(fp8, {}, out); !why.empty())
    return launch_failure(cudaErrorInvalidValue, "rms_norm: " + why);
  if (rows <= 0) return cudaSuccess;
  return launch_rms_norm<false>(rows, hidden, stream, out, nullptr, x, weight, eps, weight_offset, fp8, {});
}

cudaError_t add_rms_norm(bf16* out, bf16* residual, const bf16* x, const bf16* weight, int rows, int hidden,
                         float eps, float weight_offset, cudaStream_t stream, Fp8Rows fp8, Fp8Product x_product) {
  if (hidden <= 0 || hidden % 8 != 0 || !aligned16(out) || !aligned16(residual) || !aligned16(x) ||
      !aligned16(weight))
    return bad_width("add_rms_norm", "hidden", hidden);
  if (hidden > kMaxNormHidden) return too_wide("add_rms_norm", hidden);
  if (const std::string why = fp8_arguments_error(fp8, x_product, out); !why.empty())
    return launch_failure(cudaErrorInvalidValue, "add_rms_norm: " + why);
  if (rows <= 0) return cudaSuccess;
  return launch_rms_norm<true>(rows, hidden, stream, out, residual, x, weight, eps, weight_offset, fp8, x_product);
}

cudaError_t silu_and_mul(bf16* out, const bf16* gate_up, int tokens, int inter, cudaStream_t stream) {
  return act_and_mul<GateActivation::kSilu>("silu_and_mul", out, gate_up, tokens, inter, stream);
}

cudaError_t gelu_tanh_and_mul(bf16* out, const bf16* gate_up, int tokens, int inter, cudaStream_t stream) {
  return act_and_mul<GateActivation::kGeluTanh>("gelu_tanh_and_mul", out, gate_up, tokens, inter, stream);
}

cudaError_t soft_cap(float* x, int64_t n, float cap, cudaStream_t stream) {
  if (!(cap > 0.0f)) return launch_failure(cudaErrorInvalidValue, "soft_cap: cap must be > 0");
  if (n <= 0) return cudaSuccess;
  soft_cap_kernel<<<static_cast<unsigned>((n + kRowThreads - 1) / kRowThreads), kRowThreads, 0, stream>>>(x, n, cap);
  return cudaGetLastError();
}

}  // namespace paged::cuda
