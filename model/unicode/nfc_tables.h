// The Unicode data behind NFC (model/unicode/nfc.cpp): canonical decompositions and combining classes of Unicode
// 14.0, kept in model/unicode/nfc_tables.cpp. Internal to NFC.
#pragma once

#include <cstdint>
#include <span>

namespace paged::unicode::nfc_tables {

struct PairDecomposition {
  char32_t code_point, first, second;
  bool recomposes;  // false for the composition exclusions
};
struct SingletonDecomposition {
  char32_t code_point, replacement;
};
struct CombiningClassRange {
  char32_t first, last;
  uint8_t combining_class;
};

/// Every canonical decomposition into two code points, sorted by code_point.
std::span<const PairDecomposition> pair_decompositions();

/// Every canonical decomposition into one code point, sorted by code_point.
std::span<const SingletonDecomposition> singleton_decompositions();

/// The ranges of code points that share one nonzero canonical combining class, sorted and disjoint.
std::span<const CombiningClassRange> combining_class_ranges();

}  // namespace paged::unicode::nfc_tables
