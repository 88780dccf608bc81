// The token bitmask kernel against its CPU twin, apply_token_mask: bit for bit on random masks and rows.
#include <bit>
#include <numeric>
#include <span>

#include "kernels/cuda/token_bitmask.h"
#include "model/sampling/sampler.h"
#include "tests/kernels/cuda/gpu_test_util.h"

namespace paged::gpu_test {

TEST_CASE("apply_token_bitmask masks logits bit for bit as apply_token_mask", "[gpu][sampling][structured]") {
  require_device();
  std::mt19937 rng(18);
  for (const int vocab : {1, 31, 32, 513, 128256}) {
    const int rows = 9, words = (vocab + 31) / 32;
    std::vector<float> logits(static_cast<size_t>(rows) * vocab);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (auto& l : logits) l = normal(rng);
    // Mask i goes to logits row perm[i]; the first 6 rows are masked (all clear, all set, random densities).
    std::vector<int32_t> perm(rows);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    const int n = 6;
    perm.resize(n);
    std::vector<uint32_t> masks(static_cast<size_t>(n) * words);
    std::vector<float> want = logits;
    for (int i = 0; i < n; ++i) {
      std::span<uint32_t> mask(masks.data() + int64_t{i} * words, words);
      for (uint32_t& w : mask) w = i == 0 ? 0u : i == 1 ? ~0u : static_cast<uint32_t>(rng()) & static_cast<uint32_t>(rng());
      apply_token_mask(std::span<float>(want.data() + int64_t{perm[i]} * vocab, vocab), mask);
    }
    DeviceArray<float> d_logits(logits);
    DeviceArray<int32_t> d_rows(perm);
    DeviceArray<uint32_t> d_masks(masks);
    CUDA_REQUIRE(cuda::apply_token_bitmask(d_logits.get(), d_rows.get(), d_masks.get(), n, vocab, nullptr));
    const auto got = d_logits.download();
    size_t differing = 0;
    for (size_t i = 0; i < got.size(); ++i) differing += std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want[i]);
    CHECK(differing == 0);
    CHECK(want != logits);
  }
}

}  // namespace paged::gpu_test
