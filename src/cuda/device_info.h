// cuda/device_info.h: what the CUDA runtime sees (no CUDA headers here, so host code and the
// CLI can ask without including cuda_runtime.h).
#pragma once

#include <string>

namespace comet::cuda {

struct DeviceInfo {
  int device_count = 0;    // 0 when no GPU or no driver
  std::string name;        // of device 0
  int num_sms = 0;         // of device 0
  int compute_major = 0;
  int compute_minor = 0;
  std::string error;       // why device_count is 0, if the runtime said
};

// Never throws: a machine without a GPU is a normal answer.
DeviceInfo query_device_info();

}  // namespace comet::cuda
