// cuda/check.h: every CUDA runtime and cuBLAS call goes through these; a failure throws
// comet::Error with the call, file:line and the runtime's message. A failed call also leaves its
// error as the thread's "last error", which the next COMET_CUDA_CHECK_LAUNCH would report as its
// own launch's: the failure branch clears it (a sticky error stays, and every later call says so).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <sstream>

#include "comet/error.h"

#define COMET_CUDA_CHECK(call)                                                              \
  do {                                                                                      \
    const cudaError_t comet_cuda_err_ = (call);                                             \
    if (comet_cuda_err_ != cudaSuccess) {                                                   \
      (void)cudaGetLastError();                                                             \
      std::ostringstream comet_cuda_os_;                                                    \
      comet_cuda_os_ << "CUDA error " << cudaGetErrorName(comet_cuda_err_) << " ("           \
                     << cudaGetErrorString(comet_cuda_err_) << ") in `" #call "` at "       \
                     << __FILE__ << ":" << __LINE__;                                        \
      throw ::comet::Error(comet_cuda_os_.str());                                           \
    }                                                                                       \
  } while (0)

// After a kernel launch: catches bad launch configurations at once.
#define COMET_CUDA_CHECK_LAUNCH() COMET_CUDA_CHECK(cudaGetLastError())

namespace comet::cuda {
// Whether `p` is a multiple of `bytes` (the 16-byte vector loads and stores, 4-byte words).
inline bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
}  // namespace comet::cuda
