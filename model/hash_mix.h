// One step of a 64-bit chained hash, shared by every content-keyed table (prefix cache blocks, router affinity).
#pragma once

#include <cstdint>

namespace paged {

/// splitmix64's finaliser over h ^ (x + golden ratio): a cheap, well-mixed step for chaining 64-bit words into a hash.
inline uint64_t hash_mix(uint64_t h, uint64_t x) {
  h ^= x + 0x9e3779b97f4a7c15ULL;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
  return h ^ (h >> 31);
}

}  // namespace paged
