// fabric/fabric_util.h: small helpers shared by the fabric implementations (fabric.cu,
// nccl_fabric.cu). Internal; includes the CUDA runtime.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/check.h"

namespace comet::fabric::detail {

inline int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// Heap sizes are rounded to this (fabric.h).
inline constexpr int64_t kHeapAlign = 256;

// Number of visible CUDA devices; 0 when the runtime finds no driver or device.
inline int visible_devices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

// Restores the caller's current device on scope exit.
struct DeviceGuard {
  int saved = 0;
  DeviceGuard() { COMET_CUDA_CHECK(cudaGetDevice(&saved)); }
  ~DeviceGuard() { cudaSetDevice(saved); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
};

}  // namespace comet::fabric::detail
