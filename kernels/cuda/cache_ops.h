// Whole-block moves of the paged KV cache: copy-on-write copies inside the device pool, and swaps between the
// device pool and a pinned host pool on a copy stream, completion signalled by an event.
// CPU twin: paged::cpu::copy_blocks (kernels/cpu/ops.h); a swap is a plain copy of the same bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/cuda/launch.h"

namespace paged::cuda {

/// One tier of KV blocks (device memory, or pinned host memory): num_caches arrays of num_blocks blocks laid end to
/// end in one allocation, i.e. [num_caches][num_blocks][block_bytes]. The runner uses cache 2 * layer for a layer's
/// K and 2 * layer + 1 for its V; a block of one cache is [num_kv_heads][block_size][head_dim] bf16.
struct BlockPool {
  void* base = nullptr;
  int num_caches = 0;
  int num_blocks = 0;
  size_t block_bytes = 0;  // a multiple of 16

  char* block(int cache, int64_t index) const {
    return static_cast<char*>(base) + (static_cast<int64_t>(cache) * num_blocks + index) * block_bytes;
  }
};

/// For each (src, dst) pair and every cache of the device pool: block dst := block src. Copy-on-write before the
/// step's attention, so enqueue it on the compute stream. Contract: no block is a destination twice, and no
/// destination is also a source in the same call (the pairs run in parallel).
cudaError_t copy_blocks(const BlockPool& pool,
                        const int32_t* pairs,  // device [num_pairs][2]: (src block, dst block)
                        int num_pairs, cudaStream_t stream);

/// For each (src, dst) pair and every cache: block dst of `to` := block src of `from`. One of the pools is the
/// device pool, the other pinned host memory (any direction works: the copies use unified addressing). Both pools
/// have the same num_caches and block_bytes. The copies go on `copy_stream`, after `ready` when it is not null
/// (e.g. an event recorded on the compute stream after the last step that wrote the blocks), and `done` is
/// recorded on `copy_stream` after them: a step that reads swapped-in blocks waits for `done`
/// (cudaStreamWaitEvent), and swapped-out device blocks may be reused once `done` has completed.
/// Consecutive pairs of consecutive blocks are merged into one copy.
cudaError_t swap_blocks(const BlockPool& from, const BlockPool& to, const std::vector<std::pair<int32_t, int32_t>>& pairs,
                        cudaStream_t copy_stream, cudaEvent_t ready, cudaEvent_t done);

}  // namespace paged::cuda
