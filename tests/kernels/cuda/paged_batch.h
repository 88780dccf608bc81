// The batches the attention tests run: sequences over a shuffled paged cache on host and device (PagedBatch,
// DeviceBatch), the shapes they cover and their description for failure messages.
#pragma once

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention.h"
#include "tests/kernels/cuda/gpu_test_util.h"

namespace paged::gpu_test {

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

inline std::vector<Shape> shapes() {
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

inline std::string describe(const Shape& s) {
  return "head_dim " + std::to_string(s.head_dim) + ", block " + std::to_string(s.block_size) + ", heads " +
         std::to_string(s.heads) + "/" + std::to_string(s.kv_heads);
}

}  // namespace paged::gpu_test
