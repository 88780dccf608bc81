// Pre-quantised FP8 checkpoints for the tests, written at test time by tools/make_fp8_checkpoints.py (pure python3)
// from a float32 checkpoint: each layout L as OUT/L, and OUT/L-ref its weights dequantised in Python (code x scale).
#pragma once

#include <catch2/catch.hpp>

#include <cstdlib>
#include <mutex>
#include <set>
#include <string>

namespace paged::test {

/// Every layout the script writes, in its order.
inline const char* const kFp8Layouts[] = {"fp8-tensor", "fp8-tensor-static", "fp8-block", "fp8-block-small",
                                          "ct-channel", "ct-tensor-static", "ct-block"};

/// Writes `layouts` (comma-separated) of the float32 checkpoint `src` into `out` (--random-llama: a seeded random
/// float32 Llama into `src` first); fails the test when the script fails.
inline void make_fp8_checkpoints(const std::string& src, const std::string& out, const std::string& layouts,
                                 bool random_llama = false) {
  // $PAGED_SOURCE_DIR where the sources are not where they were built (the GPU machine: run_gpu_checks.sh sets it).
  const char* sources = std::getenv("PAGED_SOURCE_DIR");
  const std::string script =
      "python3 '" + std::string(sources ? sources : PAGED_SOURCE_DIR) + "/tools/make_fp8_checkpoints.py' ";
  if (random_llama) REQUIRE(std::system((script + "--random-llama '" + src + "'").c_str()) == 0);
  REQUIRE(std::system((script + "'" + src + "' '" + out + "' --layouts " + layouts).c_str()) == 0);
}

/// make_fp8_checkpoints(src, out, layouts) the first time this process asks for `out`; returns `out`.
inline std::string fp8_checkpoints_once(const std::string& src, const std::string& out, const std::string& layouts) {
  static std::mutex mu;
  static std::set<std::string> written;
  std::lock_guard lock(mu);
  if (!written.count(out)) {
    make_fp8_checkpoints(src, out, layouts);
    written.insert(out);
  }
  return out;
}

/// Every layout, comma-separated (the script's --layouts).
inline std::string all_fp8_layouts() {
  std::string list;
  for (const char* l : kFp8Layouts) list += (list.empty() ? "" : ",") + std::string(l);
  return list;
}

}  // namespace paged::test
