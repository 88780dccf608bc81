// An independent safetensors reader and writer for the loader tests (not the project's SafeTensors): whole files as
// bytes, tensors as name, dtype, shape and raw bytes.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <boost/json.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace paged::test {

/// The whole file's bytes; fails the test when it cannot be read.
inline std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Writes `bytes` as the whole file; fails the test when it cannot.
inline void write_bytes(const std::filesystem::path& p, std::string_view bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  REQUIRE(out);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// One tensor of a safetensors file: its raw little-endian bytes.
struct RawTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

/// The tensors of the file, sorted by name.
inline std::vector<RawTensor> read_safetensors(const std::filesystem::path& p) {
  const std::string file = read_bytes(p);
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  const boost::json::object header = boost::json::parse(std::string_view(file).substr(8, n)).as_object();
  const size_t data = 8 + n;
  std::vector<RawTensor> out;
  for (const auto& kv : header) {
    if (kv.key() == "__metadata__") continue;
    const auto& e = kv.value().as_object();
    RawTensor t;
    t.name = std::string(kv.key());
    t.dtype = std::string(e.at("dtype").as_string());
    for (const auto& d : e.at("shape").as_array()) t.shape.push_back(d.to_number<int64_t>());
    const auto& off = e.at("data_offsets").as_array();
    const auto b = off[0].to_number<size_t>(), en = off[1].to_number<size_t>();
    t.bytes = file.substr(data + b, en - b);
    out.push_back(std::move(t));
  }
  std::sort(out.begin(), out.end(), [](const RawTensor& a, const RawTensor& b) { return a.name < b.name; });
  return out;
}

/// Writes tensors in order; `edit_header` may change the header (offsets, dtypes, shapes) before it is written.
inline void write_safetensors(const std::filesystem::path& p, const std::vector<RawTensor>& tensors,
                       const std::function<void(boost::json::object&)>& edit_header = {}) {
  boost::json::object header;
  header["__metadata__"] = boost::json::object{{"format", "pt"}};
  std::string data;
  for (const auto& t : tensors) {
    boost::json::array shape;
    for (int64_t d : t.shape) shape.push_back(d);
    header[t.name] = boost::json::object{{"dtype", t.dtype},
                                  {"shape", shape},
                                  {"data_offsets", boost::json::array{data.size(), data.size() + t.bytes.size()}}};
    data += t.bytes;
  }
  if (edit_header) edit_header(header);
  std::string h = boost::json::serialize(header);
  while (h.size() % 8) h += ' ';
  uint64_t n = h.size();
  std::string file(reinterpret_cast<const char*>(&n), 8);
  write_bytes(p, file + h + data);
}

/// The tensor `name` of `ts` (the test fails when it is absent).
inline RawTensor& find_tensor(std::vector<RawTensor>& ts, const std::string& name) {
  auto it = std::find_if(ts.begin(), ts.end(), [&](const RawTensor& t) { return t.name == name; });
  REQUIRE(it != ts.end());
  return *it;
}

}  // namespace paged::test
