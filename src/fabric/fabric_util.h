// fabric/fabric_util.h: small helpers shared by the fabric implementations (fabric.cu,
// nccl_fabric.cu). Internal; includes the CUDA runtime.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/check.h"
#include "fabric/fabric.h"

namespace comet::fabric::detail {

inline int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// Heap sizes are rounded to this (fabric.h).
inline constexpr int64_t kHeapAlign = 256;

// A heap size allocate() takes: [0, kMaxHeapBytesPerRank] (fabric.h), so that rounding it up
// and multiplying it by the ranks cannot overflow.
inline bool valid_heap_size(int64_t bytes) { return bytes >= 0 && bytes <= kMaxHeapBytesPerRank; }
inline void check_heap_size(int64_t bytes) {
  COMET_CHECK(valid_heap_size(bytes), "fabric: a heap of " << bytes << " bytes per rank is outside [0, "
                                                           << kMaxHeapBytesPerRank << "]");
}

// Number of visible CUDA devices; 0 when the runtime finds no driver or device.
inline int visible_devices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

// Makes GPU `local_rank` current: the GPU a process of a multi-process run drives (LOCAL_RANK).
// Throws comet::Error, prefixed by `context`, when no GPU or too few GPUs are visible.
// `source` names the variable local_rank came from (ProcessEnv::local_rank_source).
inline void set_local_rank_device(int local_rank, const std::string& context = "",
                                  const std::string& source = "LOCAL_RANK") {
  const int devices = visible_devices();
  COMET_CHECK(devices > 0, context << "no CUDA device is visible");
  COMET_CHECK(local_rank < devices,
              context << source << "=" << local_rank << (source == "LOCAL_RANK" ? "" : " (LOCAL_RANK is unset)")
                      << " but only " << devices << " GPU(s) are visible to this process (CUDA_VISIBLE_DEVICES?)");
  COMET_CUDA_CHECK(cudaSetDevice(local_rank));
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
