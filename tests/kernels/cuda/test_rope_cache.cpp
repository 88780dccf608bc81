// rope_and_cache against cpu::rope followed by cpu::reshape_and_cache: full and partial rotary (Phi-3's
// partial_rotary_factor), with and without LongRoPE's attention factor, with and without per-head norms (Qwen3's and
// Gemma 3's q_norm / k_norm: cpu::rms_norm over each head row first), into caches and in place. Its FP8 extras (an
// FP8 product's scales, the FP8 cache) against the passes they replace, bit for bit: test_kv_fp8.cpp.
#include <numeric>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/rope_cache.h"
#include "tests/kernels/cuda/gpu_test_util.h"

using namespace paged;
using namespace paged::gpu_test;

TEST_CASE("rope_and_cache matches (rms_norm per head +) rope + reshape_and_cache", "[gpu][rope]") {
  require_device();
  std::mt19937 rng(4);
  for (const int head_dim : {64, 128})
    for (const int block_size : {8, 16, 32})
      for (const auto& [heads, kv_heads] : {std::pair{8, 8}, std::pair{16, 4}, std::pair{32, 4}, std::pair{2, 1}})
        for (const auto& [rotary_dim, attention_factor] :
             {std::pair{head_dim, 1.0f}, std::pair{head_dim * 3 / 4, 1.19f}, std::pair{head_dim / 2, 1.0f}})
          for (const int norm : {0, 1, 2})  // none; q/k norms; with Gemma's weight offset 1
            for (const bool in_place : {false, true}) {
              const float norm_offset = norm == 2 ? 1.0f : 0.0f, eps = 1e-6f;
              // Block size 16: enough tokens for the launch of a prefill step (one block a token).
              const int tokens = block_size == 16 ? 1100 : 45, num_blocks = tokens / block_size + 8;
              const int64_t stride = static_cast<int64_t>(heads + 2 * kv_heads) * head_dim + 8;  // padded row
              INFO("head_dim " << head_dim << " block " << block_size << " heads " << heads << "/" << kv_heads
                                << " rotary_dim " << rotary_dim << " attention factor " << attention_factor
                                << " norm " << norm << (in_place ? " in place" : " into caches"));
              const auto qkv = random_bf16_values(rng, tokens * stride, 3.0f);
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
              auto q_w = random_bf16_values(rng, head_dim, 0.5f), k_w = random_bf16_values(rng, head_dim, 0.5f);
              for (auto& w : q_w) w = round_bf16(w + 1.0f);

              // CPU: split the fused rows, normalise each q and k head (rounded to bf16, as the kernel keeps it),
              // rotate, cache.
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
              if (norm > 0) {
                std::vector<float> q_applied = q_w, k_applied = k_w;
                for (auto& w : q_applied) w += norm_offset;
                for (auto& w : k_applied) w += norm_offset;
                cpu::rms_norm(q.data(), q.data(), q_applied.data(), tokens * heads, head_dim, eps);
                cpu::rms_norm(k.data(), k.data(), k_applied.data(), tokens * kv_heads, head_dim, eps);
                for (auto* x : {&q, &k})
                  for (auto& e : *x) e = round_bf16(e);
              }
              cpu::rope(q.data(), k.data(), positions.data(), inv_freq.data(), tokens, heads, kv_heads, head_dim,
                        rotary_dim, attention_factor);
              auto k_ref = k_cache0, v_ref = v_cache0;
              cpu::reshape_and_cache(k.data(), v.data(), k_ref.data(), v_ref.data(), slots.data(), tokens, kv_heads,
                                     head_dim, block_size);

              DeviceArray<bf16> d_qkv(to_bf16(qkv)), d_k(to_bf16(k_cache0)), d_v(to_bf16(v_cache0));
              DeviceArray<bf16> d_qw(to_bf16(q_w)), d_kw(to_bf16(k_w));
              DeviceArray<int32_t> d_pos(positions);
              DeviceArray<int64_t> d_slots(slots);
              DeviceArray<float> d_freq(inv_freq);
              cuda::RopeExtras extras;
              if (norm > 0)
                extras = {.q_norm = d_qw.get(), .k_norm = d_kw.get(), .norm_eps = eps, .norm_offset = norm_offset};
              CUDA_REQUIRE(cuda::rope_and_cache(d_qkv.get(), in_place ? nullptr : d_k.get(),
                                                in_place ? nullptr : d_v.get(), d_pos.get(), d_slots.get(),
                                                d_freq.get(), tokens, heads, kv_heads, head_dim, rotary_dim,
                                                attention_factor, block_size, stride, nullptr, extras));
              const auto qkv_out = to_float(d_qkv.download());
              std::vector<float> q_out(q.size()), k_out_rows(k.size());
              for (int t = 0; t < tokens; ++t) {
                std::copy(&qkv_out[t * stride], &qkv_out[t * stride] + heads * head_dim,
                          &q_out[static_cast<size_t>(t) * heads * head_dim]);
                std::copy(&qkv_out[t * stride] + heads * head_dim, &qkv_out[t * stride] + (heads + kv_heads) * head_dim,
                          &k_out_rows[static_cast<size_t>(t) * kv_heads * head_dim]);
              }
              check_close(q_out, q, "rotated q");
              // In place the keys are rotated in the row (padding tokens too); into caches they stay as they were.
              // Values and the padding at the end of each row stay either way.
              if (in_place) check_close(k_out_rows, k, "rotated k in the row");
              for (int t = 0; t < tokens; ++t)
                for (int64_t c = static_cast<int64_t>(heads + (in_place ? kv_heads : 0)) * head_dim; c < stride; ++c)
                  REQUIRE(qkv_out[t * stride + c] == qkv[t * stride + c]);
              // Written slots: K close (rotated), V exact (copied); every other slot untouched.
              const auto k_out = to_float(d_k.download()), v_out = to_float(d_v.download());
              if (in_place) {
                REQUIRE(k_out == k_cache0);
                REQUIRE(v_out == v_cache0);
                continue;
              }
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

TEST_CASE("rope_and_cache refuses mismatched caches and half-given extras", "[gpu][rope]") {
  require_device();
  DeviceArray<bf16> qkv(3 * 64), cache(8 * 64);
  DeviceArray<uint8_t> fp8(8 * 68);
  DeviceArray<float> scale(64);
  const auto call = [&](bf16* k, bf16* v, const cuda::RopeExtras& x) {
    return cuda::rope_and_cache(qkv.get(), k, v, nullptr, nullptr, nullptr, 1, 1, 1, 64, 64, 1.0f, 8, 3 * 64, nullptr, x);
  };
  CHECK(call(cache.get(), nullptr, {}) == cudaErrorInvalidValue);
  CHECK(call(nullptr, nullptr, {.k_fp8 = fp8.get()}) == cudaErrorInvalidValue);
  CHECK(call(cache.get(), cache.get(), {.k_fp8 = fp8.get(), .v_fp8 = fp8.get()}) == cudaErrorInvalidValue);
  CHECK(call(nullptr, nullptr, {.q_norm = qkv.get()}) == cudaErrorInvalidValue);
  CHECK(call(nullptr, nullptr, {.product = {.x_scale = scale.get()}}) == cudaErrorInvalidValue);
}
