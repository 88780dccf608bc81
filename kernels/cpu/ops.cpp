#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "model/lora/lora_adapter.h"

namespace paged::cpu {

namespace {

// Dot product with eight independent accumulators so the compiler vectorises it. The summation order depends only
// on k, never on the batch, so a row's result is the same whatever else is in the batch.
inline float dot(const float* a, const float* b, int k) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= k; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < k; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

void rms_norm(float* out, const float* x, const float* weight, int rows, int dim, float eps) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<int64_t>(r) * dim;
    float* o = out + static_cast<int64_t>(r) * dim;
    double ss = 0.0;
    for (int i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / dim) + eps);
    for (int i = 0; i < dim; ++i) o[i] = weight[i] * (xr[i] * inv);
  }
}

void add_rms_norm(float* out, float* residual, const float* x, const float* weight, int rows, int dim, float eps) {
  const int64_t n = static_cast<int64_t>(rows) * dim;
  for (int64_t i = 0; i < n; ++i) residual[i] += x[i];
  rms_norm(out, residual, weight, rows, dim, eps);
}

void linear(float* out, const float* x, const float* w, const float* bias, int m, int n, int k) {
  // Weight rows outer: each row of w is read once and reused for every token of the batch.
  for (int j = 0; j < n; ++j) {
    const float* wj = w + static_cast<int64_t>(j) * k;
    const float b = bias ? bias[j] : 0.0f;
    for (int i = 0; i < m; ++i) out[static_cast<int64_t>(i) * n + j] = dot(x + static_cast<int64_t>(i) * k, wj, k) + b;
  }
}

void rope(float* q, float* k, const int32_t* positions, const float* inv_freq, int tokens, int num_heads,
          int num_kv_heads, int head_dim, int rotary_dim, float attention_factor) {
  const int half = rotary_dim / 2;
  std::vector<float> cos_t(half), sin_t(half);
  auto rotate = [&](float* v) {
    for (int i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * cos_t[i] - b * sin_t[i];
      v[i + half] = b * cos_t[i] + a * sin_t[i];
    }
  };
  for (int t = 0; t < tokens; ++t) {
    for (int i = 0; i < half; ++i) {
      // HF computes the angle in float32: position * inv_freq.
      const float angle = static_cast<float>(positions[t]) * inv_freq[i];
      cos_t[i] = std::cos(angle) * attention_factor;
      sin_t[i] = std::sin(angle) * attention_factor;
    }
    for (int h = 0; h < num_heads; ++h) rotate(q + (static_cast<int64_t>(t) * num_heads + h) * head_dim);
    for (int h = 0; h < num_kv_heads; ++h) rotate(k + (static_cast<int64_t>(t) * num_kv_heads + h) * head_dim);
  }
}

void reshape_and_cache(const float* k, const float* v, float* k_cache, float* v_cache, const int64_t* slot_mapping,
                       int tokens, int num_kv_heads, int head_dim, int block_size) {
  for (int t = 0; t < tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    if (slot < 0) continue;  // padding
    const int64_t block = slot / block_size, offset = slot % block_size;
    for (int h = 0; h < num_kv_heads; ++h) {
      const int64_t dst = ((block * num_kv_heads + h) * block_size + offset) * head_dim;
      const int64_t src = (static_cast<int64_t>(t) * num_kv_heads + h) * head_dim;
      std::memcpy(k_cache + dst, k + src, sizeof(float) * head_dim);
      std::memcpy(v_cache + dst, v + src, sizeof(float) * head_dim);
    }
  }
}

void paged_attention(float* out, const float* q, const float* k_cache, const float* v_cache,
                     const int32_t* block_tables, const int32_t* query_start, const int32_t* context_lens,
                     int num_seqs, int max_blocks_per_seq, int num_heads, int num_kv_heads, int head_dim,
                     int block_size, float scale, int window) {
  const int group = num_heads / num_kv_heads;
  std::vector<float> scores;
  std::vector<float> acc(head_dim);
  for (int s = 0; s < num_seqs; ++s) {
    const int32_t* table = block_tables + static_cast<int64_t>(s) * max_blocks_per_seq;
    const int q_begin = query_start[s], q_len = query_start[s + 1] - q_begin;
    const int ctx = context_lens[s];
    for (int i = 0; i < q_len; ++i) {
      const int pos = ctx - q_len + i;  // this query's position; it sees keys first..pos
      const int first = window > 0 ? std::max(0, pos - window + 1) : 0;
      scores.resize(pos + 1);
      for (int h = 0; h < num_heads; ++h) {
        const int kvh = h / group;
        const float* qv = q + (static_cast<int64_t>(q_begin + i) * num_heads + h) * head_dim;
        float max_score = -INFINITY;
        for (int j = first; j <= pos; ++j) {
          const int64_t base = ((static_cast<int64_t>(table[j / block_size]) * num_kv_heads + kvh) * block_size +
                                j % block_size) * head_dim;
          scores[j] = dot(qv, k_cache + base, head_dim) * scale;
          max_score = std::max(max_score, scores[j]);
        }
        float sum = 0.0f;
        for (int j = first; j <= pos; ++j) {
          scores[j] = std::exp(scores[j] - max_score);
          sum += scores[j];
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int j = first; j <= pos; ++j) {
          const int64_t base = ((static_cast<int64_t>(table[j / block_size]) * num_kv_heads + kvh) * block_size +
                                j % block_size) * head_dim;
          const float p = scores[j];
          for (int d = 0; d < head_dim; ++d) acc[d] += p * v_cache[base + d];
        }
        float* o = out + (static_cast<int64_t>(q_begin + i) * num_heads + h) * head_dim;
        const float inv = 1.0f / sum;
        for (int d = 0; d < head_dim; ++d) o[d] = acc[d] * inv;
      }
    }
  }
}

void silu_and_mul(float* out, const float* gate_up, int tokens, int inter) {
  for (int t = 0; t < tokens; ++t) {
    const float* g = gate_up + static_cast<int64_t>(t) * 2 * inter;
    const float* u = g + inter;
    float* o = out + static_cast<int64_t>(t) * inter;
    for (int i = 0; i < inter; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

void gelu_tanh_and_mul(float* out, const float* gate_up, int tokens, int inter) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  for (int t = 0; t < tokens; ++t) {
    const float* g = gate_up + static_cast<int64_t>(t) * 2 * inter;
    const float* u = g + inter;
    float* o = out + static_cast<int64_t>(t) * inter;
    for (int i = 0; i < inter; ++i) {
      const float x = g[i];
      o[i] = 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x))) * u[i];
    }
  }
}

void soft_cap(float* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) x[i] = std::tanh(x[i] / cap) * cap;
}

void copy_blocks(float* cache, std::span<const std::pair<int32_t, int32_t>> src_dst, int64_t block_elems) {
  for (const auto& [src, dst] : src_dst)
    std::memcpy(cache + dst * block_elems, cache + src * block_elems, sizeof(float) * block_elems);
}

void add_lora_pairs(float* out, const float* x, int k, const std::vector<LoraPair>& pairs, std::vector<float>& ax) {
  for (const LoraPair& p : pairs) {
    ax.assign(static_cast<size_t>(p.rank), 0.0f);
    for (int j = 0; j < p.rank; ++j) {
      const float* a = &p.a[static_cast<size_t>(j) * k];
      float sum = 0.0f;
      for (int i = 0; i < k; ++i) sum += a[i] * x[i];
      ax[j] = p.scale * sum;
    }
    for (int i = 0; i < p.out_rows; ++i) {
      const float* b = &p.b[static_cast<size_t>(i) * p.rank];
      float sum = 0.0f;
      for (int j = 0; j < p.rank; ++j) sum += b[j] * ax[j];
      out[p.out_offset + i] += sum;
    }
  }
}

}  // namespace paged::cpu
