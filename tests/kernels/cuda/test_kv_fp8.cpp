// The FP8 KV cache (kernels/cuda/kv_fp8.h) against its CPU twins: cache_kv_fp8 writes cpu::quantize_rows_fp8's codes
// and scales bit for bit at each token's slot (and nothing for padding), and both attention kernels over an FP8
// cache match cpu::paged_attention over the values that cache holds (codes times scales).
#include <cstring>

#include "kernels/cpu/fp8.h"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/kv_fp8.h"
#include "kernels/cuda/rope_cache.h"
#include "tests/kernels/cuda/paged_batch.h"

using namespace paged;
using namespace paged::gpu_test;

namespace {

// A float cache [num_blocks][kv_heads][block_size][head_dim] in the FP8 layout (each head row quantised), and the
// same cache holding what the FP8 one means (the CPU twin's input).
struct Fp8Cache {
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};
Fp8Cache quantised_cache(const std::vector<float>& cache, int num_blocks, const Shape& s) {
  const int D = s.head_dim, rows = s.kv_heads * s.block_size;
  const size_t block_bytes = cuda::kv_fp8_block_bytes(s.kv_heads, s.block_size, D);
  Fp8Cache out{std::vector<uint8_t>(block_bytes * num_blocks), cache};
  for (int b = 0; b < num_blocks; ++b) {
    uint8_t* block = out.bytes.data() + block_bytes * b;
    std::vector<float> scales(rows);
    cpu::quantize_rows_fp8(&cache[size_t(b) * rows * D], rows, D, block, scales.data());
    std::memcpy(block + size_t(rows) * D, scales.data(), rows * sizeof(float));
    for (int r = 0; r < rows; ++r)
      for (int d = 0; d < D; ++d)
        out.values[(size_t(b) * rows + r) * D + d] = cpu::e4m3_to_float(block[size_t(r) * D + d]) * scales[r];
  }
  return out;
}

}  // namespace

TEST_CASE("cache_kv_fp8 writes the CPU twin's codes and scales at each slot", "[gpu][fp8][kv]") {
  require_device();
  std::mt19937 rng(21);
  for (const Shape& s : {Shape{64, 16, 8, 2}, Shape{128, 8, 32, 8}, Shape{128, 32, 4, 4}}) {
    INFO(describe(s));
    const int tokens = 37, num_blocks = 12, D = s.head_dim;
    const int64_t stride = int64_t{s.heads + 2 * s.kv_heads} * D;
    std::vector<float> qkv = random_bf16_values(rng, size_t(tokens) * stride, 3.0f);
    for (int d = 0; d < D; ++d) qkv[size_t(5) * stride + s.heads * D + d] = 0.0f;  // a zero K head: scale 1
    std::vector<int64_t> slots(tokens);
    std::vector<int64_t> free_slots(size_t(num_blocks) * s.block_size);
    std::iota(free_slots.begin(), free_slots.end(), 0);
    std::shuffle(free_slots.begin(), free_slots.end(), rng);
    for (int t = 0; t < tokens; ++t) slots[t] = t % 9 == 4 ? -1 : free_slots[t];  // some padding
    const size_t block_bytes = cuda::kv_fp8_block_bytes(s.kv_heads, s.block_size, D);
    DeviceArray<bf16> d_qkv(to_bf16(qkv));
    DeviceArray<int64_t> d_slots(slots);
    DeviceArray<uint8_t> k(block_bytes * num_blocks), v(block_bytes * num_blocks);
    CUDA_REQUIRE(cudaMemset(k.get(), 0xab, k.size()));
    CUDA_REQUIRE(cudaMemset(v.get(), 0xab, v.size()));
    CUDA_REQUIRE(cuda::cache_kv_fp8(d_qkv.get(), k.get(), v.get(), d_slots.get(), tokens, s.heads, s.kv_heads, D,
                                    s.block_size, stride, nullptr));
    const std::vector<uint8_t> got[2] = {k.download(), v.download()};
    std::vector<uint8_t> want[2] = {std::vector<uint8_t>(k.size(), 0xab), std::vector<uint8_t>(v.size(), 0xab)};
    for (int t = 0; t < tokens; ++t) {
      if (slots[t] < 0) continue;
      const int64_t block = slots[t] / s.block_size, offset = slots[t] % s.block_size;
      for (int kind = 0; kind < 2; ++kind)
        for (int h = 0; h < s.kv_heads; ++h) {
          const float* row = &qkv[size_t(t) * stride + size_t(s.heads + kind * s.kv_heads + h) * D];
          uint8_t* base = want[kind].data() + block * block_bytes;
          const int64_t r = int64_t{h} * s.block_size + offset;
          float scale = 0.0f;
          cpu::quantize_rows_fp8(row, 1, D, base + r * D, &scale);
          std::memcpy(base + int64_t{s.kv_heads} * s.block_size * D + r * 4, &scale, sizeof scale);
        }
    }
    CHECK(got[0] == want[0]);
    CHECK(got[1] == want[1]);
  }
}

TEST_CASE("rope_and_cache's FP8 extras are scale_fp8_product, rope_and_cache in place and cache_kv_fp8 in one pass",
          "[gpu][fp8][kv][rope]") {
  require_device();
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> scales(0.01f, 2.0f);
  for (const Shape& s : {Shape{64, 16, 8, 2}, Shape{128, 8, 32, 8}, Shape{128, 32, 4, 4}, Shape{128, 16, 14, 2}})
    for (const bool product : {false, true})
      for (const bool norms : {false, true})
        for (const bool fp8_cache : {false, true}) {
          if (!product && !fp8_cache) continue;  // the plain kernel: test_rope_cache.cpp
          INFO(describe(s) << (product ? ", FP8 product" : "") << (norms ? ", head norms" : "")
                           << (fp8_cache ? ", FP8 cache" : ", bf16 cache"));
          // Block size 16: enough tokens for the launch of a prefill step (one block a token).
          const int tokens = s.block_size == 16 ? 1100 : 41, num_blocks = tokens / s.block_size + 8;
          const int D = s.head_dim, rotary = D * 3 / 4;
          const int64_t width = int64_t{s.heads + 2 * s.kv_heads} * D, stride = width + 8;
          // A product of codes as Gemm::product_fp8 leaves it (large, unscaled), or plain values.
          std::vector<float> qkv = random_bf16_values(rng, size_t(tokens) * stride, 3.0f);
          if (product)
            for (float& v : qkv) v = round_bf16(v * 100.0f);
          std::vector<float> x_scale(tokens), w_scale(width);
          for (float& v : x_scale) v = scales(rng);
          for (float& v : w_scale) v = scales(rng) * 0.01f;
          const std::vector<float> bias = random_bf16_values(rng, width, 0.5f);
          std::vector<int32_t> positions(tokens);
          std::uniform_int_distribution<int32_t> pos(0, 70000);
          for (auto& p : positions) p = pos(rng);
          std::vector<int64_t> free_slots(size_t(num_blocks) * s.block_size), slots(tokens);
          std::iota(free_slots.begin(), free_slots.end(), 0);
          std::shuffle(free_slots.begin(), free_slots.end(), rng);
          for (int t = 0; t < tokens; ++t) slots[t] = t % 7 == 3 ? -1 : free_slots[t];
          const auto q_w = random_bf16_values(rng, D, 0.5f), k_w = random_bf16_values(rng, D, 0.5f);
          DeviceArray<float> d_sx(x_scale), d_sw(w_scale), d_freq(test_inv_freq(rotary));
          DeviceArray<bf16> d_bias(to_bf16(bias)), d_qw(to_bf16(q_w)), d_kw(to_bf16(k_w));
          DeviceArray<int32_t> d_pos(positions);
          DeviceArray<int64_t> d_slots(slots);
          const size_t cache_bytes = fp8_cache ? cuda::kv_fp8_block_bytes(s.kv_heads, s.block_size, D) * num_blocks
                                               : size_t(num_blocks) * s.kv_heads * s.block_size * D * sizeof(bf16);
          struct Out {  // the row buffer and the two caches (bf16 or FP8 bytes), fresh
            Out(const std::vector<float>& qkv, size_t cache_bytes) : qkv(to_bf16(qkv)), k(cache_bytes), v(cache_bytes) {
              CUDA_REQUIRE(cudaMemset(k.get(), 0xab, cache_bytes));
              CUDA_REQUIRE(cudaMemset(v.get(), 0xab, cache_bytes));
            }
            DeviceArray<bf16> qkv;
            DeviceArray<uint8_t> k, v;
          };
          const cuda::Fp8Product scaled{d_sx.get(), d_sw.get(), d_bias.get()};
          cuda::RopeExtras x;
          if (norms) x = {.q_norm = d_qw.get(), .k_norm = d_kw.get(), .norm_eps = 1e-6f, .norm_offset = 0.0f};
          const auto rope = [&](Out& o, bool caches, const cuda::RopeExtras& e) {
            bf16* k = caches && !fp8_cache ? reinterpret_cast<bf16*>(o.k.get()) : nullptr;
            bf16* v = caches && !fp8_cache ? reinterpret_cast<bf16*>(o.v.get()) : nullptr;
            return cuda::rope_and_cache(o.qkv.get(), k, v, d_pos.get(), d_slots.get(), d_freq.get(), tokens, s.heads,
                                        s.kv_heads, D, rotary, 1.0f, s.block_size, stride, nullptr, e);
          };
          // The passes one at a time, each checked against its CPU twin (test_fp8.cpp, test_rope_cache.cpp, above).
          Out want(qkv, cache_bytes);
          if (product) {
            for (int t = 0; t < tokens; ++t)  // scale_fp8_product on each row's width (the rows are padded)
              CUDA_REQUIRE(cuda::scale_fp8_product(want.qkv.get() + t * stride, d_sx.get() + t, d_sw.get(),
                                                   d_bias.get(), 1, int(width), nullptr));
          }
          if (fp8_cache) {
            CUDA_REQUIRE(rope(want, false, x));
            CUDA_REQUIRE(cuda::cache_kv_fp8(want.qkv.get(), want.k.get(), want.v.get(), d_slots.get(), tokens,
                                            s.heads, s.kv_heads, D, s.block_size, stride, nullptr));
          } else {
            CUDA_REQUIRE(rope(want, true, x));
          }
          // In one pass.
          Out got(qkv, cache_bytes);
          cuda::RopeExtras fused = x;
          if (product) fused.product = scaled;
          if (fp8_cache) {
            fused.k_fp8 = got.k.get();
            fused.v_fp8 = got.v.get();
          }
          CUDA_REQUIRE(rope(got, true, fused));
          const auto got_qkv = to_float(got.qkv.download()), want_qkv = to_float(want.qkv.download());
          for (int t = 0; t < tokens; ++t)  // the query heads, rotated (the rest of the row is not the output)
            for (int c = 0; c < s.heads * D; ++c) REQUIRE(got_qkv[t * stride + c] == want_qkv[t * stride + c]);
          CHECK(got.k.download() == want.k.download());
          CHECK(got.v.download() == want.v.download());
        }
}

TEST_CASE("decode and prefill over an FP8 cache match the CPU twin over the values it holds", "[gpu][fp8][kv]") {
  require_device();
  std::mt19937 rng(22);
  for (const Shape& shape : shapes()) {
    INFO(describe(shape));
    for (const int window : {0, 100}) {
      INFO("window " << window);
      // Decode rows over ragged contexts (several partitions), and a prefill batch with cached prefixes and a chunk
      // long enough for the prefill kernel's two m-tiles a warp.
      const int q_long = cuda::kPrefillTwoTileRows / (shape.heads / shape.kv_heads) + 40;
      const std::vector<int> ctx = {1, 17, 100, 513, 1100}, p_ctx = {33, 300, 129, 40, q_long + 61},
                             p_q = {33, 37, 128, 1, q_long};
      for (const bool decode : {true, false}) {
        PagedBatch batch(rng, shape, decode ? ctx : p_ctx, decode ? std::vector<int>(ctx.size(), 1) : p_q, 2.0f);
        // Values of very different sizes per head row: the per-row scales matter.
        for (size_t i = 0; i < batch.k_cache.size(); ++i) {
          const float row_scale = std::ldexp(1.0f, static_cast<int>(i / shape.head_dim % 7) - 3);
          batch.k_cache[i] *= row_scale;
          batch.v_cache[i] *= row_scale;
        }
        const Fp8Cache k8 = quantised_cache(batch.k_cache, batch.num_blocks, shape);
        const Fp8Cache v8 = quantised_cache(batch.v_cache, batch.num_blocks, shape);
        batch.k_cache = k8.values;
        batch.v_cache = v8.values;
        DeviceBatch dev(batch);
        DeviceArray<uint8_t> dk(k8.bytes), dv(v8.bytes);
        dev.args.k_cache = dev.args.v_cache = nullptr;  // the kernels must read the FP8 cache alone
        dev.args.k_fp8 = dk.get();
        dev.args.v_fp8 = dv.get();
        dev.args.window = window;
        // Decode: partitions of 256 (several a sequence) and 2048 (whole sequences); prefill once.
        for (const int partition : decode ? std::vector<int>{256, 2048} : std::vector<int>{0}) {
          CUDA_REQUIRE(cudaMemset(dev.out.get(), 0xff, dev.out.size() * sizeof(bf16)));
          if (decode) {
            const size_t ws_bytes =
                cuda::paged_attention_decode_workspace(batch.total_q, shape.heads, shape.head_dim, 2048, partition);
            DeviceArray<char> ws(ws_bytes);
            CUDA_REQUIRE(cuda::paged_attention_decode(dev.args, 2048, partition, ws.get(), ws_bytes, nullptr));
          } else {
            CUDA_REQUIRE(cuda::paged_attention_prefill(dev.args, *std::max_element(p_q.begin(), p_q.end()), nullptr));
          }
          // Decode takes the codes exactly and applies the scales in float32: bf16's error. Prefill rounds each
          // dequantised K and V element to bf16 for its shared-memory tiles once more: twice bf16's budget, and a
          // quarter more for the largest error of its over a thousand long-chunk rows.
          const double factor = decode ? 1.0 : 2.5;
          check_close(to_float(dev.out.download()), batch.reference(window),
                      decode ? "decode, partition " + std::to_string(partition) : "prefill", factor * kBf16RelL2,
                      factor * kBf16MaxNorm);
        }
      }
    }
  }
}
