// cuda/device_info.h: what the CUDA runtime sees (no CUDA headers here, so host code and the
// CLI can ask without including cuda_runtime.h).
#pragma once

#include <string>

namespace comet::cuda {

struct DeviceInfo {
  int device_count = 0;    // 0 when no GPU or no driver
  std::string name;        // of the device asked about
  int num_sms = 0;         // of the device asked about
  int compute_major = 0;
  int compute_minor = 0;
  std::string error;       // why device_count is 0, if the runtime said
};

// Never throws: a machine without a GPU is a normal answer. `device` outside the visible
// devices is an error in `error`, with device_count still the count.
DeviceInfo query_device_info(int device = 0);

}  // namespace comet::cuda
