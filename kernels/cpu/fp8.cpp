#include "kernels/cpu/fp8.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

namespace paged::cpu {

namespace {

// The 127 non-negative finite e4m3 values, by code (0x00 .. 0x7e): increasing with the code.
const std::array<float, 127>& positive_values() {
  static const std::array<float, 127> values = [] {
    std::array<float, 127> v{};
    for (int code = 0; code < 127; ++code) v[code] = e4m3_to_float(static_cast<uint8_t>(code));
    return v;
  }();
  return values;
}

}  // namespace

uint8_t float_to_e4m3(float x) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const float a = std::fabs(x);
  const auto& v = positive_values();
  if (a >= v.back()) return sign | 0x7e;
  // The first value above a, and the one below: the nearer, ties to the even code.
  const int hi = static_cast<int>(std::upper_bound(v.begin(), v.end(), a) - v.begin()), lo = hi - 1;
  const float below = a - v[lo], above = v[hi] - a;
  const int code = below < above ? lo : above < below ? hi : (lo % 2 == 0 ? lo : hi);
  return sign | static_cast<uint8_t>(code);
}

void quantize_rows_fp8(const float* x, int64_t rows, int cols, uint8_t* q, float* scale) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * cols;
    float absmax = 0.0f;
    for (int c = 0; c < cols; ++c) absmax = std::max(absmax, std::fabs(row[c]));
    const float inv = absmax > 0.0f ? kFp8Max / absmax : 1.0f;
    scale[r] = absmax > 0.0f ? absmax / kFp8Max : 1.0f;
    for (int c = 0; c < cols; ++c) q[r * cols + c] = float_to_e4m3(row[c] * inv);
  }
}

void fake_quantize_rows_fp8(float* x, int64_t rows, int cols) {
  std::vector<uint8_t> q(cols);
  for (int64_t r = 0; r < rows; ++r) {
    float scale = 1.0f;
    quantize_rows_fp8(x + r * cols, 1, cols, q.data(), &scale);
    for (int c = 0; c < cols; ++c) x[r * cols + c] = e4m3_to_float(q[c]) * scale;
  }
}

void linear_fp8(float* out, const uint8_t* xq, const float* scale_x, const uint8_t* wq, const float* scale_w,
                const float* bias, int m, int n, int k) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int c = 0; c < k; ++c)
        acc += e4m3_to_float(xq[int64_t{i} * k + c]) * e4m3_to_float(wq[int64_t{j} * k + c]);
      out[int64_t{i} * n + j] = acc * scale_x[i] * scale_w[j] + (bias ? bias[j] : 0.0f);
    }
}

}  // namespace paged::cpu
