// copy_blocks against cpu::copy_blocks, and swap_blocks round trips through pinned host memory on a copy stream.
#include <cstring>
#include <numeric>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/cache_ops.h"
#include "tests/kernels/cuda/gpu_test_util.h"

using namespace paged;
using namespace paged::gpu_test;

namespace {

constexpr int kCaches = 6;  // 3 layers x (K, V)

// Block `index` of cache `cache` of a [caches][blocks][block_elems] host array.
std::vector<float> host_block(const std::vector<float>& pool, int blocks, int64_t block_elems, int cache, int index) {
  const auto begin = pool.begin() + (static_cast<int64_t>(cache) * blocks + index) * block_elems;
  return {begin, begin + block_elems};
}

}  // namespace

TEST_CASE("copy_blocks matches the CPU twin in every cache", "[gpu][cache]") {
  require_device();
  std::mt19937 rng(7);
  const int blocks = 40;
  const int64_t block_elems = 4 * 16 * 64;  // kv_heads * block_size * head_dim
  auto pool = random_bf16_values(rng, static_cast<size_t>(kCaches) * blocks * block_elems);
  // Sources 0..9 copied to distinct destinations among 10..39 (no destination is also a source).
  std::vector<int32_t> dst(30);
  std::iota(dst.begin(), dst.end(), 10);
  std::shuffle(dst.begin(), dst.end(), rng);
  std::vector<std::pair<int32_t, int32_t>> pairs;
  for (int i = 0; i < 12; ++i) pairs.emplace_back(i % 10, dst[i]);
  std::vector<int32_t> flat;
  for (auto [s, d] : pairs) {
    flat.push_back(s);
    flat.push_back(d);
  }
  auto ref = pool;
  for (int c = 0; c < kCaches; ++c)
    cpu::copy_blocks(ref.data() + static_cast<int64_t>(c) * blocks * block_elems, pairs, block_elems);

  DeviceArray<bf16> d_pool(to_bf16(pool));
  DeviceArray<int32_t> d_pairs(flat);
  const cuda::BlockPool bp{d_pool.get(), kCaches, blocks, block_elems * sizeof(bf16)};
  CUDA_REQUIRE(cuda::copy_blocks(bp, d_pairs.get(), static_cast<int>(pairs.size()), nullptr));
  REQUIRE(to_float(d_pool.download()) == ref);
}

TEST_CASE("swap_blocks moves blocks to pinned memory and back, completing by event", "[gpu][cache]") {
  require_device();
  std::mt19937 rng(8);
  const int dev_blocks = 40, host_blocks = 25;
  const int64_t block_elems = 2 * 8 * 128;
  const size_t block_bytes = block_elems * sizeof(bf16);
  const auto pool = random_bf16_values(rng, static_cast<size_t>(kCaches) * dev_blocks * block_elems);
  DeviceArray<bf16> d_pool(to_bf16(pool));
  void* host = nullptr;
  CUDA_REQUIRE(cudaMallocHost(&host, kCaches * host_blocks * block_bytes));
  std::memset(host, 0, kCaches * host_blocks * block_bytes);
  cudaStream_t compute = nullptr, copy = nullptr;
  cudaEvent_t ready = nullptr, done = nullptr;
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  CUDA_REQUIRE(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking));
  CUDA_REQUIRE(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  CUDA_REQUIRE(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  const cuda::BlockPool device_pool{d_pool.get(), kCaches, dev_blocks, block_bytes};
  const cuda::BlockPool host_pool{host, kCaches, host_blocks, block_bytes};

  // A copy-on-write on the compute stream (block 3 -> block 30) that the swap-out must see: it waits for `ready`.
  DeviceArray<int32_t> cow(std::vector<int32_t>{3, 30});
  CUDA_REQUIRE(cuda::copy_blocks(device_pool, cow.get(), 1, compute));
  CUDA_REQUIRE(cudaEventRecord(ready, compute));

  // Out: a run of consecutive blocks (merged into one copy), scattered ones, and the block just written.
  const std::vector<std::pair<int32_t, int32_t>> out = {{5, 0}, {6, 1}, {7, 2}, {20, 10}, {2, 24}, {30, 11}};
  CUDA_REQUIRE(cuda::swap_blocks(device_pool, host_pool, out, copy, ready, done));
  CUDA_REQUIRE(cudaEventSynchronize(done));
  const auto* host_bf16 = static_cast<const bf16*>(host);
  for (auto [src, dst] : out)
    for (int c = 0; c < kCaches; ++c) {
      const int from = src == 30 ? 3 : src;  // block 30 holds block 3's data after the copy-on-write
      const auto want = host_block(pool, dev_blocks, block_elems, c, from);
      for (int64_t e = 0; e < block_elems; ++e)
        REQUIRE(__bfloat162float(host_bf16[(static_cast<int64_t>(c) * host_blocks + dst) * block_elems + e]) ==
                want[e]);
    }

  // In: back to other device blocks, then a kernel on the compute stream after waiting for `done` reads them.
  const std::vector<std::pair<int32_t, int32_t>> in = {{0, 35}, {1, 36}, {2, 37}, {10, 38}, {11, 39}};
  CUDA_REQUIRE(cuda::swap_blocks(host_pool, device_pool, in, copy, nullptr, done));
  CUDA_REQUIRE(cudaStreamWaitEvent(compute, done, 0));
  DeviceArray<int32_t> after(std::vector<int32_t>{35, 33});  // copies swapped-in block 35 onward: ordered by done
  CUDA_REQUIRE(cuda::copy_blocks(device_pool, after.get(), 1, compute));
  CUDA_REQUIRE(cudaStreamSynchronize(compute));
  const auto result = to_float(d_pool.download());
  const std::vector<std::pair<int, int>> expect = {{35, 5}, {36, 6}, {37, 7}, {38, 20}, {39, 3}, {33, 5}};
  for (auto [block, origin] : expect)
    for (int c = 0; c < kCaches; ++c)
      REQUIRE(host_block(result, dev_blocks, block_elems, c, block) ==
              host_block(pool, dev_blocks, block_elems, c, origin));

  cudaEventDestroy(ready);
  cudaEventDestroy(done);
  cudaStreamDestroy(compute);
  cudaStreamDestroy(copy);
  cudaFreeHost(host);
}
