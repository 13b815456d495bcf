// GPU tests of the bench's synchronization (bench/timing.h, label `gpu`): a launch that does not
// finish is named after the no-progress limit, in an Error or (the tool's way) in one line on
// stderr and exit code 3, instead of hanging the process; launches that keep finishing are
// waited for however long they take together; a check's copy to the host and a variant's first
// launch are never what waits.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "bench/timing.h"
#include "cuda/signal.cuh"
#include "gpu_test_util.h"

namespace comet::bench {
namespace {

// Spins until the host sets *release (mapped pinned memory), so the test decides when it ends.
__global__ void wait_for_host(const volatile int* release) {
  while (*release == 0) __nanosleep(1000);
}

__global__ void sleep_ns(uint64_t ns) {
  const uint64_t t0 = cuda::globaltimer_ns();
  while (cuda::globaltimer_ns() - t0 < ns) __nanosleep(1000);
}

// A non-blocking stream, and a host flag in mapped pinned memory that `wait_for_host` polls so
// that a test decides when its stuck kernel ends; both released when the test ends.
class BenchTiming : public ::testing::Test {
 protected:
  void SetUp() override {
    COMET_REQUIRE_GPU();
    COMET_CUDA_CHECK(cudaHostAlloc(&release_, sizeof(int), cudaHostAllocMapped));
    *release_ = 0;
    COMET_CUDA_CHECK(cudaHostGetDevicePointer(&release_dev_, release_, 0));
    COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (release_ != nullptr) *release_ = 1;
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
    if (release_ != nullptr) cudaFreeHost(release_);
  }
  void launch_stuck(cudaStream_t s) const { wait_for_host<<<1, 1, 0, s>>>(release_dev_); }
  // Ends the stuck kernel and waits for everything enqueued behind it.
  void release() const {
    *release_ = 1;
    COMET_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  cudaStream_t stream_ = nullptr;

 private:
  int* release_ = nullptr;
  int* release_dev_ = nullptr;
};

// The Error's message from `f` (throwing form), or "" when it returns.
template <class F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST_F(BenchTiming, NamesALaunchThatDoesNotFinish) {
  const Events ends(2);
  const std::vector<Variant> variants{{"quick", {}}, {"stuck", {}}};
  sleep_ns<<<1, 1, 0, stream_>>>(1000);
  COMET_CUDA_CHECK(cudaEventRecord(ends[0], stream_));
  launch_stuck(stream_);
  COMET_CUDA_CHECK(cudaEventRecord(ends[1], stream_));
  const std::string message = error_message(
      [&] { sync_or_name_hang(stream_, variants, {{ends[0], 0, 3}, {ends[1], 1, 3}}, 0.5, OnHang::kThrow); });
  EXPECT_NE(message.find("'stuck' (timed round 3)"), std::string::npos) << message;
  EXPECT_EQ(message.find("'quick'"), std::string::npos) << message;
  // The kernel is still running; released, the stream finishes and the process goes on.
  release();
  EXPECT_EQ(cudaEventQuery(ends[1]), cudaSuccess);
}

// A check's copy to pageable host memory waits for the kernel before it; behind one that does not
// finish, the copy must not be what waits (it would block the thread for good): the stream is
// polled first and the check named.
TEST_F(BenchTiming, NamesACheckWhoseKernelDoesNotFinishBeforeCopying) {
  int* value = nullptr;
  COMET_CUDA_CHECK(cudaMalloc(&value, sizeof(int)));
  COMET_CUDA_CHECK(cudaMemsetAsync(value, 0x5a, sizeof(int), stream_));
  launch_stuck(stream_);
  int copied = 0;  // pageable, like the bench's result vectors
  const std::string message = error_message(
      [&] { copy_to_host_or_name_hang(&copied, value, sizeof copied, stream_, "stuck check", 0.5, OnHang::kThrow); });
  EXPECT_NE(message.find("'stuck check' (check)"), std::string::npos) << message;
  EXPECT_EQ(copied, 0);  // nothing was copied past the stuck kernel
  release();
  // Released, the same call copies.
  EXPECT_NO_THROW(copy_to_host_or_name_hang(&copied, value, sizeof copied, stream_, "released check", 0.5,
                                            OnHang::kThrow));
  EXPECT_EQ(copied, 0x5a5a5a5a);
  cudaFree(value);
}

// The first warm-up round waits for each variant before launching the next: a first launch that
// loads its kernels blocks the thread behind a stuck launch, so the stuck one must be named
// before any later variant is launched (here the third variant's launch must never be called).
TEST_F(BenchTiming, FirstWarmUpRoundNamesAStuckVariantBeforeLaunchingTheNext) {
  int later_launches = 0;
  const std::vector<Variant> variants{
      {"quick", [](cudaStream_t s) { sleep_ns<<<1, 1, 0, s>>>(1000); }},
      {"stuck", [&](cudaStream_t s) { launch_stuck(s); }},
      {"later", [&](cudaStream_t s) { ++later_launches; sleep_ns<<<1, 1, 0, s>>>(1000); }}};
  const std::string message =
      error_message([&] { time_interleaved(variants, stream_, 2, 0, 1, {}, 0.5, OnHang::kThrow); });
  EXPECT_NE(message.find("'stuck' (warm-up)"), std::string::npos) << message;
  EXPECT_EQ(later_launches, 0);
  release();
  // Released (the flag stays set), the same variants time to the end.
  const std::vector<double> us = time_interleaved(variants, stream_, 2, 0, 1, {}, 0.5, OnHang::kThrow);
  EXPECT_EQ(us.size(), 3u);
  EXPECT_EQ(later_launches, 3);  // one warm-up round and two timed rounds
}

// The tool's way, in a child process (gtest's threadsafe death test: the child starts the binary
// afresh, so it opens its own CUDA context): the kernel runs for 5 s, far past the 0.5 s limit,
// and the child must exit with code 3 and the named variant on stderr. (The kernel ends on its
// own, so a process exit that waited for it would still end, 5 s later.)
TEST_F(BenchTiming, ExitsWithCodeThreeNamingALaunchThatDoesNotFinish) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto run_stuck = [] {
    cudaStream_t stream;
    COMET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const Events end(1);
    sleep_ns<<<1, 1, 0, stream>>>(5'000'000'000ull);
    COMET_CUDA_CHECK(cudaEventRecord(end[0], stream));
    sync_or_name_hang(stream, {Variant{"stuck", {}}}, {{end[0], 0, kWarmUp}}, 0.5);
    std::exit(0);  // not reached: the limit ends the process first
  };
  EXPECT_EXIT(run_stuck(), ::testing::ExitedWithCode(3), "comet: error: bench: variant 'stuck' \\(warm-up\\)");
}

TEST_F(BenchTiming, WaitsForLaunchesThatKeepFinishing) {
  // Four launches of 0.3 s each against a 0.5 s no-progress limit: 1.2 s in all, never 0.5 s
  // without one finishing, so no Error.
  const std::vector<Variant> variants{{"slow", {}}};
  const Events ends(4);
  std::vector<LaunchMark> marks;
  for (int i = 0; i < 4; ++i) {
    sleep_ns<<<1, 1, 0, stream_>>>(300'000'000ull);
    COMET_CUDA_CHECK(cudaEventRecord(ends[i], stream_));
    marks.push_back({ends[i], 0, i});
  }
  EXPECT_NO_THROW(sync_or_name_hang(stream_, variants, marks, 0.5, OnHang::kThrow));
  EXPECT_EQ(cudaStreamQuery(stream_), cudaSuccess);
}

}  // namespace
}  // namespace comet::bench
