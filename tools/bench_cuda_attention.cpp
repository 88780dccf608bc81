// Decode-attention bandwidth on the GPU: the paged decode kernel at a Llama-3-8B shape (32 query heads, 8 KV heads,
// head_dim 128, block 16) over a batch of sequences with shuffled block tables, timed with CUDA events. Reports
// bytes moved (K and V of every context token once per KV head, plus queries, outputs and block tables) per second
// against the H200's measured 4.3 TB/s copy bandwidth; then the same over the FP8 cache (--kv-cache-dtype fp8: codes
// and per-token scales, kernels/cuda/kv_fp8.h), its bytes and its time per step beside bf16's.
// Usage: bench_cuda_attention [batch=64] [context=2048] [iterations=50]
// Built everywhere (bench_*.cpp always are); without the CUDA backend it says so and exits.
#include <cstdio>

#ifndef PAGED_HAVE_CUDA

int main() {
  std::puts("bench_cuda_attention: no CUDA (built without the CUDA backend)");
  return 0;
}

#else

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/kv_fp8.h"

namespace {

constexpr double kPeakBytesPerSecond = 4.3e12;  // measured device-to-device copy on the H200 (DEVICE.md)

#define BENCH_CHECK(expr)                                                                                \
  do {                                                                                                   \
    const cudaError_t bench_status = (expr);                                                             \
    if (bench_status != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s: %s\n", #expr, paged::cuda::describe_launch_error(bench_status).c_str()); \
      std::exit(1);                                                                                      \
    }                                                                                                    \
  } while (0)

template <typename T>
T* device_array(size_t n) {
  void* p = nullptr;
  BENCH_CHECK(cudaMalloc(&p, n * sizeof(T)));
  return static_cast<T*>(p);
}

// Fills a device bf16 array with values in [-1, 1): a 1 MiB random tile repeated (the kernel's speed does not depend
// on the values, only on them being finite).
void fill_random(paged::cuda::bf16* dst, size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<paged::cuda::bf16> tile(size_t{1} << 19);
  for (auto& x : tile) x = __float2bfloat16(u(rng));
  for (size_t at = 0; at < n; at += tile.size())
    BENCH_CHECK(cudaMemcpy(dst + at, tile.data(), std::min(tile.size(), n - at) * sizeof(tile[0]),
                           cudaMemcpyHostToDevice));
}

}  // namespace

int main(int argc, char** argv) {
  using paged::cuda::bf16;
  const int batch = argc > 1 ? std::atoi(argv[1]) : 64;
  const int context = argc > 2 ? std::atoi(argv[2]) : 2048;
  const int iterations = argc > 3 ? std::atoi(argv[3]) : 50;
  const int heads = 32, kv_heads = 8, head_dim = 128, block_size = 16;
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    std::puts("bench_cuda_attention: no CUDA device");
    return 0;
  }
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));

  const int blocks_per_seq = (context + block_size - 1) / block_size;
  const int num_blocks = batch * blocks_per_seq;
  const size_t cache_elems = static_cast<size_t>(num_blocks) * kv_heads * block_size * head_dim;
  std::mt19937 rng(1234);
  std::vector<int32_t> tables(num_blocks);
  std::iota(tables.begin(), tables.end(), 0);
  std::shuffle(tables.begin(), tables.end(), rng);  // sequences' blocks scattered over the pool, as in serving
  const std::vector<int32_t> context_lens(batch, context);

  bf16* k = device_array<bf16>(cache_elems);
  bf16* v = device_array<bf16>(cache_elems);
  bf16* q = device_array<bf16>(static_cast<size_t>(batch) * heads * head_dim);
  bf16* out = device_array<bf16>(static_cast<size_t>(batch) * heads * head_dim);
  int32_t* d_tables = device_array<int32_t>(tables.size());
  int32_t* d_lens = device_array<int32_t>(context_lens.size());
  fill_random(k, cache_elems, rng);
  fill_random(v, cache_elems, rng);
  fill_random(q, static_cast<size_t>(batch) * heads * head_dim, rng);
  BENCH_CHECK(cudaMemcpy(d_tables, tables.data(), tables.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  BENCH_CHECK(cudaMemcpy(d_lens, context_lens.data(), context_lens.size() * sizeof(int32_t), cudaMemcpyHostToDevice));

  // The FP8 cache: every code 0x38 (1.0) and every scale 0x38383838 (4.4e-5): the kernel's time does not depend on
  // the values.
  const size_t fp8_bytes = paged::cuda::kv_fp8_block_bytes(kv_heads, block_size, head_dim) * num_blocks;
  uint8_t* k8 = device_array<uint8_t>(fp8_bytes);
  uint8_t* v8 = device_array<uint8_t>(fp8_bytes);
  BENCH_CHECK(cudaMemset(k8, 0x38, fp8_bytes));
  BENCH_CHECK(cudaMemset(v8, 0x38, fp8_bytes));

  paged::cuda::PagedAttentionArgs args{
      .out = out, .q = q, .q_stride = static_cast<int64_t>(heads) * head_dim, .k_cache = k, .v_cache = v,
      .block_tables = d_tables, .query_start = nullptr, .context_lens = d_lens, .num_seqs = batch,
      .max_blocks_per_seq = blocks_per_seq, .num_heads = heads, .num_kv_heads = kv_heads, .head_dim = head_dim,
      .block_size = block_size, .scale = 0.08838834764831845f};

  const double kv_bytes = 2.0 * batch * context * kv_heads * head_dim * sizeof(bf16);
  const double other_bytes = 2.0 * batch * heads * head_dim * sizeof(bf16) + tables.size() * sizeof(int32_t);
  std::printf("decode attention on %s (%d SMs): batch %d x context %d, %d heads / %d KV heads, head_dim %d, "
              "block %d; K+V %.1f MB\n",
              prop.name, prop.multiProcessorCount, batch, context, heads, kv_heads, head_dim, block_size,
              kv_bytes / 1e6);
  cudaEvent_t start, stop;
  BENCH_CHECK(cudaEventCreate(&start));
  BENCH_CHECK(cudaEventCreate(&stop));
  double best_fraction = 0.0, best_us[2] = {1e30, 1e30};
  for (const bool fp8 : {false, true}) {
    for (const int partition : {128, 256, 512}) {
      args.k_fp8 = fp8 ? k8 : nullptr;
      args.v_fp8 = fp8 ? v8 : nullptr;
      const size_t ws_bytes =
          paged::cuda::paged_attention_decode_workspace(batch, heads, head_dim, context, partition);
      void* ws = ws_bytes ? device_array<char>(ws_bytes) : nullptr;
      for (int i = 0; i < 5; ++i)
        BENCH_CHECK(paged::cuda::paged_attention_decode(args, context, partition, ws, ws_bytes, nullptr));
      BENCH_CHECK(cudaEventRecord(start));
      for (int i = 0; i < iterations; ++i)
        BENCH_CHECK(paged::cuda::paged_attention_decode(args, context, partition, ws, ws_bytes, nullptr));
      BENCH_CHECK(cudaEventRecord(stop));
      BENCH_CHECK(cudaEventSynchronize(stop));
      float ms = 0.f;
      BENCH_CHECK(cudaEventElapsedTime(&ms, start, stop));
      const double seconds = ms / 1e3 / iterations;
      // Partial results of a split context are written and read back once more: counted as moved bytes too.
      const double bytes = (fp8 ? 2.0 * fp8_bytes * context / (blocks_per_seq * block_size) : kv_bytes) +
                           other_bytes + 2.0 * ws_bytes;
      const double fraction = bytes / seconds / kPeakBytesPerSecond;
      if (!fp8) best_fraction = std::max(best_fraction, fraction);
      best_us[fp8] = std::min(best_us[fp8], seconds * 1e6);
      std::printf("  %s partition %3d: %8.1f us  %6.2f TB/s  %5.1f%% of 4.3 TB/s\n", fp8 ? "FP8 " : "bf16", partition,
                  seconds * 1e6, bytes / seconds / 1e12, 100.0 * fraction);
      if (ws) BENCH_CHECK(cudaFree(ws));
    }
  }
  std::printf("RESULT decode_attention_bandwidth_fraction %.3f (target >= 0.70); FP8 cache %.1f us vs bf16 %.1f us "
              "(%.2fx)\n", best_fraction, best_us[1], best_us[0], best_us[0] / best_us[1]);
  cudaFree(k8);
  cudaFree(v8);
  cudaFree(k);
  cudaFree(v);
  cudaFree(q);
  cudaFree(out);
  cudaFree(d_tables);
  cudaFree(d_lens);
  return 0;
}

#endif
