#include "kernels/cuda/moe.h"

#include <string>

#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/mma.cuh"

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

constexpr int kGemmWarps = 8, kGemmThreads = 32 * kGemmWarps;
constexpr int kTileN = 128, kTileK = 64, kStages = 3;
// bf16 per shared-memory row: a K slice plus 16 bytes, so that ldmatrix's eight 144-byte-apart rows fall on distinct
// banks (and every 16-byte chunk stays aligned for cp.async).
constexpr int kPitch = kTileK + 8;
constexpr int kChunksPerRow = kTileK / 8;                     // 16-byte chunks of a slice row
constexpr int kRowsPerPass = kGemmThreads / kChunksPerRow;  // slice rows the block's threads load at once

// Dynamic shared memory of a kRows block: kStages stages of an A slice [kRows][kPitch] and a B slice [kTileN][kPitch].
template <int kRows>
constexpr int grouped_smem_bytes() {
  return kStages * (kRows + kTileN) * kPitch * static_cast<int>(sizeof(bf16));
}

// grid: (ceil(n / kTileN), max_tiles); block: kGemmThreads (8 warps); dynamic shared memory grouped_smem_bytes.
// Block (i, t) computes rows tile_row[t] .. (at most kRows, within expert tile_expert[t]) x columns kTileN i .. of y,
// the A rows gathered through x_rows. The K slices of A and of the expert's weight rows (B) stream into shared memory
// by cp.async, kStages - 1 slices ahead of the one being multiplied; a slice row is 128 bytes, whole cache lines of
// the weights. Warps: 2 x 4 of (kRows / 2) x 32 from 64 rows, 1 x 8 of 16 x 16 for 16 rows; each computes m16n8k16
// MMAs (kernels/cuda/mma.cuh) from ldmatrix fragments.
template <int kRows>
__global__ void __launch_bounds__(kGemmThreads, kRows == 16 ? 3 : 2) grouped_linear_kernel(GroupedGemmArgs a) {
  constexpr int kWarpsM = kRows >= 64 ? 2 : 1, kWarpsN = kGemmWarps / kWarpsM;
  constexpr int kWarpRows = kRows / kWarpsM, kWarpCols = kTileN / kWarpsN;
  constexpr int kFragsM = kWarpRows / 16, kFragsN = kWarpCols / 8;
  constexpr int kPassesA = (kRows + kRowsPerPass - 1) / kRowsPerPass, kPassesB = kTileN / kRowsPerPass;
  static_assert(kWarpRows % 16 == 0 && kWarpCols % 16 == 0 && kTileK % 32 == 0 && kTileN % kRowsPerPass == 0);
  extern __shared__ __align__(16) unsigned char grouped_smem[];
  bf16* const sa = reinterpret_cast<bf16*>(grouped_smem);  // [stage][kRows][kPitch]
  bf16* const sb = sa + kStages * kRows * kPitch;           // [stage][kTileN][kPitch]

  const int expert = a.tile_expert[blockIdx.y];
  if (expert < 0) return;
  const int row0 = a.tile_row[blockIdx.y], row_end = min(a.offsets[expert + 1], row0 + kRows);
  const int n0 = blockIdx.x * kTileN;
  const bf16* w = a.w + static_cast<int64_t>(expert) * a.n * a.k;  // int64: experts x n x k passes 2^31

  // This thread loads chunk `col` of slice rows r0 + kRowsPerPass * i: their sources (rows past the tile or past n
  // read nothing).
  const int r0 = threadIdx.x / kChunksPerRow, col = (threadIdx.x % kChunksPerRow) * 8;
  const bf16* src_a[kPassesA];
  bool ok_a[kPassesA];
#pragma unroll
  for (int i = 0; i < kPassesA; ++i) {
    const int r = r0 + kRowsPerPass * i, p = row0 + r;
    ok_a[i] = r < kRows && p < row_end;
    src_a[i] = a.x + (ok_a[i] ? static_cast<int64_t>(a.x_rows ? a.x_rows[p] : p) * a.k : 0) + col;
  }
  const bf16* src_b = w + static_cast<int64_t>(min(n0 + r0, a.n - 1)) * a.k + col;
  // K slice `kt` into stage `stage`, one cp.async group; chunks past k or outside the tile become zeros.
  const auto load = [&](int kt, int stage) {
    const int k0 = kt * kTileK;
    const bool in_k = k0 + col < a.k;
#pragma unroll
    for (int i = 0; i < kPassesA; ++i) {
      const int r = r0 + kRowsPerPass * i;
      if (r >= kRows) break;
      const bool valid = ok_a[i] && in_k;
      cp_async_16(&sa[(stage * kRows + r) * kPitch + col], valid ? src_a[i] + k0 : a.x, valid);
    }
#pragma unroll
    for (int i = 0; i < kPassesB; ++i) {
      const int r = r0 + kRowsPerPass * i;
      const bool valid = n0 + r < a.n && in_k;
      cp_async_16(&sb[(stage * kTileN + r) * kPitch + col],
                  valid ? src_b + static_cast<int64_t>(kRowsPerPass * i) * a.k + k0 : a.w, valid);
    }
    cp_async_commit();
  };

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, wm = warp / kWarpsN, wn = warp % kWarpsN;
  float acc[kFragsM][kFragsN][4];
#pragma unroll
  for (int i = 0; i < kFragsM; ++i)
#pragma unroll
    for (int j = 0; j < kFragsN; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

  const int k_tiles = (a.k + kTileK - 1) / kTileK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load(s, s);
    else cp_async_commit();  // empty groups keep the count of cp_async_wait right
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<kStages - 2>();  // slice kt has landed (this thread's part)
    __syncthreads();               // ... every thread's; and slice kt - 1's stage is no longer read
    if (const int next = kt + kStages - 1; next < k_tiles) load(next, next % kStages);
    else cp_async_commit();
    const int stage = kt % kStages;
    const bf16* as = sa + (stage * kRows + wm * kWarpRows) * kPitch;
    const bf16* bs = sb + (stage * kTileN + wn * kWarpCols) * kPitch;
#pragma unroll
    for (int kk = 0; kk < kTileK; kk += 32) {
      // B: n-tile j's registers of two k-steps from one ldmatrix (rows along N, K along the row).
      uint32_t b[kFragsN][4];
#pragma unroll
      for (int j = 0; j < kFragsN; ++j) ldmatrix_x4(b[j], &bs[(8 * j + (lane & 7)) * kPitch + kk + 8 * (lane >> 3)]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // A: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15) = a0..a3.
        uint32_t af[kFragsM][4];
#pragma unroll
        for (int i = 0; i < kFragsM; ++i)
          ldmatrix_x4(af[i],
                      &as[(16 * i + (lane & 7) + 8 * ((lane >> 3) & 1)) * kPitch + kk + 16 * h + 8 * (lane >> 4)]);
#pragma unroll
        for (int i = 0; i < kFragsM; ++i)
#pragma unroll
          for (int j = 0; j < kFragsN; ++j)
            mma_bf16_16816(acc[i][j], af[i][0], af[i][1], af[i][2], af[i][3], b[j][2 * h], b[j][2 * h + 1]);
      }
    }
  }
  cp_async_wait<0>();

  // D fragments: rows g and g + 8 of each 16-row fragment, columns 2c, 2c + 1 of each n-tile (n is even).
  const int g = lane / 4, c = lane % 4;
#pragma unroll
  for (int i = 0; i < kFragsM; ++i)
#pragma unroll
    for (int j = 0; j < kFragsN; ++j) {
      const int out_col = n0 + wn * kWarpCols + 8 * j + 2 * c;
      if (out_col >= a.n) continue;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row0 + wm * kWarpRows + 16 * i + g + 8 * h;
        if (row < row_end)
          *reinterpret_cast<uint32_t*>(a.y + static_cast<int64_t>(row) * a.n + out_col) =
              pack_bf16(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
      }
    }
}

template <int kRows>
cudaError_t launch_grouped_linear(const GroupedGemmArgs& a, cudaStream_t stream) {
  constexpr int smem = grouped_smem_bytes<kRows>();
  // Above 48 KiB a kernel must opt in, on each device it runs on: set at every launch (not a stream operation).
  const cudaError_t opt_in =
      cudaFuncSetAttribute(grouped_linear_kernel<kRows>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (opt_in != cudaSuccess) return opt_in;
  grouped_linear_kernel<kRows><<<dim3((a.n + kTileN - 1) / kTileN, a.max_tiles), kGemmThreads, smem, stream>>>(a);
  return cudaGetLastError();
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
  if (tile_rows != 16 && tile_rows != 64 && tile_rows != 128)
    return refuse("group_experts: tile_rows " + std::to_string(tile_rows) + " (supported: 16, 64, 128)");
  const int max_tiles = (slots + tile_rows - 1) / tile_rows + num_experts;  // max_expert_tiles
  group_offsets_kernel<<<1, kGroupThreads, 0, stream>>>(groups, experts, slots, num_experts, tile_rows, max_tiles);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess || slots <= 0) return e;
  group_place_kernel<<<num_experts, kPlaceThreads, 0, stream>>>(groups, experts, slots, top_k);
  return cudaGetLastError();
}

cudaError_t grouped_linear(const GroupedGemmArgs& a, cudaStream_t stream) {
  if (a.k <= 0 || a.k % 8 != 0 || a.n <= 0 || a.n % 8 != 0 || !aligned16(a.x) || !aligned16(a.w))
    return refuse("grouped_linear: k " + std::to_string(a.k) + " and n " + std::to_string(a.n) +
                  " must be positive multiples of 8, x and w 16-byte aligned");
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
  switch (a.tile_rows) {
    case 16: return launch_grouped_linear<16>(a, stream);
    case 64: return launch_grouped_linear<64>(a, stream);
    case 128: return launch_grouped_linear<128>(a, stream);
    default: return refuse("grouped_linear: tile_rows " + std::to_string(a.tile_rows) + " (supported: 16, 64, 128)");
  }
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
