#include "kernels/cuda/launch.h"

#include <utility>

namespace paged::cuda {

namespace {
thread_local std::string last_failure;
}

cudaError_t launch_failure(cudaError_t error, std::string message) {
  last_failure = std::move(message);
  return error;
}

std::string describe_launch_error(cudaError_t error) {
  std::string text = cudaGetErrorString(error);
  if (!last_failure.empty()) text = last_failure + " (" + text + ")";
  return text;
}

}  // namespace paged::cuda
