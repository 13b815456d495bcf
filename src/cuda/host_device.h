// cuda/host_device.h: COMET_HOST_DEVICE marks small inline functions that host-only translation
// units (g++) and CUDA ones (nvcc) both compile, so one definition serves both sides.
#pragma once

#if defined(__CUDACC__)
#define COMET_HOST_DEVICE __host__ __device__
#else
#define COMET_HOST_DEVICE
#endif
