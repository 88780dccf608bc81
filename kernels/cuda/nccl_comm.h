// NCCL for tensor parallelism across the GPUs of one host: the group's unique id, made once and handed to every
// rank as plain bytes in a CAF message (so that the same set-up can later span hosts), and one communicator per
// rank. Plain C++ (neither CUDA nor NCCL headers): actors/messages.h includes it for the id in every build; the
// functions exist only where the CUDA backend is built (nccl_comm.cpp).
#pragma once

#include <cstddef>
#include <vector>

struct CUstream_st;  // cudaStream_t is CUstream_st*
struct ncclComm;     // ncclComm_t is ncclComm*

namespace paged {

/// ncclUniqueId as its NCCL_UNIQUE_ID_BYTES (128) bytes: the serialisable form that travels to the ranks
/// (registered in actors/messages.cpp).
struct NcclUniqueId {
  std::vector<char> bytes;
};

/// A fresh id for one group (ncclGetUniqueId): call it once per group, in the process that hands it to the ranks,
/// before any other NCCL call there. Sets NCCL_NVLS_ENABLE=0 in the environment first (NCCL reads its environment
/// at its first call; NVLink SHARP stays off on our machines). Throws GpuError naming NCCL's result.
NcclUniqueId nccl_unique_id();

enum class NcclType { bf16, f32 };

/// One rank's communicator in a group of `size`, on CUDA device `device` (made current on the calling thread).
/// The constructor blocks until all `size` ranks of `id` have joined, so the ranks join concurrently, each on its
/// own thread or process; NCCL's teardown is collective within a host too, so the destructor waits for every
/// other rank's and the ranks are torn down concurrently as well. Errors throw GpuError naming the NCCL result and
/// NCCL's last error message.
class NcclComm {
 public:
  NcclComm(const NcclUniqueId& id, int rank, int size, int device);
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  /// Sums `count` elements at `data` (memory of this rank's device) over the ranks, in place, enqueued on `stream`
  /// (which may be capturing a CUDA graph). Every rank calls it with the same count and type, in the same order.
  void all_reduce_sum(void* data, size_t count, NcclType type, CUstream_st* stream);

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }

 private:
  ncclComm* comm_ = nullptr;
  int rank_ = 0, size_ = 1, device_ = 0;
};

}  // namespace paged
