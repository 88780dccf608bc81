// One step of a 64-bit chained hash, shared by every content-keyed table (prefix cache blocks, router affinity).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace paged {

/// splitmix64's finaliser over h ^ (x + golden ratio): a cheap, well-mixed step for chaining 64-bit words into a hash.
inline uint64_t hash_mix(uint64_t h, uint64_t x) {
  h ^= x + 0x9e3779b97f4a7c15ULL;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
  return h ^ (h >> 31);
}

/// A 64-bit hash of bytes: their length, then each 8-byte word (the last zero-padded), chained by hash_mix.
inline uint64_t hash_bytes(std::string_view bytes) {
  uint64_t h = hash_mix(0, bytes.size());
  for (size_t i = 0; i < bytes.size(); i += 8) {
    uint64_t word = 0;
    std::memcpy(&word, bytes.data() + i, std::min<size_t>(8, bytes.size() - i));
    h = hash_mix(h, word);
  }
  return h;
}

}  // namespace paged
