// fabric/nccl_fabric.h: the version helpers of the Nccl fabric (nccl_fabric.cu), for tests
// and tools. No NCCL or CUDA headers here. Only in builds with NCCL (nccl_fabric_available());
// the fabric itself is made by make_nccl_fabric() in fabric/fabric.h.
#pragma once

#include <string>

namespace comet::fabric {

// NCCL_VERSION_CODE of the headers this build was compiled with (e.g. 22809 for 2.28.9).
int nccl_compiled_version();
// ncclGetVersion() of the libnccl loaded at run time.
int nccl_runtime_version();
// "2.28.9" for 22809 (and the pre-2.9 scheme: "2.8.4" for 2804).
std::string nccl_version_name(int code);
// Throws comet::Error with both versions when they differ: structures and device-side
// inline functions of the headers must match the library (NCCL checks only some of that).
void check_nccl_version(int compiled, int runtime);

// The file through which the serial-th Nccl fabric of this process (0, 1, ...) is bootstrapped:
// "<bootstrap_file>.<serial>". Rank 0 writes it and removes it once every rank has joined.
std::string nccl_bootstrap_path(const std::string& bootstrap_file, int serial);

}  // namespace comet::fabric
