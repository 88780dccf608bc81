// Warp-level tensor-core and shared-memory primitives the attention kernels and the grouped GEMM (moe.cu) share: the m16n8k16 bf16 MMA with its
// fragment layouts, ldmatrix (plain and transposed) and cp.async. CUDA translation units only.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace paged::cuda {

// One m16n8k16 bf16 MMA with float accumulators: d += a * b (PTX ISA fragment layouts; g = lane / 4, c = lane % 4):
//   a (16x16, row major): a0 = A[g][2c..2c+1], a1 = A[g+8][2c..2c+1], a2 = A[g][2c+8..2c+9], a3 = A[g+8][2c+8..2c+9]
//   b (16x8, column major): b0 = B[2c..2c+1][g], b1 = B[2c+8..2c+9][g]
//   d (16x8): d0, d1 = D[g][2c..2c+1], d2, d3 = D[g+8][2c..2c+1]
// Each 32-bit register holds two bf16, the lower index in the low half.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two floats as one register of two bf16 (round to nearest even), `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Four 8x8 bf16 matrices from shared memory: lane L gives the address of row L % 8 of matrix L / 8 (16 bytes,
// 16-byte aligned), and gets r[m] = matrix m's row L / 4, elements 2 (L % 4) .. +1: with rows along N and columns
// along K, two B registers (b0, b1) of two k-steps or two n-tiles.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  const auto at = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(at));
}

// Two 8x8 bf16 matrices: lanes 0-15 give the row addresses as for ldmatrix_x4 (the others' are not read): the two B
// registers of one k-step.
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* row) {
  const auto at = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(at));
}

// The same, each matrix transposed: r[m] = matrix m's column L / 4, rows 2 (L % 4) .. +1 (B registers from a matrix
// stored with K along rows, as V [token][dim] is for P V).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  const auto at = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(at));
}

// Copies 16 bytes global -> shared without passing through registers (both 16-byte aligned); with `valid` false it
// reads nothing and writes 16 zero bytes (`src` must still be a mapped address).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  const auto at = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(at), "l"(src), "r"(valid ? 16 : 0));
}

// The same for 4 bytes (both 4-byte aligned).
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, bool valid) {
  const auto at = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(at), "l"(src), "r"(valid ? 4 : 0));
}

// Closes the group of cp.async issued since the last commit.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most `kPending` committed groups of this thread are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

}  // namespace paged::cuda
