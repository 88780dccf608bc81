#include "kernels/cuda/moe.h"

#include <mma.h>

#include <string>

#include "kernels/cuda/device_utils.cuh"

namespace paged::cuda {

namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

cudaError_t refuse(const std::string& message) { return launch_failure(cudaErrorInvalidValue, message); }

// ---- routing ------------------------------------------------------------------------------------------------------

constexpr int kRouteWarps = 4;
constexpr int kPerLane = kMaxExperts / 32;  // router logits a lane holds

// (value, expert) of the larger probability; equal ones: the lower expert id.
__device__ __forceinline__ bool better(float v, int e, float v2, int e2) { return v > v2 || (v == v2 && e < e2); }

// grid: ceil(tokens / kRouteWarps); block: 32 * kRouteWarps. Warp w of block b routes token b * kRouteWarps + w:
// lane l holds experts l, l + 32, ...; the softmax's max and sum, then top_k rounds of a warp-wide argmax.
__global__ void __launch_bounds__(32 * kRouteWarps)
    route_topk_kernel(int32_t* __restrict__ experts, float* __restrict__ weights, const float* __restrict__ logits,
                      int tokens, int num_experts, int top_k, bool renormalize) {
  const int lane = threadIdx.x % 32;
  const int token = blockIdx.x * kRouteWarps + threadIdx.x / 32;
  if (token >= tokens) return;
  const float* row = logits + static_cast<int64_t>(token) * num_experts;
  float p[kPerLane];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < num_experts ? row[e] : -INFINITY;
    mx = fmaxf(mx, p[i]);
  }
  mx = warp_max(mx);
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + 32 * i;
    p[i] = e < num_experts ? expf(p[i] - mx) : 0.f;
    sum += p[i];
  }
  sum = warp_sum(sum);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) p[i] = lane + 32 * i < num_experts ? p[i] / sum : -1.f;  // -1: no expert
  float chosen_p[kMaxTopK];
  int chosen_e[kMaxTopK];
  float chosen_sum = 0.f;
  for (int j = 0; j < top_k; ++j) {
    float best = -2.f;
    int best_e = INT32_MAX;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (better(p[i], lane + 32 * i, best, best_e)) {
        best = p[i];
        best_e = lane + 32 * i;
      }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float v = __shfl_xor_sync(kFullMask, best, off);
      const int e = __shfl_xor_sync(kFullMask, best_e, off);
      if (better(v, e, best, best_e)) {
        best = v;
        best_e = e;
      }
    }
    if (best_e % 32 == lane) {
#pragma unroll
      for (int i = 0; i < kPerLane; ++i)
        if (lane + 32 * i == best_e) p[i] = -2.f;  // taken
    }
    chosen_p[j] = best;
    chosen_e[j] = best_e;
    chosen_sum += best;
  }
  if (lane == 0)
    for (int j = 0; j < top_k; ++j) {
      const int64_t slot = static_cast<int64_t>(token) * top_k + j;
      experts[slot] = chosen_e[j];
      weights[slot] = renormalize ? chosen_p[j] / chosen_sum : chosen_p[j];
    }
}

// ---- grouping -----------------------------------------------------------------------------------------------------

constexpr int kGroupThreads = 1024, kPlaceThreads = 256;

// grid: (1); block: kGroupThreads. Counts the slots of each expert (shared atomics: a count does not depend on the
// order), the exclusive scan into offsets, then the tile table: expert e's tiles follow those of the experts before
// it; entries past the last tile get expert -1.
__global__ void __launch_bounds__(kGroupThreads)
    group_offsets_kernel(ExpertGroupsView g, const int32_t* __restrict__ experts, int slots, int num_experts,
                         int tile_rows, int max_tiles) {
  __shared__ int count[kMaxExperts], first_tile[kMaxExperts + 1], offset[kMaxExperts + 1];
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int s = threadIdx.x; s < slots; s += blockDim.x) {
    const int e = experts[s];
    if (e >= 0 && e < num_experts) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // at most kMaxExperts steps
    offset[0] = first_tile[0] = 0;
    for (int e = 0; e < num_experts; ++e) {
      offset[e + 1] = offset[e] + count[e];
      first_tile[e + 1] = first_tile[e] + (count[e] + tile_rows - 1) / tile_rows;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e <= num_experts; e += blockDim.x) g.offsets[e] = offset[e];
  for (int t = first_tile[num_experts] + threadIdx.x; t < max_tiles; t += blockDim.x) {
    g.tile_expert[t] = -1;
    g.tile_row[t] = 0;
  }
  for (int e = threadIdx.x / 32; e < num_experts; e += blockDim.x / 32)
    for (int j = threadIdx.x % 32; j < first_tile[e + 1] - first_tile[e]; j += 32) {
      g.tile_expert[first_tile[e] + j] = e;
      g.tile_row[first_tile[e] + j] = offset[e] + j * tile_rows;
    }
}

// grid: (num_experts); block: kPlaceThreads. Block e walks the slots in order, kPlaceThreads at a time, and writes
// each of its own at offsets[e] + (its slots before it): a ballot per warp, the warps' totals before it.
__global__ void __launch_bounds__(kPlaceThreads)
    group_place_kernel(ExpertGroupsView g, const int32_t* __restrict__ experts, int slots, int top_k) {
  __shared__ int warp_total[kPlaceThreads / 32];
  const int e = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int base = g.offsets[e];
  if (g.offsets[e + 1] == base) return;  // no slot chose this expert (uniform over the block)
  int placed = base;  // the positions written so far, from the expert's first
  for (int first = 0; first < slots; first += kPlaceThreads) {
    const int s = first + threadIdx.x;
    const bool mine = s < slots && experts[s] == e;
    const unsigned ballot = __ballot_sync(kFullMask, mine);
    if (lane == 0) warp_total[warp] = __popc(ballot);
    __syncthreads();
    int before = placed;
    for (int w = 0; w < warp; ++w) before += warp_total[w];
    if (mine) {
      const int p = before + __popc(ballot & ((1u << lane) - 1u));
      g.sorted_slot[p] = s;
      g.sorted_token[p] = s / top_k;
      g.slot_position[s] = p;
    }
    for (int w = 0; w < kPlaceThreads / 32; ++w) placed += warp_total[w];
    __syncthreads();  // warp_total is rewritten by the next round
  }
}

// ---- grouped GEMM -------------------------------------------------------------------------------------------------

constexpr int kTileN = 64, kTileK = 64, kGemmThreads = 128;
constexpr int kSmemPad = 8;  // bf16 elements after each smem row: ld 72 (144 bytes) keeps WMMA's 32-byte alignment

// grid: (ceil(n / kTileN), max_tiles); block: kGemmThreads (4 warps). Block (i, t) computes rows tile_row[t] ..
// (at most kRows, within expert tile_expert[t]) x columns kTileN i .. of y. The A rows are gathered through x_rows.
// Warps: kRows 64 -> 2 x 2 warps of 32 x 32; kRows 16 -> 1 x 4 warps of 16 x 16. The next K slice is loaded into
// registers while the current one is multiplied from shared memory.
template <int kRows>
__global__ void __launch_bounds__(kGemmThreads) grouped_linear_kernel(GroupedGemmArgs a) {
  using namespace nvcuda;
  constexpr int kWarpM = kRows == 64 ? 32 : 16, kWarpN = kRows == 64 ? 32 : 16;
  constexpr int kWarpsN = kTileN / kWarpN;
  constexpr int kFragM = kWarpM / 16, kFragN = kWarpN / 16;
  constexpr int kLd = kTileK + kSmemPad;
  constexpr int kVecA = kRows * kTileK / 8, kVecB = kTileN * kTileK / 8;  // 16-byte vectors per slice
  constexpr int kPerThreadA = (kVecA + kGemmThreads - 1) / kGemmThreads, kPerThreadB = kVecB / kGemmThreads;
  __shared__ __align__(32) bf16 As[kRows * kLd];
  __shared__ __align__(32) bf16 Bs[kTileN * kLd];
  __shared__ __align__(32) float Cs[kRows * (kTileN + 4)];

  const int expert = a.tile_expert[blockIdx.y];
  if (expert < 0) return;
  const int row0 = a.tile_row[blockIdx.y], row_end = min(a.offsets[expert + 1], row0 + kRows);
  const int n0 = blockIdx.x * kTileN;
  const bf16* w = a.w + static_cast<int64_t>(expert) * a.n * a.k;  // int64: experts x n x k passes 2^31
  const int warp = threadIdx.x / 32, wm = warp / kWarpsN, wn = warp % kWarpsN;

  // The source of vector v of the A and B slices at k0 (null: zeros).
  int64_t a_row[kPerThreadA];
#pragma unroll
  for (int i = 0; i < kPerThreadA; ++i) {
    const int v = threadIdx.x + i * kGemmThreads, r = v / (kTileK / 8), p = row0 + r;
    a_row[i] = v < kVecA && p < row_end ? static_cast<int64_t>(a.x_rows ? a.x_rows[p] : p) * a.k : -1;
  }
  Bf16x8 zero;
#pragma unroll
  for (int i = 0; i < 4; ++i) zero.h[i] = __floats2bfloat162_rn(0.f, 0.f);
  Bf16x8 ra[kPerThreadA], rb[kPerThreadB];
  const auto load = [&](int k0) {
#pragma unroll
    for (int i = 0; i < kPerThreadA; ++i) {
      const int v = threadIdx.x + i * kGemmThreads, c = k0 + (v % (kTileK / 8)) * 8;
      ra[i] = a_row[i] >= 0 && c < a.k ? load_bf16x8(a.x + a_row[i] + c) : zero;
    }
#pragma unroll
    for (int i = 0; i < kPerThreadB; ++i) {
      const int v = threadIdx.x + i * kGemmThreads, r = v / (kTileK / 8), c = k0 + (v % (kTileK / 8)) * 8;
      rb[i] = n0 + r < a.n && c < a.k ? load_bf16x8(w + static_cast<int64_t>(n0 + r) * a.k + c) : zero;
    }
  };
  const auto store = [&] {
#pragma unroll
    for (int i = 0; i < kPerThreadA; ++i) {
      const int v = threadIdx.x + i * kGemmThreads;
      if (v < kVecA) store_bf16x8(&As[(v / (kTileK / 8)) * kLd + (v % (kTileK / 8)) * 8], ra[i]);
    }
#pragma unroll
    for (int i = 0; i < kPerThreadB; ++i) {
      const int v = threadIdx.x + i * kGemmThreads;
      store_bf16x8(&Bs[(v / (kTileK / 8)) * kLd + (v % (kTileK / 8)) * 8], rb[i]);
    }
  };

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kFragM][kFragN];
#pragma unroll
  for (int i = 0; i < kFragM; ++i)
#pragma unroll
    for (int j = 0; j < kFragN; ++j) wmma::fill_fragment(acc[i][j], 0.f);
  load(0);
  for (int k0 = 0; k0 < a.k; k0 += kTileK) {
    store();
    __syncthreads();
    if (k0 + kTileK < a.k) load(k0 + kTileK);  // in flight while this slice is multiplied
#pragma unroll
    for (int kk = 0; kk < kTileK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa[kFragM];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> fb[kFragN];
#pragma unroll
      for (int i = 0; i < kFragM; ++i) wmma::load_matrix_sync(fa[i], &As[(wm * kWarpM + i * 16) * kLd + kk], kLd);
#pragma unroll
      for (int j = 0; j < kFragN; ++j) wmma::load_matrix_sync(fb[j], &Bs[(wn * kWarpN + j * 16) * kLd + kk], kLd);
#pragma unroll
      for (int i = 0; i < kFragM; ++i)
#pragma unroll
        for (int j = 0; j < kFragN; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
    __syncthreads();  // As / Bs are rewritten by the next slice
  }
#pragma unroll
  for (int i = 0; i < kFragM; ++i)
#pragma unroll
    for (int j = 0; j < kFragN; ++j)
      wmma::store_matrix_sync(&Cs[(wm * kWarpM + i * 16) * (kTileN + 4) + wn * kWarpN + j * 16], acc[i][j],
                              kTileN + 4, wmma::mem_row_major);
  __syncthreads();
  for (int i = threadIdx.x; i < kRows * kTileN; i += kGemmThreads) {
    const int r = i / kTileN, c = i % kTileN;
    if (row0 + r < row_end && n0 + c < a.n)
      a.y[static_cast<int64_t>(row0 + r) * a.n + n0 + c] = __float2bfloat16(Cs[r * (kTileN + 4) + c]);
  }
}

constexpr int kGemvThreads = 128, kGemvRowsPerWarp = 2, kGemvRows = kGemvThreads / 32 * kGemvRowsPerWarp;

// grid: (ceil(n / kGemvRows), gemv_slots); block: kGemvThreads. Block (i, p) computes columns kGemvRows i .. of
// position p's row of y: warp w the columns of its kGemvRowsPerWarp weight rows, 8 k-elements a lane and load.
__global__ void __launch_bounds__(kGemvThreads) grouped_gemv_kernel(GroupedGemmArgs a) {
  const int p = blockIdx.y;
  int lo = 0, hi = a.num_experts;  // the expert of p: the last e with offsets[e] <= p (empty experts come before)
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (a.offsets[mid] <= p) lo = mid;
    else hi = mid;
  }
  const bf16* x = a.x + static_cast<int64_t>(a.x_rows ? a.x_rows[p] : p) * a.k;
  const bf16* w = a.w + static_cast<int64_t>(lo) * a.n * a.k;
  const int lane = threadIdx.x % 32, r0 = blockIdx.x * kGemvRows + threadIdx.x / 32 * kGemvRowsPerWarp;
  float acc[kGemvRowsPerWarp] = {};
#pragma unroll 4
  for (int c = lane * 8; c < a.k; c += 32 * 8) {
    float xf[8];
    bf16x8_to_float(load_bf16x8(x + c), xf);
#pragma unroll
    for (int r = 0; r < kGemvRowsPerWarp; ++r) {
      if (r0 + r >= a.n) break;
      float wf[8];
      bf16x8_to_float(load_bf16x8(w + static_cast<int64_t>(r0 + r) * a.k + c), wf);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[r] += wf[i] * xf[i];
    }
  }
#pragma unroll
  for (int r = 0; r < kGemvRowsPerWarp; ++r) {
    const float v = warp_sum(acc[r]);
    if (lane == 0 && r0 + r < a.n) a.y[static_cast<int64_t>(p) * a.n + r0 + r] = __float2bfloat16(v);
  }
}

// ---- combination --------------------------------------------------------------------------------------------------

constexpr int kCombineThreads = 128;

// grid: (tokens); block: kCombineThreads. Block t sums its top_k weighted rows of y, 8 columns a thread.
__global__ void __launch_bounds__(kCombineThreads)
    combine_experts_kernel(bf16* __restrict__ out, const bf16* __restrict__ y,
                           const int32_t* __restrict__ slot_position, const float* __restrict__ weights, int top_k,
                           int hidden, bool accumulate) {
  const int64_t t = blockIdx.x;
  for (int c = threadIdx.x * 8; c < hidden; c += kCombineThreads * 8) {
    float sum[8] = {};
    if (accumulate) bf16x8_to_float(load_bf16x8(out + t * hidden + c), sum);
    for (int j = 0; j < top_k; ++j) {
      const float wj = weights[t * top_k + j];
      float v[8];
      bf16x8_to_float(load_bf16x8(y + static_cast<int64_t>(slot_position[t * top_k + j]) * hidden + c), v);
#pragma unroll
      for (int i = 0; i < 8; ++i) sum[i] += wj * v[i];
    }
    store_bf16x8(out + t * hidden + c, float_to_bf16x8(sum));
  }
}

}  // namespace

cudaError_t route_topk(int32_t* experts, float* weights, const float* logits, int tokens, int num_experts, int top_k,
                       bool renormalize, cudaStream_t stream) {
  if (num_experts < 1 || num_experts > kMaxExperts || top_k < 1 || top_k > kMaxTopK || top_k > num_experts)
    return refuse("route_topk: " + std::to_string(num_experts) + " experts, top " + std::to_string(top_k) +
                  " (supported: up to " + std::to_string(kMaxExperts) + " experts, top 1.." +
                  std::to_string(kMaxTopK) + ")");
  if (tokens <= 0) return cudaSuccess;
  route_topk_kernel<<<(tokens + kRouteWarps - 1) / kRouteWarps, 32 * kRouteWarps, 0, stream>>>(
      experts, weights, logits, tokens, num_experts, top_k, renormalize);
  return cudaGetLastError();
}

cudaError_t group_experts(const ExpertGroupsView& groups, const int32_t* experts, int slots, int top_k,
                          int num_experts, int tile_rows, cudaStream_t stream) {
  if (num_experts < 1 || num_experts > kMaxExperts || top_k < 1)
    return refuse("group_experts: " + std::to_string(num_experts) + " experts (supported: 1.." +
                  std::to_string(kMaxExperts) + ")");
  if (tile_rows != 16 && tile_rows != 64)
    return refuse("group_experts: tile_rows " + std::to_string(tile_rows) + " (supported: 16, 64)");
  const int max_tiles = (slots + tile_rows - 1) / tile_rows + num_experts;  // max_expert_tiles
  group_offsets_kernel<<<1, kGroupThreads, 0, stream>>>(groups, experts, slots, num_experts, tile_rows, max_tiles);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess || slots <= 0) return e;
  group_place_kernel<<<num_experts, kPlaceThreads, 0, stream>>>(groups, experts, slots, top_k);
  return cudaGetLastError();
}

cudaError_t grouped_linear(const GroupedGemmArgs& a, cudaStream_t stream) {
  if (a.k <= 0 || a.k % 8 != 0 || a.n <= 0 || !aligned16(a.x) || !aligned16(a.w))
    return refuse("grouped_linear: k " + std::to_string(a.k) + " must be a positive multiple of 8, n positive, x "
                  "and w 16-byte aligned");
  if (a.gemv_slots > 0) {
    if (a.gemv_slots > 65535 || a.num_experts < 1)
      return refuse("grouped_linear: " + std::to_string(a.gemv_slots) + " GEMV positions (supported: up to 65535) "
                    "over " + std::to_string(a.num_experts) + " experts (at least 1)");
    grouped_gemv_kernel<<<dim3((a.n + kGemvRows - 1) / kGemvRows, a.gemv_slots), kGemvThreads, 0, stream>>>(a);
    return cudaGetLastError();
  }
  if (a.max_tiles <= 0) return cudaSuccess;
  if (a.max_tiles > 65535)  // the grid's y limit
    return refuse("grouped_linear: " + std::to_string(a.max_tiles) + " row tiles exceed 65535 (use larger tiles)");
  const dim3 grid((a.n + kTileN - 1) / kTileN, a.max_tiles);
  switch (a.tile_rows) {
    case 16: grouped_linear_kernel<16><<<grid, kGemmThreads, 0, stream>>>(a); break;
    case 64: grouped_linear_kernel<64><<<grid, kGemmThreads, 0, stream>>>(a); break;
    default: return refuse("grouped_linear: tile_rows " + std::to_string(a.tile_rows) + " (supported: 16, 64)");
  }
  return cudaGetLastError();
}

cudaError_t combine_experts(bf16* out, const bf16* y, const int32_t* slot_position, const float* weights, int tokens,
                            int top_k, int hidden, bool accumulate, cudaStream_t stream) {
  if (hidden <= 0 || hidden % 8 != 0 || !aligned16(out) || !aligned16(y))
    return refuse("combine_experts: hidden " + std::to_string(hidden) +
                  " must be a positive multiple of 8 with 16-byte aligned pointers");
  if (tokens <= 0) return cudaSuccess;
  combine_experts_kernel<<<tokens, kCombineThreads, 0, stream>>>(out, y, slot_position, weights, top_k, hidden,
                                                                 accumulate);
  return cudaGetLastError();
}

}  // namespace paged::cuda
