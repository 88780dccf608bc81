#include "model/loader/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <boost/json.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include "model/json_file.h"

namespace paged {
namespace json = boost::json;
namespace fs = std::filesystem;

const char* dtype_name(DType d) {
  switch (d) {
    case DType::f32: return "F32";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::f8_e4m3: return "F8_E4M3";
  }
  return "?";
}

size_t dtype_size(DType d) { return d == DType::f32 ? 4 : d == DType::f8_e4m3 ? 1 : 2; }

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void TensorView::to_floats(int64_t first, int64_t n, float* out) const {
  const auto* bytes = static_cast<const unsigned char*>(data) + first * static_cast<int64_t>(dtype_size(dtype));
  uint16_t half = 0;
  switch (dtype) {
    case DType::f32: std::memcpy(out, bytes, static_cast<size_t>(n) * 4); break;
    case DType::f16:
      for (int64_t i = 0; i < n; ++i) {
        std::memcpy(&half, bytes + 2 * i, 2);
        out[i] = f16_to_float(half);
      }
      break;
    case DType::bf16:
      for (int64_t i = 0; i < n; ++i) {
        std::memcpy(&half, bytes + 2 * i, 2);
        out[i] = bf16_to_float(half);
      }
      break;
    case DType::f8_e4m3:
      for (int64_t i = 0; i < n; ++i) out[i] = e4m3_to_float(bytes[i]);
      break;
  }
}

float bf16_to_float(uint16_t v) { return std::bit_cast<float>(static_cast<uint32_t>(v) << 16); }

uint16_t float_to_bf16(float f) {
  uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

float f16_to_float(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { mant <<= 1; ++e; } while (!(mant & 0x400u));
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  return std::bit_cast<float>(bits);
}

float e4m3_to_float(uint8_t v) {
  static const std::array<float, 256> values = [] {  // by code: a table, since loading decodes every weight
    std::array<float, 256> t{};
    for (int code = 0; code < 256; ++code) {
      const int exponent = (code >> 3) & 0xf, mantissa = code & 7;
      const float magnitude = exponent == 0 ? std::ldexp(mantissa / 8.0f, -6)  // subnormal
                                            : std::ldexp(1.0f + mantissa / 8.0f, exponent - 7);
      t[code] = exponent == 0xf && mantissa == 7 ? std::nanf("") : (code & 0x80) ? -magnitude : magnitude;
    }
    return t;
  }();
  return values[v];
}

uint16_t float_to_f16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (absx < 0x38800000u) {  // subnormal or zero in half
    const float a = std::bit_cast<float>(absx);
    // 2^-24 is the smallest half subnormal; rounding handled by the float add trick.
    float scaled = a * 16777216.0f;  // a / 2^-24
    uint32_t m = static_cast<uint32_t>(std::nearbyint(scaled));
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t exp = ((absx >> 23) - 127 + 15) << 10;
  uint32_t mant = absx & 0x7fffffu;
  uint32_t h = exp | (mant >> 13);
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

struct SafeTensors::Mapping {
  std::string path;
  void* base = MAP_FAILED;
  size_t size = 0;
  ~Mapping() {
    if (base != MAP_FAILED) munmap(base, size);
  }
};

namespace {

DType parse_dtype(std::string_view s, const std::string& where) {
  if (s == "F32") return DType::f32;
  if (s == "F16") return DType::f16;
  if (s == "BF16") return DType::bf16;
  if (s == "F8_E4M3") return DType::f8_e4m3;
  if (s == "F8_E5M2")
    throw ModelError(where + ": dtype F8_E5M2 is not supported (FP8 checkpoints load as F8_E4M3 with their scales)");
  throw ModelError(where + ": unsupported dtype " + std::string(s) + " (supported: F32, F16, BF16, F8_E4M3)");
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

SafeTensors::SafeTensors(const std::string& model_dir, LoadObserver observer) : observer_(std::move(observer)) {
  fs::path dir(model_dir);
  std::vector<fs::path> shards;
  if (fs::exists(dir / "model.safetensors.index.json")) {
    const json::object index = read_json_object<ModelError>(dir / "model.safetensors.index.json");
    const json::value* weight_map = index.if_contains("weight_map");
    if (!weight_map || !weight_map->is_object())
      throw ModelError("model.safetensors.index.json: malformed (needs an object 'weight_map')");
    std::set<std::string> files;
    for (const auto& kv : weight_map->get_object()) {
      if (!kv.value().is_string()) throw ModelError("model.safetensors.index.json: weight_map values must be strings");
      std::string f(kv.value().as_string());
      if (f.find('/') != std::string::npos) throw ModelError("model.safetensors.index.json: bad shard name " + f);
      files.insert(f);
    }
    for (const auto& f : files) shards.push_back(dir / f);
  } else if (fs::exists(dir / "model.safetensors")) {
    shards.push_back(dir / "model.safetensors");
  } else {
    throw ModelError("no model.safetensors or model.safetensors.index.json in " + model_dir);
  }
  std::vector<std::string> paths;
  for (const auto& path : shards) paths.push_back(path.string());
  map_files(paths);
}

SafeTensors::SafeTensors(File file) { map_files({file.path}); }

void SafeTensors::map_files(const std::vector<std::string>& paths) {
  for (const auto& path : paths) {
    auto m = std::make_unique<Mapping>();
    m->path = path;
    int fd = ::open(m->path.c_str(), O_RDONLY);
    if (fd < 0) throw ModelError("cannot open " + m->path);
    struct stat st{};
    fstat(fd, &st);
    m->size = static_cast<size_t>(st.st_size);
    if (m->size < 8) {
      ::close(fd);
      throw ModelError(m->path + ": truncated (shorter than the 8-byte header length)");
    }
    m->base = mmap(nullptr, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (m->base == MAP_FAILED) throw ModelError("cannot map " + m->path);
    const auto* bytes = static_cast<const unsigned char*>(m->base);
    uint64_t header_len = 0;
    std::memcpy(&header_len, bytes, 8);  // little-endian, as the format says and x86 is
    if (header_len > m->size - 8)
      throw ModelError(m->path + ": truncated (header length " + std::to_string(header_len) + " beyond the file)");
    boost::system::error_code ec;
    json::value header = json::parse(
        std::string_view(reinterpret_cast<const char*>(bytes + 8), header_len), ec);
    if (ec || !header.is_object()) throw ModelError(m->path + ": malformed JSON header");
    const size_t data_start = 8 + header_len;
    const size_t data_size = m->size - data_start;
    for (const auto& kv : header.as_object()) {
      std::string name(kv.key());
      if (name == "__metadata__") continue;
      const std::string where = m->path + ": tensor '" + name + "'";
      if (!kv.value().is_object()) throw ModelError(where + ": entry is not an object");
      const auto& e = kv.value().as_object();
      if (!e.contains("dtype") || !e.at("dtype").is_string() || !e.contains("shape") ||
          !e.at("shape").is_array() || !e.contains("data_offsets") || !e.at("data_offsets").is_array() ||
          e.at("data_offsets").as_array().size() != 2)
        throw ModelError(where + ": needs dtype, shape and two data_offsets");
      TensorView t;
      t.dtype = parse_dtype(e.at("dtype").as_string(), where);
      uint64_t numel = 1;  // saturates instead of wrapping: a huge shape must not pass for a small one
      for (const auto& d : e.at("shape").as_array()) {
        if (!d.is_int64() || d.as_int64() < 0) throw ModelError(where + ": bad shape");
        t.shape.push_back(d.as_int64());
        const auto dim = static_cast<uint64_t>(d.as_int64());
        numel = dim != 0 && numel > UINT64_MAX / dim ? UINT64_MAX : numel * dim;
      }
      const auto& off = e.at("data_offsets").as_array();
      if (!off[0].is_int64() || !off[1].is_int64() || off[0].as_int64() < 0 || off[1].as_int64() < off[0].as_int64())
        throw ModelError(where + ": bad data_offsets");
      auto begin = static_cast<uint64_t>(off[0].as_int64()), end = static_cast<uint64_t>(off[1].as_int64());
      if (end > data_size)
        throw ModelError(where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                         ") out of range (data section holds " + std::to_string(data_size) + " bytes; truncated?)");
      t.nbytes = end - begin;
      if (numel > t.nbytes || numel * dtype_size(t.dtype) != t.nbytes)
        throw ModelError(where + ": shape " + shape_str(t.shape) + " does not match its " +
                         std::to_string(t.nbytes) + " bytes");
      t.data = bytes + data_start + begin;
      if (tensors_.count(name)) throw ModelError(where + ": duplicated across shards");
      total_bytes_ += static_cast<int64_t>(t.nbytes);
      tensors_.emplace(std::move(name), std::move(t));
    }
    files_.push_back(std::move(m));
  }
}

SafeTensors::~SafeTensors() = default;

bool SafeTensors::contains(const std::string& name) const { return tensors_.count(name) != 0; }

const TensorView& SafeTensors::get(const std::string& name, const std::vector<int64_t>& expected_shape) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw ModelError("checkpoint lacks tensor '" + name + "'");
  if (!expected_shape.empty() && it->second.shape != expected_shape)
    throw ModelError("tensor '" + name + "' has shape " + shape_str(it->second.shape) + " but the config implies " +
                     shape_str(expected_shape));
  if (observer_) {
    std::lock_guard lock(loaded_mu_);
    if (loaded_.insert(name).second) {
      loaded_bytes_ += static_cast<int64_t>(it->second.nbytes);
      observer_(loaded_bytes_, total_bytes_);
    }
  }
  return it->second;
}

}  // namespace paged
