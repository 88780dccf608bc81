// The error of the CUDA backend's host code. Plain C++ (no CUDA headers), so code built without CUDA can name it.
#pragma once

#include <stdexcept>

namespace paged {

/// A CUDA, cuBLAS or NCCL failure inside the runner (not a problem of the model files: those are ModelError).
struct GpuError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace paged
