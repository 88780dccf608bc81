// Where the tests find the shared model and golden outputs, and small JSON helpers for them.
#pragma once

#include <catch2/catch.hpp>

#include <boost/json.hpp>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "model/tokenizer.h"

namespace paged::test {

inline const std::string kShared = PAGED_SHARED_DIR;
inline const std::string kModel = kShared + "/models/stories260K";
inline const std::string kGolden = kShared + "/golden/stories260K-greedy.json";

/// The parsed JSON file; fails the test when it cannot be read.
inline boost::json::value read_json(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  return boost::json::parse(ss.str());
}

/// A JSON array of integers as token ids.
inline std::vector<TokenId> ids_of(const boost::json::value& v) {
  std::vector<TokenId> out;
  for (const auto& x : v.as_array()) out.push_back(static_cast<TokenId>(x.to_number<int64_t>()));
  return out;
}

}  // namespace paged::test
