// tests/gpu/gpu_test_util.h: small helpers shared by the GPU tests (label `gpu`).
//
// Every GPU test starts with COMET_REQUIRE_GPU(), which skips with a visible message on a
// machine without a CUDA device (CI), so the suite still reports what it did not run.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/check.h"
#include "ref/oracle.h"

namespace comet::testing {

inline bool have_gpu() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return count > 0;
}

#define COMET_REQUIRE_GPU()                                                            \
  do {                                                                                 \
    if (!::comet::testing::have_gpu()) GTEST_SKIP() << "no CUDA device: GPU test skipped"; \
  } while (0)

// Owning device allocation of `count` elements of T.
template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (count_) COMET_CUDA_CHECK(cudaMalloc(&ptr_, count_ * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), count_(o.count_) { o.ptr_ = nullptr; o.count_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(count_, o.count_);
    return *this;
  }
  T* get() const { return ptr_; }
  size_t size() const { return count_; }
  void upload(const std::vector<T>& host) {
    COMET_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    // Landed for work on any stream: the pageable copy and the memset below run on the legacy
    // stream, which non-blocking streams do not wait for.
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    if (count_) COMET_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  // Fill every byte with `byte` (0xff makes bf16 NaN: a stale value can never pass a check).
  void poison(int byte = 0xff) {
    if (count_) COMET_CUDA_CHECK(cudaMemset(ptr_, byte, count_ * sizeof(T)));
    COMET_CUDA_CHECK(cudaDeviceSynchronize());
  }
  void zero() { poison(0); }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

inline std::vector<std::vector<double>> as_double(const std::vector<std::vector<float>>& v) {
  std::vector<std::vector<double>> out;
  for (const auto& r : v) out.emplace_back(r.begin(), r.end());
  return out;
}

// Every rank's output ([T_r][hidden]) within the bf16 tolerance of `want`, as a whole and row
// by row (ref::Comparison::within; the message carries the comparison either way).
inline ::testing::AssertionResult close_to(const std::vector<std::vector<float>>& got,
                                           const std::vector<std::vector<double>>& want, int hidden) {
  const ref::Comparison cmp = ref::compare_outputs(got, want, hidden);
  if (cmp.within(ref::tolerance_for(DType::kBF16))) return ::testing::AssertionSuccess() << cmp.describe();
  return ::testing::AssertionFailure() << cmp.describe();
}

}  // namespace comet::testing
