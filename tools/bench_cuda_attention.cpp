// Paged attention on the GPU at a Llama-3-8B shape (32 query heads, 8 KV heads, head_dim 128, block 16) over
// sequences with shuffled block tables, timed with CUDA events, bf16 cache and FP8 cache (--kv-cache-dtype fp8:
// codes and per-token scales, kernels/cuda/kv_fp8.h) side by side.
//
//   bench_cuda_attention [batch=64] [context=2048] [iterations=50]
//       Decode: bytes moved (K and V of every context token once per KV head, plus queries, outputs and block
//       tables) per second against the H200's measured 4.3 TB/s copy bandwidth, per partition size.
//   bench_cuda_attention prefill [seqs=8] [queries=2048] [prefix=0] [iterations=20]
//       Prefill: `seqs` sequences of `queries` new tokens each after `prefix` cached ones (a chunk of a longer
//       prompt when prefix > 0), causal. Reports the FLOP/s of the scores and P.V products of the visible
//       (query, key) pairs (4 x head_dim per pair and query head) against the H200's measured 790 TFLOP/s bf16.
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
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/kv_fp8.h"

namespace {

constexpr double kPeakBytesPerSecond = 4.3e12;  // measured device-to-device copy on the H200 (DEVICE.md)
constexpr double kPeakFlopPerSecond = 790e12;   // measured bf16 GEMM on the H200 (DEVICE.md)
constexpr int kHeads = 32, kKvHeads = 8, kHeadDim = 128, kBlockSize = 16;

#define BENCH_CHECK(expr)                                                                                \
  do {                                                                                                   \
    const cudaError_t bench_status = (expr);                                                             \
    if (bench_status != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s: %s\n", #expr, paged::cuda::describe_launch_error(bench_status).c_str()); \
      std::exit(1);                                                                                      \
    }                                                                                                    \
  } while (0)

using paged::cuda::bf16;

// A device allocation of n T, freed with the owner.
template <typename T>
struct DeviceArray {
  T* p = nullptr;
  explicit DeviceArray(size_t n) {
    BENCH_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(n, 1) * sizeof(T)));
  }
  ~DeviceArray() { cudaFree(p); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
};

// Fills a device bf16 array with values in [-1, 1): a 1 MiB random tile repeated (the kernels' speed does not depend
// on the values, only on them being finite).
void fill_random(bf16* dst, size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<bf16> tile(size_t{1} << 19);
  for (auto& x : tile) x = __float2bfloat16(u(rng));
  for (size_t at = 0; at < n; at += tile.size())
    BENCH_CHECK(cudaMemcpy(dst + at, tile.data(), std::min(tile.size(), n - at) * sizeof(tile[0]),
                           cudaMemcpyHostToDevice));
}

template <typename T>
void upload(T* dst, const std::vector<T>& src) {
  BENCH_CHECK(cudaMemcpy(dst, src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice));
}

// `seqs` sequences of `context` tokens each over a paged cache whose blocks are shuffled over the pool (as in
// serving), bf16 and FP8, with `queries` query rows of q_stride elements in all; args point into it (bf16 cache).
struct Batch {
  int blocks_per_seq, num_blocks;
  size_t cache_elems, fp8_bytes;
  DeviceArray<bf16> k, v, q, out;
  DeviceArray<uint8_t> k8, v8;
  DeviceArray<int32_t> tables, query_start, context_lens;
  paged::cuda::PagedAttentionArgs args;

  Batch(int seqs, int context, int64_t queries, int64_t q_stride, const std::vector<int32_t>& starts)
      : blocks_per_seq((context + kBlockSize - 1) / kBlockSize),
        num_blocks(seqs * blocks_per_seq),
        cache_elems(static_cast<size_t>(num_blocks) * kKvHeads * kBlockSize * kHeadDim),
        fp8_bytes(paged::cuda::kv_fp8_block_bytes(kKvHeads, kBlockSize, kHeadDim) * num_blocks),
        k(cache_elems), v(cache_elems), q(queries * q_stride), out(queries * kHeads * kHeadDim),
        k8(fp8_bytes), v8(fp8_bytes), tables(num_blocks), query_start(starts.size()), context_lens(seqs) {
    std::mt19937 rng(1234);
    std::vector<int32_t> table(num_blocks);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    upload(tables.p, table);
    upload(context_lens.p, std::vector<int32_t>(seqs, context));
    if (!starts.empty()) upload(query_start.p, starts);
    fill_random(k.p, cache_elems, rng);
    fill_random(v.p, cache_elems, rng);
    fill_random(q.p, queries * q_stride, rng);
    // The FP8 cache: every code 0x38 (1.0) and every scale 0x38383838 (4.4e-5).
    BENCH_CHECK(cudaMemset(k8.p, 0x38, fp8_bytes));
    BENCH_CHECK(cudaMemset(v8.p, 0x38, fp8_bytes));
    args = {.out = out.p, .q = q.p, .q_stride = q_stride, .k_cache = k.p, .v_cache = v.p,
            .block_tables = tables.p, .query_start = starts.empty() ? nullptr : query_start.p,
            .context_lens = context_lens.p, .num_seqs = seqs, .max_blocks_per_seq = blocks_per_seq,
            .num_heads = kHeads, .num_kv_heads = kKvHeads, .head_dim = kHeadDim, .block_size = kBlockSize,
            .scale = 0.08838834764831845f};
  }
  // Reads the FP8 cache (fp8) or the bf16 one.
  void use_fp8(bool fp8) {
    args.k_fp8 = fp8 ? k8.p : nullptr;
    args.v_fp8 = fp8 ? v8.p : nullptr;
  }
};

// Milliseconds per call of `launch` over `iterations` calls, after 3 warm-up calls.
template <typename Launch>
double time_ms(int iterations, Launch&& launch) {
  for (int i = 0; i < 3; ++i) BENCH_CHECK(launch());
  cudaEvent_t start, stop;
  BENCH_CHECK(cudaEventCreate(&start));
  BENCH_CHECK(cudaEventCreate(&stop));
  BENCH_CHECK(cudaEventRecord(start));
  for (int i = 0; i < iterations; ++i) BENCH_CHECK(launch());
  BENCH_CHECK(cudaEventRecord(stop));
  BENCH_CHECK(cudaEventSynchronize(stop));
  float ms = 0.f;
  BENCH_CHECK(cudaEventElapsedTime(&ms, start, stop));
  BENCH_CHECK(cudaEventDestroy(start));
  BENCH_CHECK(cudaEventDestroy(stop));
  return ms / iterations;
}

int run_decode(int batch, int context, int iterations, const cudaDeviceProp& prop) {
  Batch b(batch, context, batch, int64_t{kHeads} * kHeadDim, {});
  const double kv_bytes = 2.0 * batch * context * kKvHeads * kHeadDim * sizeof(bf16);
  const double other_bytes = 2.0 * batch * kHeads * kHeadDim * sizeof(bf16) + b.num_blocks * sizeof(int32_t);
  std::printf("decode attention on %s (%d SMs): batch %d x context %d, %d heads / %d KV heads, head_dim %d, "
              "block %d; K+V %.1f MB\n",
              prop.name, prop.multiProcessorCount, batch, context, kHeads, kKvHeads, kHeadDim, kBlockSize,
              kv_bytes / 1e6);
  double best_fraction = 0.0, best_us[2] = {1e30, 1e30};
  for (const bool fp8 : {false, true}) {
    b.use_fp8(fp8);
    for (int partition = 128; partition <= paged::cuda::kMaxDecodePartition && partition < 2 * context;
         partition *= 2) {
      const size_t ws_bytes =
          paged::cuda::paged_attention_decode_workspace(batch, kHeads, kHeadDim, context, partition);
      DeviceArray<char> ws(ws_bytes);
      const double seconds = time_ms(iterations, [&] {
        return paged::cuda::paged_attention_decode(b.args, context, partition, ws.p, ws_bytes, nullptr);
      }) / 1e3;
      // Partial results of a split context are written and read back once more: counted as moved bytes too.
      const double bytes = (fp8 ? 2.0 * b.fp8_bytes * context / (b.blocks_per_seq * kBlockSize) : kv_bytes) +
                           other_bytes + 2.0 * ws_bytes;
      const double fraction = bytes / seconds / kPeakBytesPerSecond;
      if (!fp8) best_fraction = std::max(best_fraction, fraction);
      best_us[fp8] = std::min(best_us[fp8], seconds * 1e6);
      std::printf("  %s partition %4d: %8.1f us  %6.2f TB/s  %5.1f%% of 4.3 TB/s\n", fp8 ? "FP8 " : "bf16",
                  partition, seconds * 1e6, bytes / seconds / 1e12, 100.0 * fraction);
    }
  }
  std::printf("RESULT decode_attention_bandwidth_fraction %.3f (target >= 0.70); FP8 cache %.1f us vs bf16 %.1f us "
              "(%.2fx)\n", best_fraction, best_us[1], best_us[0], best_us[0] / best_us[1]);
  return 0;
}

int run_prefill(int seqs, int queries, int prefix, int iterations, const cudaDeviceProp& prop) {
  std::vector<int32_t> starts(seqs + 1);
  for (int s = 0; s <= seqs; ++s) starts[s] = s * queries;
  // The queries are read from fused QKV rows, as the runner passes them.
  Batch b(seqs, prefix + queries, int64_t{seqs} * queries, int64_t{kHeads + 2 * kKvHeads} * kHeadDim, starts);
  // Visible (query, key) pairs: query i (from 0) of a sequence sees prefix + i + 1 keys.
  const double pairs = double(seqs) * (double(queries) * prefix + double(queries) * (queries + 1) / 2.0);
  const double flop = 4.0 * kHeadDim * kHeads * pairs;
  std::printf("prefill attention on %s (%d SMs): %d sequences x %d queries after a prefix of %d, %d heads / %d KV "
              "heads, head_dim %d, block %d\n",
              prop.name, prop.multiProcessorCount, seqs, queries, prefix, kHeads, kKvHeads, kHeadDim, kBlockSize);
  double us[2] = {0, 0};
  for (const bool fp8 : {false, true}) {
    b.use_fp8(fp8);
    us[fp8] = 1e3 * time_ms(iterations, [&] { return paged::cuda::paged_attention_prefill(b.args, queries, nullptr); });
    std::printf("  %s cache: %10.1f us  %7.1f TFLOP/s  %5.1f%% of 790\n", fp8 ? "FP8 " : "bf16", us[fp8],
                flop / us[fp8] / 1e6, 100.0 * flop / (us[fp8] / 1e6) / kPeakFlopPerSecond);
  }
  std::printf("RESULT prefill_attention %dx%d+%d bf16 %.1f us (%.1f TFLOP/s), FP8 cache %.1f us\n", seqs, queries,
              prefix, us[0], flop / us[0] / 1e6, us[1]);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int device_count = 0;
  if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0) {
    std::puts("bench_cuda_attention: no CUDA device");
    return 0;
  }
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  const auto arg = [&](int i, int fallback) { return argc > i ? std::atoi(argv[i]) : fallback; };
  if (argc > 1 && std::string(argv[1]) == "prefill")
    return run_prefill(arg(2, 8), arg(3, 2048), arg(4, 0), arg(5, 20), prop);
  return run_decode(arg(1, 64), arg(2, 2048), arg(3, 50), prop);
}

#endif
