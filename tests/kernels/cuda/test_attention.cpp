// Paged-attention decode and prefill against cpu::paged_attention: block sizes 8/16/32, head dims 64/128, GQA
// groups 1/4/8 (and 3, 7, 12, 16), ragged lengths, shuffled block tables whose unused entries are -1,
// queries read from a fused QKV row, sliding windows (1, 32, 100, 700: inside one partition or tile, across
// several, beyond the context).
#include <numeric>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention.h"
#include "tests/kernels/cuda/gpu_test_util.h"

using namespace paged;
using namespace paged::gpu_test;

namespace {

struct Shape {
  int head_dim, block_size, heads, kv_heads;
};

// A batch of sequences over a shuffled paged cache, on host and device.
struct PagedBatch {
  Shape shape;
  std::vector<int32_t> context_lens, query_start, tables;
  int max_blocks_per_seq = 0, num_blocks = 0, total_q = 0;
  int64_t q_stride = 0;
  std::vector<float> q_fused;  // [total_q][q_stride]: q heads, then room for k and v as in the QKV buffer
  std::vector<float> q_dense;  // [total_q][heads][head_dim]: what the CPU twin takes
  std::vector<float> k_cache, v_cache;

  PagedBatch(std::mt19937& rng, Shape s, const std::vector<int>& ctx, const std::vector<int>& q_len,
             float q_scale)
      : shape(s), context_lens(ctx.begin(), ctx.end()) {
    const int n = static_cast<int>(ctx.size());
    query_start.assign(n + 1, 0);
    for (int i = 0; i < n; ++i) query_start[i + 1] = query_start[i] + q_len[i];
    total_q = query_start[n];
    int needed = 0;
    for (int c : ctx) {
      const int blocks = (c + s.block_size - 1) / s.block_size;
      max_blocks_per_seq = std::max(max_blocks_per_seq, blocks);
      needed += blocks;
    }
    max_blocks_per_seq += 2;  // slack entries stay -1: a kernel that reads past the context faults or fails
    num_blocks = needed + 5;
    std::vector<int32_t> physical(num_blocks);
    std::iota(physical.begin(), physical.end(), 0);
    std::shuffle(physical.begin(), physical.end(), rng);
    tables.assign(static_cast<size_t>(n) * max_blocks_per_seq, -1);
    int next = 0;
    for (int i = 0; i < n; ++i)
      for (int b = 0; b < (ctx[i] + s.block_size - 1) / s.block_size; ++b)
        tables[static_cast<size_t>(i) * max_blocks_per_seq + b] = physical[next++];
    const size_t cache_elems = static_cast<size_t>(num_blocks) * s.kv_heads * s.block_size * s.head_dim;
    k_cache = random_bf16_values(rng, cache_elems);
    v_cache = random_bf16_values(rng, cache_elems);
    q_stride = static_cast<int64_t>(s.heads + 2 * s.kv_heads) * s.head_dim;
    q_fused = random_bf16_values(rng, total_q * q_stride, q_scale);
    q_dense.resize(static_cast<size_t>(total_q) * s.heads * s.head_dim);
    for (int t = 0; t < total_q; ++t)
      std::copy(&q_fused[t * q_stride], &q_fused[t * q_stride] + s.heads * s.head_dim,
                &q_dense[static_cast<size_t>(t) * s.heads * s.head_dim]);
  }

  std::vector<float> reference(int window = 0) const {
    std::vector<float> out(q_dense.size());
    cpu::paged_attention(out.data(), q_dense.data(), k_cache.data(), v_cache.data(), tables.data(),
                         query_start.data(), context_lens.data(), static_cast<int>(context_lens.size()),
                         max_blocks_per_seq, shape.heads, shape.kv_heads, shape.head_dim, shape.block_size,
                         scale(), window);
    return out;
  }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(shape.head_dim)); }
};

// The batch on the device, and the args struct pointing into it.
struct DeviceBatch {
  DeviceArray<bf16> q, k, v, out;
  DeviceArray<int32_t> tables, query_start, context_lens;
  cuda::PagedAttentionArgs args;

  explicit DeviceBatch(const PagedBatch& b)
      : q(to_bf16(b.q_fused)), k(to_bf16(b.k_cache)), v(to_bf16(b.v_cache)), out(b.q_dense.size()),
        tables(b.tables), query_start(b.query_start), context_lens(b.context_lens) {
    args.out = out.get();
    args.q = q.get();
    args.q_stride = b.q_stride;
    args.k_cache = k.get();
    args.v_cache = v.get();
    args.block_tables = tables.get();
    args.query_start = query_start.get();
    args.context_lens = context_lens.get();
    args.num_seqs = static_cast<int>(b.context_lens.size());
    args.max_blocks_per_seq = b.max_blocks_per_seq;
    args.num_heads = b.shape.heads;
    args.num_kv_heads = b.shape.kv_heads;
    args.head_dim = b.shape.head_dim;
    args.block_size = b.shape.block_size;
    args.scale = b.scale();
  }
};

std::vector<Shape> shapes() {
  std::vector<Shape> out;
  for (int head_dim : {64, 128})
    for (int block_size : {8, 16, 32})
      for (int group : {1, 4, 8}) out.push_back({head_dim, block_size, 2 * group, 2});
  out.push_back({128, 16, 14, 2});  // group 7 (Qwen2-0.5B's 14 heads over 2 KV heads)
  out.push_back({64, 16, 6, 2});    // group 3
  out.push_back({128, 8, 32, 2});   // group 16: the decode kernel's second row block
  out.push_back({64, 32, 24, 2});   // group 12
  return out;
}

std::string describe(const Shape& s) {
  return "head_dim " + std::to_string(s.head_dim) + ", block " + std::to_string(s.block_size) + ", heads " +
         std::to_string(s.heads) + "/" + std::to_string(s.kv_heads);
}

}  // namespace

TEST_CASE("paged_attention_decode matches the CPU twin", "[gpu][attention]") {
  require_device();
  std::mt19937 rng(5);
  for (const Shape& shape : shapes()) {
    // Ragged contexts around block and partition edges, plus random ones.
    std::vector<int> ctx = {1, 7, 16, 17, 64, 65, 511, 512, 513};
    if (!quick_mode()) ctx.push_back(1100);
    std::uniform_int_distribution<int> len(1, quick_mode() ? 700 : 1500);
    for (int i = 0; i < 4; ++i) ctx.push_back(len(rng));
    std::shuffle(ctx.begin(), ctx.end(), rng);
    const std::vector<int> q_len(ctx.size(), 1);
    for (const float q_scale : {1.0f, 4.0f}) {  // 4: peaked softmax, where the partition merge matters most
      const PagedBatch batch(rng, shape, ctx, q_len, q_scale);
      const auto ref = batch.reference();
      DeviceBatch dev(batch);
      const int max_ctx = *std::max_element(ctx.begin(), ctx.end());
      // 512: the default; 64: many partitions per sequence; a max_context_len above the real one: what a CUDA
      // graph captured for longer contexts replays with.
      for (const auto& [partition, max_len] : {std::pair{512, max_ctx}, std::pair{64, max_ctx}, std::pair{512, 4000}}) {
        INFO(describe(shape) << ", partition " << partition << ", max_context_len " << max_len << ", q scale "
                             << q_scale);
        const size_t ws_bytes = cuda::paged_attention_decode_workspace(batch.total_q, shape.heads, shape.head_dim,
                                                                       max_len, partition);
        DeviceArray<char> ws(ws_bytes);
        CUDA_REQUIRE(cudaMemset(dev.out.get(), 0xff, dev.out.size() * sizeof(bf16)));  // NaN: unwritten shows
        CUDA_REQUIRE(cuda::paged_attention_decode(dev.args, max_len, partition, ws.get(), ws_bytes, nullptr));
        check_close(to_float(dev.out.download()), ref, "decode");
      }
    }
  }
}

TEST_CASE("paged_attention_prefill matches the CPU twin: prefill, cached prefix, chunks, decode rows",
          "[gpu][attention]") {
  require_device();
  std::mt19937 rng(6);
  for (const Shape& shape : shapes()) {
    // (context, queries): whole prompts, a cached prefix with a new chunk, single decode tokens, odd sizes.
    std::vector<std::pair<int, int>> seqs = {{1, 1}, {5, 5}, {33, 33}, {100, 37}, {300, 1}, {64, 64}, {257, 200},
                                             {18, 3}, {129, 128}, {40, 1}};
    std::shuffle(seqs.begin(), seqs.end(), rng);
    std::vector<int> ctx, q_len;
    for (auto [c, q] : seqs) {
      ctx.push_back(c);
      q_len.push_back(q);
    }
    const PagedBatch batch(rng, shape, ctx, q_len, 2.0f);
    const auto ref = batch.reference();
    DeviceBatch dev(batch);
    INFO(describe(shape));
    CUDA_REQUIRE(cudaMemset(dev.out.get(), 0xff, dev.out.size() * sizeof(bf16)));
    const int max_q = *std::max_element(q_len.begin(), q_len.end());
    CUDA_REQUIRE(cuda::paged_attention_prefill(dev.args, max_q, nullptr));
    check_close(to_float(dev.out.download()), ref, "prefill");
  }
}

TEST_CASE("decode and prefill with a sliding window match the CPU twin", "[gpu][attention]") {
  require_device();
  std::mt19937 rng(8);
  for (const Shape& shape : {Shape{128, 16, 32, 8}, Shape{64, 8, 8, 2}, Shape{128, 32, 28, 4}})
    for (const int window : {1, 32, 100, 700}) {
      INFO(describe(shape) << ", window " << window);
      // Decode: contexts below, at and far beyond the window, over partitions of 64 (many skipped) and 512.
      const std::vector<int> ctx = {1, 31, 32, 33, 99, 100, 101, 640, 1500, 2049};
      const PagedBatch decode(rng, shape, ctx, std::vector<int>(ctx.size(), 1), 4.0f);
      const auto decode_ref = decode.reference(window);
      DeviceBatch dev(decode);
      dev.args.window = window;
      for (const int partition : {64, 512}) {
        const size_t ws_bytes = cuda::paged_attention_decode_workspace(decode.total_q, shape.heads, shape.head_dim,
                                                                       4096, partition);
        DeviceArray<char> ws(ws_bytes);
        CUDA_REQUIRE(cudaMemset(dev.out.get(), 0xff, dev.out.size() * sizeof(bf16)));
        CUDA_REQUIRE(cuda::paged_attention_decode(dev.args, 4096, partition, ws.get(), ws_bytes, nullptr));
        check_close(to_float(dev.out.download()), decode_ref, "decode, partition " + std::to_string(partition));
      }
      // Prefill: whole prompts longer than the window, a chunk after a long cached prefix, decode rows.
      const std::vector<int> p_ctx = {300, 129, 1000, 40, 65}, p_q = {300, 128, 77, 1, 65};
      const PagedBatch prefill(rng, shape, p_ctx, p_q, 2.0f);
      DeviceBatch pdev(prefill);
      pdev.args.window = window;
      CUDA_REQUIRE(cudaMemset(pdev.out.get(), 0xff, pdev.out.size() * sizeof(bf16)));
      CUDA_REQUIRE(cuda::paged_attention_prefill(pdev.args, 300, nullptr));
      check_close(to_float(pdev.out.download()), prefill.reference(window), "prefill");
    }
}

TEST_CASE("attention launchers name what they refuse", "[gpu][attention]") {
  require_device();
  cuda::PagedAttentionArgs a;
  a.num_heads = 8;
  a.num_kv_heads = 2;
  a.head_dim = 96;
  a.block_size = 16;
  a.num_seqs = 1;
  a.q_stride = 8 * 96;
  cudaError_t e = cuda::paged_attention_prefill(a, 1, nullptr);
  CHECK(e == cudaErrorInvalidValue);
  CHECK(cuda::describe_launch_error(e).find("head_dim 96") != std::string::npos);
  a.head_dim = 128;
  a.q_stride = 8 * 128;
  a.block_size = 12;
  e = cuda::paged_attention_decode(a, 100, 512, nullptr, 0, nullptr);
  CHECK(e == cudaErrorInvalidValue);
  CHECK(cuda::describe_launch_error(e).find("block_size 12") != std::string::npos);
  a.block_size = 16;
  a.num_heads = 64;  // group 32
  a.q_stride = 64 * 128;
  e = cuda::paged_attention_decode(a, 100, 512, nullptr, 0, nullptr);
  CHECK(e == cudaErrorInvalidValue);
  CHECK(cuda::describe_launch_error(e).find("at most 16") != std::string::npos);
}
