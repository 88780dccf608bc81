// NcclComm: see nccl_comm.h. The default (blocking) NCCL configuration: initialisation and teardown return once
// every rank got there.
#include "kernels/cuda/nccl_comm.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/cuda/gpu_error.h"

namespace paged {

namespace {

void check(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return;
  std::string message = std::string(what) + ": " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(nullptr);
  if (last && *last) message += " (" + std::string(last) + ")";
  throw GpuError(message);
}

}  // namespace

NcclUniqueId nccl_unique_id() {
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  ncclUniqueId id;
  check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  NcclUniqueId out;
  out.bytes.assign(id.internal, id.internal + NCCL_UNIQUE_ID_BYTES);
  return out;
}

NcclComm::NcclComm(const NcclUniqueId& id, int rank, int size, int device) : rank_(rank), size_(size), device_(device) {
  const std::string who = "rank " + std::to_string(rank) + " of " + std::to_string(size);
  if (id.bytes.size() != NCCL_UNIQUE_ID_BYTES)
    throw GpuError("NCCL unique id of " + std::to_string(id.bytes.size()) + " bytes, not " +
                   std::to_string(NCCL_UNIQUE_ID_BYTES) + " (" + who + ")");
  if (size < 1 || rank < 0 || rank >= size) throw GpuError("invalid NCCL rank " + who);
  const cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess)
    throw GpuError("cudaSetDevice(" + std::to_string(device) + ") for NCCL " + who + ": " + cudaGetErrorString(e));
  ncclUniqueId uid;
  std::memcpy(uid.internal, id.bytes.data(), NCCL_UNIQUE_ID_BYTES);
  const std::string what = "ncclCommInitRank (" + who + ", device " + std::to_string(device) + ")";
  check(ncclCommInitRank(&comm_, size, uid, rank), what.c_str());
}

NcclComm::~NcclComm() {
  // Finalize flushes this rank's outstanding operations and waits for the group to be quiescent; destroy then only
  // frees local resources.
  cudaSetDevice(device_);
  ncclCommFinalize(comm_);
  ncclCommDestroy(comm_);
}

void NcclComm::all_reduce_sum(void* data, size_t count, NcclType type, CUstream_st* stream) {
  const ncclDataType_t t = type == NcclType::bf16 ? ncclBfloat16 : ncclFloat32;
  check(ncclAllReduce(data, data, count, t, ncclSum, comm_, stream), "ncclAllReduce");
}

}  // namespace paged
