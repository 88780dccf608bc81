// gemv (decode-sized linear layers with a fused residual add or SiLU-and-mul output) against the CPU twins composed
// with the same bf16 rounding points: cpu::linear -> add / cpu::silu_and_mul; with a norm weight, cpu::rms_norm
// first (and the same bits as cuda::rms_norm followed by gemv); its RoPE output against its store output followed by
// rope_and_cache (itself checked against cpu::rope and cpu::reshape_and_cache in test_rope_cache.cpp).
#include <algorithm>
#include <cstring>

#include "kernels/cpu/fp8.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/layer_ops.h"
#include "kernels/cuda/rope_cache.h"
#include "tests/kernels/cuda/gpu_test_util.h"

using namespace paged;
using namespace paged::gpu_test;

namespace {

std::vector<float> rounded(std::vector<float> v) {
  for (auto& x : v) x = round_bf16(x);
  return v;
}

}  // namespace

TEST_CASE("gemv matches linear -> add / silu_and_mul on the CPU", "[gpu][gemv]") {
  require_device();
  std::mt19937 rng(21);
  std::vector<std::pair<int, int>> shapes = {{16, 8}, {144, 64}, {1008, 264}, {256, 4104}};
  if (!quick_mode()) shapes.insert(shapes.end(), {{6144, 4096}, {4096, 14336}, {28672, 4096}});
  for (const auto& [n, k] : shapes) {
    const auto x = random_bf16_values(rng, k, 2.0f);
    const auto w = random_bf16_values(rng, static_cast<size_t>(n) * k, 1.0f / std::sqrt(static_cast<float>(k)));
    const auto bias = random_bf16_values(rng, n);
    const auto residual = random_bf16_values(rng, n);
    DeviceArray<bf16> d_x(to_bf16(x)), d_w(to_bf16(w)), d_b(to_bf16(bias));
    // The CPU twins: the product with the bias, the residual plus the rounded product, SiLU-and-mul of its halves.
    std::vector<float> with_bias(n), p(n), added(n), act(n / 2);
    cpu::linear(with_bias.data(), x.data(), w.data(), bias.data(), 1, n, k);
    cpu::linear(p.data(), x.data(), w.data(), nullptr, 1, n, k);
    for (int i = 0; i < n; ++i) added[i] = round_bf16(residual[i] + round_bf16(p[i]));
    const auto p_rounded = rounded(p);
    cpu::silu_and_mul(act.data(), p_rounded.data(), 1, n / 2);
    // Every tile of kGemvTiles (-1: the default); the tensor-core tiles take FP8 weights only.
    for (int tile = -1; tile < static_cast<int>(cuda::kGemvTiles.size()); ++tile) {
      INFO("n " << n << " k " << k << " tile " << tile);
      cuda::GemvArgs a{.x = d_x.get(), .w = d_w.get(), .n = n, .k = k};
      DeviceArray<bf16> d_y(n), d_act(n / 2);
      if (tile >= 0 && cuda::kGemvTiles[tile].tensor_cores) {
        a.y = d_y.get();
        const cudaError_t e = cuda::gemv(a, nullptr, tile);
        CHECK(e == cudaErrorInvalidValue);
        CHECK(cuda::describe_launch_error(e).find("needs FP8 weights") != std::string::npos);
        continue;
      }
      a.y = d_y.get();
      a.bias = d_b.get();
      a.output = cuda::GemvOutput::kStore;
      CUDA_REQUIRE(cuda::gemv(a, nullptr, tile));
      check_close(to_float(d_y.download()), with_bias, "store + bias");

      d_y.upload(to_bf16(residual));  // the residual stream, updated in place
      a.bias = nullptr;
      a.output = cuda::GemvOutput::kAddToResidual;
      a.prefetch_l2 = 1.0f;  // as the runner's O projection: the weights asked into L2 first, the same sums
      CUDA_REQUIRE(cuda::gemv(a, nullptr, tile));
      check_close(to_float(d_y.download()), added, "add to residual");
      a.prefetch_l2 = 0.0f;

      a.y = d_act.get();
      a.output = cuda::GemvOutput::kSiluMul;
      CUDA_REQUIRE(cuda::gemv(a, nullptr, tile));
      check_close(to_float(d_act.download()), act, "silu_and_mul");
    }
  }
}

TEST_CASE("gemv names what it refuses", "[gpu][gemv]") {
  require_device();
  DeviceArray<bf16> buf(1024);
  cuda::GemvArgs a;
  a.x = a.w = buf.get();
  a.y = buf.get();
  a.n = 16;
  a.k = 12;
  cudaError_t e = cuda::gemv(a, nullptr);
  CHECK(e == cudaErrorInvalidValue);
  CHECK(cuda::describe_launch_error(e).find("k 12") != std::string::npos);
  a.k = 16;
  a.n = 24;
  a.output = cuda::GemvOutput::kSiluMul;
  e = cuda::gemv(a, nullptr);
  CHECK(e == cudaErrorInvalidValue);
  CHECK(cuda::describe_launch_error(e).find("n 24") != std::string::npos);
  a.n = 32;
  a.bias = buf.get();
  CHECK(cuda::gemv(a, nullptr) == cudaErrorInvalidValue);
  a.bias = nullptr;
  e = cuda::gemv(a, nullptr, static_cast<int>(cuda::kGemvTiles.size()));
  CHECK(e == cudaErrorInvalidValue);
  CHECK(cuda::describe_launch_error(e).find("no tile") != std::string::npos);
}

TEST_CASE("gemv with a norm weight takes x through rms_norm first, the same bits as the norm kernel", "[gpu][gemv]") {
  require_device();
  std::mt19937 rng(23);
  std::vector<std::pair<int, int>> shapes = {{16, 64}, {144, 272}, {1008, 4096}};  // k of 16 for FP8
  if (!quick_mode()) shapes.insert(shapes.end(), {{6144, 4096}, {256, cuda::kMaxNormedK}});
  const float eps = 1e-5f;
  for (const auto& [n, k] : shapes) {
    const auto w = random_bf16_values(rng, static_cast<size_t>(n) * k, 1.0f / std::sqrt(static_cast<float>(k)));
    for (const float offset : {0.0f, 1.0f})  // Gemma's norms scale by 1 + weight
      for (const bool fp8 : {false, true}) {
        INFO("n " << n << " k " << k << " offset " << offset << (fp8 ? " FP8" : " bf16"));
        const auto x = random_bf16_values(rng, k, 3.0f);
        const auto norm_w = random_bf16_values(rng, k, 0.5f);
        // The CPU twin: the norm rounded to bf16, then the product.
        std::vector<float> normed(k), shifted(k);
        for (int i = 0; i < k; ++i) shifted[i] = norm_w[i] + offset;
        cpu::rms_norm(normed.data(), x.data(), shifted.data(), 1, k, eps);
        normed = rounded(normed);
        DeviceArray<bf16> d_x(to_bf16(x)), d_nw(to_bf16(norm_w)), d_w(to_bf16(w)), d_normed(k);
        std::vector<uint8_t> codes(static_cast<size_t>(n) * k);
        DeviceArray<uint8_t> d_q(codes);
        DeviceArray<float> d_scale(n);
        std::vector<float> p(n);
        if (fp8) {
          CUDA_REQUIRE(cuda::quantize_rows_fp8(d_w.get(), n, k, d_q.get(), d_scale.get(), nullptr));
          codes = d_q.download();
          const std::vector<float> scale = d_scale.download();
          for (int r = 0; r < n; ++r) {
            float acc = 0.0f;
            for (int c = 0; c < k; ++c) acc += cpu::e4m3_to_float(codes[size_t(r) * k + c]) * normed[c];
            p[r] = acc * scale[r];
          }
        } else {
          cpu::linear(p.data(), normed.data(), w.data(), nullptr, 1, n, k);
        }
        std::vector<float> act(n / 2);
        const auto p_rounded = rounded(p);
        cpu::silu_and_mul(act.data(), p_rounded.data(), 1, n / 2);
        for (const cuda::GemvOutput output : {cuda::GemvOutput::kStore, cuda::GemvOutput::kSiluMul}) {
          const bool silu = output == cuda::GemvOutput::kSiluMul;
          cuda::GemvArgs a{.x = d_x.get(), .w = fp8 ? nullptr : d_w.get(), .w_fp8 = fp8 ? d_q.get() : nullptr,
                           .w_scale = fp8 ? d_scale.get() : nullptr, .n = n, .k = k, .output = output};
          // Unfused: the norm kernel, then the product of what it wrote.
          DeviceArray<bf16> d_apart(silu ? n / 2 : n), d_fused(silu ? n / 2 : n);
          CUDA_REQUIRE(cuda::rms_norm(d_normed.get(), d_x.get(), d_nw.get(), 1, k, eps, offset, nullptr));
          a.x = d_normed.get();
          a.y = d_apart.get();
          CUDA_REQUIRE(cuda::gemv(a, nullptr));
          a.x = d_x.get();
          a.y = d_fused.get();
          a.norm_weight = d_nw.get();
          a.norm_eps = eps;
          a.norm_offset = offset;
          CUDA_REQUIRE(cuda::gemv(a, nullptr));
          const auto fused = d_fused.download(), apart = d_apart.download();
          CHECK(std::equal(fused.begin(), fused.end(), apart.begin(), [](bf16 l, bf16 r) {
            return std::memcmp(&l, &r, sizeof l) == 0;
          }));
          check_close(to_float(fused), silu ? act : p, silu ? "fused norm, silu_and_mul" : "fused norm, store");
        }
      }
  }
  DeviceArray<bf16> buf(cuda::kMaxNormedK + 8);
  cuda::GemvArgs too_wide{.x = buf.get(), .w = buf.get(), .y = buf.get(), .n = 8, .k = cuda::kMaxNormedK + 8,
                          .norm_weight = buf.get()};
  CHECK(cuda::gemv(too_wide, nullptr) == cudaErrorInvalidValue);
}

TEST_CASE("gemv's RoPE output is its store output followed by rope_and_cache, bit for bit", "[gpu][gemv][rope]") {
  require_device();
  std::mt19937 rng(29);
  struct Shape {
    int heads, kv_heads, head_dim, rotary_dim, k, block_size;
    float attention_factor;
  };
  std::vector<Shape> shapes = {{4, 2, 64, 64, 64, 16, 1.0f},       // full rotary
                               {6, 2, 128, 96, 256, 32, 1.19f},    // partial rotary (Phi), LongRoPE's factor
                               {8, 8, 64, 32, 128, 8, 1.0f},       // half rotary, no grouping
                               {2, 1, 128, 128, 4096, 16, 1.0f}};  // a long k
  if (!quick_mode()) shapes.push_back({32, 8, 128, 128, 4096, 16, 1.0f});  // Llama-3-8B's QKV
  for (const Shape& sh : shapes) {
    const int n = (sh.heads + 2 * sh.kv_heads) * sh.head_dim, k = sh.k, num_blocks = 6;
    const auto x = random_bf16_values(rng, k, 2.0f);
    const auto w = random_bf16_values(rng, static_cast<size_t>(n) * k, 1.0f / std::sqrt(static_cast<float>(k)));
    const auto bias = random_bf16_values(rng, n);
    const size_t cache_elems = static_cast<size_t>(num_blocks) * sh.kv_heads * sh.block_size * sh.head_dim;
    const auto cache0 = to_bf16(random_bf16_values(rng, 2 * cache_elems));
    const std::vector<bf16> k0(cache0.begin(), cache0.begin() + cache_elems), v0(cache0.begin() + cache_elems,
                                                                                 cache0.end());
    DeviceArray<bf16> d_x(to_bf16(x)), d_w(to_bf16(w)), d_b(to_bf16(bias));
    std::vector<uint8_t> codes(static_cast<size_t>(n) * k);
    DeviceArray<uint8_t> d_q(codes);
    DeviceArray<float> d_scale(n), d_freq(test_inv_freq(sh.rotary_dim));
    CUDA_REQUIRE(cuda::quantize_rows_fp8(d_w.get(), n, k, d_q.get(), d_scale.get(), nullptr));
    DeviceArray<int32_t> d_pos(1);
    DeviceArray<int64_t> d_slot(1);
    DeviceArray<bf16> y_ref(n), k_ref(k0), v_ref(v0), y(n), k_out(k0), v_out(v0);
    for (const int64_t slot : {int64_t{sh.block_size + 3}, int64_t{num_blocks * sh.block_size - 1}, int64_t{-1}})
      for (const int32_t position : {0, 98765})
        for (const bool fp8 : {false, true})
          for (const bool with_bias : {false, true})
            for (const bool caches : {true, false})  // without: the FP8 cache's in-place rotation
              for (int tile = -1; tile < static_cast<int>(cuda::kGemvTiles.size()); ++tile) {
                if (tile >= 0 && cuda::kGemvTiles[tile].tensor_cores && (!fp8 || k % 64 != 0)) continue;
                INFO("heads " << sh.heads << "/" << sh.kv_heads << " head_dim " << sh.head_dim << " rotary "
                              << sh.rotary_dim << " k " << k << " slot " << slot << " position " << position
                              << (fp8 ? " FP8" : " bf16") << (with_bias ? " bias" : "")
                              << (caches ? "" : " no caches") << " tile " << tile);
                d_pos.upload({position});
                d_slot.upload({slot});
                for (auto* cache : {&k_ref, &k_out}) cache->upload(k0);
                for (auto* cache : {&v_ref, &v_out}) cache->upload(v0);
                cuda::GemvArgs a{.x = d_x.get(), .w = fp8 ? nullptr : d_w.get(), .w_fp8 = fp8 ? d_q.get() : nullptr,
                                 .w_scale = fp8 ? d_scale.get() : nullptr, .bias = with_bias ? d_b.get() : nullptr,
                                 .y = y_ref.get(), .n = n, .k = k};
                // Apart: the product stored, then RoPE and the cache write.
                CUDA_REQUIRE(cuda::gemv(a, nullptr, tile));
                CUDA_REQUIRE(cuda::rope_and_cache(y_ref.get(), caches ? k_ref.get() : nullptr,
                                                  caches ? v_ref.get() : nullptr, d_pos.get(), d_slot.get(),
                                                  d_freq.get(), 1, sh.heads, sh.kv_heads, sh.head_dim,
                                                  sh.rotary_dim, sh.attention_factor, sh.block_size, n, nullptr));
                a.y = y.get();
                a.output = cuda::GemvOutput::kRope;
                a.rope = {.k_cache = caches ? k_out.get() : nullptr, .v_cache = caches ? v_out.get() : nullptr,
                          .position = d_pos.get(), .slot = d_slot.get(), .inv_freq = d_freq.get(),
                          .num_heads = sh.heads, .num_kv_heads = sh.kv_heads, .head_dim = sh.head_dim,
                          .rotary_dim = sh.rotary_dim, .block_size = sh.block_size,
                          .attention_factor = sh.attention_factor};
                CUDA_REQUIRE(cuda::gemv(a, nullptr, tile));
                const auto same = [](const std::vector<bf16>& l, const std::vector<bf16>& r) {
                  return l.size() == r.size() && std::memcmp(l.data(), r.data(), l.size() * sizeof(bf16)) == 0;
                };
                CHECK(same(y.download(), y_ref.download()));
                CHECK(same(k_out.download(), k_ref.download()));
                CHECK(same(v_out.download(), v_ref.download()));
              }
  }
  // What it refuses, by name.
  DeviceArray<bf16> x(16), w(48 * 16), y(48), kc(256), vc(256);
  DeviceArray<int32_t> pos(std::vector<int32_t>{0});
  DeviceArray<int64_t> slot(std::vector<int64_t>{0});
  DeviceArray<float> freq(8);
  cuda::GemvArgs a{.x = x.get(), .w = w.get(), .y = y.get(), .n = 48, .k = 16, .output = cuda::GemvOutput::kRope};
  a.rope = {.k_cache = kc.get(), .v_cache = vc.get(), .position = pos.get(), .slot = slot.get(),
            .inv_freq = freq.get(), .num_heads = 1, .num_kv_heads = 1, .head_dim = 16, .rotary_dim = 16,
            .block_size = 16};
  CUDA_REQUIRE(cuda::gemv(a, nullptr));
  // Each change of the good arguments, and the words its refusal names.
  const auto refused = [&](void (*change)(cuda::GemvArgs&), const char* words) {
    cuda::GemvArgs bad = a;
    change(bad);
    const cudaError_t e = cuda::gemv(bad, nullptr);
    CHECK(e == cudaErrorInvalidValue);
    CHECK(cuda::describe_launch_error(e).find(words) != std::string::npos);
  };
  refused([](cuda::GemvArgs& b) { b.n = 64; }, "n 64");
  refused([](cuda::GemvArgs& b) { b.rope.rotary_dim = 6; }, "rotary_dim 6");
  refused([](cuda::GemvArgs& b) { b.rope.v_cache = nullptr; }, "both caches or neither");
  refused([](cuda::GemvArgs& b) { b.rope.block_size = 12; }, "block_size 12");
  refused([](cuda::GemvArgs& b) { b.rope.slot = nullptr; }, "position, slot and inv_freq");
}
