// rope_and_cache against cpu::rope followed by cpu::reshape_and_cache: full and partial rotary (Phi-3's
// partial_rotary_factor), with and without LongRoPE's attention factor.
#include <numeric>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/rope_cache.h"
#include "tests/kernels/cuda/gpu_test_util.h"

using namespace paged;
using namespace paged::gpu_test;

TEST_CASE("rope_and_cache matches rope + reshape_and_cache", "[gpu][rope]") {
  require_device();
  std::mt19937 rng(4);
  for (const int head_dim : {64, 128}) {
    for (const int block_size : {8, 16, 32}) {
      for (const auto& [heads, kv_heads] : {std::pair{8, 8}, std::pair{16, 4}, std::pair{32, 4}})
      for (const auto& [rotary_dim, attention_factor] :
           {std::pair{head_dim, 1.0f}, std::pair{head_dim * 3 / 4, 1.19f}, std::pair{head_dim / 2, 1.0f}}) {
        const int tokens = 45, num_blocks = 20;
        const int64_t stride = static_cast<int64_t>(heads + 2 * kv_heads) * head_dim + 8;  // padded row
        INFO("head_dim " << head_dim << " block " << block_size << " heads " << heads << "/" << kv_heads
                          << " rotary_dim " << rotary_dim << " attention factor " << attention_factor);
        const auto qkv = random_bf16_values(rng, tokens * stride);
        const size_t cache_elems = static_cast<size_t>(num_blocks) * kv_heads * block_size * head_dim;
        const auto k_cache0 = random_bf16_values(rng, cache_elems), v_cache0 = random_bf16_values(rng, cache_elems);
        std::vector<int32_t> positions(tokens);
        std::uniform_int_distribution<int32_t> pos(0, 120000);
        for (auto& p : positions) p = pos(rng);
        positions[0] = 0;
        // Distinct slots in shuffled order, every fifth token padding.
        std::vector<int64_t> all_slots(static_cast<size_t>(num_blocks) * block_size);
        std::iota(all_slots.begin(), all_slots.end(), 0);
        std::shuffle(all_slots.begin(), all_slots.end(), rng);
        std::vector<int64_t> slots(all_slots.begin(), all_slots.begin() + tokens);
        for (int t = 2; t < tokens; t += 5) slots[t] = -1;
        const auto inv_freq = test_inv_freq(rotary_dim);

        // CPU: split the fused rows, rotate, cache.
        std::vector<float> q(static_cast<size_t>(tokens) * heads * head_dim),
            k(static_cast<size_t>(tokens) * kv_heads * head_dim), v(k.size());
        for (int t = 0; t < tokens; ++t) {
          const float* row = &qkv[t * stride];
          std::copy(row, row + heads * head_dim, &q[static_cast<size_t>(t) * heads * head_dim]);
          std::copy(row + heads * head_dim, row + (heads + kv_heads) * head_dim,
                    &k[static_cast<size_t>(t) * kv_heads * head_dim]);
          std::copy(row + (heads + kv_heads) * head_dim, row + (heads + 2 * kv_heads) * head_dim,
                    &v[static_cast<size_t>(t) * kv_heads * head_dim]);
        }
        cpu::rope(q.data(), k.data(), positions.data(), inv_freq.data(), tokens, heads, kv_heads, head_dim, rotary_dim,
                  attention_factor);
        auto k_ref = k_cache0, v_ref = v_cache0;
        cpu::reshape_and_cache(k.data(), v.data(), k_ref.data(), v_ref.data(), slots.data(), tokens, kv_heads,
                               head_dim, block_size);

        DeviceArray<bf16> d_qkv(to_bf16(qkv)), d_k(to_bf16(k_cache0)), d_v(to_bf16(v_cache0));
        DeviceArray<int32_t> d_pos(positions);
        DeviceArray<int64_t> d_slots(slots);
        DeviceArray<float> d_freq(inv_freq);
        CUDA_REQUIRE(cuda::rope_and_cache(d_qkv.get(), d_k.get(), d_v.get(), d_pos.get(), d_slots.get(),
                                          d_freq.get(), tokens, heads, kv_heads, head_dim, rotary_dim,
                                          attention_factor, block_size, stride, nullptr));
        const auto qkv_out = to_float(d_qkv.download());
        std::vector<float> q_out(q.size());
        for (int t = 0; t < tokens; ++t)
          std::copy(&qkv_out[t * stride], &qkv_out[t * stride] + heads * head_dim,
                    &q_out[static_cast<size_t>(t) * heads * head_dim]);
        check_close(q_out, q, "rotated q");
        // K/V rows of the row buffer stay as they were; the padding at the end of each row too.
        for (int t = 0; t < tokens; ++t)
          for (int64_t c = static_cast<int64_t>(heads) * head_dim; c < stride; ++c)
            REQUIRE(qkv_out[t * stride + c] == qkv[t * stride + c]);
        // Written slots: K close (rotated), V exact (copied); every other slot untouched.
        const auto k_out = to_float(d_k.download()), v_out = to_float(d_v.download());
        REQUIRE(v_out == v_ref);
        std::vector<bool> written(static_cast<size_t>(num_blocks) * block_size, false);
        for (int64_t s : slots)
          if (s >= 0) written[s] = true;
        std::vector<float> k_got, k_want;
        for (int b = 0; b < num_blocks; ++b)
          for (int h = 0; h < kv_heads; ++h)
            for (int o = 0; o < block_size; ++o) {
              const size_t base = ((static_cast<size_t>(b) * kv_heads + h) * block_size + o) * head_dim;
              for (int d = 0; d < head_dim; ++d) {
                if (written[static_cast<size_t>(b) * block_size + o]) {
                  k_got.push_back(k_out[base + d]);
                  k_want.push_back(k_ref[base + d]);
                } else {
                  REQUIRE(k_out[base + d] == k_ref[base + d]);
                }
              }
            }
        check_close(k_got, k_want, "rotated k in the cache");
      }
    }
  }
}
