// The disk tier's files: one file per KV block of one tensor-parallel rank, named by the model's identity and the
// block's restart-stable key (the chained hash of its whole token prefix), holding the block's tokens and salt for
// verification and its KV bytes with a checksum. Pure C++ file I/O: no CAF, no CUDA. Thread-compatible: the
// executor that owns the host pool uses it.
//
// Layout (little-endian): "PGKV0001", identity u64, rank u32, key u64, salt u64, token count u32, KV bytes u64,
// checksum of the KV bytes u64, the token ids (i32 each), the KV bytes. A file that differs in any field, is shorter
// or longer, or whose checksum fails is a miss: load() never hands out KV that this block did not write.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

#include "model/types.h"

namespace paged {

class KvDiskStore {
 public:
  /// Files of model `identity` (a hash of what makes its KV: weights, dtype, block size, tensor parallelism) and
  /// tensor-parallel `rank` in `dir`, which must exist.
  KvDiskStore(std::filesystem::path dir, uint64_t identity, int rank);

  /// DIR/<identity>-<key>.kv for rank 0, DIR/<identity>-<key>-r<rank>.kv for the others (16 hex digits each).
  std::filesystem::path path_of(uint64_t key) const;
  /// Writes the block's file (a temporary file renamed over it). False on an I/O error, leaving no file.
  bool save(uint64_t key, uint64_t salt, std::span<const TokenId> tokens, std::span<const std::byte> kv) const;
  /// Fills `kv` from the block's file if it holds exactly this identity, rank, key, salt and tokens and kv.size()
  /// KV bytes whose checksum matches; false otherwise (a missing, truncated, corrupt or foreign file).
  bool load(uint64_t key, uint64_t salt, std::span<const TokenId> tokens, std::span<std::byte> kv) const;
  /// Deletes the block's file, if there is one.
  void remove(uint64_t key) const;

  /// The keys of the rank-0 files of `identity` in `dir`, least recently written first (empty for a missing dir).
  static std::vector<uint64_t> list_keys(const std::filesystem::path& dir, uint64_t identity);

 private:
  std::filesystem::path dir_;
  uint64_t identity_;
  int rank_;
};

}  // namespace paged
