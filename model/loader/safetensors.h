// Memory-mapped safetensors checkpoints (single file or sharded through model.safetensors.index.json).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "model/loader/config.h"

namespace paged {

/// A tensor's element type. f8_e4m3: the e4m3 codes of a pre-quantised FP8 checkpoint (safetensors' F8_E4M3), which
/// mean something only with the scales beside them (model/loader/fp8_checkpoint.h).
enum class DType { f32, f16, bf16, f8_e4m3 };

/// The safetensors name: F32, F16, BF16, F8_E4M3.
const char* dtype_name(DType d);
/// Bytes per element.
size_t dtype_size(DType d);

/// A tensor inside a mapped file: valid while the SafeTensors object lives.
struct TensorView {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
  int64_t numel() const;
  /// Elements [first, first + n) (row-major) as float32 into out: an F8_E4M3 tensor's code values, without the
  /// scales they need (Fp8WeightScales::dequantise applies them).
  void to_floats(int64_t first, int64_t n, float* out) const;
};

/// float32 <-> bf16/f16 conversions (round to nearest even).
float bf16_to_float(uint16_t v);
uint16_t float_to_bf16(float f);
float f16_to_float(uint16_t v);
uint16_t float_to_f16(float f);
/// The value of the OCP e4m3 ("e4m3fn": bias 7, 3 mantissa bits, no infinities, largest 448) code `v`; 0x7f and 0xff
/// are NaN.
float e4m3_to_float(uint8_t v);

/// Every tensor of a checkpoint folder. Each header is parsed with Boost.JSON and every offset, dtype and shape is
/// checked against the file before any byte is read; a problem throws ModelError naming the file and tensor.
class SafeTensors {
 public:
  /// Called as loading goes: bytes of the distinct tensors handed out by get() so far, of all the checkpoint's.
  using LoadObserver = std::function<void(int64_t loaded_bytes, int64_t total_bytes)>;

  explicit SafeTensors(const std::string& model_dir, LoadObserver observer = {});
  /// One safetensors file (a LoRA adapter's adapter_model.safetensors).
  struct File {
    std::string path;
  };
  explicit SafeTensors(File file);
  ~SafeTensors();
  SafeTensors(const SafeTensors&) = delete;
  SafeTensors& operator=(const SafeTensors&) = delete;

  bool contains(const std::string& name) const;
  /// Throws ModelError when absent, or when `expected_shape` is given and differs. The first get() of a tensor
  /// counts it as loaded for the observer (thread-safe: tensor-parallel ranks load at once).
  const TensorView& get(const std::string& name, const std::vector<int64_t>& expected_shape = {}) const;
  /// Bytes of every tensor of the checkpoint.
  int64_t total_bytes() const { return total_bytes_; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }

 private:
  struct Mapping;
  void map_files(const std::vector<std::string>& paths);
  std::vector<std::unique_ptr<Mapping>> files_;
  std::map<std::string, TensorView> tensors_;
  int64_t total_bytes_ = 0;
  LoadObserver observer_;
  mutable std::mutex loaded_mu_;
  mutable std::set<std::string> loaded_;  // tensors handed out so far
  mutable int64_t loaded_bytes_ = 0;
};

}  // namespace paged
