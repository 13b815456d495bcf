// Device query through the CUDA runtime; used to pick a backend and to key tuning tables.
#include <cuda_runtime.h>

#include "cuda/device_info.h"

namespace comet::cuda {

DeviceInfo query_device_info(int device) {
  DeviceInfo info;
  cudaError_t err = cudaGetDeviceCount(&info.device_count);
  if (err != cudaSuccess) {
    info.device_count = 0;
    info.error = cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky error of a failed query
    return info;
  }
  if (info.device_count == 0) return info;
  if (device < 0 || device >= info.device_count) {
    info.error = "device " + std::to_string(device) + " is not among the " + std::to_string(info.device_count) + " visible";
    return info;
  }
  cudaDeviceProp prop{};
  err = cudaGetDeviceProperties(&prop, device);
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
