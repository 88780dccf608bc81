#include "kernels/cuda/lora.h"

#include <string>

#include "kernels/cuda/gemm.h"

namespace paged::cuda {

cudaError_t add_lora(Gemm& gemm, bf16* y, const bf16* x, float* v, bf16* v16, int rows, const LoraArgs& args,
                     cudaStream_t stream) {
  const int64_t cols = int64_t{args.slots} * args.rank;
  if (rows < 0 || args.slots < 0 || args.rank < 0 ||
      (args.rank > 0 && (args.n <= 0 || args.k <= 0 || args.n % 8 || args.k % 8 || cols % 8)))
    return launch_failure(cudaErrorInvalidValue, "add_lora: rows " + std::to_string(rows) + ", " +
                                                     std::to_string(args.slots) + " slots of rank " +
                                                     std::to_string(args.rank) + " on " + std::to_string(args.n) +
                                                     " x " + std::to_string(args.k) +
                                                     " (n, k and slots x rank multiples of 8)");
  if (rows == 0 || cols == 0) return cudaSuccess;
  const int c = static_cast<int>(cols);
  if (cudaError_t e = gemm.linear(v, x, args.a, nullptr, rows, c, args.k, /*y_f32=*/true, stream); e != cudaSuccess)
    return e;
  if (cudaError_t e = lora_keep_slot(v16, v, rows, args, stream); e != cudaSuccess) return e;
  return gemm.linear_add(y, v16, args.b, rows, args.n, c, stream);
}

}  // namespace paged::cuda
