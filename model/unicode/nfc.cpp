#include "model/unicode/nfc.h"

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <unordered_set>

#include "model/unicode/nfc_tables.h"
#include "model/unicode/utf8.h"

namespace paged::unicode {
namespace {

using nfc_tables::CombiningClassRange;
using nfc_tables::PairDecomposition;
using nfc_tables::SingletonDecomposition;

// Hangul syllables compose and decompose by arithmetic (Unicode 3.12).
constexpr char32_t kHangulFirst = 0xAC00, kLeadingFirst = 0x1100, kVowelFirst = 0x1161, kTrailingBase = 0x11A7;
constexpr char32_t kLeadingCount = 19, kVowelCount = 21, kTrailingCount = 28;
constexpr char32_t kHangulCount = kLeadingCount * kVowelCount * kTrailingCount;

// The entry of `table` (sorted by code_point) for `cp`, or null.
template <class Entry>
const Entry* find_entry(std::span<const Entry> table, char32_t cp) {
  auto it =
      std::lower_bound(table.begin(), table.end(), cp, [](const Entry& e, char32_t c) { return e.code_point < c; });
  return it != table.end() && it->code_point == cp ? &*it : nullptr;
}

uint8_t combining_class(char32_t cp) {
  const std::span<const CombiningClassRange> ranges = nfc_tables::combining_class_ranges();
  auto it = std::upper_bound(ranges.begin(), ranges.end(), cp,
                             [](char32_t c, const CombiningClassRange& r) { return c < r.first; });
  return it != ranges.begin() && cp <= (it - 1)->last ? (it - 1)->combining_class : 0;
}

void append_decomposition(char32_t cp, std::u32string& out) {
  if (cp >= kHangulFirst && cp < kHangulFirst + kHangulCount) {
    const char32_t index = cp - kHangulFirst;
    out += kLeadingFirst + index / (kVowelCount * kTrailingCount);
    out += kVowelFirst + index % (kVowelCount * kTrailingCount) / kTrailingCount;
    if (index % kTrailingCount != 0) out += kTrailingBase + index % kTrailingCount;
  } else if (const PairDecomposition* pair = find_entry(nfc_tables::pair_decompositions(), cp)) {
    append_decomposition(pair->first, out);
    append_decomposition(pair->second, out);
  } else if (const SingletonDecomposition* singleton = find_entry(nfc_tables::singleton_decompositions(), cp)) {
    append_decomposition(singleton->replacement, out);
  } else {
    out += cp;
  }
}

// The primary composite of `first` followed by `second`, or 0.
char32_t compose(char32_t first, char32_t second) {
  if (first >= kLeadingFirst && first < kLeadingFirst + kLeadingCount && second >= kVowelFirst &&
      second < kVowelFirst + kVowelCount) {
    return kHangulFirst + ((first - kLeadingFirst) * kVowelCount + second - kVowelFirst) * kTrailingCount;
  }
  if (first >= kHangulFirst && first < kHangulFirst + kHangulCount && (first - kHangulFirst) % kTrailingCount == 0 &&
      second > kTrailingBase && second < kTrailingBase + kTrailingCount) {
    return first + second - kTrailingBase;
  }
  static const std::unordered_map<uint64_t, char32_t> composites = [] {
    std::unordered_map<uint64_t, char32_t> map;
    for (const PairDecomposition& pair : nfc_tables::pair_decompositions()) {
      if (pair.recomposes) map.emplace(static_cast<uint64_t>(pair.first) << 32 | pair.second, pair.code_point);
    }
    return map;
  }();
  auto it = composites.find(static_cast<uint64_t>(first) << 32 | second);
  return it == composites.end() ? 0 : it->second;
}

// True when NFC leaves `text` as it is because it has none of the characters that NFC may change or move: the
// non-starters, those that compose with what precedes them, and those with a decomposition that does not recompose.
// Below U+0300 there are none.
bool stays_under_nfc(std::string_view text) {
  static const std::unordered_set<char32_t> suspects = [] {
    std::unordered_set<char32_t> set;
    for (const CombiningClassRange& range : nfc_tables::combining_class_ranges()) {
      for (char32_t cp = range.first; cp <= range.last; ++cp) set.insert(cp);
    }
    for (const PairDecomposition& pair : nfc_tables::pair_decompositions())
      set.insert(pair.recomposes ? pair.second : pair.code_point);
    for (const SingletonDecomposition& singleton : nfc_tables::singleton_decompositions())
      set.insert(singleton.code_point);
    for (char32_t cp = kVowelFirst; cp < kVowelFirst + kVowelCount; ++cp) set.insert(cp);
    for (char32_t cp = kTrailingBase + 1; cp < kTrailingBase + kTrailingCount; ++cp) set.insert(cp);
    return set;
  }();
  for (size_t i = 0; i < text.size();) {
    if (static_cast<unsigned char>(text[i]) < 0xCC) {  // below U+0300
      ++i;
      continue;
    }
    const utf8::Char c = utf8::next(text.substr(i));
    if (suspects.contains(c.code_point)) return false;
    i += c.length;
  }
  return true;
}

}  // namespace

std::string nfc(std::string_view text) {
  if (stays_under_nfc(text)) return std::string(text);

  std::u32string decomposed;
  for (size_t i = 0; i < text.size();) {
    const utf8::Char c = utf8::next(text.substr(i));
    append_decomposition(c.code_point, decomposed);
    i += c.length;
  }

  // Canonical ordering: a stable sort of each run of non-starters by combining class.
  for (size_t i = 1; i < decomposed.size(); ++i) {
    const uint8_t cls = combining_class(decomposed[i]);
    for (size_t j = i; cls != 0 && j > 0 && combining_class(decomposed[j - 1]) > cls; --j)
      std::swap(decomposed[j - 1], decomposed[j]);
  }

  // Canonical composition: a character joins the last starter unless a character between them blocks it (one of
  // combining class 0 or of a class not below its own).
  std::u32string composed;
  size_t starter = std::u32string::npos;
  uint8_t last_class = 0;
  for (const char32_t cp : decomposed) {
    const uint8_t cls = combining_class(cp);
    if (starter != std::u32string::npos) {
      const bool adjacent = composed.size() == starter + 1;
      if (adjacent || (last_class != 0 && last_class < cls)) {
        if (const char32_t composite = compose(composed[starter], cp)) {
          composed[starter] = composite;
          continue;
        }
      }
    }
    if (cls == 0) starter = composed.size();
    last_class = cls;
    composed += cp;
  }

  std::string out;
  out.reserve(text.size());
  for (const char32_t cp : composed) utf8::append(out, cp);
  return out;
}

}  // namespace paged::unicode
