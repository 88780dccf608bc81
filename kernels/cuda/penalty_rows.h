// The host side of cuda::apply_penalties: a sequence's logits processing (paged::PenaltyOps, model/sampling) packed
// into the rows and sections the kernel reads. Host C++ only (the .cu files do not include model/ headers).
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/cuda/sampling.h"
#include "model/sampling/sampler.h"

namespace paged::cuda {

/// Appends `ops` for logits row `logits_row` to the arrays apply_penalties reads.
inline void append_penalty_row(const PenaltyOps& ops, int32_t logits_row, std::vector<PenaltyRow>& rows,
                               std::vector<int32_t>& ids, std::vector<float>& values) {
  PenaltyRow row{.logits_row = logits_row, .repetition = ops.repetition};
  const auto section = [&](const auto& entries) {
    for (const auto& e : entries) {
      if constexpr (std::is_same_v<std::decay_t<decltype(e)>, TokenId>) {
        ids.push_back(e);
        values.push_back(0.0f);
      } else {
        ids.push_back(e.first);
        values.push_back(e.second);
      }
    }
    return static_cast<int32_t>(ids.size());
  };
  row.bias = static_cast<int32_t>(ids.size());
  row.masked = section(ops.bias);
  row.repeated = section(ops.masked);
  row.subtract = section(ops.repeated);
  row.end = section(ops.subtract);
  rows.push_back(row);
}

}  // namespace paged::cuda
