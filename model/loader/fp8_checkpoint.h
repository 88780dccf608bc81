// Pre-quantised FP8 checkpoints in the Hugging Face formats people publish: config.json's quantization_config read
// into an Fp8Checkpoint (model/loader/config.h), and the scales beside each F8_E4M3 weight. Formats:
//   quant_method "fp8" (vLLM / AutoFP8): `weight` F8_E4M3 [out][in], `weight_scale` F32 [] or [1] per tensor,
//     activation_scheme "dynamic", or "static" with an `input_scale` per layer;
//   quant_method "fp8" with weight_block_size [br, bc] (transformers' FineGrainedFP8: Qwen3-*-FP8, DeepSeek-V3):
//     `weight_scale_inv` [ceil(out / br)][ceil(in / bc)], a multiplier despite its name;
//   quant_method "compressed-tensors", format "float-quantized" (llm-compressor, RedHatAI): config_groups whose
//     weights are {num_bits 8, type float, symmetric, strategy tensor | channel | block}, `weight_scale` [1] / [out, 1]
//     / the block grid, input_activations per token dynamic, per tensor static (`input_scale`) or per group dynamic.
// A weight's value is code x scale (the scale of its tensor, row or block). Anything else in quantization_config is
// refused with one line naming the field and its value.
#pragma once

#include <boost/json/value.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "model/loader/config.h"
#include "model/loader/safetensors.h"

namespace paged {

/// config.json's quantization_config as an Fp8Checkpoint (enabled). Throws ModelError naming the first field it does
/// not support ("config.json: unsupported quantization_config.<path> = <value>"): another quant_method or format,
/// integer or non-8-bit types, asymmetric or group-wise weights, a kv_cache_scheme, an unknown field, ...
Fp8Checkpoint read_quantization_config(const boost::json::value& quantization_config);

/// The scales of one F8_E4M3 weight [out][in] of an FP8 checkpoint: the tensor named as the weight with its last
/// part "weight" replaced by the checkpoint's scale_suffix, as float32 (F32, BF16 or F16 on disk).
class Fp8WeightScales {
 public:
  /// Throws ModelError naming the tensor when the weight is not a 2-D "*.weight", the checkpoint is not an FP8 one,
  /// the scale tensor is absent, not of a float dtype, of another shape than the layout implies (both shapes named),
  /// or holds a value that is negative or not finite; with static activations also when the layer's `input_scale`
  /// is absent or not one positive float (it is checked, not used: activations are scaled per token).
  Fp8WeightScales(const SafeTensors& weights, const std::string& weight_name, const TensorView& weight,
                  const Fp8Checkpoint& fp8);
  /// The scale of element (row, col) of the weight.
  float at(int64_t row, int64_t col) const {
    return scales_[static_cast<size_t>((row / block_rows_) * grid_cols_ + col / block_cols_)];
  }
  /// Multiplies values [n] (the code values of columns [col_begin, col_begin + n) of `row`) by their scales.
  void dequantise(int64_t row, int64_t col_begin, int64_t n, float* values) const;
  /// Whether each row has one scale (per-tensor and per-channel layouts): the codes then serve an FP8 linear with a
  /// scale per output row as they are.
  bool per_row() const { return block_cols_ >= columns_; }
  /// The scales of rows [row_begin, row_begin + rows), one per row; only when per_row().
  std::vector<float> row_scales(int64_t row_begin, int64_t rows) const;

 private:
  std::vector<float> scales_;  // [grid rows][grid_cols_]: one per block of block_rows_ x block_cols_ elements
  int64_t block_rows_ = 1, block_cols_ = 1, grid_cols_ = 1, columns_ = 1;
};

}  // namespace paged
