// The token ids the KV tests fill blocks with: n consecutive ids from `first`, so that blocks of different runs never
// share content by accident.
#pragma once

#include <numeric>
#include <vector>

#include "model/types.h"

namespace paged::test {

/// [first, first + n).
inline std::vector<TokenId> iota_tokens(int n, TokenId first) {
  std::vector<TokenId> t(n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

}  // namespace paged::test
