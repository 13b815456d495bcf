// gpu/fabric_test_kernels.cuh: kernels the fabric tests use to move bytes through a peer table
// (tests/gpu/fabric_test.cu, nccl_fabric_test.cu, tests/multi_gpu/). Deliberately naive: they
// check addresses, not speed.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/check.h"

namespace comet::testing {

// Kernels get internal linkage: several test files of one binary include this header.
namespace {

// out[i] = peer heap byte at `offset + i`, read through table[peer] on this device.
__global__ void read_through_table_kernel(void* const* table, int peer, int64_t offset, uint8_t* out, int64_t n) {
  const uint8_t* src = static_cast<const uint8_t*>(table[peer]) + offset;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = src[i];
}

// Peer heap byte at `offset + i` = in[i], written through table[peer].
__global__ void write_through_table_kernel(void* const* table, int peer, int64_t offset, const uint8_t* in,
                                           int64_t n) {
  uint8_t* dst = static_cast<uint8_t*>(table[peer]) + offset;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = in[i];
  // Stores to another GPU become visible to it at kernel end; the barrier after the launch
  // orders them for the reader.
}

}  // namespace

inline void read_through_table(void* const* table, int peer, int64_t offset, uint8_t* out, int64_t n,
                               cudaStream_t stream = nullptr) {
  read_through_table_kernel<<<8, 256, 0, stream>>>(table, peer, offset, out, n);
  COMET_CUDA_CHECK_LAUNCH();
}

inline void write_through_table(void* const* table, int peer, int64_t offset, const uint8_t* in, int64_t n,
                                cudaStream_t stream = nullptr) {
  write_through_table_kernel<<<8, 256, 0, stream>>>(table, peer, offset, in, n);
  COMET_CUDA_CHECK_LAUNCH();
}

// A byte that says who wrote it for whom: a mix-up of ranks or offsets changes it.
__host__ __device__ inline uint8_t tag_byte(int src, int dst, int64_t i) {
  return uint8_t((src * 131 + dst * 29 + i * 7 + 1) & 0xff);
}

}  // namespace comet::testing
