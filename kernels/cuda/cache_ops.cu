#include "kernels/cuda/cache_ops.h"

#include <string>

#include "kernels/cuda/device_utils.cuh"

namespace paged::cuda {

namespace {

constexpr int kCopyThreads = 256;

// grid: (num_pairs, num_caches); block: kCopyThreads. Block (p, c) copies one block of cache c in 16-byte words.
__global__ void __launch_bounds__(kCopyThreads)
    copy_blocks_kernel(char* __restrict__ base,             // [num_caches][num_blocks][block_bytes]
                       const int32_t* __restrict__ pairs,   // [num_pairs][2]
                       int num_blocks, int64_t block_bytes) {
  const int32_t src = pairs[2 * blockIdx.x], dst = pairs[2 * blockIdx.x + 1];
  const int64_t cache = static_cast<int64_t>(blockIdx.y) * num_blocks;
  const uint4* from = reinterpret_cast<const uint4*>(base + (cache + src) * block_bytes);
  uint4* to = reinterpret_cast<uint4*>(base + (cache + dst) * block_bytes);
  for (int64_t i = threadIdx.x; i < block_bytes / 16; i += blockDim.x) to[i] = from[i];
}

}  // namespace

cudaError_t copy_blocks(const BlockPool& pool, const int32_t* pairs, int num_pairs, cudaStream_t stream) {
  if (pool.block_bytes % 16 != 0 || reinterpret_cast<uintptr_t>(pool.base) % 16 != 0)
    return launch_failure(cudaErrorInvalidValue, "copy_blocks: block_bytes and the pool base must be 16-byte aligned");
  if (num_pairs <= 0 || pool.num_caches <= 0) return cudaSuccess;
  copy_blocks_kernel<<<dim3(num_pairs, pool.num_caches), kCopyThreads, 0, stream>>>(
      static_cast<char*>(pool.base), pairs, pool.num_blocks, static_cast<int64_t>(pool.block_bytes));
  return cudaGetLastError();
}

cudaError_t swap_blocks(const BlockPool& from, const BlockPool& to, const std::vector<std::pair<int32_t, int32_t>>& pairs,
                        cudaStream_t copy_stream, cudaEvent_t ready, cudaEvent_t done) {
  if (from.num_caches != to.num_caches || from.block_bytes != to.block_bytes)
    return launch_failure(cudaErrorInvalidValue, "swap_blocks: pools differ in num_caches or block_bytes");
  for (const auto& [src, dst] : pairs)
    if (src < 0 || src >= from.num_blocks || dst < 0 || dst >= to.num_blocks)
      return launch_failure(cudaErrorInvalidValue, "swap_blocks: pair (" + std::to_string(src) + ", " +
                                                       std::to_string(dst) + ") outside the pools");
  if (ready != nullptr)
    if (cudaError_t e = cudaStreamWaitEvent(copy_stream, ready, 0); e != cudaSuccess) return e;
  // One 2D copy per run of consecutive pairs: `run` blocks wide, one row per cache, each pool's row pitch being a
  // whole cache. A swap of a sequence's blocks usually has such runs, and fewer, larger copies keep the copy engine
  // busy instead of waiting on per-call overhead. A pitch beyond the device's limit (2 GiB on current GPUs: a large
  // pool with few layers) falls back to one copy per cache.
  int device = 0, max_pitch = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (cudaError_t e = cudaDeviceGetAttribute(&max_pitch, cudaDevAttrMaxPitch, device); e != cudaSuccess) return e;
  const size_t from_pitch = from.num_blocks * from.block_bytes, to_pitch = to.num_blocks * to.block_bytes;
  const bool two_d = from_pitch <= static_cast<size_t>(max_pitch) && to_pitch <= static_cast<size_t>(max_pitch);
  for (size_t i = 0; i < pairs.size();) {
    size_t run = 1;
    while (i + run < pairs.size() && pairs[i + run].first == pairs[i].first + static_cast<int32_t>(run) &&
           pairs[i + run].second == pairs[i].second + static_cast<int32_t>(run))
      ++run;
    const size_t width = run * from.block_bytes;
    if (two_d) {
      const cudaError_t e = cudaMemcpy2DAsync(to.block(0, pairs[i].second), to_pitch, from.block(0, pairs[i].first),
                                              from_pitch, width, from.num_caches, cudaMemcpyDefault, copy_stream);
      if (e != cudaSuccess) return e;
    } else {
      for (int c = 0; c < from.num_caches; ++c) {
        const cudaError_t e = cudaMemcpyAsync(to.block(c, pairs[i].second), from.block(c, pairs[i].first), width,
                                              cudaMemcpyDefault, copy_stream);
        if (e != cudaSuccess) return e;
      }
    }
    i += run;
  }
  return cudaEventRecord(done, copy_stream);
}

}  // namespace paged::cuda
