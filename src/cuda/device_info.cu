// Device query through the CUDA runtime; used to pick a backend and to key tuning tables.
#include <cuda_runtime.h>

#include "cuda/device_info.h"

namespace comet::cuda {

DeviceInfo query_device_info() {
  DeviceInfo info;
  cudaError_t err = cudaGetDeviceCount(&info.device_count);
  if (err != cudaSuccess) {
    info.device_count = 0;
    info.error = cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky error of a failed query
    return info;
  }
  if (info.device_count == 0) return info;
  cudaDeviceProp prop{};
  err = cudaGetDeviceProperties(&prop, 0);
  if (err != cudaSuccess) {
    info.error = cudaGetErrorString(err);
    return info;
  }
  info.name = prop.name;
  info.num_sms = prop.multiProcessorCount;
  info.compute_major = prop.major;
  info.compute_minor = prop.minor;
  return info;
}

}  // namespace comet::cuda
