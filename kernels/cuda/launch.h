// What every CUDA launcher of kernels/cuda shares on the host side: the bf16 type, and the reason a launcher
// refused its arguments. Host C++ includes this (no device code here).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <string>

namespace paged::cuda {

using bf16 = __nv_bfloat16;

/// Records `message` as the reason of the failure about to be returned and returns `error`. Launchers call it when
/// they reject their arguments (e.g. an unsupported head size), so that the caller can say more than
/// "invalid argument". Thread-local: the message belongs to the thread that called the launcher.
cudaError_t launch_failure(cudaError_t error, std::string message);

/// The message of the last launch_failure on this thread ("" if none), followed by cudaGetErrorString(error).
std::string describe_launch_error(cudaError_t error);

/// Supported head sizes of the attention and RoPE kernels: one switch turns the runtime size into a template
/// parameter; anything else is refused with a message naming this list.
inline constexpr int kSupportedHeadDims[] = {64, 128};
/// Supported KV block sizes (tokens per block): powers of two so that token -> (block, offset) is a shift and a mask.
inline constexpr int kSupportedBlockSizes[] = {8, 16, 32};

}  // namespace paged::cuda
