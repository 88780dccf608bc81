// gather_rows, rms_norm, add_rms_norm (also with Gemma's weight offset 1), silu_and_mul,
// gelu_tanh_and_mul and soft_cap against their CPU twins.
#include <tuple>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/layer_ops.h"
#include "tests/kernels/cuda/gpu_test_util.h"

using namespace paged;
using namespace paged::gpu_test;

TEST_CASE("gather_rows copies the indexed rows and zeroes out-of-range ones", "[gpu][layer_ops]") {
  require_device();
  std::mt19937 rng(1);
  const int vocab = 1000, hidden = 264, n = 37;
  const auto table = random_bf16_values(rng, static_cast<size_t>(vocab) * hidden);
  std::vector<int32_t> ids(n);
  std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
  for (auto& id : ids) id = pick(rng);
  ids[3] = -1;
  ids[10] = vocab;  // out of range: a zero row
  DeviceArray<bf16> d_table(to_bf16(table)), d_out(static_cast<size_t>(n) * hidden);
  DeviceArray<int32_t> d_ids(ids);
  // Scale 1: a copy; Gemma's sqrt(2560) as bf16 rounds it (50.5): each value times it, rounded to bf16 once.
  for (const float scale : {1.0f, round_bf16(std::sqrt(2560.0f))}) {
    INFO("scale " << scale);
    CUDA_REQUIRE(cuda::gather_rows(d_out.get(), d_table.get(), d_ids.get(), n, hidden, vocab, scale, nullptr));
    const auto out = to_float(d_out.download());
    for (int i = 0; i < n; ++i)
      for (int c = 0; c < hidden; ++c) {
        const float row = ids[i] >= 0 && ids[i] < vocab ? table[static_cast<size_t>(ids[i]) * hidden + c] : 0.f;
        REQUIRE(out[static_cast<size_t>(i) * hidden + c] == round_bf16(row * scale));
      }
  }
}

TEST_CASE("rms_norm and add_rms_norm match the CPU twins, with weight offsets 0 and 1 (Gemma)", "[gpu][layer_ops]") {
  require_device();
  std::mt19937 rng(2);
  for (const float offset : {0.0f, 1.0f})
  // Widths for each register layout of the kernel (1, 2, 4 and 8 chunks a thread of 256; 1,024 threads past 16,384),
  // full and ragged.
  for (const int hidden : {64, 896, 2048, 4096, 5120, 8192, 12296, 16384, 28680}) {
    for (const int rows : {1, 5, 130}) {
      INFO("weight offset " << offset);
      const size_t n = static_cast<size_t>(rows) * hidden;
      const auto x = random_bf16_values(rng, n, 2.0f);
      const auto residual = random_bf16_values(rng, n, 3.0f);
      auto weight = random_bf16_values(rng, hidden, 0.5f);
      for (auto& w : weight) w = round_bf16(w + 1.0f - offset);
      // The CPU twin takes the weights as the kernel applies them: weight + offset, in float32.
      std::vector<float> applied = weight;
      for (auto& w : applied) w += offset;
      const float eps = 1e-5f;
      DeviceArray<bf16> d_x(to_bf16(x)), d_res(to_bf16(residual)), d_w(to_bf16(weight)), d_out(n);

      std::vector<float> ref(n);
      cpu::rms_norm(ref.data(), x.data(), applied.data(), rows, hidden, eps);
      CUDA_REQUIRE(cuda::rms_norm(d_out.get(), d_x.get(), d_w.get(), rows, hidden, eps, offset, nullptr));
      check_close(to_float(d_out.download()), ref, "rms_norm hidden " + std::to_string(hidden));

      std::vector<float> ref_res = residual;
      cpu::add_rms_norm(ref.data(), ref_res.data(), x.data(), applied.data(), rows, hidden, eps);
      CUDA_REQUIRE(
          cuda::add_rms_norm(d_out.get(), d_res.get(), d_x.get(), d_w.get(), rows, hidden, eps, offset, nullptr));
      check_close(to_float(d_out.download()), ref, "add_rms_norm out, hidden " + std::to_string(hidden));
      check_close(to_float(d_res.download()), ref_res, "add_rms_norm residual, hidden " + std::to_string(hidden));
    }
  }
}

TEST_CASE("silu_and_mul and gelu_tanh_and_mul (Gemma's GeGLU) match the CPU twins", "[gpu][layer_ops]") {
  require_device();
  std::mt19937 rng(3);
  using CpuOp = void (*)(float*, const float*, int, int);
  using GpuOp = cudaError_t (*)(bf16*, const bf16*, int, int, cudaStream_t);
  const std::vector<std::tuple<std::string, CpuOp, GpuOp>> ops = {
      {"silu_and_mul", cpu::silu_and_mul, cuda::silu_and_mul},
      {"gelu_tanh_and_mul", cpu::gelu_tanh_and_mul, cuda::gelu_tanh_and_mul}};
  for (const auto& [name, cpu_op, gpu_op] : ops)
    for (const int inter : {8, 1024, 6912, 14336}) {  // 6912: Gemma 3 1B's intermediate size
      const int tokens = inter == 8 ? 70000 : 9;  // more rows than a grid is high: rows strided by its height
      const auto gate_up = random_bf16_values(rng, static_cast<size_t>(tokens) * 2 * inter, 3.0f);
      std::vector<float> ref(static_cast<size_t>(tokens) * inter);
      cpu_op(ref.data(), gate_up.data(), tokens, inter);
      DeviceArray<bf16> d_in(to_bf16(gate_up)), d_out(ref.size());
      CUDA_REQUIRE(gpu_op(d_out.get(), d_in.get(), tokens, inter, nullptr));
      check_close(to_float(d_out.download()), ref, name + " inter " + std::to_string(inter));
    }
}

TEST_CASE("soft_cap matches the CPU twin on float logits", "[gpu][layer_ops][gemma]") {
  require_device();
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 20.0f);
  for (const int64_t n : {int64_t{1}, int64_t{1000}, int64_t{3} * 262208}) {  // 262208: Gemma 3's vocabulary
    std::vector<float> x(n);
    for (auto& v : x) v = nd(rng);
    std::vector<float> ref = x;
    cpu::soft_cap(ref.data(), n, 30.0f);
    DeviceArray<float> d_x(x);
    CUDA_REQUIRE(cuda::soft_cap(d_x.get(), n, 30.0f, nullptr));
    const std::vector<float> got = d_x.download();
    double worst = 0;
    for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(double(got[i]) - ref[i]));
    INFO("n " << n);
    CHECK(worst < 1e-4);  // tanhf's few ulps, times the cap
  }
  CHECK(cuda::soft_cap(nullptr, 8, 0.0f, nullptr) == cudaErrorInvalidValue);
}

TEST_CASE("row kernels refuse widths that are not multiples of 8", "[gpu][layer_ops]") {
  require_device();
  DeviceArray<bf16> buf(64);
  const cudaError_t e = cuda::rms_norm(buf.get(), buf.get(), buf.get(), 1, 12, 1e-5f, 0.0f, nullptr);
  CHECK(e == cudaErrorInvalidValue);
  CHECK(cuda::describe_launch_error(e).find("hidden 12") != std::string::npos);
  const cudaError_t wide = cuda::add_rms_norm(buf.get(), buf.get(), buf.get(), buf.get(), 1, 65544, 1e-5f, 0.0f, nullptr);
  CHECK(wide == cudaErrorInvalidValue);
  CHECK(cuda::describe_launch_error(wide).find("hidden 65544") != std::string::npos);
}
