// Linear layers of one token (one-stream decode) with the row operation after them fused in: y = x * W^T stored
// (+ bias), added to the residual stream, or gated by SiLU-and-mul. The weights are streamed once in 16-byte vectors
// at the weight-read bandwidth (4.1-4.3 TB/s on the H200 for the Llama-3-8B projections, where cuBLASLt reaches
// 2.8-4.1 at one row), and one launch replaces two (GEMM, then add / activation). From two rows on, cuBLASLt's
// tensor-core GEMMs were faster in the same measurement (tools/bench_cuda_runner ops --batch 2), so the runner takes
// this path for single-token steps only. It is launched with programmatic dependent launch: it starts reading weights
// while the previous kernel finishes.
// The rounding points are those of the unfused sequence (bf16 product, bf16 sum), so only the float32 summation
// order differs from Gemm::linear followed by add_rms_norm's add or silu_and_mul.
// The QKV projection can also rotate its query and key heads and write the key and value into the paged cache
// (kRope: rope_and_cache's work in the product's epilogue, one launch fewer between the projection and attention).
// CPU twins: cpu::linear followed by the add or cpu::silu_and_mul, and for kRope the same bits as kStore followed by
// rope_and_cache (tests/kernels/cuda/test_gemv.cpp, test_fp8.cpp).
#pragma once

#include <array>
#include <cstdint>

#include "kernels/cuda/launch.h"

namespace paged::cuda {

enum class GemvOutput {
  kStore,          // y[c] = p[c] + bias[c]
  kAddToResidual,  // y[c] = y[c] + bf16(p[c]): y is the residual stream, updated in place
  kSiluMul,        // y[c] = silu(bf16(p[c])) * bf16(p[c + n/2]) for c < n/2: W holds gate rows, then up rows
  kRope,           // as kStore, then rope_and_cache (rope_cache.h) on y, a QKV row of one token (GemvRope)
};

/// kRope: what rope_and_cache takes besides the row, for the one token whose QKV row the product is: y holds the
/// query heads, then the key heads, then the value heads (n = (num_heads + 2 * num_kv_heads) * head_dim). The query
/// and key heads of y are rotated by *position (HF layout: of a head's first rotary_dim elements, i pairs with
/// i + rotary_dim / 2; angle position * inv_freq[i] in float32, cos and sin times attention_factor); with caches,
/// the rotated key and the value also go to the cache at *slot (block * block_size + offset; -1: nowhere). Without
/// (the FP8 cache, written by cache_kv_fp8 next) y alone is written. head_dim even, rotary_dim a multiple of 4 in
/// [4, head_dim], block_size in kSupportedBlockSizes.
struct GemvRope {
  bf16* k_cache = nullptr;  // [num_blocks][num_kv_heads][block_size][head_dim], or null with v_cache
  bf16* v_cache = nullptr;
  const int32_t* position = nullptr;  // [1], on the device
  const int64_t* slot = nullptr;      // [1], on the device
  const float* inv_freq = nullptr;    // [rotary_dim / 2]
  int num_heads = 0, num_kv_heads = 0, head_dim = 0, rotary_dim = 0, block_size = 0;
  float attention_factor = 1.0f;
};

struct GemvArgs {
  const bf16* x = nullptr;            // [k]
  const bf16* w = nullptr;            // [n][k], or null with w_fp8
  const uint8_t* w_fp8 = nullptr;     // [n][k] e4m3 (--quantization fp8): row c's products scaled by w_scale[c]
  const float* w_scale = nullptr;     // [n] with w_fp8
  const bf16* bias = nullptr;         // [n] or nullptr; kStore and kRope only
  bf16* y = nullptr;                  // [n], or [n/2] with kSiluMul; may not alias x
  int n = 0, k = 0;
  GemvOutput output = GemvOutput::kStore;
  // With norm_weight, the product takes RMSNorm(x) * (norm_weight + norm_offset) instead of x, rounded to bf16 as
  // cuda::rms_norm writes it (the same bits; k at most kMaxNormedK): each block normalises x itself, so the
  // one-stream step launches no norm kernel before the projections that read a norm.
  const bf16* norm_weight = nullptr;  // [k]
  float norm_eps = 0.0f, norm_offset = 0.0f;
  // Before it waits for the previous kernel (launched early, see below), each warp asks L2 for the first
  // prefetch_l2 (0..1) of its weight rows at once (bulk prefetches), so that these arrive while the previous kernel
  // leaves the memory idle: the O projection after the decode attention, which is latency-bound at one token. The
  // runner keeps the bytes asked for well within L2: more would evict their own lines before the loads reach them.
  float prefetch_l2 = 0.0f;
  GemvRope rope;  // kRope only
};

/// The widest x a gemv normalises itself (its block keeps the normed row in shared memory).
inline constexpr int kMaxNormedK = 16384;

/// How a launch divides the work: each warp reads `rows` weight rows over one of `split` contiguous K ranges, with
/// `unroll` 16-byte loads a row in flight. `rows` even (gate and up rows pair up with kSiluMul). `tensor_cores`
/// (FP8 weights, k a multiple of 64 and at most kMaxNormedK; rows 16): the warp's products as MMAs of its 16 rows.
struct GemvTile {
  int split, rows, unroll;
  bool tensor_cores = false;
};
inline constexpr std::array<GemvTile, 17> kGemvTiles{{{2, 2, 2},
                                                      {2, 2, 4},
                                                      {1, 2, 4},
                                                      {2, 4, 2},
                                                      {1, 4, 2},
                                                      {4, 2, 2},
                                                      {4, 4, 2},
                                                      {1, 4, 4},
                                                      {2, 4, 1},
                                                      {2, 8, 1},
                                                      {4, 8, 1},
                                                      {1, 8, 1},
                                                      {8, 16, 4, true},
                                                      {8, 16, 2, true},
                                                      {4, 16, 4, true},
                                                      {4, 16, 2, true},
                                                      {2, 16, 4, true}}};
inline constexpr int kGemvTileBf16 = 0;      // the tiles gemv takes by default
inline constexpr int kGemvTileFp8 = 13;      // where the tensor cores take it (8/16/2: 2.14 ms for 32 layers, H200)
inline constexpr int kGemvTileFp8Cores = 3;  // else (2/4/2: 2.30 ms for 32 layers against 2.76 with 2/2/2, H200)

/// Enqueues the product on `stream`. n and k positive multiples of 8 (n of 16 with kSiluMul, k of 16 with w_fp8); x
/// and w 16-byte aligned; exactly one of w and w_fp8. Anything else returns cudaErrorInvalidValue with a message
/// (describe_launch_error). FP8 weights are read 16 to a load, half the bytes of bf16's, and multiplied on the tensor
/// cores where k allows (x as f16; CPU twin: the dequantised product, e4m3_to_float(w) * w_scale against x, summed
/// in float32). `tile` indexes kGemvTiles (-1: the default for the weights and k), for tuning (bench_cuda_runner
/// gemv).
cudaError_t gemv(const GemvArgs& args, cudaStream_t stream, int tile = -1);

}  // namespace paged::cuda
